#![forbid(unsafe_code)]

pub mod stress;
