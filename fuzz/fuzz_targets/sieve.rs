//! Sieve scripts from arbitrary bytes, compiled and run; the property is in
//! `../sieve_checks.rs`.
#![no_main]

#[path = "../sieve_checks.rs"]
mod sieve_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sieve_checks::sieve(data));
