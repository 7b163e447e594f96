//! THREAD (REFERENCES and ORDEREDSUBJECT) over messages built from arbitrary
//! header sections; the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::thread(data));
