#![no_main]
//! `infgram::fuzz_targets::damaged_index` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| infgram::fuzz_targets::damaged_index(data));
