#![no_main]
//! `infgram::fuzz_targets::query_line` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| infgram::fuzz_targets::query_line(data));
