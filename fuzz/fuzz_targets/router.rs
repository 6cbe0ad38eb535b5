#![no_main]
//! `infgram::fuzz_targets::router` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| infgram::fuzz_targets::router(data));
