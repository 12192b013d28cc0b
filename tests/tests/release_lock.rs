//! `release_lock_on_cudamalloc:True` (the engine's `unlocked.rs`): the
//! device call of a new fixed segment runs with every lock of the engine
//! released. The mock's malloc hook holds such a call in flight while other
//! threads work on the device: with the key on they go on, with it off they
//! wait. Around that: the memory fraction's cap counts the calls in flight,
//! a pool released meanwhile stays until the allocation ended, a failed
//! call leaves nothing behind, one thread alone gets exactly what it gets
//! with the key off, and many threads allocating, freeing, emptying the
//! cache and switching the key keep exact statistics and leak no segment.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cachalot_conformance::mock::{FIXED, GIB, MIB};
use cachalot_core::replay::{Trace, replay};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error};
use cachalot_mock::{Failure, MockBackend, MockCall, MockConfig, MockStream};

/// Long enough for anything that is not blocked (a loaded machine
/// included); reached only when a test fails.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a thread that must wait is watched waiting.
const WATCH: Duration = Duration::from_millis(300);

/// A gate in the mock's `malloc`: the first `malloc` of at least `min`
/// bytes after [`GateEnds::arm`] reports its size and waits until
/// [`GateEnds::open`] (or [`PATIENCE`] passed); every other call passes.
struct Gate {
    armed: AtomicBool,
    entered: Mutex<Sender<u64>>,
    open: Mutex<Receiver<()>>,
    min: u64,
}

/// The test's ends of a [`Gate`].
struct GateEnds {
    gate: Arc<Gate>,
    entered: Receiver<u64>,
    open: Sender<()>,
}

impl GateEnds {
    fn install(m: &MockBackend, min: u64) -> Self {
        let (entered_tx, entered) = channel();
        let (open, open_rx) = channel();
        let gate = Arc::new(Gate {
            armed: AtomicBool::new(false),
            entered: Mutex::new(entered_tx),
            open: Mutex::new(open_rx),
            min,
        });
        let g = gate.clone();
        m.set_malloc_hook(Some(Arc::new(move |size| {
            if size >= g.min && g.armed.swap(false, Ordering::SeqCst) {
                g.entered.lock().unwrap().send(size).unwrap();
                // (bounded: a test that fails before it opens the gate
                // must end, not hang)
                let _ = g.open.lock().unwrap().recv_timeout(PATIENCE);
            }
        })));
        Self {
            gate,
            entered,
            open,
        }
    }

    fn arm(&self) {
        self.gate.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until a `malloc` is held at the gate; its size.
    fn held(&self) -> u64 {
        self.entered
            .recv_timeout(PATIENCE)
            .expect("no device malloc reached the gate")
    }

    fn open(&self) {
        self.open.send(()).unwrap();
    }
}

fn allocator(m: &MockBackend, config: &str) -> CachingAllocator<MockBackend> {
    CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(config).unwrap()).unwrap()
}

fn config(release: bool, extra: &str) -> String {
    let key = if release { "True" } else { "False" };
    format!("{FIXED},release_lock_on_cudamalloc:{key}{extra}")
}

/// One thread's allocation misses and its device `malloc` is held; another
/// thread then takes a cached block of its own stream, frees it and reads
/// the statistics. Returns whether that thread finished while the
/// `malloc` was held.
fn other_thread_during_a_held_malloc(release: bool) -> bool {
    let m = MockConfig::new(16 * GIB).build();
    let a = allocator(&m, &config(release, ""));
    let gate = GateEnds::install(&m, 64 * MIB);
    let (s1, s2) = (m.create_stream(), m.create_stream());
    // a cached 1 MiB block on s2, and one on s1
    for s in [s1, s2] {
        let p = a.allocate(MIB, s).unwrap();
        a.free(p).unwrap();
    }
    let reserved = a.stats().reserved_bytes.all().current;
    gate.arm();
    let finished_early = std::thread::scope(|sc| {
        let a = &a;
        let miss = sc.spawn(move || a.allocate(64 * MIB, s1).unwrap());
        assert_eq!(gate.held(), 64 * MIB);
        let (done_tx, done) = channel();
        let other = sc.spawn(move || {
            let p = a.allocate(MIB, s2).unwrap();
            a.free(p).unwrap();
            let q = a.allocate(MIB, s1).unwrap();
            a.free(q).unwrap();
            let st = a.memory_stats();
            done_tx.send(()).unwrap();
            st
        });
        let mut other = Some(other);
        let early = if release {
            done.recv_timeout(PATIENCE)
                .expect("the other thread waited for the device malloc");
            assert!(!miss.is_finished(), "the malloc is still held");
            // the held segment is counted nowhere yet, and every invariant
            // holds with the call in flight
            let st = other.take().unwrap().join().unwrap();
            assert_eq!(st["reserved_bytes.all.current"], reserved);
            assert_eq!(st["allocation.all.current"], 0);
            a.check_invariants().unwrap();
            assert_eq!(a.stats().reserved_bytes.all().current, reserved);
            true
        } else {
            assert_eq!(
                done.recv_timeout(WATCH),
                Err(RecvTimeoutError::Timeout),
                "the other thread went on while the device lock was held"
            );
            false
        };
        gate.open();
        let p = miss.join().unwrap();
        if let Some(other) = other {
            done.recv_timeout(PATIENCE).unwrap();
            other.join().unwrap();
        }
        a.free(p).unwrap();
        early
    });
    a.check_invariants().unwrap();
    let st = a.stats();
    assert_eq!(st.reserved_bytes.all().current, reserved + 64 * MIB as i64);
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(a.unlocked_device_calls(), if release { 3 } else { 0 });
    finished_early
}

#[test]
fn with_the_key_on_other_threads_go_on_during_a_device_malloc() {
    assert!(other_thread_during_a_held_malloc(true));
}

#[test]
fn with_the_key_off_other_threads_wait_for_the_device_malloc() {
    assert!(!other_thread_during_a_held_malloc(false));
}

/// The key set at run time takes effect at the next device call.
#[test]
fn the_key_set_at_run_time_takes_effect() {
    let m = MockConfig::new(16 * GIB).build();
    let a = allocator(&m, FIXED);
    let s = m.create_stream();
    // (over 10 MiB: each request is a new segment of its own size)
    let p = a.allocate(12 * MIB, s).unwrap();
    assert_eq!(a.unlocked_device_calls(), 0);
    a.set_config("release_lock_on_cudamalloc:True").unwrap();
    assert!(a.config().release_lock_on_device_malloc);
    let q = a.allocate(24 * MIB, s).unwrap();
    assert_eq!(a.unlocked_device_calls(), 1);
    // another string keeps it; naming it off turns it off
    a.set_config("max_split_size_mb:100").unwrap();
    assert!(a.config().release_lock_on_device_malloc);
    a.set_config("release_lock_on_hipmalloc:False").unwrap();
    let r = a.allocate(48 * MIB, s).unwrap();
    assert_eq!(a.unlocked_device_calls(), 1);
    assert_eq!(m.call_count(MockCall::Malloc), 3);
    for x in [p, q, r] {
        a.free(x).unwrap();
    }
    a.check_invariants().unwrap();
}

/// The memory fraction's cap counts the device calls in flight: while one
/// thread's 64 MiB call is held, another's 64 MiB request over a cap of
/// about 102 MiB is out of memory without a device call (PyTorch would
/// let both calls through and reserve past its cap).
#[test]
fn the_fraction_cap_counts_calls_in_flight() {
    let m = MockConfig::new(GIB).build();
    let a = allocator(&m, &config(true, ",per_process_memory_fraction:0.1"));
    let cap = GIB / 10;
    let gate = GateEnds::install(&m, 64 * MIB);
    let (s1, s2) = (m.create_stream(), m.create_stream());
    gate.arm();
    std::thread::scope(|sc| {
        let a = &a;
        let held = sc.spawn(move || a.allocate(64 * MIB, s1).unwrap());
        gate.held();
        let mallocs = m.call_count(MockCall::Malloc);
        match a.allocate(64 * MIB, s2) {
            Err(Error::OutOfMemory(_)) => {}
            other => panic!("expected out of memory, got {other:?}"),
        }
        assert_eq!(m.call_count(MockCall::Malloc), mallocs, "no device call");
        a.check_invariants().unwrap();
        gate.open();
        let p = held.join().unwrap();
        assert!(m.live_bytes() <= cap);
        a.free(p).unwrap();
    });
    a.check_invariants().unwrap();
    // with nothing in flight the same request fits again
    let p = a.allocate(64 * MIB, s2).unwrap();
    a.free(p).unwrap();
    assert!(a.stats().reserved_bytes.all().peak as u64 <= cap);
}

/// A private pool released while a device call for it is in flight stays
/// until the allocation ended: it gets its segment, which goes back as any
/// segment of a released pool; a pool whose call failed goes at once.
#[test]
fn a_pool_released_during_its_call_stays_until_the_call_ended() {
    for fails in [false, true] {
        let m = MockConfig::new(16 * GIB).build();
        let a = allocator(&m, &config(true, ""));
        let gate = GateEnds::install(&m, 64 * MIB);
        let s = m.create_stream();
        let pool = cachalot_core::graph_pool_handle();
        a.create_or_incref_pool(pool, None).unwrap();
        if fails {
            m.fail_call_always_with(MockCall::Malloc, Failure::OutOfMemory);
        }
        gate.arm();
        let got = std::thread::scope(|sc| {
            let a = &a;
            let held = sc.spawn(move || a.allocate_in_pool(pool, 64 * MIB, s));
            gate.held();
            a.release_pool(pool).unwrap();
            a.check_invariants().unwrap();
            // released: no new use, but not deleted (a new pool with the
            // same id could not be created now)
            assert!(a.create_or_incref_pool(pool, None).is_err());
            gate.open();
            held.join().unwrap()
        });
        a.check_invariants().unwrap();
        if fails {
            assert!(matches!(got, Err(Error::OutOfMemory(_))), "{got:?}");
            m.clear_failures_of(MockCall::Malloc);
        } else {
            let p = got.unwrap();
            assert_eq!(a.stats().reserved_bytes.all().current, 64 * MIB as i64);
            a.free(p).unwrap();
            a.empty_cache().unwrap();
        }
        // deleted: the id is free again
        a.create_or_incref_pool(pool, None).unwrap();
        a.release_pool(pool).unwrap();
        a.check_invariants().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, 0);
        assert!(m.live_segments().is_empty());
    }
}

/// A device call that fails with an error (not out of memory) made with
/// the lock released is the allocation's error, and leaves nothing in
/// flight; the next allocation works.
#[test]
fn a_failed_call_leaves_nothing_in_flight() {
    let m = MockConfig::new(16 * GIB).build();
    let a = allocator(&m, &config(true, ""));
    let s = m.create_stream();
    m.fail_call_at(MockCall::Malloc, 1);
    let e = a.allocate(8 * MIB, s).unwrap_err();
    assert!(
        !matches!(e, Error::OutOfMemory(_) | Error::NeverFits { .. }),
        "{e:?}"
    );
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    let p = a.allocate(8 * MIB, s).unwrap();
    a.free(p).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.unlocked_device_calls(), 2);
}

/// The same operations with the key off and on, on one thread: the same
/// statistics (all 122 of PyTorch's keys) and the same replay figures;
/// with the key on every device allocation went through a call made with
/// the lock released. Scripted out-of-memory ladders (the second and the
/// last rung call the device) and the recorded traces.
#[test]
fn one_thread_gets_the_same_with_the_key_on() {
    type Script = fn(&CachingAllocator<MockBackend>, &MockBackend);
    // the last rung: s1's cache released for s2's request
    let last: Script = |a, m| {
        let (s1, s2) = (m.create_stream(), m.create_stream());
        let p = a.allocate(100 * MIB, s1).unwrap();
        let q = a.allocate(100 * MIB, s1).unwrap();
        a.free(p).unwrap();
        a.free(q).unwrap();
        let r = a.allocate(100 * MIB, s2).unwrap();
        assert!(a.allocate(200 * MIB, s2).is_err());
        a.free(r).unwrap();
    };
    // the second rung: the stream's cached oversize block that is too
    // large to take (more than 20 MiB over) released alone
    let available: Script = |a, m| {
        let s = m.create_stream();
        let p = a.allocate(140 * MIB, s).unwrap();
        let q = a.allocate(60 * MIB, s).unwrap();
        a.free(p).unwrap();
        let r = a.allocate(100 * MIB, s).unwrap();
        a.free(q).unwrap();
        a.free(r).unwrap();
        a.empty_cache().unwrap();
    };
    for (script, extra) in [
        (last, ""),
        (available, ",max_split_size_mb:40"),
        (
            last,
            ",per_process_memory_fraction:0.9,garbage_collection_threshold:0.5",
        ),
    ] {
        let run = |release: bool| {
            let m = MockConfig::new(256 * MIB).auto_complete(true).build();
            let a = allocator(&m, &config(release, extra));
            script(&a, &m);
            a.check_invariants().unwrap();
            let calls = a.unlocked_device_calls();
            (a.memory_stats(), calls, m.call_count(MockCall::Malloc))
        };
        let (off, _, _) = run(false);
        let (on, calls, mallocs) = run(true);
        assert_eq!(on, off, "{extra}");
        assert_eq!(calls, mallocs, "{extra}");
        assert!(off["num_alloc_retries"] > 0 || !extra.is_empty(), "{extra}");
    }
    let dir = cachalot_conformance::traces_dir();
    for name in [
        "gpt2_train",
        "resnet50_train",
        "side_stream_pipeline",
        "churn_4streams",
    ] {
        let trace = Trace::synthetic(name)
            .unwrap_or_else(|| Trace::load(dir.join(format!("{name}.trace"))).unwrap());
        for extra in [
            "",
            ",idle_stream_reuse:True",
            ",max_split_size_mb:256,garbage_collection_threshold:0.8,per_process_memory_fraction:0.9",
        ] {
            let run = |release: bool| {
                let m = MockConfig::new(cachalot_conformance::mock::H200_BYTES)
                    .auto_complete(true)
                    .build();
                let a = allocator(&m, &config(release, extra));
                let streams: Vec<MockStream> = std::iter::once(m.default_stream())
                    .chain((1..16).map(|_| m.create_stream()))
                    .collect();
                let r = replay(&a, &streams, &trace, 2, |_| {}).unwrap();
                a.check_invariants().unwrap();
                let figures = (
                    r.peak_reserved,
                    r.peak_allocated,
                    r.device_allocs_cold,
                    r.device_allocs_all,
                    r.alloc_retries,
                    r.device_frees_all,
                );
                let calls = a.unlocked_device_calls();
                (figures, a.memory_stats(), calls)
            };
            let (f_off, s_off, _) = run(false);
            let (f_on, s_on, calls) = run(true);
            assert_eq!(f_on, f_off, "{name}{extra}");
            assert_eq!(s_on, s_off, "{name}{extra}");
            assert_eq!(calls as i64, s_on["num_device_alloc"], "{name}{extra}");
            assert!(calls > 0, "{name}{extra}");
        }
    }
}

/// Threads allocating and freeing on three streams (cache hits, misses,
/// out-of-memory ladders on a device too small for all of them under a
/// memory fraction), emptying the cache, reading the statistics, checking
/// every invariant and switching the key off and on, with every device
/// `malloc` slowed (it yields) so that calls overlap. At every `malloc`
/// the device holds no more than the cap allows with that call; at the
/// end the statistics are exact and every segment went back.
#[test]
fn concurrent_allocations_frees_and_empty_cache_with_the_key_on() {
    const THREADS: usize = 4;
    const OPS: usize = 4000;
    let capacity = 512 * MIB;
    let m = MockConfig::new(capacity).auto_complete(true).build();
    let a = allocator(&m, &config(true, ",per_process_memory_fraction:0.75"));
    let cap = (0.75 * capacity as f64) as u64;
    let over_cap = Arc::new(AtomicUsize::new(0));
    // device mallocs running now, and the most at once
    let running = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    {
        let (m2, over, running) = (m.clone(), over_cap.clone(), running.clone());
        m.set_malloc_hook(Some(Arc::new(move |size| {
            if m2.live_bytes() + size > cap {
                over.fetch_add(1, Ordering::Relaxed);
            }
            let now = running[0].fetch_add(1, Ordering::SeqCst) + 1;
            running[1].fetch_max(now, Ordering::SeqCst);
            for _ in 0..3 {
                std::thread::yield_now();
            }
            running[0].fetch_sub(1, Ordering::SeqCst);
        })));
    }
    let streams = [m.default_stream(), m.create_stream(), m.create_stream()];
    let ooms = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let (a, ooms) = (&a, &ooms);
            sc.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                let mut rand = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut live: Vec<u64> = Vec::new();
                for i in 0..OPS {
                    let r = rand();
                    // (at most 16 blocks live per thread)
                    let pick = if live.len() >= 16 { 60 } else { r % 100 };
                    match pick {
                        0..=54 => {
                            let s = streams[(r >> 8) as usize % streams.len()];
                            // mostly small and medium, some large
                            let size = match (r >> 16) % 20 {
                                0..=11 => 512 + (r >> 24) % (64 << 10),
                                12..=18 => MIB + (r >> 24) % (8 * MIB),
                                _ => 16 * MIB + (r >> 24) % (32 * MIB),
                            };
                            match a.allocate(size, s) {
                                Ok(p) => live.push(p),
                                Err(Error::OutOfMemory(_)) => {
                                    ooms.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                        55..=94 => {
                            if !live.is_empty() {
                                let k = (r >> 8) as usize % live.len();
                                a.free(live.swap_remove(k)).unwrap();
                            }
                        }
                        95..=96 => a.empty_cache().unwrap(),
                        97 => {
                            let st = a.memory_stats();
                            assert!(
                                st["allocated_bytes.all.current"]
                                    <= st["reserved_bytes.all.current"]
                            );
                            assert!(st["reserved_bytes.all.current"] as u64 <= cap);
                        }
                        98 => a.check_invariants().unwrap(),
                        _ => {
                            if t == 0 {
                                // (mostly on)
                                let on = i % 4 != 0;
                                let key = if on { "True" } else { "False" };
                                a.set_config(&format!("release_lock_on_cudamalloc:{key}"))
                                    .unwrap();
                            }
                        }
                    }
                }
                for p in live {
                    a.free(p).unwrap();
                }
            });
        }
    });
    m.set_malloc_hook(None);
    a.check_invariants().unwrap();
    let st = a.stats();
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(st.allocation.all().allocated, st.allocation.all().freed);
    assert_eq!(st.allocated_bytes.all().current, 0);
    assert_eq!(st.active_bytes.all().current, 0);
    assert_eq!(st.requested_bytes.all().current, 0);
    assert!(st.reserved_bytes.all().peak as u64 <= cap);
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    let st = a.stats();
    assert_eq!(st.reserved_bytes.all().current, 0);
    assert_eq!(st.segment.all().current, 0);
    assert_eq!(st.segment.all().allocated, st.segment.all().freed);
    assert!(m.live_segments().is_empty(), "a segment leaked");
    assert_eq!(
        over_cap.load(Ordering::Relaxed),
        0,
        "a malloc passed the cap"
    );
    assert!(a.unlocked_device_calls() > 0);
    println!(
        "{} device calls unlocked, {} out of memory, {} device mallocs, at most {} at once",
        a.unlocked_device_calls(),
        ooms.load(Ordering::Relaxed),
        m.call_count(MockCall::Malloc),
        running[1].load(Ordering::Relaxed)
    );
}
