//! The pool-checkpoint functions of the C ABI on the mock backend: a save,
//! a restore that frees what came after and allocates the checkpoint's
//! blocks again at their addresses, the delta's arrays, and bad input as
//! typed error codes.

use std::ptr::{null, null_mut};

use cachalot_capi::checkpoint::*;
use cachalot_capi::drop_in::*;
use cachalot_capi::*;

mod common;
use common::*;

/// The delta's two arrays, copied.
fn read(d: *mut CachalotCheckpointDelta) -> (Vec<usize>, Vec<usize>) {
    // SAFETY: a live delta from cachalot_pool_restore, read before it is freed.
    let d = unsafe { &*d };
    // SAFETY: each array holds its count of pointers.
    let freed = unsafe { std::slice::from_raw_parts(d.freed, d.num_freed) };
    // SAFETY: as above.
    let made = unsafe { std::slice::from_raw_parts(d.allocated, d.num_allocated) };
    let mut f: Vec<usize> = freed.iter().map(|p| p.addr()).collect();
    let mut m: Vec<usize> = made.iter().map(|p| p.addr()).collect();
    f.sort_unstable();
    m.sort_unstable();
    (f, m)
}

#[test]
fn save_restore_and_bad_input() {
    // SAFETY: a NUL-terminated literal.
    assert_eq!(unsafe { cachalot_init(c"mock".as_ptr()) }, CACHALOT_OK);
    cachalot_set_error_logging(0);
    let pool = (0, 777_001);
    assert_eq!(
        cachalot_pool_create_or_incref(0, pool.0, pool.1),
        CACHALOT_OK
    );
    let a = alloc_in(pool, 512);
    let b = alloc_in(pool, 3 << 20);
    let mut c: *mut CachalotCheckpoint = null_mut();
    // SAFETY: `c` is a valid out-pointer.
    let rc = unsafe { cachalot_pool_checkpoint(0, pool.0, pool.1, &mut c) };
    assert_eq!(rc, CACHALOT_OK);
    assert!(!c.is_null());
    assert_eq!(cachalot_raw_delete(a, 0), CACHALOT_OK);
    let later = alloc_in(pool, 4096);
    let mut d: *mut CachalotCheckpointDelta = null_mut();
    // SAFETY: a live checkpoint and a valid out-pointer.
    assert_eq!(unsafe { cachalot_pool_restore(0, c, &mut d) }, CACHALOT_OK);
    let (freed, made) = read(d);
    let mut want_freed = vec![b.addr(), later.addr()];
    want_freed.sort_unstable();
    let mut want_made = vec![a.addr(), b.addr()];
    want_made.sort_unstable();
    assert_eq!(freed, want_freed);
    assert_eq!(made, want_made);
    // SAFETY: from cachalot_pool_restore, freed once.
    unsafe { cachalot_checkpoint_delta_free(d) };
    // the blocks made are live allocations: raw_delete frees them
    let mut ok = 0;
    let live = [a.cast_const(), b.cast_const()];
    // SAFETY: two readable pointers and a valid out-pointer.
    let rc = unsafe { cachalot_pool_check_live(0, pool.0, pool.1, live.as_ptr(), 2, &mut ok) };
    assert_eq!((rc, ok), (CACHALOT_OK, 1));
    assert_eq!(cachalot_raw_delete(a, 0), CACHALOT_OK);
    assert_eq!(cachalot_raw_delete(b, 0), CACHALOT_OK);

    // bad input
    // SAFETY: NULL arguments are reported, never dereferenced.
    unsafe {
        assert_eq!(
            cachalot_pool_checkpoint(0, pool.0, pool.1, null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_pool_restore(0, null(), &mut d),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_pool_restore(0, c, null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        let mut other: *mut CachalotCheckpoint = null_mut();
        assert_eq!(
            cachalot_pool_checkpoint(0, 0, 0, &mut other),
            CACHALOT_ERR_CAPTURE
        );
        assert_eq!(
            cachalot_pool_checkpoint(0, 0, 999_999_999, &mut other),
            CACHALOT_ERR_CAPTURE
        );
        assert!(last_error().contains("mempool"), "{}", last_error());
        assert_eq!(
            cachalot_pool_restore(-1, c, &mut d),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        cachalot_checkpoint_free(null_mut());
        cachalot_checkpoint_delta_free(null_mut());
    }
    // the pool's uses all ended: its checkpoint no longer applies
    assert_eq!(cachalot_pool_release(0, pool.0, pool.1), CACHALOT_OK);
    // SAFETY: a live checkpoint and a valid out-pointer.
    let rc = unsafe { cachalot_pool_restore(0, c, &mut d) };
    assert_eq!(rc, CACHALOT_ERR_CAPTURE);
    // SAFETY: from cachalot_pool_checkpoint, freed once.
    unsafe { cachalot_checkpoint_free(c) };
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
}
