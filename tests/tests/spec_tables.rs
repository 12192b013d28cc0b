//! The [verified 2.11] tables of the spec (shared/spec/pytorch-allocator.md),
//! run on the mock with the invariant checker after every operation.

use cachalot_conformance::mock::{Dev, FIXED, GIB, MIB};
use cachalot_core::{Error, StatType};

#[test]
fn rounding_and_segment_table() {
    // request, allocated_bytes, small pool?, new segment, inactive_split bytes after
    let rows: &[(u64, u64, bool, u64, u64)] = &[
        (1, 512, true, 2 * MIB, 2096640),
        (511, 512, true, 2 * MIB, 2096640),
        (512, 512, true, 2 * MIB, 2096640),
        (513, 1024, true, 2 * MIB, 2096128),
        (1000, 1024, true, 2 * MIB, 2096128),
        (MIB, MIB, true, 2 * MIB, MIB),
        (MIB + 1, 1049088, false, 20 * MIB, 19922432),
        (2 * MIB + 1, 2097664, false, 20 * MIB, 18873856),
        (10 * MIB - 512, 10485248, false, 20 * MIB, 10486272),
        (10 * MIB - 1, 10 * MIB, false, 10 * MIB, 0),
        (10 * MIB, 10 * MIB, false, 10 * MIB, 0),
        (10 * MIB + 1, 10486272, false, 12 * MIB, 2096640),
        (20 * MIB + 1, 20972032, false, 22 * MIB, 2096640),
        (100 * MIB + 1, 104858112, false, 102 * MIB, 2096640),
    ];
    for &(req, alloc_bytes, small, seg, inactive) in rows {
        let d = Dev::new(FIXED);
        let p = d.alloc(req);
        let s = d.a.stats();
        let pool = if small {
            StatType::SmallPool
        } else {
            StatType::LargePool
        };
        assert_eq!(
            s.allocated_bytes.0[pool as usize].current, alloc_bytes as i64,
            "req {req}"
        );
        assert_eq!(
            s.allocated_bytes.all().current,
            alloc_bytes as i64,
            "req {req}"
        );
        assert_eq!(s.segment.0[pool as usize].current, 1, "req {req}");
        assert_eq!(s.reserved_bytes.all().current, seg as i64, "req {req}");
        assert_eq!(s.num_device_alloc, 1);
        assert_eq!(s.requested_bytes.all().current, req as i64);
        assert_eq!(
            s.inactive_split_bytes.all().current,
            inactive as i64,
            "req {req}"
        );
        assert_eq!(
            s.inactive_split.all().current,
            i64::from(inactive > 0),
            "req {req}"
        );
        d.free(p);
    }
}

#[test]
fn best_fit_lowest_address_and_stream_silo() {
    // PyTorch's placement (cachalot's default differs once a stream drains:
    // see `dormant_segments_are_taken_oldest_first`)
    let d = Dev::new("placement:pytorch");
    // four segments: 30, 30, 40, 50 MiB
    let ps: Vec<u64> = [30, 30, 40, 50].iter().map(|&m| d.alloc(m * MIB)).collect();
    for &p in &ps {
        d.free(p);
    }
    let lower30 = ps[0].min(ps[1]);
    let p = d.alloc(25 * MIB);
    assert_eq!(p, lower30, "25 MiB takes the lower-addressed 30 MiB block");
    assert_eq!(d.a.stats().num_device_alloc, 4);
    d.free(p);
    // stream silo: a block cached for stream 0 is never given to another stream
    let s1 = d.stream();
    let q = d.alloc_on(20 * MIB, s1);
    assert_eq!(
        d.a.stats().num_device_alloc,
        5,
        "a new segment for the other stream"
    );
    d.free(q);
}

#[test]
fn split_thresholds() {
    let d = Dev::new(FIXED);
    let a = d.alloc(512);
    let b = d.alloc(512);
    assert_eq!(b - a, 512, "small blocks split at 512 B");
    let c = d.alloc(3 * MIB / 2);
    let e = d.alloc(3 * MIB / 2);
    assert_eq!(
        e - c,
        3 * MIB / 2,
        "1.5 MiB blocks are 1.5 MiB apart in one 20 MiB segment"
    );
    for p in [a, b, c, e] {
        d.free(p);
    }
    // a 19 MiB request reusing a free 20 MiB block is not split (remainder exactly 1 MiB)
    let d = Dev::new(FIXED);
    let big = d.alloc(20 * MIB);
    d.free(big);
    let before = d.a.stats().allocated_bytes.all().current;
    let x = d.alloc(19 * MIB);
    assert_eq!(
        d.a.stats().allocated_bytes.all().current - before,
        20 * MIB as i64
    );
    assert_eq!(d.a.block_size(x), Some(20 * MIB));
    d.free(x);
    // 19 MiB − 512 is split (remainder 1 MiB + 512)
    let y = d.alloc(19 * MIB - 512);
    assert_eq!(d.a.block_size(y), Some(19 * MIB - 512));
    assert_eq!(
        d.a.stats().inactive_split_bytes.all().current,
        (MIB + 512) as i64
    );
    d.free(y);
}

#[test]
fn inactive_split_trace_and_empty_cache() {
    let d = Dev::new(FIXED);
    let s = || d.a.stats();
    let a = d.alloc(2 * MIB);
    assert_eq!(s().inactive_split.all().current, 1);
    assert_eq!(s().inactive_split_bytes.all().current, 18 * MIB as i64);
    let b = d.alloc(2 * MIB);
    assert_eq!(s().inactive_split_bytes.all().current, 16 * MIB as i64);
    d.free(a);
    assert_eq!(s().inactive_split.all().current, 2);
    assert_eq!(s().inactive_split_bytes.all().current, 18 * MIB as i64);
    d.free(b);
    assert_eq!(s().inactive_split.all().current, 0);
    assert_eq!(s().inactive_split_bytes.all().current, 0);
    let before = s();
    d.a.empty_cache().unwrap();
    d.check();
    let after = s();
    assert_eq!(
        before.reserved_bytes.all().current - after.reserved_bytes.all().current,
        20 * MIB as i64
    );
    assert_eq!(after.segment.all().current, 0);
    assert_eq!(after.num_device_free, 1);
    assert_eq!(after.num_sync_all_streams, before.num_sync_all_streams + 1);
    assert!(d.m.live_segments().is_empty());
}

#[test]
fn coalescing_and_empty_cache_keeps_split_segments() {
    let d = Dev::new(FIXED);
    let a = d.alloc(4 * MIB);
    let b = d.alloc(4 * MIB);
    let c = d.alloc(4 * MIB);
    d.free(b);
    d.free(a); // a merges with b
    let x = d.alloc(8 * MIB);
    assert_eq!(x, a, "a and b coalesced into one 8 MiB block at a");
    d.free(x);
    d.a.empty_cache().unwrap();
    d.check();
    assert_eq!(
        d.a.stats().segment.all().current,
        1,
        "segment with a live block is kept"
    );
    d.free(c);
    d.a.empty_cache().unwrap();
    assert_eq!(d.a.stats().segment.all().current, 0);
}

#[test]
fn oversize_blocks() {
    let d = Dev::new("max_split_size_mb:100,expandable_segments:False");
    assert_eq!(d.a.stats().max_split_size, 100 * MIB as i64);
    let p = d.alloc(150 * MIB);
    assert_eq!(d.a.stats().oversize_allocations.current, 1);
    assert_eq!(d.a.stats().oversize_segments.current, 1);
    d.free(p);
    assert_eq!(d.a.stats().oversize_allocations.current, 0);
    // not used for 120 MiB (150 ≥ 120 + 20) nor 30 MiB
    let q = d.alloc(120 * MIB);
    assert_ne!(q, p);
    let r = d.alloc(30 * MIB);
    assert_ne!(r, p);
    d.free(q);
    d.free(r);
    // used whole for 140 MiB
    let before = d.a.stats();
    let x = d.alloc(140 * MIB);
    assert_eq!(x, p);
    let after = d.a.stats();
    assert_eq!(
        after.allocated_bytes.all().current - before.allocated_bytes.all().current,
        150 * MIB as i64
    );
    assert_eq!(
        after.requested_bytes.all().current - before.requested_bytes.all().current,
        140 * MIB as i64
    );
    d.free(x);
}

#[test]
fn release_available_cached_blocks_largest_first() {
    // cached 150 + 120 MiB, 200 MiB request over the cap: both released, no retry
    let d = Dev::with_capacity("max_split_size_mb:100,expandable_segments:False", 400 * MIB);
    let a = d.alloc(150 * MIB);
    let b = d.alloc(120 * MIB);
    d.free(a);
    d.free(b);
    let x = d.alloc(200 * MIB);
    let s = d.a.stats();
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.num_device_free, 2);
    d.free(x);
    // cached 150 + 300 MiB: only the 300 MiB block is released
    let d = Dev::with_capacity("max_split_size_mb:100,expandable_segments:False", 600 * MIB);
    let a = d.alloc(150 * MIB);
    let b = d.alloc(300 * MIB);
    d.free(a);
    d.free(b);
    let x = d.alloc(200 * MIB);
    let s = d.a.stats();
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.reserved_bytes.all().current, (150 + 200) * MIB as i64);
    d.free(x);
    // cached 150 + 120 + 110 MiB: largest first, and only until the target
    // is reached: 150 + 120 go, the 110 MiB block stays cached
    let d = Dev::with_capacity("max_split_size_mb:100,expandable_segments:False", 450 * MIB);
    let ps: Vec<u64> = [150, 120, 110].iter().map(|&m| d.alloc(m * MIB)).collect();
    for &p in &ps {
        d.free(p);
    }
    let x = d.alloc(200 * MIB);
    let s = d.a.stats();
    assert_eq!(s.num_device_free, 2);
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.reserved_bytes.all().current, (110 + 200) * MIB as i64);
    assert!(d.m.live_segments().iter().any(|seg| seg.0 == ps[2]));
    d.free(x);
}

#[test]
fn fraction_capped_oom_counts_retry_ooms_and_syncs() {
    let d = Dev::with_capacity(FIXED, 8 * GIB);
    d.a.set_memory_fraction(0.5).unwrap();
    let a = d.alloc(3 * GIB);
    let e = d.a.allocate(2 * GIB, d.s0()).unwrap_err();
    d.check();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("Tried to allocate 2.00 GiB"), "{msg}");
    assert!(msg.contains("4.00 GiB allowed"), "{msg}");
    let s = d.a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (1, 1, 1)
    );
    // a request above the cap can never fit
    let e = d.a.allocate(5 * GIB, d.s0()).unwrap_err();
    assert!(matches!(e, Error::NeverFits { .. }), "{e}");
    d.free(a);
}

#[test]
fn fraction_cap_admits_a_segment_that_reaches_it_exactly() {
    // spec 2.8 step 5: fail only when reserved + segment > allowed maximum
    let d = Dev::with_capacity(FIXED, 8 * GIB);
    d.a.set_memory_fraction(0.5).unwrap();
    let a = d.alloc(3 * GIB);
    let b = d.alloc(GIB); // reserved becomes exactly the 4 GiB allowed
    let s = d.a.stats();
    assert_eq!(s.reserved_bytes.all().current, 4 * GIB as i64);
    assert_eq!((s.num_alloc_retries, s.num_ooms), (0, 0));
    let e = d.a.allocate(2 * MIB, d.s0()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    d.free(a);
    d.free(b);
}

#[test]
fn oom_message_shows_segment_size() {
    let d = Dev::with_capacity(FIXED, 64 * MIB);
    let a = d.alloc(60 * MIB);
    let e = d.a.allocate(3 * MIB, d.s0()).unwrap_err();
    assert!(e.to_string().contains("Tried to allocate 20.00 MiB"), "{e}");
    let e = d.a.allocate(15 * MIB, d.s0()).unwrap_err();
    assert!(e.to_string().contains("Tried to allocate 16.00 MiB"), "{e}");
    match e {
        Error::OutOfMemory(r) => {
            assert_eq!(r.segment_size, 16 * MIB);
            assert!(!r.fits_after_empty_cache);
        }
        other => panic!("expected OOM, got {other}"),
    }
    d.free(a);
    d.check();
}

#[test]
fn oom_observers_run_before_the_error_returns() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let d = Dev::with_capacity(FIXED, 64 * MIB);
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    d.a.add_oom_observer(Arc::new(move |r| {
        s2.store(r.segment_size, Ordering::SeqCst);
    }));
    assert!(d.a.allocate(100 * MIB, d.s0()).is_err());
    assert_eq!(seen.load(Ordering::SeqCst), 100 * MIB);
}

#[test]
fn garbage_collection_frees_blocks_at_or_above_mean_age() {
    // allowed 400 MiB, threshold 0.5, four cached 60 MiB blocks, then a 70 MiB miss
    let d = Dev::with_capacity(
        "garbage_collection_threshold:0.5,expandable_segments:False",
        800 * MIB,
    );
    d.a.set_memory_fraction(0.5).unwrap();
    let ps: Vec<u64> = (0..4).map(|_| d.alloc(60 * MIB)).collect();
    for p in ps {
        d.free(p);
    }
    let syncs = d.a.stats().num_sync_all_streams;
    let x = d.alloc(70 * MIB);
    let s = d.a.stats();
    assert_eq!(s.num_device_free, 4, "all four released");
    assert_eq!(s.num_sync_all_streams, syncs, "no event synchronization");
    assert_eq!(s.reserved_bytes.all().current, 70 * MIB as i64);
    d.free(x);
    // without a memory fraction the threshold has no effect
    let d = Dev::with_capacity(
        "garbage_collection_threshold:0.5,expandable_segments:False",
        800 * MIB,
    );
    let ps: Vec<u64> = (0..4).map(|_| d.alloc(60 * MIB)).collect();
    for p in ps {
        d.free(p);
    }
    let x = d.alloc(70 * MIB);
    assert_eq!(d.a.stats().num_device_free, 0);
    d.free(x);
}

#[test]
fn record_stream_defers_reuse_until_the_stream_completes() {
    let d = Dev::manual(FIXED);
    let side = d.stream();
    let p = d.alloc(4 * MIB);
    d.a.record_stream(p, side).unwrap();
    d.check();
    d.m.launch(side).unwrap(); // the side stream is busy
    let before = d.a.stats();
    d.free(p);
    let s = d.a.stats();
    assert_eq!(
        s.allocation.all().current,
        before.allocation.all().current - 1
    );
    assert_eq!(
        s.allocated_bytes.all().current,
        before.allocated_bytes.all().current - 4 * MIB as i64
    );
    assert_eq!(
        s.active.all().current,
        before.active.all().current,
        "still active"
    );
    // an equal allocation meanwhile gets a different block
    let q = d.alloc(4 * MIB);
    assert_ne!(q, p);
    d.free(q);
    // after the side stream finishes, the next malloc frees the pending block
    d.m.complete(side).unwrap();
    let r = d.alloc(4 * MIB);
    let s = d.a.stats();
    assert_eq!(s.active.all().current, 1);
    assert_eq!(r, p, "the pending block is free again and is the best fit");
    d.free(r);
}

#[test]
fn events_are_pooled_not_created_per_free() {
    let d = Dev::new(FIXED);
    let side = d.stream();
    for _ in 0..100 {
        let p = d.alloc(MIB);
        d.a.record_stream(p, side).unwrap();
        d.free(p);
    }
    assert!(d.m.counters().create_event <= 2, "{:?}", d.m.counters());
    assert!(d.m.counters().record_event >= 100);
}

#[test]
fn bad_input_is_a_typed_error() {
    let d = Dev::new(FIXED);
    assert_eq!(
        d.a.allocate(0, d.s0()).unwrap(),
        0,
        "size 0 is a null allocation"
    );
    assert_eq!(d.a.stats().allocation.all().allocated, 0);
    d.a.free(0).unwrap();
    match d.a.allocate(1 << 60, d.s0()) {
        Err(Error::NeverFits { reason, .. }) => assert!(reason.contains("1EB")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        d.a.free(0xdead_0000),
        Err(Error::UnknownPointer(0xdead_0000))
    ));
    let p = d.alloc(1000);
    d.free(p);
    assert!(matches!(d.a.free(p), Err(Error::DoubleFree(_))));
    assert!(matches!(
        d.a.record_stream(p, d.s0()),
        Err(Error::NotLive(_))
    ));
    assert!(matches!(
        d.a.record_stream(0x1234_5600, d.s0()),
        Err(Error::UnknownPointer(_))
    ));
    assert!(
        matches!(d.a.set_config("max_split_size_mb:5"), Err(Error::Config(e)) if e.key == "max_split_size_mb")
    );
    assert!(matches!(
        d.a.set_memory_fraction(1.5),
        Err(Error::InvalidArgument(_))
    ));
    d.check();
    // the error messages are clear
    assert!(
        Error::UnknownPointer(0x10)
            .to_string()
            .contains("invalid device pointer")
    );
}

#[test]
fn reset_semantics_and_flat_keys() {
    let d = Dev::new(FIXED);
    let a = d.alloc(100);
    d.free(a);
    d.a.empty_cache().unwrap();
    let m = d.a.memory_stats();
    assert_eq!(m.len(), 122);
    assert!(m["reserved_bytes.all.peak"] > 0);
    d.a.reset_peak_stats();
    let m = d.a.memory_stats();
    assert_eq!(m["reserved_bytes.all.peak"], 0);
    assert_eq!(m["num_device_alloc"], 1);
    d.a.reset_accumulated_stats();
    let b = d.alloc(1024);
    let m = d.a.memory_stats();
    assert_eq!(m["active_bytes.all.current"], 1024);
    assert_eq!(m["active_bytes.all.freed"], 0);
    assert_eq!(m["num_device_alloc"], 1);
    d.free(b);
    d.a.empty_cache().unwrap();
    let m = d.a.memory_stats();
    assert_eq!(m["active_bytes.all.freed"], 1024);
    assert_eq!(m["num_device_free"], 1);
    assert_eq!(m["max_split_size"], -1);
}

#[test]
fn runtime_reconfiguration() {
    let d = Dev::new("max_split_size_mb:100,expandable_segments:False");
    d.a.set_config("roundup_power2_divisions:4").unwrap();
    let c = d.a.config();
    assert_eq!(c.max_split_size, u64::MAX, "re-parse resets max_split_size");
    let p = d.alloc(1200000);
    assert_eq!(d.a.block_size(p), Some(1310720));
    d.free(p);
    assert!(d.a.set_config("bogus:1").is_err());
    assert_eq!(
        d.a.config().roundup_power2_divisions[0],
        4,
        "failed parse changes nothing"
    );
}

#[test]
fn retry_searches_free_blocks_after_sync_fixing_189504() {
    // A pending block becomes free during the last-resort sync: it must be used
    // instead of failing (PyTorch #189504 retried only the device allocation).
    let d = Dev::manual_with_capacity(FIXED, 20 * MIB);
    let side = d.stream();
    let a = d.alloc(4 * MIB);
    let b = d.alloc(16 * MIB); // takes the rest of the 20 MiB segment
    d.a.record_stream(a, side).unwrap();
    d.m.launch(side).unwrap();
    d.free(a);
    // no room for a new segment; the pending block is the only candidate
    let c =
        d.a.allocate(4 * MIB, d.s0())
            .expect("found after syncing events");
    assert_eq!(c, a);
    assert_eq!(d.a.stats().num_alloc_retries, 1);
    d.check();
    d.free(c);
    d.free(b);
}

#[test]
fn dropping_the_allocator_returns_every_segment() {
    let d = Dev::new(FIXED);
    let side = d.stream();
    let p = d.alloc(3 * MIB);
    let _q = d.alloc(300);
    d.a.record_stream(p, side).unwrap();
    d.free(p);
    let m = d.m.clone();
    drop(d);
    assert!(m.live_segments().is_empty());
    assert_eq!(m.live_events(), 0);
}

#[test]
fn small_blocks_split_at_a_512_byte_remainder() {
    // small pool: a remainder of exactly kMinBlockSize (512 B) is split off
    // (spec 2.6: remainder >= 512), so the next 512 B request fits in it
    let d = Dev::new(FIXED);
    let a = d.alloc(MIB); // 2 MiB segment: 1 MiB out, 1 MiB free
    let b = d.alloc(MIB - 512); // the free 1 MiB: 512 B left over
    assert_eq!(d.a.block_size(b), Some(MIB - 512), "split, not taken whole");
    assert_eq!(d.a.stats().inactive_split_bytes.all().current, 512);
    let c = d.alloc(512);
    assert_eq!(
        c,
        b + MIB - 512,
        "the 512 B remainder serves a 512 B request"
    );
    assert_eq!(d.a.stats().num_device_alloc, 1, "no new segment");
    assert_eq!(d.a.stats().inactive_split.all().current, 0);
    for p in [a, b, c] {
        d.free(p);
    }
}

#[test]
fn garbage_collection_frees_the_old_and_keeps_the_young() {
    // allowed 400 MiB, threshold 0.5 (200 MiB). A 60 MiB block is freed
    // first; ten searches of the large pool (each takes the free 30 MiB
    // block, which comes back young) age it; then another 60 MiB block is
    // freed. A 70 MiB miss finds 250 MiB reserved (target 50 MiB); the
    // mean age is (11 + 1 + 1) / 3 = 4, so only the old block (age 11) is
    // released, which meets the target: the young ones stay cached.
    let d = Dev::with_capacity(
        "garbage_collection_threshold:0.5,expandable_segments:False",
        800 * MIB,
    );
    d.a.set_memory_fraction(0.5).unwrap();
    let old = d.alloc(60 * MIB);
    let young = d.alloc(60 * MIB);
    let x = d.alloc(30 * MIB);
    let live = d.alloc(100 * MIB); // keeps the stream from draining
    d.free(old);
    d.free(x);
    for _ in 0..10 {
        let p = d.alloc(30 * MIB);
        assert_eq!(p, x, "the 30 MiB block is the best fit");
        d.free(p);
    }
    d.free(young);
    let s = d.a.stats();
    assert_eq!(s.reserved_bytes.all().current, 250 * MIB as i64);
    let syncs = s.num_sync_all_streams;
    let y = d.alloc(70 * MIB);
    let s = d.a.stats();
    assert_eq!(s.num_device_free, 1, "only the oldest block is released");
    assert_eq!(s.num_sync_all_streams, syncs);
    assert_eq!(s.reserved_bytes.all().current, (250 - 60 + 70) * MIB as i64);
    assert!(
        d.m.live_segments().iter().all(|seg| seg.0 != old),
        "the old segment went back to the device"
    );
    // the young blocks are still cached: served without a device call
    let devs = s.num_device_alloc;
    let p = d.alloc(60 * MIB);
    assert_eq!(p, young);
    let q = d.alloc(30 * MIB);
    assert_eq!(q, x);
    assert_eq!(d.a.stats().num_device_alloc, devs);
    for p in [p, q, y, live] {
        d.free(p);
    }
}

#[test]
fn release_available_below_target_releases_nothing_and_the_ladder_continues() {
    // max_split_size 100 MiB, 300 MiB device. Cached: 120 MiB (oversize)
    // and 90 MiB (not oversize). A 200 MiB request misses and cannot get
    // a segment (210 + 200 > 300). release_available_cached_blocks: no
    // cached block >= 200 MiB, and the oversize blocks below the target
    // total 120 MiB < 200 MiB: it releases nothing and fails, so no second
    // device call follows it; the last rung (sync, release all, retry)
    // then releases both and succeeds.
    let d = Dev::with_capacity("max_split_size_mb:100,expandable_segments:False", 300 * MIB);
    let a = d.alloc(120 * MIB);
    let b = d.alloc(90 * MIB);
    d.free(a);
    d.free(b);
    d.m.reset_counters();
    let syncs = d.a.stats().num_sync_all_streams;
    let x = d.alloc(200 * MIB);
    let s = d.a.stats();
    let c = d.m.counters();
    assert_eq!(s.num_alloc_retries, 1, "the ladder reached its last rung");
    assert_eq!(s.num_sync_all_streams, syncs + 1);
    assert_eq!(s.num_device_free, 2, "both released by release-all");
    assert_eq!(
        (c.malloc, c.malloc_failed),
        (2, 1),
        "one failed device call before release-all, none after release_available"
    );
    assert_eq!(s.reserved_bytes.all().current, 200 * MIB as i64);
    d.free(x);
}

#[test]
fn oversize_stats_count_from_max_split_size_inclusive() {
    // spec 3.2: oversize_segments counts segments >= max_split_size,
    // oversize_allocations handed-out blocks >= max_split_size
    let d = Dev::new("max_split_size_mb:100,expandable_segments:False");
    let below = d.alloc(98 * MIB); // a 98 MiB segment, handed out whole
    assert_eq!(d.a.block_size(below), Some(98 * MIB));
    let s = d.a.stats();
    assert_eq!(s.oversize_segments.current, 0);
    assert_eq!(s.oversize_allocations.current, 0);
    let at = d.alloc(100 * MIB); // exactly max_split_size
    assert_eq!(d.a.block_size(at), Some(100 * MIB));
    let s = d.a.stats();
    assert_eq!(
        s.oversize_segments.current, 1,
        "a 100 MiB segment is oversize"
    );
    assert_eq!(
        s.oversize_allocations.current, 1,
        "a 100 MiB block is oversize"
    );
    d.free(at);
    let s = d.a.stats();
    assert_eq!(s.oversize_allocations.current, 0);
    assert_eq!(s.oversize_segments.current, 1, "still cached");
    d.a.empty_cache().unwrap();
    assert_eq!(d.a.stats().oversize_segments.current, 0);
    d.free(below);
}

#[test]
fn oversize_fit_boundaries() {
    // spec 2.5, max_split_size 100 MiB, max_non_split_rounding 20 MiB; a
    // live block keeps the stream from draining its pool (so the search is
    // the best fit over active blocks, not the dormant list)
    let d = Dev::new("max_split_size_mb:100,expandable_segments:False");
    let hold = d.alloc(MIB + 1);
    let p = d.alloc(150 * MIB);
    d.free(p);
    // 150 MiB = 130 MiB + 20 MiB: not taken (block >= request + rounding)
    let q = d.alloc(130 * MIB);
    assert_ne!(q, p, "a block exactly 20 MiB larger is not taken");
    d.free(q);
    // a request one 512 B class larger: 150 MiB < 130 MiB + 512 + 20 MiB
    let devs = d.a.stats().num_device_alloc;
    let r = d.alloc(130 * MIB + 512);
    assert_eq!(r, p, "a block less than 20 MiB larger is taken");
    assert_eq!(d.a.block_size(r), Some(150 * MIB), "whole, not split");
    assert_eq!(d.a.stats().num_device_alloc, devs);
    d.free(r);
    d.free(hold);
    // free blocks of 100 MiB (exactly max_split_size, so oversize) and
    // 110 MiB: a request below max_split_size takes neither; requests of
    // max_split_size take them best fit first, and whole: a request of
    // max_split_size or more is never split (spec 2.6)
    let d = Dev::new("max_split_size_mb:100,expandable_segments:False");
    let hold = d.alloc(MIB + 1);
    let m100 = d.alloc(100 * MIB);
    let m110 = d.alloc(110 * MIB);
    d.free(m100);
    d.free(m110);
    let below = d.alloc(100 * MIB - 512);
    assert!(
        below != m100 && below != m110,
        "a request below max_split_size skips oversize blocks"
    );
    let devs = d.a.stats().num_device_alloc;
    let at = d.alloc(100 * MIB);
    assert_eq!(at, m100, "a request of max_split_size takes the best fit");
    let at2 = d.alloc(100 * MIB);
    assert_eq!(at2, m110, "and a block less than 20 MiB larger");
    assert_eq!(d.a.block_size(at2), Some(110 * MIB), "whole, not split");
    assert_eq!(d.a.stats().num_device_alloc, devs);
    for x in [below, at, at2, hold] {
        d.free(x);
    }
}

/// pytorch-allocator.md §5.1's worked example (`expandable_segments:True`):
/// 512 B → +2 MiB; 3 MiB → +20 MiB; 25 MiB placed right after the 3 MiB
/// block → +20 MiB only; both freed + `empty_cache` → −40 MiB in one unmap
/// call after one stream sync; the small segment stays while its block
/// lives; `segment` never moves; the data stays where it was written.
#[test]
fn expandable_segments_worked_example() {
    use cachalot_mock::MockCall;
    let d = Dev::new("placement:pytorch,expandable_segments:True");
    let s = || d.a.stats();
    let reserved = || s().reserved_bytes.all().current;
    let small = d.alloc(512);
    assert_eq!(reserved(), 2 * MIB as i64);
    assert_eq!(s().num_device_alloc, 1);
    d.m.use_memory(d.s0(), small, 512, 7).unwrap();
    let a = d.alloc(3 * MIB);
    assert_eq!(reserved(), 22 * MIB as i64);
    d.m.use_memory(d.s0(), a, 3 * MIB, 1).unwrap();
    let b = d.alloc(25 * MIB);
    assert_eq!(b, a + 3 * MIB, "placed directly after the 3 MiB block");
    assert_eq!(reserved(), 42 * MIB as i64);
    assert_eq!(s().num_device_alloc, 3, "one per map call");
    assert_eq!(s().segment.all().current, 0);
    assert_eq!(s().inactive_split.all().current, 0);
    d.m.use_memory(d.s0(), b, 25 * MIB, 2).unwrap();
    assert_eq!(d.m.tag_at(a), Some(1));
    assert_eq!(d.m.tag_at(a + 3 * MIB - 1), Some(1));
    assert_eq!(d.m.tag_at(b + 25 * MIB - 1), Some(2));
    assert_eq!(d.m.tag_at(small), Some(7));
    let snap = d.a.snapshot();
    assert!(snap.segments.iter().all(|g| g.is_expandable));
    let mut sizes: Vec<u64> = snap.segments.iter().map(|g| g.total_size).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [2 * MIB, 40 * MIB], "mapped ranges as segments");
    d.free(a);
    d.free(b);
    let before = s();
    let syncs = d.m.call_count(MockCall::SynchronizeEvent);
    let unmaps = d.m.call_count(MockCall::Unmap);
    d.a.empty_cache().unwrap();
    d.check();
    let after = s();
    assert_eq!(
        before.reserved_bytes.all().current - after.reserved_bytes.all().current,
        40 * MIB as i64
    );
    assert_eq!(after.num_device_free, before.num_device_free + 1);
    assert_eq!(d.m.call_count(MockCall::SynchronizeEvent), syncs + 1);
    assert_eq!(d.m.call_count(MockCall::Unmap), unmaps + 2, "two pages");
    assert_eq!(reserved(), 2 * MIB as i64, "the small segment stays");
    assert_eq!(d.m.tag_at(small), Some(7));
    d.free(small);
    d.a.empty_cache().unwrap();
    d.check();
    assert_eq!(reserved(), 0);
    assert_eq!(s().segment.all().current, 0);
    assert_eq!(s().num_device_free, 2);
    d.drop_without_vmm_leaks();
}

/// Pages freed in the middle of an expandable segment are unmapped inward
/// (whole pages only), the allocator can map them again, and dropping the
/// allocator with pages still mapped leaks nothing.
#[test]
fn expandable_segments_unmap_inward_and_drop() {
    let d = Dev::new("placement:pytorch,expandable_segments:True");
    let s = || d.a.stats();
    let reserved = || s().reserved_bytes.all().current;
    let a = d.alloc(30 * MIB); // pages 0-1, 10 MiB free after it
    let b = d.alloc(10 * MIB); // fills page 1
    let c = d.alloc(50 * MIB); // pages 2-4
    assert_eq!((b, c), (a + 30 * MIB, a + 40 * MIB));
    assert_eq!(reserved(), 100 * MIB as i64);
    d.free(b);
    d.a.empty_cache().unwrap();
    d.check();
    assert_eq!(reserved(), 100 * MIB as i64, "no whole free page");
    d.free(a);
    d.a.empty_cache().unwrap();
    d.check();
    assert_eq!(reserved(), 60 * MIB as i64, "pages 0-1 unmapped");
    let a2 = d.alloc(40 * MIB);
    assert_eq!(a2, a, "the unmapped pages are mapped again");
    assert_eq!(reserved(), 100 * MIB as i64);
    d.m.use_memory(d.s0(), a2, 40 * MIB, 3).unwrap();
    assert_eq!(d.m.tag_at(a2 + 40 * MIB - 1), Some(3));
    d.drop_without_vmm_leaks();
}

/// `expandable_segments:True` needs a backend with virtual memory: a typed
/// "not supported" error otherwise, at construction and at run time.
#[test]
fn expandable_segments_need_virtual_memory() {
    use cachalot_core::{AllocatorConfig, CachingAllocator, ConfigErrorKind};
    let m = cachalot_mock::MockConfig::new(GIB)
        .virtual_memory(false)
        .build();
    let conf = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let e = CachingAllocator::with_config(m.clone(), conf).unwrap_err();
    assert!(
        matches!(&e, Error::Config(c) if matches!(c.kind, ConfigErrorKind::Unsupported { .. })),
        "{e}"
    );
    // the default (no key given) is fixed segments there, not an error
    let a = CachingAllocator::with_config(m.clone(), AllocatorConfig::default()).unwrap();
    assert!(!a.config().expandable_segments);
    let e = a.set_config("expandable_segments:True").unwrap_err();
    assert!(matches!(&e, Error::Config(_)), "{e}");
    assert!(!a.config().expandable_segments);
    a.set_config("expandable_segments:False").unwrap();
    a.set_config("max_split_size_mb:100").unwrap();
    assert!(!a.config().expandable_segments);
    let p = a
        .allocate(3 * MIB, cachalot_core::Backend::default_stream(&m))
        .unwrap();
    a.free(p).unwrap();
    assert_eq!(
        m.call_count(cachalot_mock::MockCall::Reserve),
        0,
        "no virtual-memory call"
    );
}

/// The default on a backend with virtual memory is cachalot's expandable
/// mode; `placement:pytorch` alone is PyTorch's default mode (fixed
/// segments), and a given `expandable_segments` is kept whatever the
/// placement, at construction and through `set_config`.
#[test]
fn the_default_is_expandable_where_the_backend_has_virtual_memory() {
    use cachalot_core::config::Placement;
    use cachalot_core::{AllocatorConfig, CachingAllocator};
    let cases: [(&str, bool); 6] = [
        ("", true),
        ("max_split_size_mb:100", true),
        ("placement:pytorch", false),
        ("expandable_segments:False", false),
        ("placement:pytorch,expandable_segments:True", true),
        ("placement:steady,expandable_segments:False", false),
    ];
    for (conf, want) in cases {
        let m = cachalot_mock::MockConfig::new(GIB).build();
        let c = AllocatorConfig::parse(conf).unwrap();
        assert!(
            !c.expandable_segments || c.expandable_segments_given,
            "{conf}"
        );
        let a = CachingAllocator::with_config(m.clone(), c).unwrap();
        assert_eq!(a.config().expandable_segments, want, "{conf}");
        let p = a
            .allocate(3 * MIB, cachalot_core::Backend::default_stream(&m))
            .unwrap();
        assert_eq!(
            m.call_count(cachalot_mock::MockCall::Reserve) > 0,
            want,
            "{conf}: pages mapped"
        );
        a.free(p).unwrap();
        a.empty_cache().unwrap();
    }
    // at run time: the placement decides while the key was never given
    let m = cachalot_mock::MockConfig::new(GIB).build();
    let a = CachingAllocator::with_config(m, AllocatorConfig::default()).unwrap();
    assert!(a.config().expandable_segments);
    a.set_config("placement:pytorch").unwrap();
    assert_eq!(a.config().placement, Placement::PyTorch);
    assert!(!a.config().expandable_segments, "PyTorch's default mode");
    a.set_config("placement:steady").unwrap();
    assert!(a.config().expandable_segments);
    a.set_config("expandable_segments:False").unwrap();
    a.set_config("garbage_collection_threshold:0.5").unwrap();
    assert!(!a.config().expandable_segments, "a given value is kept");
    let mut c = AllocatorConfig::default();
    c.set_expandable_segments(false);
    let m = cachalot_mock::MockConfig::new(GIB).build();
    let a = CachingAllocator::with_config(m, c).unwrap();
    assert!(!a.config().expandable_segments, "set in code");
}

/// `get_free_block` with expandable segments (PyTorch 2.11): a free block
/// just before the unmapped rest of its segment counts as the size it can
/// grow to, so a larger block that cannot grow is the better fit.
#[test]
fn expandable_best_fit_counts_the_room_to_grow() {
    let d = Dev::new("placement:pytorch,expandable_segments:True");
    let x1 = d.alloc(4 * MIB); // page 0 mapped, 16 MiB free after x1
    let x2 = d.alloc(8 * MIB);
    let x3 = d.alloc(4 * MIB); // 4 MiB free left before the unmapped pages
    assert_eq!((x2, x3), (x1 + 4 * MIB, x1 + 12 * MIB));
    d.free(x2); // 8 MiB free between x1 and x3
    let y = d.alloc(4 * MIB);
    assert_eq!(y, x2, "the 8 MiB block, not the 4 MiB one that can grow");
    assert_eq!(d.a.stats().reserved_bytes.all().current, 20 * MIB as i64);
    for p in [x1, x3, y] {
        d.free(p);
    }
}
