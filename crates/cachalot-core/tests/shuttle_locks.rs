//! Model check of the shard/device lock protocol (`docs/design-shards.md`)
//! with shuttle's randomized and PCT schedulers: the engine's locks and
//! thread-locals are shuttle's under the `shuttle` feature, so every lock
//! acquisition is a scheduling point. Two threads on two streams allocate
//! (hits on their shards, misses and OOMs on a device too small for both),
//! free, record uses on each other's stream and empty the cache, while the
//! main thread reads the stats and checks every invariant. Every schedule
//! must end (no deadlock), lose no block, and leave the stats exactly the
//! sums over the blocks, every current at zero. The same with the device
//! calls of new segments made with every lock released
//! (`release_lock_on_cudamalloc:True`).
//!
//! Run: `cargo test -p cachalot-core --features shuttle --test shuttle_locks`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cachalot_core::{AllocatorConfig, CachingAllocator, Error};
use cachalot_mock::{MockBackend, MockConfig, MockStream};

const MIB: u64 = 1 << 20;

/// One worker: a few rounds of hit, miss, OOM, cross-stream use and free.
fn worker(a: &CachingAllocator<MockBackend>, m: &MockBackend, s: MockStream, other: MockStream) {
    let mut live = Vec::new();
    for round in 0..3u64 {
        // small blocks: a miss, then hits on the shard
        for k in 0..3u64 {
            live.push(a.allocate((512 << k) + round * 512, s).unwrap());
        }
        // a large one: fits once, not twice (out of memory for one thread)
        match a.allocate(40 * MIB, s) {
            Ok(p) => {
                if round == 1 {
                    // used on the other stream: its free waits for an event
                    a.record_stream(p, other).unwrap();
                }
                live.push(p);
            }
            Err(Error::OutOfMemory(_)) => {}
            Err(e) => panic!("{e}"),
        }
        if let Some(p) = live.pop() {
            a.free(p).unwrap();
        }
        if round == 2 {
            m.complete_all();
            a.empty_cache().unwrap();
        }
    }
    for p in live {
        a.free(p).unwrap();
    }
}

fn scenario() {
    scenario_with(AllocatorConfig::default());
}

/// [`scenario`] with fixed segments whose device calls run with every lock
/// released (`release_lock_on_cudamalloc:True`): the misses and OOMs of
/// one thread stop mid-ladder, the other thread's hits, frees, misses and
/// `empty_cache` run meanwhile, and the ladder goes on after the call.
fn unlocked_malloc() {
    scenario_with(
        AllocatorConfig::parse("expandable_segments:False,release_lock_on_cudamalloc:True")
            .unwrap(),
    );
}

fn scenario_with(config: AllocatorConfig) {
    let m = MockConfig::new(64 * MIB).build();
    let a = Arc::new(CachingAllocator::with_config(m.clone(), config).unwrap());
    let (s1, s2) = (m.create_stream(), m.create_stream());
    let t1 = {
        let (a, m) = (a.clone(), m.clone());
        shuttle::thread::spawn(move || worker(&a, &m, s1, s2))
    };
    let t2 = {
        let (a, m) = (a.clone(), m.clone());
        shuttle::thread::spawn(move || worker(&a, &m, s2, s1))
    };
    // a reader in the middle of it all: a consistent, exact view
    let s = a.memory_stats();
    assert!(s["allocated_bytes.all.current"] <= s["reserved_bytes.all.current"]);
    a.check_invariants().unwrap();
    t1.join().unwrap();
    t2.join().unwrap();
    m.complete_all();
    a.check_invariants().unwrap();
    settle_frees(&a);
    let st = a.stats();
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(st.active.all().current, 0);
    assert_eq!(st.allocated_bytes.all().current, 0);
    assert_eq!(st.requested_bytes.all().current, 0);
    assert_eq!(st.allocation.all().allocated, st.allocation.all().freed);
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    assert!(m.live_segments().is_empty(), "a segment was lost");
}

/// Ends the frees still waiting for other streams' work (all of it done
/// on the mock by now), as PyTorch's `empty_cache` does: the default lends
/// one stream's free blocks to another (`docs/design-expandable.md`,
/// "Cross-stream lending"), and the free of a lent block waits, as a free
/// after `record_stream` does, so its block stays `active` (PyTorch's
/// meaning: allocated, or freed with uses pending) until then. The stats
/// match the blocks before as after (`check_invariants`).
fn settle_frees(a: &CachingAllocator<MockBackend>) {
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
}

/// Hits and frees alone on two streams, the shards logging (forced: both
/// shards out, so every operation is logged and a log of the model's 3
/// entries fills at once): flushes on both threads take windows out, sum
/// them with no lock held and file them in either order, while the main
/// thread's reads must wait for every window flushed before them.
fn flushes() {
    hits_and_frees(true, FIXED);
    hits_and_frees(true, "");
}

/// Fixed segments: no block is lent from one stream to another, so every
/// operation after the first segments is a hit or a plain free on the fast
/// path. (The default lends free blocks across streams, and a lent block's
/// free waits for the borrower's work: the fast path is off while such
/// frees wait, so few schedules would reach the shared mirror's handovers.)
const FIXED: &str = "expandable_segments:False";

/// Schedules of [`mirror`] in which the two threads took short turns on
/// the shared mirror (the shards log from then on), and in all.
static MET: AtomicUsize = AtomicUsize::new(0);
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// The same hits and frees with the shards starting on the shared mirror
/// (several shards out, owned by one thread at a time, written with
/// relaxed loads and stores that the model check may interleave): in some
/// schedules the threads take short turns there (fewer than the model's
/// `SHORT_TURN`, 8 operations, three times in a row) and the shards
/// switch to their logs mid-way; in others the mirror passes from thread
/// to thread; the stats stay exact either way (a claim that let two
/// threads write at once fails here at once).
fn mirror() {
    hits_and_frees(false, FIXED);
}

/// [`mirror`] in the default configuration (cachalot's expandable mode,
/// blocks lent across streams): the stats stay exact.
fn mirror_default() {
    hits_and_frees(false, "");
}

fn hits_and_frees(logs: bool, config: &str) {
    let m = MockConfig::new(64 * MIB).build();
    let config = AllocatorConfig::parse(config).unwrap();
    let fixed = !config.expandable_segments && config.expandable_segments_given;
    let a = Arc::new(CachingAllocator::with_config(m.clone(), config).unwrap());
    if logs {
        a.force_shard_logs();
    }
    let (s1, s2) = (m.create_stream(), m.create_stream());
    // one segment per stream first, so that what follows is all hits
    for s in [s1, s2] {
        let p = a.allocate(4096, s).unwrap();
        a.free(p).unwrap();
    }
    let hs: Vec<_> = [s1, s2]
        .into_iter()
        .map(|s| {
            let a = a.clone();
            shuttle::thread::spawn(move || {
                for k in 0..8u64 {
                    let p = a.allocate(512 * (1 + k % 3), s).unwrap();
                    let q = a.allocate(1024, s).unwrap();
                    a.free(p).unwrap();
                    a.free(q).unwrap();
                }
            })
        })
        .collect();
    a.check_invariants().unwrap();
    let mid = a.stats();
    assert!(mid.allocation.all().current <= 4);
    for h in hs {
        h.join().unwrap();
    }
    a.check_invariants().unwrap();
    m.complete_all();
    settle_frees(&a);
    let st = a.stats();
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(st.allocation.all().allocated, 2 + 2 * 16);
    assert_eq!(st.allocation.all().freed, 2 + 2 * 16);
    // two threads with two blocks each at most, and one alone before
    assert!((2..=4).contains(&st.allocation.all().peak));
    assert_eq!(st.active_bytes.all().current, 0);
    if !logs && fixed {
        RUNS.fetch_add(1, Ordering::Relaxed);
        if a.shards_log() {
            MET.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn flush_schedules() {
    shuttle::check_random(flushes, 3000);
    shuttle::check_pct(flushes, 3000, 3);
}

#[test]
fn mirror_schedules() {
    shuttle::check_random(mirror_default, 1000);
    shuttle::check_pct(mirror_default, 1000, 3);
    shuttle::check_random(mirror, 3000);
    shuttle::check_pct(mirror, 3000, 3);
    let (met, runs) = (MET.load(Ordering::Relaxed), RUNS.load(Ordering::Relaxed));
    // both ways were taken: some schedules took short turns, some not
    assert!(
        met > 0 && met < runs,
        "short turns in {met} of {runs} schedules"
    );
}

#[test]
fn random_schedules() {
    shuttle::check_random(scenario, 3000);
}

#[test]
fn pct_schedules() {
    shuttle::check_pct(scenario, 3000, 3);
}

#[test]
fn unlocked_malloc_schedules() {
    shuttle::check_random(unlocked_malloc, 3000);
    shuttle::check_pct(unlocked_malloc, 3000, 3);
}
