//! Model check of the shard/device lock protocol (`docs/design-shards.md`)
//! with shuttle's randomized and PCT schedulers: the engine's locks and
//! thread-locals are shuttle's under the `shuttle` feature, so every lock
//! acquisition is a scheduling point. Two threads on two streams allocate
//! (hits on their shards, misses and OOMs on a device too small for both),
//! free, record uses on each other's stream and empty the cache, while the
//! main thread reads the stats and checks every invariant. Every schedule
//! must end (no deadlock), lose no block, and leave the stats exactly the
//! sums over the blocks, every current at zero.
//!
//! Run: `cargo test -p cachalot-core --features shuttle --test shuttle_locks`.

use std::sync::Arc;

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
    let m = MockConfig::new(64 * MIB).build();
    let a = Arc::new(CachingAllocator::with_config(m.clone(), AllocatorConfig::default()).unwrap());
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

#[test]
fn random_schedules() {
    shuttle::check_random(scenario, 3000);
}

#[test]
fn pct_schedules() {
    shuttle::check_pct(scenario, 3000, 3);
}
