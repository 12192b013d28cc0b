//! Fuzz target `capi`: [`cachalot_capi::fuzz::capi`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cachalot_capi::fuzz::capi(data));
