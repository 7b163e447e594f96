//! The PROXY protocol (v1 and v2) header reader on arbitrary bytes; the
//! properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::proxy_header(data));
