//! The ManageSieve command framer and parser on arbitrary client bytes, and its
//! strings read back; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::managesieve_command(data));
