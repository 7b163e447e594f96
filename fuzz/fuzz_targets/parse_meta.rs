//! `parse_meta` on arbitrary messages; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::message_meta(data));
