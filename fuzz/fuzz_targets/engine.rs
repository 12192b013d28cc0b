//! Fuzz target `engine`: [`cachalot_conformance::fuzz::engine`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cachalot_conformance::fuzz::engine(data));
