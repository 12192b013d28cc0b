//! Fuzz target `trace`: [`cachalot_core::fuzz::trace`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cachalot_core::fuzz::trace(data));
