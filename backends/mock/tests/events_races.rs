//! Streams, work completion, events and the eager race checker.

use cachalot_core::Backend;
use cachalot_mock::{MockBackend, MockConfig, MockStream, Submitted, codes};

const M: u64 = 1 << 20;

fn dev() -> (MockBackend, MockStream, MockStream, MockStream) {
    let d = MockBackend::new(1 << 30);
    let a = d.create_stream();
    let b = d.create_stream();
    let c = d.create_stream();
    (d, a, b, c)
}

#[test]
fn streams_and_work_ids() {
    let (d, a, b, _) = dev();
    assert_eq!(d.default_stream(), MockStream(0));
    assert_eq!((a, b), (MockStream(1), MockStream(2)));
    assert_eq!(d.stream_count(), 4);
    assert_eq!(d.launch(a).unwrap(), Submitted::Work { stream: a, seq: 1 });
    assert_eq!(d.launch(a).unwrap(), Submitted::Work { stream: a, seq: 2 });
    assert_eq!(d.pending(a).unwrap(), 2);
    d.complete_n(a, 1).unwrap();
    assert_eq!((d.submitted(a).unwrap(), d.completed(a).unwrap()), (2, 1));
    d.complete(a).unwrap();
    assert_eq!(d.pending(a).unwrap(), 0);
    let e = d.launch(MockStream(99)).unwrap_err();
    assert_eq!(e.code, codes::INVALID_RESOURCE_HANDLE);
    assert!(d.complete(MockStream(99)).is_err());
}

#[test]
fn events_follow_work_completion() {
    let (d, a, _, _) = dev();
    let e = d.create_event().unwrap();
    assert!(d.query_event(&e).unwrap(), "never recorded: complete");
    d.launch(a).unwrap();
    d.launch(a).unwrap();
    d.record_event(&e, a).unwrap();
    d.launch(a).unwrap();
    assert!(!d.query_event(&e).unwrap());
    d.complete_n(a, 1).unwrap();
    assert!(!d.query_event(&e).unwrap());
    d.complete_n(a, 1).unwrap();
    assert!(d.query_event(&e).unwrap());
    assert_eq!(d.pending(a).unwrap(), 1, "work after the record is pending");
    // Re-record: the event now stands for the later work.
    d.record_event(&e, a).unwrap();
    assert!(!d.query_event(&e).unwrap());
    d.synchronize_event(&e).unwrap();
    assert!(d.query_event(&e).unwrap());
    assert_eq!(d.pending(a).unwrap(), 0);
    d.destroy_event(e).unwrap();
    let c = d.counters();
    assert_eq!(
        (
            c.create_event,
            c.record_event,
            c.query_event,
            c.synchronize_event,
            c.destroy_event
        ),
        (1, 2, 6, 1, 1)
    );
}

#[test]
fn synchronize_event_completes_only_up_to_the_record() {
    let (d, a, _, _) = dev();
    let e = d.create_event().unwrap();
    d.launch(a).unwrap();
    d.record_event(&e, a).unwrap();
    d.launch(a).unwrap();
    d.launch(a).unwrap();
    d.synchronize_event(&e).unwrap();
    assert_eq!(d.completed(a).unwrap(), 1);
    assert_eq!(d.pending(a).unwrap(), 2);
    d.destroy_event(e).unwrap();
}

#[test]
fn completion_cascades_through_waits() {
    let (d, a, b, c) = dev();
    let ea = d.create_event().unwrap();
    let eb = d.create_event().unwrap();
    d.launch(a).unwrap();
    d.launch(a).unwrap();
    d.record_event(&ea, a).unwrap();
    d.launch(a).unwrap(); // not awaited
    d.stream_wait_event(b, &ea).unwrap();
    d.launch(b).unwrap();
    d.record_event(&eb, b).unwrap();
    d.stream_wait_event(c, &eb).unwrap();
    d.launch(c).unwrap();
    d.complete(c).unwrap();
    assert_eq!(d.completed(b).unwrap(), 1);
    assert_eq!(
        d.completed(a).unwrap(),
        2,
        "only what c transitively waited for"
    );
    assert!(d.query_event(&ea).unwrap());
    assert!(d.query_event(&eb).unwrap());
    d.synchronize_device().unwrap();
    assert_eq!(d.pending(a).unwrap(), 0);
    d.destroy_event(ea).unwrap();
    d.destroy_event(eb).unwrap();
}

#[test]
fn bad_events_are_errors() {
    let (d, a, _, _) = dev();
    let e = d.create_event().unwrap();
    let copy = e.clone();
    d.destroy_event(e).unwrap();
    for r in [
        d.query_event(&copy).map(|_| ()),
        d.record_event(&copy, a),
        d.synchronize_event(&copy),
        d.stream_wait_event(a, &copy),
        d.destroy_event(copy.clone()),
    ] {
        assert_eq!(r.unwrap_err().code, codes::INVALID_RESOURCE_HANDLE);
    }
    let other = MockBackend::new(1 << 30);
    let foreign = other.create_event().unwrap();
    let err = d.query_event(&foreign).unwrap_err();
    assert!(err.message.contains("another"), "{err}");
    assert_eq!(d.live_events(), 0);
    assert_eq!(other.live_events(), 1);
}

#[test]
fn auto_complete_mode() {
    let d = MockConfig::new(1 << 30).auto_complete(true).build();
    let a = d.create_stream();
    let b = d.create_stream();
    let e = d.create_event().unwrap();
    d.launch(a).unwrap();
    d.record_event(&e, a).unwrap();
    assert!(d.query_event(&e).unwrap());
    let p = d.malloc(2 * M).unwrap();
    d.use_memory(a, p, 512, 1).unwrap();
    d.use_memory(b, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 0);
    assert_eq!(d.tracked_uses(), 0);
    // Switching it off keeps pending work pending.
    d.set_auto_complete(false);
    d.launch(a).unwrap();
    assert_eq!(d.pending(a).unwrap(), 1);
    d.set_auto_complete(true);
    assert_eq!(d.pending(a).unwrap(), 0);
    d.destroy_event(e).unwrap();
}

#[test]
fn unordered_use_on_another_stream_is_a_race() {
    let (d, a, b, _) = dev();
    let p = d.malloc(4 * M).unwrap();
    let w = d.use_memory(a, p, 2048, 1).unwrap();
    let w2 = d.use_memory(b, p + 1024, 4096, 2).unwrap();
    let races = d.races();
    assert_eq!(races.len(), 1);
    let r = races[0];
    assert_eq!(r.earlier.at, w);
    assert_eq!(r.later.at, w2);
    assert_eq!((r.earlier.tag, r.later.tag), (1, 2));
    assert_eq!((r.earlier.stream, r.later.stream), (a, b));
    assert_eq!(r.overlap, (p + 1024, p + 2048));
    assert_eq!(r.capture_id, None);
    assert!(r.to_string().contains("race"));
    d.clear_races();
    assert_eq!(d.race_count(), 0);
}

#[test]
fn ordered_uses_are_not_races() {
    let (d, a, b, _) = dev();
    let p = d.malloc(4 * M).unwrap();
    // Same stream: stream order.
    d.use_memory(a, p, 512, 1).unwrap();
    d.use_memory(a, p, 512, 2).unwrap();
    // Same tag on another stream: same allocation, not a reuse.
    d.use_memory(a, p + 8192, 512, 5).unwrap();
    d.use_memory(b, p + 8192, 512, 5).unwrap();
    // Disjoint bytes.
    d.use_memory(b, p + 512, 512, 3).unwrap();
    assert_eq!(d.race_count(), 0);
    // B waits on an event recorded after A's use.
    let e = d.create_event().unwrap();
    d.use_memory(a, p + 4096, 512, 10).unwrap();
    d.record_event(&e, a).unwrap();
    d.stream_wait_event(b, &e).unwrap();
    d.use_memory(b, p + 4096, 512, 11).unwrap();
    assert_eq!(d.race_count(), 0);
    d.destroy_event(e).unwrap();
}

#[test]
fn event_recorded_before_the_use_does_not_order_it() {
    let (d, a, b, _) = dev();
    let p = d.malloc(4 * M).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(&e, a).unwrap();
    d.use_memory(a, p, 512, 1).unwrap();
    d.stream_wait_event(b, &e).unwrap();
    d.use_memory(b, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 1);
    d.destroy_event(e).unwrap();
}

#[test]
fn completed_work_is_visible_to_later_work() {
    let (d, a, b, _) = dev();
    let p = d.malloc(4 * M).unwrap();
    d.use_memory(a, p, 512, 1).unwrap();
    d.complete(a).unwrap();
    d.use_memory(b, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 0);
    // Completion after the later use's submission does not help.
    d.use_memory(a, p + 512, 512, 3).unwrap();
    d.use_memory(b, p + 512, 512, 4).unwrap();
    d.complete_all();
    assert_eq!(d.race_count(), 1);
}

#[test]
fn happens_before_is_transitive() {
    let (d, a, b, c) = dev();
    let p = d.malloc(4 * M).unwrap();
    let ea = d.create_event().unwrap();
    let eb = d.create_event().unwrap();
    d.use_memory(a, p, 512, 1).unwrap();
    d.record_event(&ea, a).unwrap();
    d.stream_wait_event(b, &ea).unwrap();
    d.launch(b).unwrap();
    d.record_event(&eb, b).unwrap();
    d.stream_wait_event(c, &eb).unwrap();
    d.use_memory(c, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 0);
    d.destroy_event(ea).unwrap();
    d.destroy_event(eb).unwrap();
}

#[test]
fn same_tag_subsumption_keeps_races_visible() {
    // X(tag1, a) -> Y(tag1, b) ordered; Z(tag2, c) unordered with both.
    let (d, a, b, c) = dev();
    let p = d.malloc(4 * M).unwrap();
    let e = d.create_event().unwrap();
    d.use_memory(a, p, 512, 1).unwrap();
    d.record_event(&e, a).unwrap();
    d.stream_wait_event(b, &e).unwrap();
    d.use_memory(b, p, 512, 1).unwrap();
    d.use_memory(c, p, 512, 2).unwrap();
    assert!(d.race_count() >= 1);
    assert!(d.races().iter().all(|r| r.later.stream == c));
    d.destroy_event(e).unwrap();
}

#[test]
fn the_record_stream_hazard() {
    // A block used on a side stream, freed and handed to the main stream
    // before the side stream's work completed: the mock reports the race
    // unless the allocator waited for an event on the side stream.
    let (d, main, side, _) = dev();
    let seg = d.malloc(2 * M).unwrap();
    d.use_memory(main, seg, 4096, 1).unwrap();
    d.use_memory(side, seg, 4096, 1).unwrap(); // record_stream'ed use
    let e = d.create_event().unwrap();
    d.record_event(&e, side).unwrap();
    // Correct allocator: query the event before reuse.
    assert!(!d.query_event(&e).unwrap());
    d.complete(side).unwrap();
    assert!(d.query_event(&e).unwrap());
    d.use_memory(main, seg, 4096, 2).unwrap();
    assert_eq!(d.race_count(), 0);
    // Buggy allocator: reuse while the side stream is still busy.
    d.use_memory(side, seg + 8192, 4096, 3).unwrap();
    d.use_memory(main, seg + 8192, 4096, 4).unwrap();
    assert_eq!(d.race_count(), 1);
    d.destroy_event(e).unwrap();
}

#[test]
fn uses_must_be_inside_live_segments_and_free_forgets_them() {
    let (d, a, b, _) = dev();
    let p = d.malloc(2 * M).unwrap();
    assert_eq!(
        d.use_memory(a, p + 2 * M - 512, 1024, 1).unwrap_err().code,
        codes::INVALID_DEVICE_POINTER
    );
    assert_eq!(
        d.use_memory(a, p, 0, 1).unwrap_err().code,
        codes::INVALID_VALUE
    );
    d.use_memory(a, p, 512, 1).unwrap();
    d.free(p, 2 * M).unwrap();
    assert!(d.use_memory(a, p, 512, 1).is_err(), "use after free");
    let q = d.malloc(2 * M).unwrap();
    assert_eq!(q, p, "same place again");
    d.use_memory(b, q, 512, 2).unwrap();
    assert_eq!(d.race_count(), 0);
}

#[test]
fn race_checking_can_be_disabled() {
    let d = MockConfig::new(1 << 30).race_checking(false).build();
    let a = d.create_stream();
    let b = d.create_stream();
    let p = d.malloc(2 * M).unwrap();
    d.use_memory(a, p, 512, 1).unwrap();
    d.use_memory(b, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 0);
    d.set_race_checking(true);
    d.use_memory(a, p, 512, 1).unwrap();
    d.use_memory(b, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 1);
}

#[test]
fn hundred_thousand_uses_stay_cheap() {
    let d = MockBackend::new(64 << 30);
    let streams: Vec<_> = (0..4).map(|_| d.create_stream()).collect();
    let segs: Vec<u64> = (0..64).map(|_| d.malloc(20 * M).unwrap()).collect();
    let ev = d.create_event().unwrap();
    let t = std::time::Instant::now();
    let mut x: u64 = 1;
    for i in 0..100_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let s = streams[(x >> 60) as usize % 4];
        let seg = segs[(x >> 40) as usize % segs.len()];
        let off = ((x >> 20) % 16) * M;
        // Tags are per (segment, slot, stream): no two streams share a tag,
        // so every unordered overlap would be a race; order them all.
        for &o in &streams {
            if o != s {
                d.record_event(&ev, o).unwrap();
                d.stream_wait_event(s, &ev).unwrap();
            }
        }
        d.use_memory(s, seg + off, 2 * M, i).unwrap();
        if i % 1000 == 0 {
            d.complete_all();
        }
    }
    assert_eq!(d.race_count(), 0);
    d.complete_all();
    d.launch(streams[0]).unwrap();
    assert!(d.tracked_uses() < 200_000, "{}", d.tracked_uses());
    let secs = t.elapsed().as_secs_f64();
    assert!(secs < 30.0, "took {secs} s");
    d.destroy_event(ev).unwrap();
}
