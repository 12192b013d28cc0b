//! Fuzz target `config`: [`cachalot_core::fuzz::config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cachalot_core::fuzz::config(data));
