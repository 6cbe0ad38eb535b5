#![no_main]
//! `infgram::fuzz_targets::cnf` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| infgram::fuzz_targets::cnf(data));
