//! The group-commit frames of both sides (requests, answers, the frame
//! reader); the properties are in `../checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::group_commit_frames(data));
