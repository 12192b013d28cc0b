//! Late completion (`Completion::Random`), per-device address ranges and the
//! simulated contents of memory (tags last written).

use cachalot_core::Backend;
use cachalot_mock::{
    Completion, DEFAULT_BASE_ADDRESS, DEVICE_ADDRESS_STRIDE, MockBackend, MockConfig, MockStream,
    codes,
};

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn late(seed: u64, max_delay_ops: u32) -> MockBackend {
    MockConfig::new(G)
        .completion(Completion::Random {
            seed,
            max_delay_ops,
        })
        .build()
}

/// Submits `n` units on `s`, then makes host calls until all complete;
/// returns the clock ticks (after the submissions) at which the completed
/// count changed, as `(ticks, completed)`.
fn completion_trace(d: &MockBackend, s: MockStream, n: u64) -> Vec<(u64, u64)> {
    for _ in 0..n {
        d.launch(s).unwrap();
    }
    let t0 = d.op_clock();
    let mut trace = Vec::new();
    let mut last = d.completed(s).unwrap();
    while d.pending(s).unwrap() > 0 {
        d.memory_info().unwrap();
        let c = d.completed(s).unwrap();
        if c != last {
            trace.push((d.op_clock() - t0, c));
            last = c;
        }
        assert!(d.op_clock() - t0 < 10_000, "late work never completed");
    }
    trace
}

#[test]
fn late_work_completes_within_its_delay_and_in_order() {
    for seed in 0..20 {
        let d = late(seed, 7);
        let s = d.create_stream();
        let e = d.create_event().unwrap();
        d.launch(s).unwrap();
        let submitted_at = d.op_clock();
        assert_eq!(d.pending(s).unwrap(), 1, "never complete at submission");
        // record_event is the first op after submission: the unit may be done.
        d.record_event(&e, s).unwrap();
        let mut done_at = None;
        for _ in 0..8 {
            if d.query_event(&e).unwrap() {
                done_at = Some(d.op_clock() - submitted_at);
                break;
            }
        }
        let k = done_at.expect("complete within max_delay_ops + 1 operations");
        assert!((2..=8).contains(&k), "seed {seed}: {k}");
        // Many units: completions move forward only, and all finish.
        let trace = completion_trace(&d, s, 50);
        assert!(trace.windows(2).all(|w| w[0].1 < w[1].1));
        assert_eq!(trace.last().unwrap().1, 51);
        d.destroy_event(e).unwrap();
    }
}

#[test]
fn late_completion_is_deterministic_and_varies_with_the_seed() {
    let run = |seed| {
        let d = late(seed, 5);
        let s = d.create_stream();
        completion_trace(&d, s, 40)
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn zero_delay_completes_at_the_next_operation() {
    let d = late(3, 0);
    let s = d.create_stream();
    d.launch(s).unwrap();
    assert_eq!(d.pending(s).unwrap(), 1);
    d.memory_info().unwrap();
    assert_eq!(d.pending(s).unwrap(), 0);
}

#[test]
fn late_completion_cascades_and_leaves_ordering_to_events() {
    // Work on s2 waits on s1's work: s2 completing completes s1's too, and
    // an unordered use of the same bytes on s2 while s1's is pending races.
    let d = late(11, 30);
    let (s1, s2) = (d.create_stream(), d.create_stream());
    let p = d.malloc(2 * M).unwrap();
    d.use_memory(s1, p, 1024, 1).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(&e, s1).unwrap();
    d.stream_wait_event(s2, &e).unwrap();
    d.use_memory(s2, p, 1024, 2).unwrap();
    assert_eq!(d.race_count(), 0, "ordered through the event");
    d.complete(s2).unwrap();
    assert_eq!(d.pending(s1).unwrap(), 0, "completing s2 completed s1");
    let s3 = d.create_stream();
    d.use_memory(s1, p, 1024, 3).unwrap();
    d.use_memory(s3, p, 1024, 4).unwrap();
    assert_eq!(
        d.race_count(),
        1,
        "s1's new work is still pending: s3 races with it"
    );
    d.destroy_event(e).unwrap();
}

#[test]
fn completion_modes_switch() {
    let d = MockBackend::new(G);
    assert_eq!(d.completion(), Completion::Manual);
    let s = d.create_stream();
    d.launch(s).unwrap();
    d.set_completion(Completion::Random {
        seed: 1,
        max_delay_ops: 0,
    });
    d.launch(s).unwrap();
    d.memory_info().unwrap();
    assert_eq!(
        d.completed(s).unwrap(),
        2,
        "in order: the first completes too"
    );
    d.set_completion(Completion::Manual);
    d.launch(s).unwrap();
    for _ in 0..5 {
        d.memory_info().unwrap();
    }
    assert_eq!(d.pending(s).unwrap(), 1, "manual again");
    d.set_auto_complete(true);
    assert_eq!(d.completion(), Completion::Immediate);
    assert!(d.auto_complete());
    assert_eq!(d.pending(s).unwrap(), 0);
    let cfg = MockConfig::new(G).auto_complete(true);
    assert_eq!(cfg.completion, Completion::Immediate);
}

#[test]
fn each_device_has_its_own_range() {
    let d0 = MockConfig::new(G).device(0).build();
    assert_eq!(d0.address_range(), (DEFAULT_BASE_ADDRESS, 1 << 40));
    let mut ranges = vec![d0.address_range()];
    for i in 1..8 {
        let d = MockConfig::new(80 * G).device(i).build();
        let (base, size) = d.address_range();
        assert_eq!(
            base,
            DEFAULT_BASE_ADDRESS + u64::from(i) * DEVICE_ADDRESS_STRIDE
        );
        assert_eq!(size, 1 << 40);
        ranges.push((base, size));
    }
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            assert!(a.0 + a.1 <= b.0, "{a:?} and {b:?} overlap");
        }
    }
    // A huge device's default range is capped at half the stride (still
    // disjoint), the other half left to virtual-memory reservations.
    let huge = MockConfig::new(8 << 40).device(1).build();
    assert_eq!(huge.address_range().1, DEVICE_ADDRESS_STRIDE / 2);
    let (lo, hi) = huge.reservation_range();
    assert_eq!(hi - lo, DEVICE_ADDRESS_STRIDE / 2);
    // An explicit base is used as given, on any device.
    let at = MockConfig::new(G).device(5).base_address(1 << 40).build();
    assert_eq!(at.address_range().0, 1 << 40);
}

#[test]
fn pointers_of_one_device_are_unknown_to_another() {
    let d0 = MockConfig::new(G).device(0).build();
    let d1 = MockConfig::new(G).device(1).build();
    let p0 = d0.malloc(2 * M).unwrap();
    let p1 = d1.malloc(2 * M).unwrap();
    assert_ne!(p0, p1);
    assert_eq!(p1 - p0, DEVICE_ADDRESS_STRIDE, "same placement, own range");
    let e = d1.free(p0, 2 * M).unwrap_err();
    assert_eq!(e.code, codes::INVALID_DEVICE_POINTER);
    assert_eq!(d1.live_segments(), vec![(p1, 2 * M)]);
    assert_eq!(d0.live_segments(), vec![(p0, 2 * M)]);
    assert!(d1.use_memory(d1.default_stream(), p0, 512, 1).is_err());
}

#[test]
fn memory_keeps_the_tags_last_written() {
    let d = MockBackend::new(G);
    let (s1, s2) = (d.create_stream(), d.create_stream());
    let p = d.malloc(4 * M).unwrap();
    assert_eq!(d.read_tags(p, 4096).unwrap(), vec![(p, p + 4096, None)]);
    d.use_memory(s1, p, 4096, 7).unwrap();
    d.use_memory(s1, p + 1024, 1024, 8).unwrap();
    assert_eq!(
        d.read_tags(p, 8192).unwrap(),
        vec![
            (p, p + 1024, Some(7)),
            (p + 1024, p + 2048, Some(8)),
            (p + 2048, p + 4096, Some(7)),
            (p + 4096, p + 8192, None),
        ]
    );
    assert_eq!(d.tag_at(p + 1500), Some(8));
    assert_eq!(d.tag_at(p + 5000), None);
    assert_eq!(d.tag_at(p + 4 * M), None, "outside the segment");
    assert_eq!(
        d.read_tags(p + 4 * M - 512, 1024).unwrap_err().code,
        codes::INVALID_DEVICE_POINTER
    );
    // Uses inside a capture write nothing until the graph is launched.
    d.begin_capture(s2).unwrap();
    d.use_memory(s2, p, 512, 9).unwrap();
    let g = d.end_capture(s2).unwrap();
    assert_eq!(d.tag_at(p), Some(7));
    d.complete_all();
    d.launch_graph(&g, s2).unwrap();
    assert_eq!(d.tag_at(p), Some(9));
    // Freeing forgets the contents: a new segment at the same address is blank.
    d.complete_all();
    d.free(p, 4 * M).unwrap();
    let q = d.malloc(4 * M).unwrap();
    assert_eq!(q, p);
    assert_eq!(d.read_tags(q, 4 * M).unwrap(), vec![(q, q + 4 * M, None)]);
    assert!(d.capture().is_some());
}
