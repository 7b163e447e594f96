//! The COMPRESS=DEFLATE stream on arbitrary compressed input (bombs included)
//! and as a round trip; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::deflate(data));
