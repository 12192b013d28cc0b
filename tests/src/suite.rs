//! The conformance suite: behaviour every backend must show under the
//! engine. Each check panics with a message on failure.

use cachalot_core::{Backend, Error};

use crate::Harness;

const MIB: u64 = 1 << 20;

/// One named check of the suite.
pub type Check<H> = (&'static str, fn(&H));

/// Every check of the suite, by name, for a test binary to run in turn.
pub fn all<H: Harness>() -> Vec<Check<H>> {
    vec![
        ("alloc_free_reuse", alloc_free_reuse::<H>),
        (
            "default_config_reuses_and_returns_everything",
            default_config_reuses_and_returns_everything::<H>,
        ),
        ("data_survives_reuse", data_survives_reuse::<H>),
        (
            "record_stream_defers_reuse",
            record_stream_defers_reuse::<H>,
        ),
        (
            "empty_cache_returns_segments",
            empty_cache_returns_segments::<H>,
        ),
        ("oom_is_typed", oom_is_typed::<H>),
        ("bad_pointers_are_typed", bad_pointers_are_typed::<H>),
        ("events_are_recycled", events_are_recycled::<H>),
        (
            "expandable_data_across_map_and_unmap",
            expandable_data_across_map_and_unmap::<H>,
        ),
        (
            "expandable_pages_move_between_streams",
            expandable_pages_move_between_streams::<H>,
        ),
        (
            "expandable_lends_behind_a_fence",
            expandable_lends_behind_a_fence::<H>,
        ),
        (
            "expandable_ghosts_carry_data",
            expandable_ghosts_carry_data::<H>,
        ),
        (
            "expandable_record_stream_keeps_pages",
            expandable_record_stream_keeps_pages::<H>,
        ),
        (
            "expandable_fraction_oom_releases_and_retries",
            expandable_fraction_oom_releases_and_retries::<H>,
        ),
        (
            "expandable_empty_cache_returns_every_page",
            expandable_empty_cache_returns_every_page::<H>,
        ),
    ]
}

/// The two expandable modes: PyTorch 2.11's and cachalot's (page recycling).
const EXPANDABLE: [&str; 2] = [
    "placement:pytorch,expandable_segments:True",
    "expandable_segments:True",
];

/// An allocator with `config` when the backend has virtual memory; `None`
/// (the check does not apply, and says so) otherwise.
fn expandable<H: Harness>(h: &H, config: &str) -> Option<cachalot_core::CachingAllocator<H::B>> {
    if h.backend().virtual_memory().is_none() {
        println!(
            "conformance[{}]: no virtual memory, expandable checks do not apply",
            h.name()
        );
        return None;
    }
    Some(h.allocator(config))
}

/// Fills `len` bytes at `p` with `v` on `s` and, where the harness reads
/// memory, checks them.
fn fill_and_check<H: Harness>(
    h: &H,
    b: &H::B,
    p: u64,
    len: u64,
    v: u8,
    s: <H::B as Backend>::Stream,
) {
    h.fill(b, p, len, v, s);
    expect_bytes(h, b, p, len, v, format_args!("block {p:#x}"));
}

/// Where the harness reads memory: the `len` bytes at `p` (`what`, in the
/// messages) all equal `v`. A harness that says it reads memory
/// ([`Harness::can_read`]) but returns nothing fails.
fn expect_bytes<H: Harness>(
    h: &H,
    b: &H::B,
    p: u64,
    len: u64,
    v: u8,
    what: std::fmt::Arguments<'_>,
) {
    match h.read(b, p, len) {
        Some(bytes) => {
            assert_eq!(bytes.len() as u64, len, "read of {what}");
            if let Some(at) = bytes.iter().position(|&x| x != v) {
                panic!("{what} corrupted: byte {at} is {}, not {v}", bytes[at]);
            }
        }
        None => assert!(
            !h.can_read(),
            "{} reads memory but returned nothing for {what}",
            h.name()
        ),
    }
}

/// Expandable segments: data written into blocks reads back after other
/// pages of the segment are unmapped (`empty_cache`) and mapped again.
pub fn expandable_data_across_map_and_unmap<H: Harness>(h: &H) {
    for config in EXPANDABLE {
        let Some(a) = expandable(h, config) else {
            return;
        };
        let b = a.backend();
        let s = b.default_stream();
        let keep = a.allocate(3 * MIB, s).expect("alloc");
        fill_and_check(h, b, keep, 3 * MIB, 0x11, s);
        let big = a.allocate(48 * MIB, s).expect("alloc");
        let tail = a.allocate(5 * MIB, s).expect("alloc");
        fill_and_check(h, b, big, 48 * MIB, 0x22, s);
        fill_and_check(h, b, tail, 5 * MIB, 0x33, s);
        a.free(big).expect("free");
        a.empty_cache().expect("empty_cache"); // unmaps big's whole pages
        check(&a);
        expect_bytes(h, b, keep, 3 * MIB, 0x11, format_args!("block {keep:#x}"));
        expect_bytes(h, b, tail, 5 * MIB, 0x33, format_args!("block {tail:#x}"));
        let again = a.allocate(40 * MIB, s).expect("alloc after unmap");
        fill_and_check(h, b, again, 40 * MIB, 0x44, s);
        expect_bytes(h, b, keep, 3 * MIB, 0x11, format_args!("block {keep:#x}"));
        expect_bytes(h, b, tail, 5 * MIB, 0x33, format_args!("block {tail:#x}"));
        for p in [keep, tail, again] {
            a.free(p).expect("free");
        }
        check(&a);
    }
}

/// cachalot's expandable mode: pages freed on one stream serve another
/// stream's larger request through a fresh mapping (no single free block
/// holds it, so none is lent: reserved grows by the difference only), the
/// data written through the new mapping reads back, and a live block of
/// the first stream is untouched.
pub fn expandable_pages_move_between_streams<H: Harness>(h: &H) {
    let Some(a) = expandable(h, "expandable_segments:True") else {
        return;
    };
    let b = a.backend();
    let s0 = b.default_stream();
    let side = h.new_stream(b);
    let s1 = h.handle(&side);
    let live = a.allocate(2 * MIB, s0).expect("alloc");
    fill_and_check(h, b, live, 2 * MIB, 0x55, s0);
    let p = a.allocate(64 * MIB, s0).expect("alloc");
    fill_and_check(h, b, p, 64 * MIB, 0x66, s0);
    a.free(p).expect("free");
    let before = a.stats().reserved_bytes.all().current;
    let q = a.allocate(66 * MIB, s1).expect("alloc on the other stream");
    assert_eq!(
        a.stats().reserved_bytes.all().current,
        before + 2 * MIB as i64,
        "the freed pages served the other stream"
    );
    fill_and_check(h, b, q, 66 * MIB, 0x77, s1);
    expect_bytes(h, b, live, 2 * MIB, 0x55, format_args!("block {live:#x}"));
    a.free(q).expect("free");
    a.free(live).expect("free");
    check(&a);
    drop(side);
}

/// cachalot's expandable mode, ghost mappings: memory that page recycling
/// moves to another stream stays mapped at its old place too (one physical
/// allocation mapped at two addresses, which the driver must accept: no
/// ghost would be left otherwise), and comes back there with no driver
/// call. The data written at each place reads back, the block that stays
/// live is intact throughout, and `empty_cache` unmaps every ghost.
pub fn expandable_ghosts_carry_data<H: Harness>(h: &H) {
    let Some(a) = expandable(h, "expandable_segments:True") else {
        return;
    };
    let b = a.backend();
    let s0 = b.default_stream();
    let side = h.new_stream(b);
    let s1 = h.handle(&side);
    let x = a.allocate(50 * MIB, s0).expect("alloc");
    let live = a.allocate(2 * MIB, s0).expect("alloc");
    let y = a.allocate(50 * MIB, s0).expect("alloc");
    fill_and_check(h, b, x, 50 * MIB, 0x11, s0);
    fill_and_check(h, b, live, 2 * MIB, 0x12, s0);
    a.free(x).expect("free");
    a.free(y).expect("free");
    // more than x or y holds, so neither is lent: their pages move
    let z = a
        .allocate(100 * MIB, s1)
        .expect("alloc on the other stream");
    assert!(a.ghost_mappings() > 0, "the old mappings stay as ghosts");
    fill_and_check(h, b, z, 100 * MIB, 0x22, s1);
    a.free(z).expect("free");
    h.release(b, s1);
    let x2 = a.allocate(50 * MIB, s0).expect("alloc again");
    assert_eq!(x2, x, "the lowest chain, where the ghosts are");
    fill_and_check(h, b, x2, 50 * MIB, 0x33, s0);
    expect_bytes(h, b, live, 2 * MIB, 0x12, format_args!("block {live:#x}"));
    a.free(x2).expect("free");
    a.free(live).expect("free");
    a.empty_cache().expect("empty_cache");
    assert_eq!(a.ghost_mappings(), 0, "empty_cache unmaps every ghost");
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    check(&a);
    drop(side);
}

/// cachalot's expandable mode: a block freed on a busy stream is lent to
/// another stream's request at once (no page moves, no host wait), and
/// the borrowing stream waits for the lender's earlier work: a write
/// queued on the borrower lands after the lender's write that was still
/// queued behind busy work, so the borrower's value is what reads back.
/// Freed by the borrower, the block goes back to its own stream only
/// after the borrower's work on it.
pub fn expandable_lends_behind_a_fence<H: Harness>(h: &H) {
    let Some(a) = expandable(h, "expandable_segments:True") else {
        return;
    };
    let b = a.backend();
    let s0 = b.default_stream();
    let side = h.new_stream(b);
    let s1 = h.handle(&side);
    let n = 32 * MIB;
    let p = a.allocate(n, s0).expect("alloc");
    h.make_busy(b, s0);
    h.fill(b, p, n, 0x31, s0); // queued behind the busy work
    a.free(p).expect("free");
    let before = a.stats().reserved_bytes.all().current;
    let q = a.allocate(n, s1).expect("alloc on the other stream");
    assert_eq!(q, p, "the free block is lent");
    assert_eq!(a.stats().reserved_bytes.all().current, before);
    h.fill(b, q, n, 0x32, s1); // must run after s0's fill
    a.free(q).expect("free");
    // the lent block waits for s1's work: s0 gets other memory meanwhile
    let busy = h.is_busy(b, s1);
    let r = a.allocate(n, s0).expect("alloc meanwhile");
    if busy {
        assert!(
            r + n <= p || r >= p + n,
            "{r:#x} overlaps the pending {p:#x}"
        );
    }
    h.release(b, s0);
    h.release(b, s1);
    expect_bytes(h, b, p, n, 0x32, format_args!("lent block {p:#x}"));
    a.free(r).expect("free");
    check(&a);
    drop(side);
}

/// Expandable segments: a block freed while a busy side stream still uses
/// it (`record_stream`) keeps its pages: nothing allocated meanwhile
/// overlaps it, and the side stream's writes land.
pub fn expandable_record_stream_keeps_pages<H: Harness>(h: &H) {
    for config in EXPANDABLE {
        let Some(a) = expandable(h, config) else {
            return;
        };
        let b = a.backend();
        let s0 = b.default_stream();
        let side = h.new_stream(b);
        let s1 = h.handle(&side);
        let other = h.new_stream(b);
        let s2 = h.handle(&other);
        let n = 32 * MIB;
        let p = a.allocate(n, s0).expect("alloc");
        h.fill(b, p, n, 0x21, s0);
        a.record_stream(p, s1).expect("record_stream");
        h.make_busy(b, s1);
        h.fill(b, p, n, 0x5a, s1); // queued behind the busy work
        a.free(p).expect("free");
        let busy = h.is_busy(b, s1);
        let mut got = Vec::new();
        for s in [s0, s2, s0, s2] {
            let q = a.allocate(n, s).expect("alloc meanwhile");
            if busy {
                assert!(
                    q + n <= p || q >= p + n,
                    "{q:#x} overlaps the pending block {p:#x}"
                );
            }
            got.push(q);
        }
        for q in got {
            a.free(q).expect("free");
        }
        h.release(b, s1);
        check(&a);
        drop((side, other));
    }
}

/// Expandable segments under a memory fraction: a request that only fits
/// once cached pages are unmapped succeeds (recycling, or the OOM ladder's
/// release and retry), and reserved memory stays under the cap.
pub fn expandable_fraction_oom_releases_and_retries<H: Harness>(h: &H) {
    for config in EXPANDABLE {
        let Some(a) = expandable(h, config) else {
            return;
        };
        let b = a.backend();
        let s0 = b.default_stream();
        let side = h.new_stream(b);
        let s1 = h.handle(&side);
        let total = b.memory_info().expect("info").total;
        let cap = 256 * MIB;
        a.set_memory_fraction(cap as f64 / total as f64 + 1e-9)
            .expect("fraction");
        let p = a.allocate(160 * MIB, s0).expect("alloc");
        a.free(p).expect("free"); // cached, mapped
        let q = a.allocate(160 * MIB, s1).expect("fits once p's pages go");
        fill_and_check(h, b, q, 160 * MIB, 0x3c, s1);
        let st = a.stats();
        let r = st.reserved_bytes.all();
        assert!(
            r.current as u64 <= cap,
            "{config}: reserved {} over the cap",
            r.current
        );
        match a.allocate(300 * MIB, s0) {
            Err(Error::NeverFits { .. }) | Err(Error::OutOfMemory(_)) => {}
            other => panic!("{config}: expected an out-of-memory error, got {other:?}"),
        }
        a.free(q).expect("free");
        check(&a);
        drop(side);
    }
}

/// Expandable segments: once every block is freed, `empty_cache` unmaps
/// every page and unreserves every range; the device's free memory comes
/// back.
pub fn expandable_empty_cache_returns_every_page<H: Harness>(h: &H) {
    for config in EXPANDABLE {
        let Some(a) = expandable(h, config) else {
            return;
        };
        let b = a.backend();
        let s0 = b.default_stream();
        let side = h.new_stream(b);
        let s1 = h.handle(&side);
        let before = b.memory_info().expect("info").free;
        let mut ptrs = Vec::new();
        for (i, n) in [512u64, 3 * MIB, 70 * MIB, 700 * 1024, 33 * MIB]
            .into_iter()
            .enumerate()
        {
            let s = if i % 2 == 0 { s0 } else { s1 };
            ptrs.push(a.allocate(n, s).expect("alloc"));
        }
        for p in ptrs {
            a.free(p).expect("free");
        }
        a.empty_cache().expect("empty_cache");
        let st = a.stats();
        assert_eq!(
            st.reserved_bytes.all().current,
            0,
            "{config}: every page unmapped"
        );
        assert_eq!(a.snapshot().segments.len(), 0, "{config}: no segment left");
        let after = b.memory_info().expect("info").free;
        assert!(
            after + 16 * MIB > before,
            "{config}: device memory came back ({before} -> {after})"
        );
        check(&a);
        drop(side);
    }
}

/// The default configuration: expandable segments (cachalot's mode) where
/// the backend has virtual memory, fixed segments elsewhere. A freed block
/// is handed out again for the same size with no device call, blocks of
/// both pools on two streams are served, and `empty_cache` gives every
/// byte back to the driver.
pub fn default_config_reuses_and_returns_everything<H: Harness>(h: &H) {
    let a = h.allocator("");
    let b = a.backend();
    let vmm = b.virtual_memory().is_some();
    assert_eq!(a.config().expandable_segments, vmm, "the default's mode");
    let s0 = b.default_stream();
    let side = h.new_stream(b);
    let s1 = h.handle(&side);
    let before = b.memory_info().expect("info").free;
    let p = a.allocate(3 * MIB, s0).expect("alloc");
    a.free(p).expect("free");
    let calls = a.stats().num_device_alloc;
    let q = a.allocate(3 * MIB, s0).expect("alloc");
    assert_eq!(p, q, "cached block reused");
    assert_eq!(a.stats().num_device_alloc, calls, "no device call on a hit");
    let mut ptrs = vec![q];
    for (i, n) in [1000u64, 40 * MIB, 600 * 1024, 9 * MIB]
        .into_iter()
        .enumerate()
    {
        let s = if i % 2 == 0 { s1 } else { s0 };
        ptrs.push(a.allocate(n, s).expect("alloc"));
    }
    check(&a);
    for p in ptrs {
        a.free(p).expect("free");
    }
    a.empty_cache().expect("empty_cache");
    assert_eq!(a.stats().reserved_bytes.all().current, 0, "all released");
    assert_eq!(a.snapshot().segments.len(), 0, "no segment left");
    let after = b.memory_info().expect("info").free;
    assert!(
        after + 16 * MIB > before,
        "device memory came back ({before} -> {after})"
    );
    check(&a);
    drop(side);
}

/// Runs every check, printing one line each, and returns (passed, failed).
pub fn run_all<H: Harness>(h: &H) -> (usize, usize) {
    let (mut passed, mut failed) = (0, 0);
    for (name, f) in all::<H>() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(h)));
        match r {
            Ok(()) => {
                passed += 1;
                println!("conformance[{}] {name}: ok", h.name());
            }
            Err(e) => {
                failed += 1;
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!("conformance[{}] {name}: FAILED: {msg}", h.name());
            }
        }
    }
    (passed, failed)
}

fn check<B: Backend>(a: &cachalot_core::CachingAllocator<B>) {
    a.check_invariants()
        .unwrap_or_else(|e| panic!("invariant: {e}"));
}

/// A freed block is handed out again for the same size on the same stream,
/// without a new device allocation (fixed segments).
pub fn alloc_free_reuse<H: Harness>(h: &H) {
    let a = h.allocator(crate::mock::FIXED);
    let s = a.backend().default_stream();
    let p = a.allocate(3 * MIB, s).expect("alloc");
    assert_ne!(p, 0);
    check(&a);
    a.free(p).expect("free");
    let q = a.allocate(3 * MIB, s).expect("alloc");
    assert_eq!(p, q, "cached block reused");
    assert_eq!(a.stats().num_device_alloc, 1);
    let small = a.allocate(1000, s).expect("small");
    assert_eq!(a.stats().segment.small().current, 1);
    a.free(small).expect("free");
    a.free(q).expect("free");
    check(&a);
}

/// Data written into cached blocks reads back correctly across reuse.
pub fn data_survives_reuse<H: Harness>(h: &H) {
    let a = h.allocator("");
    let b = a.backend();
    let s = b.default_stream();
    let sizes = [512u64, 4096, MIB, 3 * MIB, 12 * MIB];
    for round in 0..3u8 {
        let ptrs: Vec<u64> = sizes
            .iter()
            .map(|&n| a.allocate(n, s).expect("alloc"))
            .collect();
        for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
            h.fill(b, p, n, round * 16 + i as u8 + 1, s);
        }
        for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
            let want = round * 16 + i as u8 + 1;
            expect_bytes(h, b, p, n, want, format_args!("block {i} of round {round}"));
        }
        // free in a scrambled order so the next round reuses split blocks
        for &i in &[3usize, 0, 4, 1, 2] {
            a.free(ptrs[i]).expect("free");
        }
        check(&a);
    }
    assert!(
        a.stats().num_device_alloc <= 3,
        "rounds 2 and 3 reuse the cache"
    );
}

/// A block freed while another stream still uses it is not handed out
/// again until that stream's work completes, and is reused after.
pub fn record_stream_defers_reuse<H: Harness>(h: &H) {
    let a = h.allocator("");
    let b = a.backend();
    let s0 = b.default_stream();
    let side = h.new_stream(b);
    let side_h = h.handle(&side);
    let p = a.allocate(8 * MIB, s0).expect("alloc");
    h.fill(b, p, 8 * MIB, 0x5a, s0);
    a.record_stream(p, side_h).expect("record_stream");
    h.make_busy(b, side_h);
    h.fill(b, p, 8 * MIB, 0x5a, side_h);
    a.free(p).expect("free");
    check(&a);
    assert_eq!(
        a.stats().active.all().current,
        1,
        "pending block stays active"
    );
    let q = a.allocate(8 * MIB, s0).expect("alloc while pending");
    if h.is_busy(b, side_h) {
        assert_ne!(q, p, "block reused while the side stream still uses it");
    }
    a.free(q).expect("free");
    h.release(b, side_h);
    let r = a.allocate(8 * MIB, s0).expect("alloc after completion");
    if r != q {
        assert_eq!(r, p, "block reused once the side stream completed");
    }
    a.free(r).expect("free");
    check(&a);
    drop(side);
}

/// `empty_cache` returns whole free segments and keeps ones with live
/// blocks (fixed segments).
pub fn empty_cache_returns_segments<H: Harness>(h: &H) {
    let a = h.allocator(crate::mock::FIXED);
    let s = a.backend().default_stream();
    let before = a.backend().memory_info().expect("info").free;
    let p = a.allocate(64 * MIB, s).expect("alloc");
    let q = a.allocate(2 * MIB, s).expect("alloc");
    a.free(p).expect("free");
    a.empty_cache().expect("empty_cache");
    let st = a.stats();
    assert_eq!(
        st.segment.all().current,
        1,
        "the segment with a live block stays"
    );
    assert_eq!(st.num_device_free, 1);
    a.free(q).expect("free");
    a.empty_cache().expect("empty_cache");
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    let after = a.backend().memory_info().expect("info").free;
    assert!(
        after + 64 * MIB > before,
        "device memory came back ({before} -> {after})"
    );
    check(&a);
}

/// Requests that cannot fit give typed errors, never a panic, and leave the
/// allocator usable.
pub fn oom_is_typed<H: Harness>(h: &H) {
    let a = h.allocator("");
    let s = a.backend().default_stream();
    let total = a.backend().memory_info().expect("info").total;
    match a.allocate(total + 64 * MIB, s) {
        Err(Error::NeverFits { .. }) | Err(Error::OutOfMemory(_)) => {}
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
    match a.allocate(1 << 60, s) {
        Err(Error::NeverFits { .. }) => {}
        other => panic!("expected NeverFits, got {other:?}"),
    }
    assert_eq!(a.stats().num_ooms, 1);
    let p = a.allocate(MIB, s).expect("still usable");
    a.free(p).expect("free");
    check(&a);
}

/// Unknown pointers, interior pointers, double frees and record_stream
/// after free are typed errors.
pub fn bad_pointers_are_typed<H: Harness>(h: &H) {
    let a = h.allocator("");
    let s = a.backend().default_stream();
    let p = a.allocate(5000, s).expect("alloc");
    assert!(
        matches!(a.free(p + 512), Err(Error::InteriorPointer { addr, block, .. }) if addr == p + 512 && block == p),
        "interior pointer"
    );
    a.free(p).expect("free");
    assert!(matches!(a.free(p), Err(Error::DoubleFree(_))));
    assert!(matches!(a.record_stream(p, s), Err(Error::NotLive(_))));
    assert!(matches!(a.free(8), Err(Error::UnknownPointer(8))));
    check(&a);
}

/// Events come from a pool: many frees with cross-stream uses reuse them.
pub fn events_are_recycled<H: Harness>(h: &H) {
    let a = h.allocator("");
    let b = a.backend();
    let s0 = b.default_stream();
    let side = h.new_stream(b);
    let side_h = h.handle(&side);
    let mut first = 0;
    for i in 0..50 {
        let p = a.allocate(MIB, s0).expect("alloc");
        a.record_stream(p, side_h).expect("record");
        a.free(p).expect("free");
        h.release(b, side_h);
        if i == 0 {
            first = p;
        }
    }
    let p = a.allocate(MIB, s0).expect("alloc");
    assert_eq!(p, first, "blocks come back after their events complete");
    a.free(p).expect("free");
    check(&a);
    drop(side);
}
