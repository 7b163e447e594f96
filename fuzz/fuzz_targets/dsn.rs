//! DSNs built from hostile replies, addresses, ENVID and messages; the
//! properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::dsn(data));
