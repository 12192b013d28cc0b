//! Private pools with options, through the C ABI on the mock: a pool whose
//! segments come from a user's allocator (C functions, as the PyTorch shim
//! passes a `CUDAPluggableAllocator`), `use_on_oom`, `no_split`, and the
//! segment trackers that see every segment event.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

use cachalot_capi::drop_in::*;
use cachalot_capi::*;

mod common;
use common::*;

const MIB: usize = 1 << 20;

fn setup(config: &std::ffi::CStr) -> MutexGuard<'static, ()> {
    let g = lock_mock();
    // SAFETY: a NUL-terminated string.
    let rc = unsafe { cachalot_set_config(config.as_ptr()) };
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
    assert_eq!(cachalot_set_memory_fraction(0, 1.0), CACHALOT_OK);
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
    events().clear();
    g
}

/// An allocation's address (as the user's allocator's are kept).
fn alloc_addr(size: usize) -> Result<u64, (c_int, String)> {
    try_alloc(size).map(|p| p.addr() as u64)
}

/// A pool allocation's address.
fn alloc_in_addr(pool: (u64, u64), size: usize) -> Result<u64, (c_int, String)> {
    try_alloc_in(pool, size).map(|p| p.addr() as u64)
}

fn free(a: u64) {
    let p: *mut c_void = std::ptr::with_exposed_provenance_mut(a as usize);
    assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_OK, "{}", last_error());
}

/// (segment address, total size, is_expandable, block sizes and states)
type Seg = (u64, u64, bool, Vec<(u64, i32)>);

fn segments(pool: (u64, u64)) -> Vec<Seg> {
    let snap = Snap::take(pool.0, pool.1, false);
    let blocks = snap.blocks();
    snap.segments()
        .iter()
        .filter(|g| (g.pool_hi, g.pool_lo) == pool || pool == (0, 0))
        .map(|g| {
            let b = &blocks[g.first_block as usize..(g.first_block + g.num_blocks) as usize];
            (
                g.address,
                g.total_size,
                g.is_expandable != 0,
                b.iter().map(|b| (b.size, b.state)).collect(),
            )
        })
        .collect()
}

// ----- a user's allocator: C functions over a fake address range -----

/// Where the fake allocator's addresses start (far from the mock's).
const FAKE_BASE: u64 = 0x0100_0000_0000;

#[derive(Default)]
struct Fake {
    /// This allocator's own range (each one's is apart from the others').
    base: u64,
    next: u64,
    live: HashMap<u64, u64>,
    allocs: usize,
    frees: usize,
    released: usize,
    /// The next alloc returns this address instead (0: none, out of memory).
    bad_next: Option<u64>,
    /// The next alloc fails with this code.
    fail_next: Option<c_int>,
    /// Every alloc returns 0 (out of memory) while set.
    oom: bool,
}

unsafe extern "C" fn fake_alloc(
    ctx: *mut c_void,
    size: usize,
    addr: *mut u64,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    // SAFETY: `ctx` is the test's `Mutex<Fake>`, alive for the test.
    let f = unsafe { &*ctx.cast::<Mutex<Fake>>() };
    let mut f = f.lock().unwrap();
    if let Some(rc) = f.fail_next.take() {
        let m = b"fake allocator refused\0";
        // SAFETY: cachalot passes a buffer of `errlen` bytes.
        unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), err.cast::<u8>(), m.len().min(errlen)) };
        return rc;
    }
    if f.oom {
        // SAFETY: cachalot passes a valid out-pointer.
        unsafe { addr.write(0) };
        return 0;
    }
    let a = match f.bad_next.take() {
        Some(a) => a,
        None => {
            let a = f.base + f.next;
            f.next += (size as u64).next_multiple_of(64 << 20);
            f.live.insert(a, size as u64);
            f.allocs += 1;
            a
        }
    };
    // SAFETY: cachalot passes a valid out-pointer.
    unsafe { addr.write(a) };
    0
}

unsafe extern "C" fn fake_free(
    ctx: *mut c_void,
    addr: u64,
    size: usize,
    _err: *mut c_char,
    _errlen: usize,
) -> c_int {
    // SAFETY: as in `fake_alloc`.
    let f = unsafe { &*ctx.cast::<Mutex<Fake>>() };
    let mut f = f.lock().unwrap();
    if f.live.get(&addr) != Some(&(size as u64)) {
        return 99;
    }
    f.live.remove(&addr);
    f.frees += 1;
    0
}

unsafe extern "C" fn fake_release(ctx: *mut c_void) {
    // SAFETY: as in `fake_alloc`.
    let f = unsafe { &*ctx.cast::<Mutex<Fake>>() };
    f.lock().unwrap().released += 1;
}

fn fake() -> &'static Mutex<Fake> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = FAKE_BASE + N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * (1 << 36);
    Box::leak(Box::new(Mutex::new(Fake {
        base,
        ..Fake::default()
    })))
}

fn create_with(pool: (u64, u64), f: &'static Mutex<Fake>) -> c_int {
    // SAFETY: the functions and `ctx` are valid from any thread for ever.
    unsafe {
        cachalot_pool_create_with_source(
            0,
            pool.0,
            pool.1,
            Some(fake_alloc),
            Some(fake_free),
            Some(fake_release),
            std::ptr::from_ref(f).cast_mut().cast(),
        )
    }
}

// ----- segment events -----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ev {
    action: i32,
    addr: u64,
    size: u64,
    pool: (u64, u64),
    /// For a fake-allocator segment: whether the fake still held it.
    held: Option<bool>,
}

static EVENTS: Mutex<Vec<Ev>> = Mutex::new(Vec::new());
/// The fake allocator whose holdings the tracker looks at.
static WATCHED: Mutex<Option<&'static Mutex<Fake>>> = Mutex::new(None);

fn events() -> MutexGuard<'static, Vec<Ev>> {
    EVENTS.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" fn on_segment(_ctx: *mut c_void, e: *const CachalotSegmentEvent) {
    // SAFETY: cachalot passes an event valid for the call.
    let e = unsafe { &*e };
    let held = WATCHED
        .lock()
        .unwrap()
        .map(|f| f.lock().unwrap().live.contains_key(&e.addr));
    events().push(Ev {
        action: e.action,
        addr: e.addr,
        size: e.size,
        pool: (e.pool_hi, e.pool_lo),
        held: if (FAKE_BASE..0x7000_0000_0000).contains(&e.addr) {
            held
        } else {
            None
        },
    });
}

fn attach_tracker_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `on_segment` may be called from any thread for ever.
        ok(unsafe { cachalot_attach_segment_tracker(Some(on_segment), null_mut()) });
    });
}

const SEGMENT_ALLOC: i32 = 3;
const SEGMENT_FREE: i32 = 4;
const SEGMENT_MAP: i32 = 5;
const SEGMENT_UNMAP: i32 = 6;

#[test]
fn a_pool_takes_every_segment_from_its_allocator() {
    // expandable segments on: the pool's segments stay whole allocations
    let _g = setup(c"expandable_segments:True");
    attach_tracker_once();
    let f = fake();
    *WATCHED.lock().unwrap() = Some(f);
    let pool = (0, 0x50c);
    ok(create_with(pool, f));
    let mut n = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { cachalot_pool_use_count(0, pool.0, pool.1, &mut n) });
    assert_eq!(n, 1);
    // three 1 MiB blocks: two share the first 2 MiB small segment
    let a = alloc_in_addr(pool, MIB).unwrap();
    let b = alloc_in_addr(pool, MIB).unwrap();
    assert_eq!(f.lock().unwrap().allocs, 1);
    let c = alloc_in_addr(pool, MIB).unwrap();
    assert_eq!(f.lock().unwrap().allocs, 2);
    for x in [a, b, c] {
        assert!((FAKE_BASE..FAKE_BASE + (1 << 40)).contains(&x), "{x:#x}");
    }
    let segs = segments(pool);
    assert_eq!(segs.len(), 2, "{segs:?}");
    assert!(
        segs.iter().all(|s| !s.2 && s.1 == 2 * MIB as u64),
        "{segs:?}"
    );
    // a default-pool allocation beside it is an expandable mapping
    let d = alloc_addr(3 * MIB).unwrap();
    assert!(!(FAKE_BASE..FAKE_BASE + (1 << 40)).contains(&d));
    assert!(
        segments((0, 0)).iter().any(|s| s.2),
        "no expandable segment"
    );
    let allocs: Vec<Ev> = events()
        .iter()
        .filter(|e| e.pool == pool)
        .copied()
        .collect();
    assert_eq!(allocs.len(), 2, "{allocs:?}");
    assert!(
        allocs
            .iter()
            .all(|e| e.action == SEGMENT_ALLOC && e.held == Some(true))
    );
    free(d);

    // the pool is let go while its blocks live: nothing goes back yet
    ok(cachalot_pool_release(0, pool.0, pool.1));
    ok(cachalot_empty_cache(0));
    assert_eq!(f.lock().unwrap().frees, 0);
    for x in [a, b, c] {
        free(x);
    }
    // freed blocks of a released pool: its segments go back to its
    // allocator, trackers hearing of each before it goes, then the pool and
    // the allocator's context are released
    ok(cachalot_empty_cache(0));
    {
        let fk = f.lock().unwrap();
        assert_eq!((fk.allocs, fk.frees, fk.released), (2, 2, 1));
        assert!(fk.live.is_empty());
    }
    let frees: Vec<Ev> = events()
        .iter()
        .filter(|e| e.pool == pool && e.action == SEGMENT_FREE)
        .copied()
        .collect();
    assert_eq!(frees.len(), 2, "{frees:?}");
    assert!(
        frees.iter().all(|e| e.held == Some(true)),
        "tracker ran after the free: {frees:?}"
    );
    assert!(segments(pool).is_empty());
    *WATCHED.lock().unwrap() = None;
}

#[test]
fn a_misbehaving_allocator_is_a_typed_error() {
    let _g = setup(c"expandable_segments:False");
    let f = fake();
    let pool = (0, 0x50d);
    ok(create_with(pool, f));
    // a source for a pool that exists: refused, its context released
    let g = fake();
    assert_eq!(create_with(pool, g), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("exists already"), "{}", last_error());
    assert_eq!(g.lock().unwrap().released, 1);
    // NULL functions: refused, context released
    let h = fake();
    // SAFETY: NULL functions are checked; `ctx` valid.
    let rc = unsafe {
        cachalot_pool_create_with_source(
            0,
            0,
            0x50e,
            None,
            Some(fake_free),
            Some(fake_release),
            std::ptr::from_ref(h).cast_mut().cast(),
        )
    };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert_eq!(h.lock().unwrap().released, 1);
    // the allocator fails: its message in cachalot's error
    f.lock().unwrap().fail_next = Some(7);
    let (rc, msg) = alloc_in_addr(pool, 4 * MIB).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_BACKEND, "{msg}");
    assert!(
        msg.contains("fake allocator refused") && msg.contains("code 7"),
        "{msg}"
    );
    // a misaligned address: refused and handed back (the fake allocator
    // answers 99: not one of its own; cachalot warns and goes on)
    let base = f.lock().unwrap().base;
    f.lock().unwrap().bad_next = Some(base + (1 << 30) + 8);
    let (rc, msg) = alloc_in_addr(pool, 4 * MIB).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_BACKEND, "{msg}");
    assert!(msg.contains("not aligned"), "{msg}");
    // NULL from the allocator: out of memory, as PyTorch reads it
    f.lock().unwrap().oom = true;
    let (rc, msg) = alloc_in_addr(pool, 4 * MIB).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_OUT_OF_MEMORY, "{msg}");
    assert!(
        msg.contains("CUDA out of memory. Tried to allocate 20.00 MiB"),
        "{msg}"
    );
    f.lock().unwrap().oom = false;
    // an address inside a segment of the device: refused
    let x = alloc_in_addr(pool, 4 * MIB).unwrap();
    f.lock().unwrap().bad_next = Some(x);
    let (rc, msg) = alloc_in_addr(pool, 30 * MIB).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_BACKEND, "{msg}");
    assert!(msg.contains("overlaps"), "{msg}");
    free(x);
    ok(cachalot_pool_release(0, pool.0, pool.1));
    ok(cachalot_empty_cache(0));
    let fk = f.lock().unwrap();
    assert_eq!((fk.frees, fk.released), (1, 1));
}

#[test]
fn use_on_oom_pools_lend_their_cached_blocks() {
    let _g = setup(c"expandable_segments:False");
    let lender = (0, 0x00a1);
    let keeper = (0, 0x00a2);
    ok(cachalot_pool_create_or_incref(0, lender.0, lender.1));
    ok(cachalot_pool_create_or_incref(0, keeper.0, keeper.1));
    ok(cachalot_pool_set_use_on_oom(0, lender.0, lender.1, 1));
    // room for 80 MiB more than is reserved now
    let mut total = 0usize;
    // SAFETY: valid out-pointers.
    ok(unsafe { cachalot_mem_get_info(0, null_mut(), &mut total) });
    let mut s = CachalotDeviceStats::default();
    // SAFETY: `s` is writable and of the size passed.
    ok(unsafe { cachalot_get_stats(0, &mut s, std::mem::size_of_val(&s)) });
    let reserved = s.reserved_bytes[0].current as f64;
    ok(cachalot_set_memory_fraction(
        0,
        (reserved + 80.0 * MIB as f64) / total as f64,
    ));

    let k = alloc_in_addr(keeper, 40 * MIB).unwrap();
    let l = alloc_in_addr(lender, 40 * MIB).unwrap();
    let (rc, _) = alloc_addr(40 * MIB).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_OUT_OF_MEMORY);
    free(k);
    free(l);
    // both pools hold a free 40 MiB block; only the lender's may be taken
    let c = alloc_addr(30 * MIB).unwrap();
    assert_eq!(c, l, "not the lender's block");
    let (rc, msg) = alloc_addr(30 * MIB).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_OUT_OF_MEMORY, "{msg}");
    free(c);
    // the block went back to the lender, whole again
    assert_eq!(alloc_in_addr(lender, 20 * MIB).unwrap(), l);
    let segs = segments(lender);
    assert_eq!(segs.len(), 1);
    free(l);
    // turned off: nothing is lent
    ok(cachalot_pool_set_use_on_oom(0, lender.0, lender.1, 0));
    assert!(alloc_addr(30 * MIB).is_err());
    // released pools lend nothing either (their free blocks go)
    ok(cachalot_pool_set_use_on_oom(0, lender.0, lender.1, 1));
    ok(cachalot_pool_release(0, lender.0, lender.1));
    ok(cachalot_pool_release(0, keeper.0, keeper.1));
    let x = alloc_addr(30 * MIB).unwrap();
    assert!(segments(lender).is_empty());
    free(x);
    // bad ids
    assert_eq!(
        cachalot_pool_set_use_on_oom(0, 0, 0, 1),
        CACHALOT_ERR_CAPTURE
    );
    assert_eq!(
        cachalot_pool_set_use_on_oom(0, 0, 0xdead, 1),
        CACHALOT_ERR_CAPTURE
    );
    ok(cachalot_set_memory_fraction(0, 1.0));
}

#[test]
fn no_split_pools_hand_out_whole_blocks() {
    let _g = setup(c"expandable_segments:False");
    let split = (0, 0x5b1);
    let whole = (0, 0x5b2);
    ok(cachalot_pool_create_or_incref(0, split.0, split.1));
    ok(cachalot_pool_create_or_incref(0, whole.0, whole.1));
    ok(cachalot_pool_set_no_split(0, whole.0, whole.1));
    let mut mine = Vec::new();
    for _ in 0..2 {
        mine.push(alloc_in_addr(split, 4 * MIB).unwrap());
        mine.push(alloc_in_addr(whole, 4 * MIB).unwrap());
    }
    // 4 MiB requests take 20 MiB segments: shared when split, one each not
    let s = segments(split);
    let w = segments(whole);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].3.len(), 3, "{s:?}");
    assert_eq!(w.len(), 2, "{w:?}");
    for seg in &w {
        assert_eq!(seg.3, vec![(20 * MIB as u64, 0)], "{w:?}");
    }
    for a in mine {
        free(a);
    }
    assert_eq!(cachalot_pool_set_no_split(0, 0, 0), CACHALOT_ERR_CAPTURE);
    ok(cachalot_pool_release(0, split.0, split.1));
    ok(cachalot_pool_release(0, whole.0, whole.1));
}

#[test]
fn trackers_see_every_segment_event_of_the_default_pools() {
    let _g = setup(c"expandable_segments:False");
    attach_tracker_once();
    // fixed segments: alloc and free
    let a = alloc_addr(30 * MIB).unwrap();
    free(a);
    ok(cachalot_empty_cache(0));
    let ev = events().clone();
    let allocs: Vec<&Ev> = ev.iter().filter(|e| e.action == SEGMENT_ALLOC).collect();
    let frees: Vec<&Ev> = ev.iter().filter(|e| e.action == SEGMENT_FREE).collect();
    assert_eq!(allocs.len(), 1, "{ev:?}");
    assert_eq!(
        (allocs[0].addr, allocs[0].size, allocs[0].pool),
        (a, 30 * MIB as u64, (0, 0))
    );
    assert_eq!(frees.len(), 1, "{ev:?}");
    assert_eq!((frees[0].addr, frees[0].size), (a, 30 * MIB as u64));
    // expandable segments: maps and unmaps of the pages
    events().clear();
    // SAFETY: a NUL-terminated literal.
    ok(unsafe { cachalot_set_config(c"expandable_segments:True".as_ptr()) });
    let b = alloc_addr(6 * MIB).unwrap();
    free(b);
    ok(cachalot_empty_cache(0));
    let ev = events().clone();
    let mapped: u64 = ev
        .iter()
        .filter(|e| e.action == SEGMENT_MAP)
        .map(|e| e.size)
        .sum();
    let unmapped: u64 = ev
        .iter()
        .filter(|e| e.action == SEGMENT_UNMAP)
        .map(|e| e.size)
        .sum();
    assert!(mapped >= 6 * MIB as u64, "{ev:?}");
    assert_eq!(mapped, unmapped, "{ev:?}");
}
