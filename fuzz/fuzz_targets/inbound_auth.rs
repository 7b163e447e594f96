//! Inbound SPF, DKIM, ARC and DMARC on arbitrary messages, with fixed DNS
//! answers; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::inbound_auth(data));
