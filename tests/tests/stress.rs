//! Lock stress: many threads share one allocator, each allocating, freeing
//! and recording its blocks on other streams, while another thread empties
//! the cache, reconfigures and takes snapshots. Afterwards every invariant
//! holds, nothing leaked, and the mock's race checker saw no unordered reuse.
//! Work completes when the janitor says so, or late on its own
//! (`Completion::Random`: after a seeded number of later device calls).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cachalot_conformance::mock::GIB;
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error};
use cachalot_mock::{Completion, MockConfig};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn allocator_is_send_and_sync() {
    assert_send_sync::<CachingAllocator<cachalot_mock::MockBackend>>();
}

#[test]
fn threads_hammer_one_allocator() {
    // work completes only when the janitor says so: frees with cross-stream
    // uses really wait for their events
    hammer(Completion::Manual);
}

#[test]
fn threads_hammer_one_allocator_with_late_completion() {
    // work completes on its own, up to 24 device calls after submission
    // (calls of all threads interleave); the janitor completes nothing
    hammer(Completion::Random {
        seed: 0x5eed_1a7e,
        max_delay_ops: 24,
    });
}

/// Operations per worker: `CACHALOT_STRESS_ITERS` (20,000 to 10^8), else
/// 20,000 (`scripts/stress_long.sh` runs them ten times longer).
fn iterations() -> u64 {
    std::env::var("CACHALOT_STRESS_ITERS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(20_000, |n| n.clamp(20_000, 100_000_000))
}

fn hammer(completion: Completion) {
    let iters = iterations();
    let m = MockConfig::new(8 * GIB).completion(completion).build();
    let janitor_completes = completion == Completion::Manual;
    let a = Arc::new(CachingAllocator::with_config(m.clone(), AllocatorConfig::default()).unwrap());
    let streams: Vec<_> = (0..6).map(|_| m.create_stream()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // allocations whose stream still had unfinished work right after its use
    let pending_seen = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for t in 0..6usize {
        let (a, m, streams) = (a.clone(), m.clone(), streams.clone());
        let pending_seen = pending_seen.clone();
        handles.push(std::thread::spawn(move || {
            let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ (t as u64 + 1);
            let mut live: Vec<u64> = Vec::new();
            let s = streams[t];
            for i in 0..iters {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if live.len() < 32 && (x & 1 == 0 || live.is_empty()) {
                    let size = 512 << (x % 14);
                    match a.allocate(size, s) {
                        Ok(p) => {
                            m.use_memory(s, p, size, (t as u64) << 40 | i).unwrap();
                            if m.pending(s).unwrap() > 0 {
                                pending_seen.fetch_add(1, Ordering::Relaxed);
                            }
                            if x.is_multiple_of(7) {
                                // used on a neighbour stream too, ordered after s
                                let other = streams[(t + 1) % streams.len()];
                                let e = m.create_event().unwrap();
                                m.record_event(&e, s).unwrap();
                                m.stream_wait_event(other, &e).unwrap();
                                m.destroy_event(e).unwrap();
                                a.record_stream(p, other).unwrap();
                            }
                            live.push(p);
                        }
                        Err(Error::OutOfMemory(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                } else {
                    let k = (x as usize / 3) % live.len();
                    a.free(live.swap_remove(k)).unwrap();
                }
            }
            for p in live {
                a.free(p).unwrap();
            }
        }));
    }
    let janitor = {
        let (a, m, stop) = (a.clone(), m.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if janitor_completes {
                    m.complete_all();
                }
                a.empty_cache().unwrap();
                let _ = a.snapshot();
                let _ = a.memory_stats();
                a.set_config(if n.is_multiple_of(2) {
                    "max_split_size_mb:64"
                } else {
                    ""
                })
                .unwrap();
                a.check_invariants().unwrap();
                n += 1;
                std::thread::yield_now();
            }
            n
        })
    };
    for h in handles {
        h.join().expect("worker");
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = janitor.join().expect("janitor");
    assert!(rounds > 0);
    let pending_seen = pending_seen.load(Ordering::Relaxed);
    assert!(
        pending_seen > 1000,
        "work must really be outstanding while blocks are reused ({pending_seen})"
    );
    a.check_invariants().unwrap();
    m.complete_all();
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(s.allocation.all().current, 0);
    assert_eq!(s.active.all().current, 0);
    assert_eq!(s.reserved_bytes.all().current, 0);
    assert!(m.live_segments().is_empty());
    assert_eq!(m.race_count(), 0, "{:?}", m.races().first());
}
