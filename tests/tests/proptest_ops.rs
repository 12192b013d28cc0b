//! Property test over one enum of operations (alloc, free, record_stream,
//! use on a stream, launch and complete work, empty_cache, set config,
//! memory fraction, injected device failures, bad pointers) with the
//! invariant checker after every operation and the mock's race checker
//! proving that no memory is handed out while another stream may still use it.

use cachalot_conformance::mock::{GIB, MIB};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error};
use cachalot_mock::{MallocFailure, MockBackend, MockConfig, MockStream};
use proptest::prelude::*;

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

struct Live {
    addr: u64,
    size: u64,
    tag: u64,
    streams: Vec<MockStream>,
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let m: MockBackend = MockConfig::new(GIB).auto_complete(false).build();
    let a = CachingAllocator::with_config(m.clone(), AllocatorConfig::default()).unwrap();
    let streams = [m.default_stream(), m.create_stream(), m.create_stream()];
    let mut live: Vec<Live> = Vec::new();
    let mut freed: Vec<u64> = Vec::new();
    let mut next_tag = 1u64;
    for op in ops {
        match op {
            Op::Alloc { size, stream } => {
                let s = streams[stream];
                match a.allocate(size, s) {
                    Ok(0) => prop_assert_eq!(size, 0),
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
                    Err(Error::OutOfMemory(_))
                    | Err(Error::NeverFits { .. })
                    | Err(Error::Backend(_)) => {}
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
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
            Op::SetConfig { idx } => a.set_config(CONFIGS[idx]).unwrap(),
            Op::Fraction { f } => a.set_memory_fraction(f).unwrap(),
            Op::InjectFailure { backend_error } => {
                let f = if backend_error {
                    MallocFailure::Backend(999)
                } else {
                    MallocFailure::OutOfMemory
                };
                m.fail_malloc_at_with(1, f);
            }
        }
        if let Err(e) = a.check_invariants() {
            return Err(TestCaseError::fail(format!("invariant violated: {e}")));
        }
        prop_assert_eq!(
            m.race_count(),
            0,
            "race: {}",
            m.races().first().map(|r| r.to_string()).unwrap_or_default()
        );
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
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn random_operations_keep_every_invariant(ops in proptest::collection::vec(op(), 1..200)) {
        run(ops)?;
    }
}
