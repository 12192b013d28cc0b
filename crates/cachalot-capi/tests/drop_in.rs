//! The C functions behind the PyTorch C++ shim (`cachalot_capi::drop_in`),
//! called as Rust `extern "C"` functions on the mock backend: each one's
//! effect, and bad input (unknown pointer, double free, bad pool id, NULL
//! out-pointers, bad sizes) as typed error codes.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::{null, null_mut};

use cachalot_capi::drop_in::*;
use cachalot_capi::history::{cachalot_history_enabled, cachalot_record_history};
use cachalot_capi::*;

mod common;
use common::*;

fn new_stream() -> *mut c_void {
    let mut s = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cachalot_stream_create(0, &mut s) }, CACHALOT_OK);
    s.cast()
}

fn use_count(hi: u64, lo: u64) -> c_int {
    let mut n = -1;
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_pool_use_count(0, hi, lo, &mut n) };
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
    n
}

#[test]
fn alloc_delete_and_stats_struct() {
    let _g = setup();
    let before = stats();
    let p = alloc(1000, null_mut());
    assert_eq!(p.addr() % 512, 0);
    let s = stats();
    assert_eq!(
        s.allocated_bytes[0].current,
        before.allocated_bytes[0].current + 1024
    );
    assert_eq!(s.allocation[1].current, before.allocation[1].current + 1);
    assert_eq!(
        s.requested_bytes[0].current,
        before.requested_bytes[0].current + 1000
    );
    // the struct and the 122 flat keys agree
    let j = json_stats(0);
    let names = [
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
    ];
    let arrays = [
        &s.allocation,
        &s.segment,
        &s.active,
        &s.inactive_split,
        &s.allocated_bytes,
        &s.reserved_bytes,
        &s.active_bytes,
        &s.inactive_split_bytes,
        &s.requested_bytes,
    ];
    for (name, a) in names.iter().zip(arrays) {
        for (i, pool) in ["all", "small_pool", "large_pool"].iter().enumerate() {
            for (field, v) in [
                ("current", a[i].current),
                ("peak", a[i].peak),
                ("allocated", a[i].allocated),
                ("freed", a[i].freed),
            ] {
                assert_eq!(
                    j[&format!("{name}.{pool}.{field}")].as_i64().unwrap(),
                    v,
                    "{name}.{pool}.{field}"
                );
            }
        }
    }
    assert_eq!(j["num_device_alloc"].as_i64().unwrap(), s.num_device_alloc);
    assert_eq!(j["max_split_size"].as_i64().unwrap(), s.max_split_size);

    assert_eq!(cachalot_raw_delete(p, -1), CACHALOT_OK);
    assert_eq!(
        stats().allocated_bytes[0].current,
        before.allocated_bytes[0].current
    );
    // double free, unknown pointer, NULL
    assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_ERR_DOUBLE_FREE);
    assert!(last_error().contains("cachalot_raw_delete"));
    let foreign = std::ptr::without_provenance_mut::<c_void>(0x1234_5678);
    assert_eq!(
        cachalot_raw_delete(foreign, -1),
        CACHALOT_ERR_INVALID_POINTER
    );
    assert_eq!(
        cachalot_raw_delete(foreign, 7),
        CACHALOT_ERR_INVALID_POINTER
    );
    assert_eq!(cachalot_raw_delete(null_mut(), -1), CACHALOT_OK);
    // interior pointer
    let q = alloc(4096, null_mut());
    assert_eq!(
        cachalot_raw_delete(q.wrapping_byte_add(512), -1),
        CACHALOT_ERR_INTERIOR_POINTER
    );
    assert_eq!(cachalot_raw_delete(q, 0), CACHALOT_OK);
    // zero bytes: NULL, success
    assert!(alloc(0, null_mut()).is_null());

    // bad arguments to the struct and alloc calls
    let mut st = CachalotDeviceStats::default();
    // SAFETY: writable, wrong size passed on purpose.
    let rc = unsafe { cachalot_get_stats(0, &mut st, 8) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("header and library differ"));
    // SAFETY: NULL out on purpose.
    let rc = unsafe { cachalot_get_stats(0, null_mut(), 8) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    // SAFETY: writable, bad device.
    let rc = unsafe { cachalot_get_stats(3, &mut st, std::mem::size_of_val(&st)) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    let mut out = null_mut();
    // SAFETY: NULL out / bad device / unknown stream on purpose.
    unsafe {
        assert_eq!(
            cachalot_alloc(16, 0, null_mut(), null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_alloc(16, -1, null_mut(), &mut out),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_alloc(16, 0, std::ptr::without_provenance_mut(999), &mut out),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn oom_report_fraction_and_info() {
    let _g = setup();
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    let rc = unsafe { cachalot_mem_get_info(0, &mut free, &mut total) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!(total as u64, cachalot::H200_TOTAL_MEMORY);
    assert!(free <= total && free > 0);
    // SAFETY: NULL pointers are skipped.
    let rc = unsafe { cachalot_mem_get_info(0, null_mut(), null_mut()) };
    assert_eq!(rc, CACHALOT_OK);

    // the fraction: round trip, bad values change nothing
    let mut f = 0.0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_get_memory_fraction(0, &mut f) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!(f, 1.0);
    assert_eq!(cachalot_set_memory_fraction(0, 0.5), CACHALOT_OK);
    for bad in [1.5, -0.1, f64::NAN] {
        assert_eq!(
            cachalot_set_memory_fraction(0, bad),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
    }
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_get_memory_fraction(0, &mut f) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!(f, 0.5);

    // over the fraction: out of memory with the report
    let ooms = stats().num_ooms;
    let mut p = null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_alloc(total / 10 * 6, 0, null_mut(), &mut p) };
    assert!(
        rc == CACHALOT_ERR_OUT_OF_MEMORY || rc == CACHALOT_ERR_NEVER_FITS,
        "{rc}"
    );
    let msg = last_error();
    assert!(msg.contains("Tried to allocate"), "{msg}");
    assert!(p.is_null());
    assert_eq!(stats().num_ooms, ooms + 1);
    // under it: fine
    let q = alloc(total / 10 * 4, null_mut());
    assert_eq!(cachalot_raw_delete(q, 0), CACHALOT_OK);
    assert_eq!(cachalot_set_memory_fraction(0, 1.0), CACHALOT_OK);
    // absurd size
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_alloc(usize::MAX, 0, null_mut(), &mut p) };
    assert_eq!(rc, CACHALOT_ERR_NEVER_FITS, "{}", last_error());

    // cacheInfo: from the device's free bytes when 0, else the largest
    // cached block when larger than the guess
    let mut largest = 0usize;
    // SAFETY: valid pointer.
    assert_eq!(unsafe { cachalot_cache_info(0, &mut largest) }, CACHALOT_OK);
    assert!(largest > 0);
    assert_eq!(cachalot_empty_cache(0), CACHALOT_OK);
    let a = alloc(30 << 20, null_mut());
    assert_eq!(cachalot_raw_delete(a, 0), CACHALOT_OK);
    let mut largest = 1usize;
    // SAFETY: valid pointer.
    assert_eq!(unsafe { cachalot_cache_info(0, &mut largest) }, CACHALOT_OK);
    // the 30 MiB block, with the rest of the pages its mapping made (the
    // default maps pages in runs of two)
    assert!((30 << 20..=32 << 20).contains(&largest), "{largest}");
    // SAFETY: NULL on purpose.
    let rc = unsafe { cachalot_cache_info(0, null_mut()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);

    // reset accumulated
    assert!(stats().allocation[0].allocated > 0);
    assert_eq!(cachalot_reset_accumulated_stats(0), CACHALOT_OK);
    assert_eq!(stats().allocation[0].allocated, 0);
    assert_eq!(cachalot_reset_accumulated_stats(-1), CACHALOT_OK);
    assert_eq!(
        cachalot_reset_accumulated_stats(5),
        CACHALOT_ERR_INVALID_ARGUMENT
    );
}

#[test]
fn mempool_uses_allocations_and_release() {
    let _g = setup();
    let (hi, lo) = (0, 9001);
    assert_eq!(use_count(hi, lo), 0);
    assert_eq!(cachalot_pool_create_or_incref(0, hi, lo), CACHALOT_OK);
    assert_eq!(use_count(hi, lo), 1);
    // an allocation in the pool lands in a segment of the pool
    let mut p = null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_alloc_in_pool(4 << 20, 0, null_mut(), hi, lo, &mut p) };
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
    assert_eq!(use_count(hi, lo), 1, "the allocation leaves the uses alone");
    {
        let snap = Snap::take(hi, lo, false);
        let segs = snap.segments();
        assert_eq!(segs.len(), 1);
        assert_eq!((segs[0].pool_hi, segs[0].pool_lo), (hi, lo));
        let b = &snap.blocks()[segs[0].first_block as usize];
        assert_eq!(b.address, p.addr() as u64);
        assert_eq!(b.state, 0);
    }
    // an ordinary allocation does not go to the pool
    let q = alloc(4 << 20, null_mut());
    {
        let snap = Snap::take(hi, lo, false);
        assert!(snap.segments().iter().all(|s| s.address != q.addr() as u64));
        let all = Snap::take(0, 0, false);
        assert!(all.segments().len() >= 2);
    }
    // checkPoolLiveAllocations
    let mut ok = -1;
    let live = [p.cast_const()];
    // SAFETY: `live` holds one pointer; valid out-pointer.
    unsafe {
        assert_eq!(
            cachalot_pool_check_live(0, hi, lo, live.as_ptr(), 1, &mut ok),
            CACHALOT_OK
        );
        assert_eq!(ok, 1);
        assert_eq!(
            cachalot_pool_check_live(0, hi, lo, null(), 0, &mut ok),
            CACHALOT_OK
        );
        assert_eq!(ok, 0, "one live block, none expected");
        let wrong = [q.cast_const()];
        assert_eq!(
            cachalot_pool_check_live(0, hi, lo, wrong.as_ptr(), 1, &mut ok),
            CACHALOT_OK
        );
        assert_eq!(ok, 0);
        assert_eq!(
            cachalot_pool_check_live(0, 0, 777, null(), 0, &mut ok),
            CACHALOT_ERR_CAPTURE
        );
        assert_eq!(
            cachalot_pool_check_live(0, hi, lo, null(), 3, &mut ok),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_pool_check_live(0, hi, lo, null(), usize::MAX, &mut ok),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
    }

    // release: no use left; the segment stays while its block is live,
    // and returns to the device at the next empty_cache once it is freed
    // (PyTorch: `graph_pools_freeable`)
    assert_eq!(cachalot_pool_release(0, hi, lo), CACHALOT_OK);
    assert_eq!(use_count(hi, lo), 0);
    assert_eq!(cachalot_empty_cache(0), CACHALOT_OK);
    let seg_size = {
        let snap = Snap::take(hi, lo, false);
        assert_eq!(snap.segments().len(), 1);
        snap.segments()[0].total_size as i64
    };
    let reserved = stats().reserved_bytes[0].current;
    assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_OK);
    assert_eq!(cachalot_empty_cache(0), CACHALOT_OK);
    assert_eq!(Snap::take(hi, lo, false).segments().len(), 0);
    assert_eq!(stats().reserved_bytes[0].current, reserved - seg_size);
    assert_eq!(cachalot_raw_delete(q, 0), CACHALOT_OK);

    // bad pool ids and misuse
    assert_eq!(cachalot_pool_release(0, hi, lo), CACHALOT_ERR_CAPTURE);
    assert_eq!(cachalot_pool_release(0, 0, 4242), CACHALOT_ERR_CAPTURE);
    assert!(last_error().contains("mempool"));
    assert_eq!(cachalot_pool_release(0, 0, 0), CACHALOT_ERR_CAPTURE);
    assert_eq!(
        cachalot_pool_create_or_incref(0, 0, 0),
        CACHALOT_ERR_CAPTURE
    );
    assert_eq!(
        cachalot_pool_create_or_incref(9, 0, 1),
        CACHALOT_ERR_INVALID_ARGUMENT
    );
    // SAFETY: valid out-pointer / NULL on purpose.
    unsafe {
        assert_eq!(
            cachalot_alloc_in_pool(16, 0, null_mut(), 0, 31337, &mut p),
            CACHALOT_ERR_CAPTURE,
            "no use"
        );
        assert_eq!(
            cachalot_alloc_in_pool(16, 0, null_mut(), 0, 0, &mut p),
            CACHALOT_ERR_CAPTURE,
            "default pool"
        );
        assert_eq!(
            cachalot_alloc_in_pool(16, 0, null_mut(), 0, 1, null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_pool_use_count(0, 0, 1, null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
    }
    // two uses: one release keeps the pool
    assert_eq!(cachalot_pool_create_or_incref(0, 0, 9002), CACHALOT_OK);
    assert_eq!(cachalot_pool_create_or_incref(0, 0, 9002), CACHALOT_OK);
    assert_eq!(use_count(0, 9002), 2);
    assert_eq!(cachalot_pool_release(0, 0, 9002), CACHALOT_OK);
    assert_eq!(use_count(0, 9002), 1);
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_alloc_in_pool(512, 0, null_mut(), 0, 9002, &mut p) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_OK);
    assert_eq!(cachalot_pool_release(0, 0, 9002), CACHALOT_OK);
    assert_eq!(cachalot_pool_release(0, 0, 9002), CACHALOT_ERR_CAPTURE);
}

#[test]
fn capture_pool_routes_the_capturing_stream() {
    let _g = setup();
    let s = new_stream();
    let mock = cachalot::allocator(Some(0)).unwrap();
    let backend = mock.as_mock().unwrap().backend();
    let ms = cachalot::mock::MockStream(s.addr() as u32);
    let (hi, lo) = (0, 7001);

    assert_eq!(cachalot_pool_begin(0, hi, lo, s.cast()), CACHALOT_OK);
    assert_eq!(use_count(hi, lo), 1);
    // a second begin of the same pool while recording: error
    assert_eq!(
        cachalot_pool_begin(0, hi, lo, s.cast()),
        CACHALOT_ERR_CAPTURE
    );
    assert!(last_error().contains("already recording"));
    // a use_mem_pool allocation into a recording pool: error
    let mut p = null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_alloc_in_pool(64, 0, null_mut(), hi, lo, &mut p) };
    assert_eq!(rc, CACHALOT_ERR_CAPTURE);

    backend.begin_capture(ms).unwrap();
    let a = alloc(1 << 20, s);
    backend.end_capture(ms).unwrap();
    assert_eq!(cachalot_pool_end(0, hi, lo), CACHALOT_OK);
    assert_eq!(
        cachalot_pool_end(0, hi, lo),
        CACHALOT_ERR_CAPTURE,
        "not recording"
    );
    // the captured allocation is in the pool; one on the same stream
    // outside the capture is not
    let b = alloc(1 << 20, s);
    {
        let snap = Snap::take(hi, lo, false);
        let addrs: Vec<u64> = snap.blocks().iter().map(|b| b.address).collect();
        assert!(addrs.contains(&(a.addr() as u64)));
        assert!(!addrs.contains(&(b.addr() as u64)));
    }
    // the graph's pool survives frees until released
    assert_eq!(cachalot_raw_delete(a, 0), CACHALOT_OK);
    assert_eq!(Snap::take(hi, lo, false).segments().len(), 1);
    assert_eq!(cachalot_pool_release(0, hi, lo), CACHALOT_OK);
    assert_eq!(Snap::take(hi, lo, false).segments().len(), 0);
    assert_eq!(cachalot_raw_delete(b, 0), CACHALOT_OK);
    // bad ids
    assert_eq!(cachalot_pool_begin(0, 0, 0, s.cast()), CACHALOT_ERR_CAPTURE);
    assert_eq!(
        cachalot_pool_begin(0, 0, 7002, std::ptr::without_provenance_mut(555)),
        CACHALOT_ERR_INVALID_ARGUMENT,
        "unknown stream"
    );
    assert_eq!(use_count(0, 7002), 0, "a failed begin takes no use");
}

#[test]
fn history_and_snapshot() {
    let _g = setup();
    // SAFETY: out-pointers valid / NULL on purpose.
    unsafe {
        assert_eq!(
            cachalot_snapshot(0, 0, 0, 1, null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_history_enabled(0, null_mut()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        cachalot_snapshot_free(null_mut());
    }
    // PyTorch's default max_entries (sys.maxsize) is clamped, not refused
    assert_eq!(cachalot_record_history(0, 1, u64::MAX, 0), CACHALOT_OK);
    assert_eq!(
        cachalot_record_history(-1, 1, 9, 0),
        CACHALOT_ERR_INVALID_ARGUMENT
    );
    assert_eq!(cachalot_record_history(0, 1, 1000, 1), CACHALOT_OK);
    let mut on = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cachalot_history_enabled(0, &mut on) }, CACHALOT_OK);
    assert_eq!(on, 1);
    let p = alloc(3000, null_mut());
    let q = alloc(5 << 20, null_mut());
    assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_OK);
    {
        let snap = Snap::take(0, 0, true);
        let actions: Vec<i32> = snap.traces().iter().map(|t| t.action).collect();
        // segment_map (the default, expandable segments; segment_alloc
        // with fixed ones), alloc, segment_map, alloc, free_requested,
        // free_completed; the snapshot's own entry comes after its copy
        assert!(actions.contains(&5), "{actions:?}");
        let alloc_at = snap
            .traces()
            .iter()
            .position(|t| t.action == 0 && t.addr == p.addr() as u64)
            .expect("the alloc entry");
        // PyTorch's sizes: the request's, not the block's (3072)
        assert_eq!(snap.traces()[alloc_at].size, 3000);
        assert!(actions.contains(&1) && actions.contains(&2), "{actions:?}");
        assert_eq!(*actions.last().unwrap(), 2, "{actions:?}");
        assert!(!actions.contains(&7), "{actions:?}");
        // blocks tile their segments in address order
        for s in snap.segments() {
            let blocks =
                &snap.blocks()[s.first_block as usize..(s.first_block + s.num_blocks) as usize];
            let mut at = s.address;
            for b in blocks {
                assert_eq!(b.address, at);
                at += b.size;
            }
            assert_eq!(at, s.address + s.total_size);
            assert_eq!(
                s.allocated_size,
                blocks
                    .iter()
                    .filter(|b| b.state == 0)
                    .map(|b| b.size)
                    .sum::<u64>()
            );
        }
        let small = snap.segments().iter().find(|s| s.is_small == 1).unwrap();
        assert_eq!(small.total_size, 2 << 20);
        // the config travels with it
        let g = snap.get();
        assert_eq!(g.max_split_size, u64::MAX);
        // SAFETY: a NUL-terminated string owned by the snapshot.
        let _ = unsafe { CStr::from_ptr(g.last_config) };
        // no traces when not asked for
        assert_eq!(Snap::take(0, 0, false).traces().len(), 0);
    }
    assert_eq!(cachalot_raw_delete(q, 0), CACHALOT_OK);
    assert_eq!(cachalot_record_history(0, 0, 0, 0), CACHALOT_OK);
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cachalot_history_enabled(0, &mut on) }, CACHALOT_OK);
    assert_eq!(on, 0);
    let snap = Snap::take(0, 0, true);
    assert!(snap.traces().is_empty(), "off clears the history");
}
