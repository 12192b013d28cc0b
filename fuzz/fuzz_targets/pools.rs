//! Fuzz target `pools`: [`cachalot_conformance::fuzz::pools`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cachalot_conformance::fuzz::pools(data));
