//! The sharded engine (`docs/design-shards.md`): threads on their own
//! streams with a janitor thread emptying the cache and reading the stats
//! every millisecond (no deadlock, exact stats at the end, throughput
//! printed), and the stat peaks exact when one thread works on several
//! shards (the thread-local budgets).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cachalot_conformance::mock::{FIXED, GIB};
use cachalot_core::rng::SplitMix64;
use cachalot_core::{AllocatorConfig, CachingAllocator, Error};
use cachalot_mock::MockConfig;

/// Eight threads on eight streams (the `cachalot threads` workload) and a
/// janitor calling `empty_cache` and `memory_stats` every millisecond.
#[test]
fn eight_streams_with_a_janitor_every_millisecond() {
    let m = MockConfig::new(16 * GIB).build();
    let a = Arc::new(
        CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap()).unwrap(),
    );
    let streams: Vec<_> = (0..8).map(|_| m.create_stream()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let janitor = {
        let (a, stop) = (a.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                a.empty_cache().unwrap();
                let s = a.memory_stats();
                // every read is a consistent view: nothing allocated is
                // more than what is reserved
                assert!(s["allocated_bytes.all.current"] <= s["reserved_bytes.all.current"]);
                assert!(s["allocated_bytes.all.current"] <= s["allocated_bytes.all.peak"]);
                rounds += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            rounds
        })
    };
    let t0 = Instant::now();
    let workers: Vec<_> = (0..8usize)
        .map(|t| {
            let (a, s, ops) = (a.clone(), streams[t], ops.clone());
            std::thread::spawn(move || {
                let mut x = SplitMix64::new(0x1234_5678 ^ (t as u64) << 32);
                let mut live = [0u64; 64];
                let mut max_live_bytes = 0u64;
                let mut live_bytes = 0u64;
                let mut sizes = [0u64; 64];
                for _ in 0..40_000 {
                    let k = (x.next_u64() % 64) as usize;
                    if live[k] != 0 {
                        a.free(std::mem::take(&mut live[k])).unwrap();
                        live_bytes -= sizes[k];
                    } else {
                        let size = 512 << (x.next_u64() % 12);
                        live[k] = a.allocate(size, s).unwrap();
                        sizes[k] = size;
                        live_bytes += size;
                        max_live_bytes = max_live_bytes.max(live_bytes);
                    }
                }
                for p in live {
                    if p != 0 {
                        a.free(p).unwrap();
                    }
                }
                ops.fetch_add(40_000, Ordering::Relaxed);
                max_live_bytes
            })
        })
        .collect();
    let maxima: Vec<u64> = workers.into_iter().map(|h| h.join().unwrap()).collect();
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let rounds = janitor.join().unwrap();
    let n = ops.load(Ordering::Relaxed);
    println!(
        "mixed: {n} ops on 8 streams in {secs:.3} s = {:.2} Mops/s, {rounds} janitor rounds",
        n as f64 / secs / 1e6
    );
    assert!(rounds > 0);
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(s.allocation.all().current, 0);
    assert_eq!(s.allocated_bytes.all().current, 0);
    assert_eq!(s.active.all().current, 0);
    assert_eq!(s.requested_bytes.all().current, 0);
    // every allocation counted and freed exactly once
    assert_eq!(
        s.allocation.all().allocated,
        s.allocation.all().freed,
        "{:?}",
        s.allocation
    );
    assert!(s.allocation.all().allocated >= n as i64 / 3);
    // the peak is at least any thread's own and at most all threads' at once
    let peak = s.requested_bytes.all().peak as u64;
    assert!(peak >= *maxima.iter().max().unwrap(), "{peak} {maxima:?}");
    assert!(peak <= maxima.iter().sum::<u64>(), "{peak} {maxima:?}");
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
}

/// One thread on four streams (four shards): every peak equals the peak a
/// sequential count gives, after every operation checked. Both ways the
/// shards keep their stats: the shared mirror (one thread: no log, no
/// flush, the shards never log) and, forced, the stat logs (replayed in
/// the order of their time stamps, strictly increasing on one thread).
/// Read every 7th operation (the stats read replays everything) and every
/// 4999th (with logs, full logs are taken out in between, each replayed
/// up to the first swap).
#[test]
fn one_thread_on_four_shards_keeps_peaks_exact() {
    use cachalot_core::PathCounts;
    for (every, logs) in [(7u32, false), (4999, false), (7, true), (4999, true)] {
        let m = MockConfig::new(16 * GIB).build();
        let a = CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap())
            .unwrap();
        if logs {
            a.force_shard_logs();
        }
        let streams: Vec<_> = (0..4).map(|_| m.create_stream()).collect();
        let mut x = SplitMix64::new(7);
        // (address, block size, request): the block sizes are asked only
        // when the stats are read every 7th operation (asking takes the
        // device lock, which replays the logs)
        let mut live: Vec<(u64, u64, u64)> = Vec::new();
        let (mut cur, mut peak, mut count, mut count_peak) = (0i64, 0i64, 0i64, 0i64);
        let (mut req, mut req_peak) = (0i64, 0i64);
        let before = PathCounts::this_thread();
        for i in 0..if every == 7 { 30_000u32 } else { 60_000 } {
            let r = x.next_u64();
            if live.len() < 200 && (r & 1 == 0 || live.is_empty()) {
                let size = 512 << (r % 13);
                let p = a.allocate(size, streams[(r >> 8) as usize % 4]).unwrap();
                let b = if every == 7 {
                    a.block_size(p).unwrap()
                } else {
                    0
                };
                live.push((p, b, size));
                cur += b as i64;
                req += size as i64;
                count += 1;
            } else {
                let (p, b, size) = live.swap_remove((r >> 16) as usize % live.len());
                a.free(p).unwrap();
                cur -= b as i64;
                req -= size as i64;
                count -= 1;
            }
            peak = peak.max(cur);
            req_peak = req_peak.max(req);
            count_peak = count_peak.max(count);
            if i % every == 0 {
                let s = a.stats();
                if every == 7 {
                    assert_eq!(s.allocated_bytes.all().current, cur, "op {i}");
                    assert_eq!(s.allocated_bytes.all().peak, peak, "op {i}");
                }
                assert_eq!(s.requested_bytes.all().current, req, "op {i}");
                assert_eq!(s.requested_bytes.all().peak, req_peak, "op {i}");
                assert_eq!(s.allocation.all().peak, count_peak, "op {i}");
            }
            if i % (every * 150).min(6000) == 0 {
                a.reset_peak_stats();
                peak = cur;
                req_peak = req;
                count_peak = count;
                a.check_invariants().unwrap();
            }
        }
        let d = PathCounts::this_thread().since(&before);
        assert!(d.fast > d.device * 4, "{d:?}");
        if !logs {
            // one thread: the shared mirror all along
            assert_eq!(d.flushes, 0, "{d:?}");
            assert!(!a.shards_log());
        } else if every > 7 {
            assert!(d.flushes > 0, "{d:?}");
        }
        a.check_invariants().unwrap();
    }
}

/// Two threads on two shards, their operations ordered by the program
/// (a barrier between steps): the allocated-bytes peak follows that order
/// exactly, on the fast path. Overlapping lifetimes peak at the sum;
/// disjoint ones at the larger (a merge that ignored the time stamps would
/// get one of the two wrong). Both starting on the shared mirror (the
/// threads' turns, an operation or two each, hand it over until the
/// shards log) and with the logs from the start.
#[test]
fn peaks_follow_the_order_of_operations_across_threads() {
    for logs in [false, true] {
        peaks_follow_the_order(logs);
    }
}

fn peaks_follow_the_order(logs: bool) {
    use cachalot_core::PathCounts;
    use std::sync::Barrier;
    let m = MockConfig::new(16 * GIB).build();
    let a =
        CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap()).unwrap();
    if logs {
        a.force_shard_logs();
    }
    let (s1, s2) = (m.create_stream(), m.create_stream());
    // a cached 8 MiB and 4 MiB block on each stream
    for s in [s1, s2] {
        let p = a.allocate(8 << 20, s).unwrap();
        let q = a.allocate(4 << 20, s).unwrap();
        a.free(p).unwrap();
        a.free(q).unwrap();
    }
    for overlap in [true, false, true, false] {
        a.reset_peak_stats();
        let bar = Barrier::new(2);
        let fast = std::thread::scope(|sc| {
            // each thread's first operation on an allocator goes to the
            // device (it learns its stream's shard there): 1 MiB each
            let (a, bar) = (&a, &bar);
            let warm = move |s| {
                let w = a.allocate(1 << 20, s).unwrap();
                a.free(w).unwrap();
                bar.wait();
            };
            let one = sc.spawn(move || {
                warm(s1);
                let before = PathCounts::this_thread();
                let p = a.allocate(8 << 20, s1).unwrap();
                if !overlap {
                    a.free(p).unwrap();
                }
                bar.wait(); // the other allocates
                bar.wait();
                if overlap {
                    a.free(p).unwrap();
                }
                PathCounts::this_thread().since(&before).fast
            });
            let two = sc.spawn(move || {
                warm(s2);
                let before = PathCounts::this_thread();
                bar.wait();
                let q = a.allocate(4 << 20, s2).unwrap();
                bar.wait();
                a.free(q).unwrap();
                PathCounts::this_thread().since(&before).fast
            });
            one.join().unwrap() + two.join().unwrap()
        });
        assert_eq!(fast, 4, "every operation on its shard");
        let st = a.stats().allocated_bytes;
        let want = if overlap { 12 << 20 } else { 8 << 20 };
        assert_eq!(st.all().peak, want, "overlap {overlap}");
        assert_eq!(st.all().current, 0);
    }
    if logs {
        assert!(a.shards_log());
    }
    a.check_invariants().unwrap();
}

/// Threads taking turns by phases on two streams (a forward thread and an
/// autograd thread): each phase a new thread runs 3,000 operations on its
/// stream, keeping a few blocks live into the next phases. The shared
/// mirror passes from thread to thread (no logs), and the requested-bytes
/// current and peak follow the program's order exactly after every phase.
/// Then two threads on the same allocator taking turns operation by
/// operation (a barrier between them) make the shards log, and the stats
/// stay exact.
#[test]
fn threads_taking_turns_by_phases_hand_the_shared_mirror_over() {
    use cachalot_core::PathCounts;
    use std::sync::Barrier;
    let m = MockConfig::new(16 * GIB).build();
    let a =
        CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap()).unwrap();
    let (s1, s2) = (m.create_stream(), m.create_stream());
    for s in [s1, s2] {
        let p = a.allocate(64 << 20, s).unwrap();
        a.free(p).unwrap();
    }
    a.reset_peak_stats();
    let handovers = a.shared_mirror_handovers();
    let (mut cur, mut peak) = (0i64, 0i64);
    let mut held: Vec<u64> = Vec::new();
    for phase in 0..6u64 {
        let s = if phase % 2 == 0 { s1 } else { s2 };
        let (a, start) = (&a, (cur, peak));
        let (kept, (c, pk), d) = std::thread::scope(|sc| {
            sc.spawn(move || {
                let before = PathCounts::this_thread();
                let (mut c, mut pk) = start;
                let mut mine: std::collections::VecDeque<(u64, i64)> = Default::default();
                for i in 0..1500u64 {
                    let size = 4096 * (1 + (i * 7 + phase) % 11);
                    let p = a.allocate(size, s).unwrap();
                    c += size as i64;
                    pk = pk.max(c);
                    mine.push_back((p, size as i64));
                    if mine.len() > 3 {
                        let (q, z) = mine.pop_front().unwrap();
                        a.free(q).unwrap();
                        c -= z;
                    }
                }
                let kept: Vec<u64> = mine.into_iter().map(|(p, _)| p).collect();
                (kept, (c, pk), PathCounts::this_thread().since(&before))
            })
            .join()
            .unwrap()
        });
        held.extend(kept);
        (cur, peak) = (c, pk);
        let st = a.stats();
        assert_eq!(st.requested_bytes.all().current, cur, "phase {phase}");
        assert_eq!(st.requested_bytes.all().peak, peak, "phase {phase}");
        assert!(d.fast > d.device * 20, "phase {phase}: {d:?}");
        assert_eq!(d.flushes, 0, "phase {phase}: {d:?}");
        assert!(!a.shards_log(), "phase {phase}");
        a.check_invariants().unwrap();
    }
    // the mirror passed at least once per phase after the first
    assert!(a.shared_mirror_handovers() - handovers >= 5);
    // now operation by operation: two threads, a barrier between turns
    let bar = Barrier::new(2);
    let turns: Vec<(u64, i64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = [(s1, 0u64), (s2, 1)]
            .into_iter()
            .map(|(s, me)| {
                let (a, bar) = (&a, &bar);
                sc.spawn(move || {
                    let mut out = Vec::new();
                    for turn in 0..40u64 {
                        if turn % 2 == me {
                            let p = a.allocate(8192, s).unwrap();
                            a.free(p).unwrap();
                            out.push((turn, 8192));
                        }
                        bar.wait();
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(turns.len(), 40);
    assert!(
        a.shards_log(),
        "turns of an operation each make the shards log"
    );
    let st = a.stats();
    assert_eq!(st.requested_bytes.all().current, cur);
    assert_eq!(st.requested_bytes.all().peak, peak.max(cur + 8192));
    for p in held {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().requested_bytes.all().current, 0);
    a.check_invariants().unwrap();
}

/// A stream's block freed by another thread (not on its shard's hint):
/// served by the device path, exactly.
#[test]
fn frees_from_other_threads_are_exact() {
    let m = MockConfig::new(4 * GIB).build();
    let a = Arc::new(
        CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap()).unwrap(),
    );
    let s = m.create_stream();
    let ptrs: Vec<u64> = (0..500)
        .map(|i| a.allocate(512 << (i % 10), s).unwrap())
        .collect();
    let a2 = a.clone();
    std::thread::spawn(move || {
        for p in ptrs {
            a2.free(p).unwrap();
        }
    })
    .join()
    .unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().allocation.all().current, 0);
    assert!(matches!(
        a.free(0x1234_0000),
        Err(Error::UnknownPointer(0x1234_0000))
    ));
}

/// How operations are served: a repeated hit and free run on the
/// stream's shard alone, with fixed segments and with expandable ones in
/// both modes (a hit in a mapped block of an expandable segment is a hit
/// like any other; a free stamps the block from the shard's clock). Once
/// expandable segments are turned off after use, the fast path is off for
/// good (the engine's best fit must then skip their blocks): every
/// operation goes to the device at once, and the device path then holds
/// no shard (the results are the same either way).
#[test]
fn paths_by_mode() {
    use cachalot_core::{Backend, PathCounts};
    for (config, later, fast) in [
        ("", None, true),
        ("expandable_segments:True", None, true),
        ("placement:pytorch,expandable_segments:True", None, true),
        (
            "expandable_segments:True",
            Some("expandable_segments:False"),
            false,
        ),
    ] {
        let m = MockConfig::new(16 * GIB).build();
        let a = CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(config).unwrap())
            .unwrap();
        let s = m.default_stream();
        let p = a.allocate(1 << 20, s).unwrap();
        a.free(p).unwrap();
        if let Some(c) = later {
            a.set_config(c).unwrap();
        }
        let before = PathCounts::this_thread();
        for _ in 0..1000 {
            let p = a.allocate(1 << 20, s).unwrap();
            a.free(p).unwrap();
        }
        let d = PathCounts::this_thread().since(&before);
        if fast {
            assert_eq!(d.fast, 2000, "{config}: {d:?}");
            assert_eq!(d.device, 0, "{config}: {d:?}");
            // one stream: its shard is the only one out and writes the
            // stats directly (no log to take out)
            assert_eq!(d.flushes, 0, "{config}: {d:?}");
        } else {
            assert_eq!(d.fast, 0, "{config}: {d:?}");
            assert_eq!(d.device, 2000, "{config}: {d:?}");
        }
        assert_eq!(a.stats().allocation.all().current, 0);
        a.check_invariants().unwrap();
    }
}

/// Hits that each raise a peak (after `reset_peak_stats`, every cached
/// block handed out again is a new high) are served on the shard, not on
/// the device path, and the peaks stay exact.
#[test]
fn hits_that_raise_peaks_stay_on_the_shard() {
    use cachalot_core::{Backend, PathCounts};
    let m = MockConfig::new(16 * GIB).build();
    let a =
        CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap()).unwrap();
    let s = m.default_stream();
    let n = 32u64;
    let warm: Vec<u64> = (0..n).map(|_| a.allocate(1 << 20, s).unwrap()).collect();
    for p in warm {
        a.free(p).unwrap();
    }
    a.reset_peak_stats();
    let before = PathCounts::this_thread();
    let again: Vec<u64> = (0..n).map(|_| a.allocate(1 << 20, s).unwrap()).collect();
    let d = PathCounts::this_thread().since(&before);
    assert_eq!(d.device, 0, "{d:?}");
    assert_eq!(d.fast, n, "{d:?}");
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all().peak, (n << 20) as i64);
    assert_eq!(st.allocation.all().peak, n as i64);
    assert_eq!(st.allocation.all().current, n as i64);
    for p in again {
        a.free(p).unwrap();
    }
    assert_eq!(a.stats().allocation.all().peak, n as i64);
    a.check_invariants().unwrap();
}

/// One thread's part of a phase of [`peaks_match_a_serial_replay`]: an
/// allocation of `size` bytes numbered `id` on the thread's stream, or the
/// free of allocation `id`.
#[derive(Clone, Copy, Debug)]
enum PhaseOp {
    Alloc { id: usize, size: u64 },
    Free { id: usize },
}

/// The stats that a phase's operations change in one direction only
/// (`allocated_bytes`, `requested_bytes`, `allocation`, `active`,
/// `active_bytes`, all pools), current and peak.
fn monotone_stats(a: &CachingAllocator<cachalot_mock::MockBackend>) -> Vec<(&'static str, i64)> {
    let s = a.stats();
    let mut out = Vec::new();
    for (name, st) in [
        ("allocated_bytes", &s.allocated_bytes),
        ("requested_bytes", &s.requested_bytes),
        ("allocation", &s.allocation),
        ("active", &s.active),
        ("active_bytes", &s.active_bytes),
    ] {
        out.push((name, st.all().current));
        out.push((name, st.all().peak));
    }
    out
}

/// A fresh allocator with `streams` streams whose caches hold, per stream,
/// `per_size` blocks of each size of `SIZES` (so the phases' allocations
/// are hits on their stream's shard), its peaks reset.
fn warmed(
    streams: usize,
    per_size: usize,
) -> (
    CachingAllocator<cachalot_mock::MockBackend>,
    Vec<cachalot_mock::MockStream>,
) {
    let m = MockConfig::new(16 * GIB).auto_complete(true).build();
    let a =
        CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(FIXED).unwrap()).unwrap();
    let ss: Vec<_> = (0..streams).map(|_| m.create_stream()).collect();
    for &s in &ss {
        let held: Vec<u64> = SIZES
            .iter()
            .flat_map(|&z| std::iter::repeat_n(z, per_size))
            .map(|z| a.allocate(z, s).unwrap())
            .collect();
        for p in held {
            a.free(p).unwrap();
        }
    }
    a.reset_peak_stats();
    (a, ss)
}

/// The sizes of [`peaks_match_a_serial_replay`]'s allocations.
const SIZES: [u64; 6] = [512, 1536, 4096, 20_000, 65_536, 700_000];

/// Exact peaks under threads, against a serial replay of the same
/// operations: `threads` threads, each on its own stream, run phases
/// separated by a barrier; in an even phase every thread only allocates
/// (one to six blocks of random sizes, cache hits on its shard), in an odd
/// one it only frees (each block it holds with probability 1/2). Within a
/// phase the threads' order does not change the stats at its end, and
/// these stats only rise in an allocating phase and only fall in a freeing
/// one, so their peaks are reached at the end of allocating phases whatever
/// the order inside a phase. Every current and peak of the threaded run
/// must therefore equal that of one thread replaying the same operations
/// phase by phase on a fresh allocator. A stamp out of real-time order
/// (an allocation of the next phase merged before a free of this one,
/// across the barrier) shows as a higher peak. With the shards logging
/// from the start and without; the flushed windows summed by the
/// flushing threads and by the stats thread.
#[test]
fn peaks_match_a_serial_replay() {
    use std::sync::Barrier;
    const PHASES: usize = 120;
    let summed_before = cachalot_core::engine::stats_thread_windows();
    for (threads, stats_thread) in [(8usize, false), (16, false), (8, true), (16, true)] {
        cachalot_core::engine::set_stats_thread(stats_thread);
        for logs in [true, false] {
            let (a, streams) = warmed(threads, 6);
            if logs {
                a.force_shard_logs();
            }
            let bar = Barrier::new(threads);
            let programs: Vec<Vec<Vec<PhaseOp>>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let (a, bar, s) = (&a, &bar, streams[t]);
                        sc.spawn(move || {
                            let mut rng =
                                SplitMix64::new(0x5EED_0000 + t as u64 * 7919 + u64::from(logs));
                            let mut held: Vec<(usize, u64)> = Vec::new();
                            let mut next_id = 0;
                            let mut phases = Vec::with_capacity(PHASES);
                            for phase in 0..PHASES {
                                let mut ops = Vec::new();
                                bar.wait();
                                if phase % 2 == 0 {
                                    for _ in 0..1 + rng.next_u64() % 6 {
                                        let size = SIZES[(rng.next_u64() % 6) as usize];
                                        let p = a.allocate(size, s).unwrap();
                                        held.push((next_id, p));
                                        ops.push(PhaseOp::Alloc { id: next_id, size });
                                        next_id += 1;
                                    }
                                } else {
                                    let mut kept = Vec::new();
                                    for (id, p) in held.drain(..) {
                                        if rng.next_u64().is_multiple_of(2) {
                                            a.free(p).unwrap();
                                            ops.push(PhaseOp::Free { id });
                                        } else {
                                            kept.push((id, p));
                                        }
                                    }
                                    held = kept;
                                }
                                phases.push(ops);
                            }
                            bar.wait();
                            phases
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let threaded = monotone_stats(&a);
            a.check_invariants().unwrap();
            // the same operations, one thread, phase by phase
            let (b, bstreams) = warmed(threads, 6);
            let mut ptrs: Vec<std::collections::HashMap<usize, u64>> =
                vec![Default::default(); threads];
            for phase in 0..PHASES {
                for (t, prog) in programs.iter().enumerate() {
                    for op in &prog[phase] {
                        match *op {
                            PhaseOp::Alloc { id, size } => {
                                ptrs[t].insert(id, b.allocate(size, bstreams[t]).unwrap());
                            }
                            PhaseOp::Free { id } => b.free(ptrs[t].remove(&id).unwrap()).unwrap(),
                        }
                    }
                }
            }
            let serial = monotone_stats(&b);
            let ops: usize = programs.iter().flatten().map(Vec::len).sum();
            eprintln!(
                "{threads} threads, logs {logs}, stats thread {stats_thread}: {ops} operations, peak allocated {}",
                serial[1].1
            );
            assert_eq!(
                threaded, serial,
                "{threads} threads, logs {logs}, stats thread {stats_thread}"
            );
            if logs {
                assert!(a.shards_log());
            }
        }
    }
    cachalot_core::engine::set_stats_thread(false);
    // (the stats thread did sum windows of the runs that had it)
    assert!(cachalot_core::engine::stats_thread_windows() > summed_before);
}
