#![no_main]
//! `infgram::fuzz_targets::index_dir` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| infgram::fuzz_targets::index_dir(data));
