//! Property test over one enum of operations (alloc, free, record_stream,
//! use on a stream, launch and complete work, empty_cache, set config,
//! memory fraction, injected device failures, bad pointers) with the
//! invariant checker after every operation and the mock's race checker
//! proving that no memory is handed out while another stream may still use it.
//! Work completes when the operations say so, or late on its own
//! (`Completion::Random`, a second property).
//!
//! Every allocation result is checked against a model of when each error
//! may happen:
//!
//! * `Backend` only when an injected backend failure fired during the call
//!   (and then always, with its code);
//! * `OutOfMemory`/`NeverFits` only when an injected OOM fired, or when even
//!   after the full cache flush of the OOM ladder the new segment does not
//!   fit: the device's live bytes after the call (what the flush left) plus
//!   the segment size exceed the capacity or the memory-fraction cap.
//!   Whenever the segment would have fit, the allocation must succeed;
//! * `NeverFits` exactly when the segment exceeds the cap itself;
//! * after any OOM every segment left on the device holds a live allocation
//!   (the flush released the others);
//! * an OOM is stable: after one that no injection caused, retrying the same
//!   request at once (nothing changed; the ladder already synchronised every
//!   event and released every whole free segment) fails again; a success
//!   means the first attempt missed a block it could have used (as without
//!   the re-search of PyTorch #189504). Skipped with `idle_stream_reuse`,
//!   where the first attempt's synchronisation can make a stream idle and so
//!   legitimately lets the retry take its cached segment.
//!
//! `regressions` replays shrunk cases that catch dropping the #189504
//! re-search or the flush deterministically.

use cachalot_conformance::mock::{GIB, MIB};
use cachalot_core::engine::rounding::{allocation_size, round_size};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error};
use cachalot_mock::{Completion, Failure, MockBackend, MockCall, MockConfig, MockStream};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: usize },
    Free { idx: usize },
    FreeBad { idx: usize, offset: u64 },
    RecordStream { idx: usize, stream: usize },
    Use { idx: usize },
    Launch { stream: usize },
    Complete { stream: usize },
    CompleteAll,
    EmptyCache,
    SetConfig { idx: usize },
    Fraction { f: f64 },
    InjectFailure { backend_error: bool },
}

const CONFIGS: &[&str] = &[
    "",
    "max_split_size_mb:40",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6",
    "idle_stream_reuse:True",
    "roundup_power2_divisions:[1:2,>:8],max_split_size_mb:64,max_non_split_rounding_mb:30",
    "large_segment_size_mb:12",
    "placement:pytorch",
    "placement:steady",
];

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..4096,
        3 => 4096u64..(2 * MIB),
        3 => (2 * MIB)..(24 * MIB),
        1 => (24 * MIB)..(160 * MIB),
        1 => Just(0u64),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), 0usize..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => (0usize..64).prop_map(|idx| Op::Free { idx }),
        1 => (0usize..64, 0u64..4).prop_map(|(idx, o)| Op::FreeBad { idx, offset: o * 512 }),
        3 => (0usize..64, 0usize..3).prop_map(|(idx, stream)| Op::RecordStream { idx, stream }),
        3 => (0usize..64).prop_map(|idx| Op::Use { idx }),
        2 => (0usize..3).prop_map(|stream| Op::Launch { stream }),
        2 => (0usize..3).prop_map(|stream| Op::Complete { stream }),
        1 => Just(Op::CompleteAll),
        1 => Just(Op::EmptyCache),
        1 => (0usize..CONFIGS.len()).prop_map(|idx| Op::SetConfig { idx }),
        1 => prop_oneof![Just(1.0f64), Just(0.5), Just(0.25)].prop_map(|f| Op::Fraction { f }),
        1 => any::<bool>().prop_map(|backend_error| Op::InjectFailure { backend_error }),
    ]
}

/// What the model knows about injected `malloc` failures: the one pending
/// (injecting again before it fires replaces it, as the mock does).
#[derive(Default)]
struct Injection {
    pending: Option<Failure>,
    seen: u64,
    /// The call failures are injected into: `Malloc` with fixed segments,
    /// `CreatePhysical` with expandable ones (the configuration in force
    /// when the failure was injected decides).
    call: Option<MockCall>,
}

impl Injection {
    fn call(&self) -> MockCall {
        self.call.unwrap_or(MockCall::Malloc)
    }
}

impl Injection {
    /// The failure that fired since the last call, if one did.
    fn fired(&mut self, m: &MockBackend) -> Result<Option<Failure>, TestCaseError> {
        let now = m.counters().injected;
        let fired = match now - self.seen {
            0 => None,
            1 => {
                let f = self.pending.take();
                prop_assert!(f.is_some(), "a failure fired that the model did not inject");
                f
            }
            n => {
                return Err(TestCaseError::fail(format!(
                    "{n} injected failures fired at once"
                )));
            }
        };
        self.seen = now;
        prop_assert_eq!(
            m.pending_failures(self.call()),
            usize::from(self.pending.is_some()),
            "pending injected failures"
        );
        Ok(fired)
    }
}

/// Checks the result of `allocate(size)` against the model (see the module
/// documentation); `fired` is the injected failure that fired during it.
fn check_alloc(
    m: &MockBackend,
    a: &CachingAllocator<MockBackend>,
    size: u64,
    fraction: f64,
    r: &Result<u64, Error>,
    fired: Option<Failure>,
) -> Result<(), TestCaseError> {
    let config = a.config();
    let rounded = round_size(size, &config);
    let seg = allocation_size(rounded, &config);
    // expandable segments map whole pages (2 MiB small, the large segment
    // size large) and may need fewer when a free block precedes them
    let need = if config.expandable_segments {
        // cachalot's expandable mode (any placement but PyTorch's) maps
        // 2 MiB pages in both pools
        let page =
            if rounded <= MIB || config.placement != cachalot_core::config::Placement::PyTorch {
                2 * MIB
            } else {
                config.large_segment_size
            };
        rounded.div_ceil(page) * page
    } else {
        seg
    };
    let total = m.capacity();
    let cap = if fraction < 1.0 {
        (fraction * total as f64) as u64
    } else {
        total
    };
    let live = m.live_bytes() + m.live_physical_bytes();
    if let Some(Failure::Backend(code)) = fired {
        return match r {
            Err(Error::Backend(e)) if e.code == code => Ok(()),
            other => Err(TestCaseError::fail(format!(
                "an injected backend failure (code {code}) fired, but allocate gave {other:?}"
            ))),
        };
    }
    match r {
        Ok(0) => prop_assert_eq!(size, 0),
        Ok(_) => prop_assert!(size > 0),
        Err(e @ (Error::OutOfMemory(_) | Error::NeverFits { .. })) => {
            prop_assert!(size > 0);
            let never = matches!(e, Error::NeverFits { .. });
            prop_assert_eq!(
                never,
                seg > cap,
                "NeverFits exactly when the {} B segment exceeds the cap {}: {}",
                seg,
                cap,
                e
            );
            prop_assert!(
                fired == Some(Failure::OutOfMemory) || live + seg.max(need) > cap,
                "OOM for {} B (segment {} B) with {} B live of cap {}: the segment fits \
                 after the flush and no failure was injected: {}",
                size,
                seg,
                live,
                cap,
                e
            );
        }
        Err(Error::Backend(e)) => {
            return Err(TestCaseError::fail(format!(
                "backend error without an injected backend failure: {e}"
            )));
        }
        Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
    }
    Ok(())
}

struct Live {
    addr: u64,
    size: u64,
    tag: u64,
    streams: Vec<MockStream>,
}

/// Which segments a run asks for, added to every configuration it sets.
#[derive(Clone, Copy, Debug)]
enum Segments {
    /// Nothing added: the default (expandable on the mock, which has virtual
    /// memory; fixed after `placement:pytorch`, both kinds then coexisting).
    Default,
    /// `expandable_segments:True` everywhere.
    Expandable,
    /// `expandable_segments:False` everywhere.
    Fixed,
    /// `expandable_segments:False,release_lock_on_cudamalloc:True`
    /// everywhere: every device allocation stops the operation for a call
    /// made with the lock released, and goes on after it.
    FixedUnlocked,
}

fn run(ops: Vec<Op>, completion: Completion) -> Result<(), TestCaseError> {
    run_with(ops, completion, Segments::Default)
}

/// [`run`], with the segments asked for added to every configuration.
/// Failures are injected into the call that makes new memory under the
/// configuration in force: `malloc` for fixed segments, `create_physical`
/// for expandable ones.
fn run_with(ops: Vec<Op>, completion: Completion, segments: Segments) -> Result<(), TestCaseError> {
    let m: MockBackend = MockConfig::new(GIB).completion(completion).build();
    let extra = match segments {
        Segments::Default => "",
        Segments::Expandable => ",expandable_segments:True",
        Segments::Fixed => ",expandable_segments:False",
        Segments::FixedUnlocked => ",expandable_segments:False,release_lock_on_cudamalloc:True",
    };
    // `extra` without its comma
    let conf = AllocatorConfig::parse(&extra[extra.len().min(1)..]).unwrap();
    let a = CachingAllocator::with_config(m.clone(), conf).unwrap();
    let streams = [m.default_stream(), m.create_stream(), m.create_stream()];
    let mut live: Vec<Live> = Vec::new();
    let mut freed: Vec<u64> = Vec::new();
    let mut next_tag = 1u64;
    let mut inj = Injection::default();
    let mut fraction = 1.0f64;
    for op in ops {
        match op {
            Op::Alloc { size, stream } => {
                let s = streams[stream];
                let r = a.allocate(size, s);
                let fired = inj.fired(&m)?;
                check_alloc(&m, &a, size, fraction, &r, fired)?;
                let oom = matches!(r, Err(Error::OutOfMemory(_) | Error::NeverFits { .. }));
                if oom {
                    // the ladder's last rung synchronised every event and
                    // released every whole free segment
                    for (base, len) in m.live_segments() {
                        prop_assert!(
                            live.iter().any(|l| l.addr >= base && l.addr < base + len),
                            "segment {:#x} (+{}) has no live allocation after the OOM flush",
                            base,
                            len
                        );
                    }
                }
                if oom && fired.is_none() && inj.pending.is_none() && !a.config().idle_stream_reuse
                {
                    let again = a.allocate(size, s);
                    prop_assert!(inj.fired(&m)?.is_none());
                    prop_assert!(
                        matches!(again, Err(Error::OutOfMemory(_) | Error::NeverFits { .. })),
                        "OOM for {} B, then the same request at once gave {:?}",
                        size,
                        again.map(|p| format!("{p:#x}"))
                    );
                }
                match r {
                    Ok(0) => {}
                    Ok(addr) => {
                        // the kernel that fills the new block runs on its stream
                        m.use_memory(s, addr, size, next_tag).unwrap();
                        live.push(Live {
                            addr,
                            size,
                            tag: next_tag,
                            streams: vec![s],
                        });
                        next_tag += 1;
                    }
                    Err(_) => {}
                }
            }
            Op::Free { idx } if !live.is_empty() => {
                let l = live.swap_remove(idx % live.len());
                a.free(l.addr).unwrap();
                freed.push(l.addr);
            }
            Op::Free { .. } => {}
            Op::FreeBad { idx, offset } => {
                if let Some(&p) = freed.get(idx % freed.len().max(1))
                    && !live.iter().any(|l| l.addr == p + offset)
                {
                    let e = a.free(p + offset).unwrap_err();
                    // inside a block reused by a live allocation: interior
                    let interior_of_live = matches!(e, Error::InteriorPointer { block, .. }
                        if live.iter().any(|l| l.addr == block));
                    prop_assert!(
                        interior_of_live
                            || matches!(e, Error::DoubleFree(_) | Error::UnknownPointer(_)),
                        "{e}"
                    );
                }
                let e = a.free(0x10_0000_0000_0000 + offset).unwrap_err();
                prop_assert!(matches!(e, Error::UnknownPointer(_)));
            }
            Op::RecordStream { idx, stream } if !live.is_empty() => {
                let n = live.len();
                let l = &mut live[idx % n];
                // as user code does: side.wait_stream(alloc_stream); t.record_stream(side)
                let e = m.create_event().unwrap();
                m.record_event(&e, l.streams[0]).unwrap();
                m.stream_wait_event(streams[stream], &e).unwrap();
                m.destroy_event(e).unwrap();
                a.record_stream(l.addr, streams[stream]).unwrap();
                if !l.streams.contains(&streams[stream]) {
                    l.streams.push(streams[stream]);
                }
            }
            Op::Use { idx } if !live.is_empty() => {
                // a kernel on one of the streams the block is known to be used on
                let l = &live[idx % live.len()];
                let s = l.streams[(idx / live.len().max(1)) % l.streams.len()];
                m.use_memory(s, l.addr, l.size, l.tag).unwrap();
            }
            Op::RecordStream { .. } | Op::Use { .. } => {}
            Op::Launch { stream } => {
                m.launch(streams[stream]).unwrap();
            }
            Op::Complete { stream } => m.complete(streams[stream]).unwrap(),
            Op::CompleteAll => m.complete_all(),
            Op::EmptyCache => a.empty_cache().unwrap(),
            Op::SetConfig { idx } => {
                let c = match (CONFIGS[idx], &extra[extra.len().min(1)..]) {
                    (c, "") => c.to_string(),
                    ("", x) => x.to_string(),
                    (c, x) => format!("{c},{x}"),
                };
                a.set_config(&c).unwrap();
                // a new configuration brings its own fraction (1 by default)
                fraction = a.config().per_process_memory_fraction;
            }
            Op::Fraction { f } => {
                a.set_memory_fraction(f).unwrap();
                fraction = f;
            }
            Op::InjectFailure { backend_error } => {
                let f = if backend_error {
                    Failure::Backend(999)
                } else {
                    Failure::OutOfMemory
                };
                // the call that makes new memory under the configuration in
                // force; a failure still pending on the other one is dropped
                let call = if a.config().expandable_segments {
                    MockCall::CreatePhysical
                } else {
                    MockCall::Malloc
                };
                if inj.pending.is_some() && inj.call() != call {
                    m.clear_failures_of(inj.call());
                }
                inj.call = Some(call);
                m.fail_call_at_with(call, 1, f);
                inj.pending = Some(f);
            }
        }
        // only allocations call malloc
        prop_assert!(
            inj.fired(&m)?.is_none(),
            "an injected failure fired outside allocate"
        );
        if let Err(e) = a.check_invariants() {
            return Err(TestCaseError::fail(format!("invariant violated: {e}")));
        }
        prop_assert_eq!(
            m.race_count(),
            0,
            "race: {}",
            m.races().first().map(|r| r.to_string()).unwrap_or_default()
        );
        // recycling never unmaps a page whose work is pending (completion
        // fences, the hard cap's synchronization)
        prop_assert_eq!(m.counters().unmap_refused, 0);
    }
    for l in live.drain(..) {
        a.free(l.addr).unwrap();
    }
    m.clear_failures();
    m.complete_all();
    a.empty_cache().unwrap();
    a.check_invariants().map_err(TestCaseError::fail)?;
    let s = a.stats();
    prop_assert_eq!(s.reserved_bytes.all().current, 0);
    prop_assert_eq!(s.active.all().current, 0);
    prop_assert!(
        m.live_segments().is_empty(),
        "leaked segments {:?}",
        m.live_segments()
    );
    prop_assert_eq!(m.race_count(), 0);
    drop(a);
    prop_assert_eq!(m.live_events(), 0);
    prop_assert!(m.vmm_usage().is_empty(), "leaked virtual memory");
    Ok(())
}

/// Cases per property: 1,024 (CI), or `PROPTEST_CASES` when set.
fn cases() -> u32 {
    cachalot_conformance::proptest_cases(1024)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            cachalot_conformance::proptest_regressions("proptest_ops"),
        ))),
        ..ProptestConfig::default()
    })]
    #[test]
    fn random_operations_keep_every_invariant(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops, Completion::Manual)?;
    }

    #[test]
    fn random_operations_keep_every_invariant_under_late_completion(
        seed in any::<u64>(),
        max_delay_ops in 0u32..24,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run(ops, Completion::Random { seed, max_delay_ops })?;
    }

    #[test]
    fn random_operations_keep_every_invariant_with_expandable_segments(
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_with(ops, Completion::Manual, Segments::Expandable)?;
    }

    #[test]
    fn random_operations_keep_every_invariant_with_expandable_segments_late_completion(
        seed in any::<u64>(),
        max_delay_ops in 0u32..24,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_with(ops, Completion::Random { seed, max_delay_ops }, Segments::Expandable)?;
    }

    #[test]
    fn random_operations_keep_every_invariant_with_fixed_segments(
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_with(ops, Completion::Manual, Segments::Fixed)?;
    }

    #[test]
    fn random_operations_keep_every_invariant_with_fixed_segments_late_completion(
        seed in any::<u64>(),
        max_delay_ops in 0u32..24,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_with(ops, Completion::Random { seed, max_delay_ops }, Segments::Fixed)?;
    }

    #[test]
    fn random_operations_keep_every_invariant_with_the_lock_released_around_malloc(
        seed in any::<u64>(),
        max_delay_ops in 0u32..24,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_with(ops, Completion::Random { seed, max_delay_ops }, Segments::FixedUnlocked)?;
    }
}

/// Shrunk cases that catch known engine mistakes deterministically (random
/// cases find them only now and then), each in the segments it was found in.
mod regressions {
    use super::*;
    use Op::*;

    /// Without the re-search after synchronising every event (PyTorch
    /// #189504) the 1 MiB + 1 B request on stream 2 fails with OOM, and an
    /// immediate retry succeeds from the block the synchronisation freed.
    #[test]
    fn oom_ladder_searches_again_after_synchronising() {
        let ops = vec![
            Alloc { size: 1, stream: 0 },
            Alloc { size: 1, stream: 0 },
            Alloc { size: 1, stream: 0 },
            Free { idx: 0 },
            Alloc { size: 1, stream: 0 },
            Alloc {
                size: 2097152,
                stream: 0,
            },
            Free { idx: 12 },
            Free { idx: 1 },
            Alloc { size: 1, stream: 0 },
            Alloc { size: 1, stream: 0 },
            Free { idx: 1 },
            FreeBad { idx: 0, offset: 0 },
            Free { idx: 4 },
            Fraction { f: 0.25 },
            Alloc { size: 1, stream: 0 },
            Free { idx: 1 },
            Alloc {
                size: 119537665,
                stream: 2,
            },
            RecordStream { idx: 17, stream: 0 },
            Alloc {
                size: 88080385,
                stream: 0,
            },
            Free { idx: 38 },
            Alloc {
                size: 1048577,
                stream: 1,
            },
            Alloc {
                size: 1048577,
                stream: 2,
            },
            Alloc {
                size: 1048577,
                stream: 2,
            },
        ];
        run_with(ops, Completion::Manual, Segments::Fixed).unwrap();
    }

    /// Expandable segments under a memory fraction, `max_split_size_mb:40`:
    /// the 1 MiB + 1 B request on stream 0 cannot take the 42 MiB free
    /// block (oversize), and the 20 MiB segment it would get is over the
    /// cap. Releasing the cache unmaps that block's whole pages and leaves
    /// a mapped 2 MiB edge that fits: without a search after the release
    /// (PyTorch 2.11 has none) the request fails with OOM, and the same
    /// request at once succeeds from that edge.
    #[test]
    fn expandable_oom_is_final() {
        let ops = vec![
            Alloc { size: 1, stream: 0 },
            Alloc { size: 1, stream: 0 },
            Alloc {
                size: 138412033,
                stream: 0,
            },
            InjectFailure {
                backend_error: true,
            },
            Free { idx: 9 },
            Alloc { size: 1, stream: 0 },
            Alloc { size: 1, stream: 1 },
            Alloc {
                size: 10485761,
                stream: 2,
            },
            Alloc {
                size: 88110081,
                stream: 1,
            },
            Alloc {
                size: 2066945,
                stream: 1,
            },
            Alloc { size: 1, stream: 0 },
            Alloc {
                size: 41942529,
                stream: 0,
            },
            SetConfig { idx: 1 },
            Alloc { size: 1, stream: 1 },
            Fraction { f: 0.25 },
            Alloc { size: 1, stream: 0 },
            Alloc { size: 1, stream: 1 },
            Free { idx: 7 },
            Free { idx: 6 },
            Alloc {
                size: 1048577,
                stream: 0,
            },
        ];
        run_with(
            ops,
            Completion::Random {
                seed: 0,
                max_delay_ops: 0,
            },
            Segments::Expandable,
        )
        .unwrap();
    }

    /// Without releasing the cache before the last device call, the 78 MiB
    /// request fails with OOM while a whole free segment stays cached.
    #[test]
    fn oom_ladder_releases_the_cache() {
        let ops = vec![
            Alloc {
                size: 2097152,
                stream: 0,
            },
            Alloc {
                size: 1048577,
                stream: 1,
            },
            SetConfig { idx: 1 },
            Alloc {
                size: 102760449,
                stream: 0,
            },
            Alloc {
                size: 142606337,
                stream: 0,
            },
            Free { idx: 1 },
            Free { idx: 1 },
            Free { idx: 1 },
            Fraction { f: 0.25 },
            Alloc {
                size: 81788929,
                stream: 0,
            },
        ];
        run_with(ops, Completion::Manual, Segments::Fixed).unwrap();
    }
}
