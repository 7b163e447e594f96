//! SMTP command lines and the DATA decoder on arbitrary bytes; the properties are
//! in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::smtp(data));
