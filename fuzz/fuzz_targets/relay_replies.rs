//! The relay client's reading of remote SMTP replies (multi-line, pipelined,
//! EHLO keywords, enhanced status); the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::relay_replies(data));
