//! The line framer of the SMTP and POP3 sessions on arbitrary client bytes, read
//! in pieces the input chooses; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::lines(data));
