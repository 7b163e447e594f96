//! The IMAP command framer (limits, literals) and parser on arbitrary client
//! bytes; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::imap_command(data));
