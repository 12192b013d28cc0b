//! The PyTorch drop-in's host path through the C ABI on the mock backend,
//! as the shim drives it for `torch.empty` + `del`: one allocation and its
//! free, with one block kept live (as in a program), with the memory
//! history off, recording entries only (PyTorch's `context=None`), and
//! recording with a context entered around every call (`context="all"`:
//! the shim enters the context PyTorch gathered, cachalot keeps it with
//! the block and the entries and releases it through the caller's
//! callback).
// criterion's macros generate undocumented items
#![allow(missing_docs)]

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::ptr::{null, null_mut};

use cachalot_capi::drop_in::{cachalot_alloc, cachalot_raw_delete};
use cachalot_capi::history::{
    CachalotContext, cachalot_context_enter, cachalot_context_exit, cachalot_history_configure,
};
use cachalot_capi::{CACHALOT_OK, cachalot_init};
use criterion::{Criterion, criterion_group, criterion_main};

unsafe extern "C" fn release(data: *mut c_void) {
    // SAFETY: `data` is a `Box<u64>` made by `context` below, released once.
    drop(unsafe { Box::from_raw(data.cast::<u64>()) });
}

fn context() -> CachalotContext {
    CachalotContext {
        data: Box::into_raw(Box::new(7u64)).cast(),
        release: Some(release),
    }
}

fn history(enabled: bool, level: c_int) {
    // SAFETY: no skip actions.
    let rc = unsafe {
        cachalot_history_configure(-1, c_int::from(enabled), 100_000, level, 1, null(), 0)
    };
    assert_eq!(rc, CACHALOT_OK);
}

fn alloc(size: usize) -> *mut c_void {
    let mut p = null_mut();
    // SAFETY: `p` is a valid out-pointer.
    let rc = unsafe { cachalot_alloc(size, 0, null_mut(), &mut p) };
    assert_eq!(rc, CACHALOT_OK);
    p
}

fn history_path(c: &mut Criterion) {
    // SAFETY: a NUL-terminated literal.
    assert_eq!(unsafe { cachalot_init(c"mock".as_ptr()) }, CACHALOT_OK);
    let keep = alloc(512);
    let pair = |size: usize| {
        let p = alloc(black_box(size));
        assert_eq!(cachalot_raw_delete(black_box(p), -1), CACHALOT_OK);
    };
    c.bench_function("pair_1mib_history_off", |b| b.iter(|| pair(1 << 20)));
    // PyTorch's RecordContext: 0 never (entries only), 3 all
    history(true, 0);
    c.bench_function("pair_1mib_entries", |b| b.iter(|| pair(1 << 20)));
    history(true, 3);
    c.bench_function("pair_1mib_contexts", |b| {
        b.iter(|| {
            assert_eq!(cachalot_context_enter(context()), CACHALOT_OK);
            let p = alloc(black_box(1 << 20));
            cachalot_context_exit();
            assert_eq!(cachalot_context_enter(context()), CACHALOT_OK);
            assert_eq!(cachalot_raw_delete(black_box(p), -1), CACHALOT_OK);
            cachalot_context_exit();
        })
    });
    history(false, 0);
    assert_eq!(cachalot_raw_delete(keep, -1), CACHALOT_OK);
}

criterion_group!(benches, history_path);
criterion_main!(benches);
