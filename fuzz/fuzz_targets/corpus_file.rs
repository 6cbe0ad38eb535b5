#![no_main]
//! `infgram::fuzz_targets::corpus_file` under libFuzzer.

libfuzzer_sys::fuzz_target!(|data: &[u8]| infgram::fuzz_targets::corpus_file(data));
