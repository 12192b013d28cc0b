//! Property tests: the race checker against naive oracles that keep every
//! use and compare all pairs.

#![allow(clippy::needless_range_loop)] // index loops read best in the oracle

use cachalot_core::{Backend, CaptureStatus, DependencyUpdate};
#[allow(unused_imports)]
use cachalot_core::{CaptureQuery as _, GraphCapture as _};
use cachalot_mock::{MockBackend, MockStream, Submitted};
use proptest::prelude::*;

const SEG: u64 = 2 << 20;

#[derive(Clone, Debug)]
enum Op {
    Use { s: usize, slot: u8, tag: u64 },
    Record { s: usize, e: usize },
    Wait { s: usize, e: usize },
    Complete { s: usize, n: u64 },
    Sync { e: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 0..6u8, 0..3u64).prop_map(|(s, slot, tag)| Op::Use { s, slot, tag }),
        2 => (0..3usize, 0..2usize).prop_map(|(s, e)| Op::Record { s, e }),
        2 => (0..3usize, 0..2usize).prop_map(|(s, e)| Op::Wait { s, e }),
        1 => (0..3usize, 0..3u64).prop_map(|(s, n)| Op::Complete { s, n }),
        1 => (0..2usize).prop_map(|e| Op::Sync { e }),
    ]
}

/// Byte range of a slot: overlapping ranges of several sizes.
fn range(slot: u8) -> (u64, u64) {
    match slot {
        0 => (0, 1024),
        1 => (512, 1024),
        2 => (1024, 2048),
        3 => (0, 4096),
        4 => (3072, 512),
        _ => (8192, 512),
    }
}

/// Naive model: per-work-item vector clocks, every use kept.
#[derive(Default)]
struct Oracle {
    submitted: [u64; 3],
    completed: [u64; 3],
    /// clock of work item (s, p) = work_clock[s][p-1]
    work_clock: [Vec<[u64; 3]>; 3],
    stream_clock: [[u64; 3]; 3],
    events: [Option<(usize, u64, [u64; 3])>; 2],
    uses: Vec<(usize, u64, [u64; 3], u64, u64, u64)>,
}

impl Oracle {
    fn complete_to(&mut self, s: usize, p: u64) {
        let p = p.min(self.submitted[s]);
        while self.completed[s] < p {
            let q = self.completed[s] + 1;
            let clock = self.work_clock[s][(q - 1) as usize];
            for j in 0..3 {
                if j != s {
                    self.complete_to(j, clock[j]);
                }
            }
            self.completed[s] = q;
        }
    }

    /// Returns whether the new use races with any kept use.
    fn use_mem(&mut self, s: usize, addr: u64, len: u64, tag: u64) -> bool {
        self.submitted[s] += 1;
        let p = self.submitted[s];
        let mut clock = self.stream_clock[s];
        clock[s] = p;
        self.work_clock[s].push(clock);
        let mut race = false;
        for &(a, pa, _, xa, xl, xt) in &self.uses {
            let overlap = xa < addr + len && addr < xa + xl;
            let ordered = a == s || clock[a] >= pa || self.completed[a] >= pa;
            if overlap && xt != tag && !ordered {
                race = true;
            }
        }
        self.uses.push((s, p, clock, addr, len, tag));
        race
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn eager_races_match_naive_oracle(ops in proptest::collection::vec(op(), 1..80)) {
        let d = MockBackend::new(1 << 30);
        let streams: Vec<MockStream> = (0..3).map(|_| d.create_stream()).collect();
        let events: Vec<_> = (0..2).map(|_| d.create_event().unwrap()).collect();
        let base = d.malloc(SEG).unwrap();
        let mut o = Oracle::default();
        for op in ops {
            match op {
                Op::Use { s, slot, tag } => {
                    let (off, len) = range(slot);
                    let before = d.race_count();
                    d.use_memory(streams[s], base + off, len, tag).unwrap();
                    let mock_race = d.race_count() > before;
                    let oracle_race = o.use_mem(s, off, len, tag);
                    prop_assert_eq!(mock_race, oracle_race);
                }
                Op::Record { s, e } => {
                    d.record_event(&events[e], streams[s]).unwrap();
                    let mut clock = o.stream_clock[s];
                    clock[s] = o.submitted[s];
                    o.events[e] = Some((s, o.submitted[s], clock));
                }
                Op::Wait { s, e } => {
                    d.stream_wait_event(streams[s], &events[e]).unwrap();
                    if let Some((_, _, clock)) = o.events[e] {
                        for j in 0..3 {
                            o.stream_clock[s][j] = o.stream_clock[s][j].max(clock[j]);
                        }
                    }
                }
                Op::Complete { s, n } => {
                    d.complete_n(streams[s], n).unwrap();
                    let p = o.completed[s] + n;
                    o.complete_to(s, p);
                }
                Op::Sync { e } => {
                    d.synchronize_event(&events[e]).unwrap();
                    if let Some((s, p, _)) = o.events[e] {
                        o.complete_to(s, p);
                    }
                }
            }
            for (k, &s) in streams.iter().enumerate() {
                prop_assert_eq!(d.completed(s).unwrap(), o.completed[k]);
            }
            for (k, e) in events.iter().enumerate() {
                let want = o.events[k].is_none_or(|(s, p, _)| o.completed[s] >= p);
                prop_assert_eq!(d.query_event(e).unwrap(), want);
            }
        }
    }
}

#[derive(Clone, Debug)]
enum COp {
    Use { s: usize, slot: u8, tag: u64 },
    Fork { from: usize, to: usize },
    Marker { s: usize },
    Launch { s: usize },
}

fn cop() -> impl Strategy<Value = COp> {
    prop_oneof![
        4 => (0..3usize, 0..6u8, 0..3u64).prop_map(|(s, slot, tag)| COp::Use { s, slot, tag }),
        3 => (0..3usize, 0..3usize).prop_map(|(from, to)| COp::Fork { from, to }),
        1 => (0..3usize).prop_map(|s| COp::Marker { s }),
        1 => (0..3usize).prop_map(|s| COp::Launch { s }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn capture_races_match_graph_reachability(ops in proptest::collection::vec(cop(), 1..60)) {
        let d = MockBackend::new(1 << 30);
        let streams: Vec<MockStream> = (0..3).map(|_| d.create_stream()).collect();
        let ev = d.create_event().unwrap();
        let base = d.malloc(SEG).unwrap();
        let origin = streams[0];
        let id = d.begin_capture(origin).unwrap();
        let active = |s: MockStream| d.capture_info(s).unwrap().status == CaptureStatus::Active;
        for op in ops {
            match op {
                COp::Use { s, slot, tag } => {
                    if active(streams[s]) {
                        let (off, len) = range(slot);
                        d.use_memory(streams[s], base + off, len, tag).unwrap();
                    }
                }
                COp::Fork { from, to } => {
                    if from != to && active(streams[from]) {
                        d.record_event(&ev, streams[from]).unwrap();
                        d.stream_wait_event(streams[to], &ev).unwrap();
                    }
                }
                COp::Marker { s } => {
                    if active(streams[s]) {
                        let t = d.capture_info(streams[s]).unwrap().terminals;
                        let m = d.add_empty_node(streams[s], &t).unwrap();
                        d.update_capture_dependencies(streams[s], &[m], DependencyUpdate::Set)
                            .unwrap();
                    }
                }
                COp::Launch { s } => {
                    if active(streams[s]) {
                        prop_assert!(matches!(d.launch(streams[s]).unwrap(), Submitted::Node(_)));
                    }
                }
            }
        }
        for &s in &streams[1..] {
            if active(s) {
                d.record_event(&ev, s).unwrap();
                d.stream_wait_event(origin, &ev).unwrap();
            }
        }
        let g = d.end_capture(origin).unwrap();
        prop_assert_eq!(g.capture_id(), id);
        let uses = g.uses();
        let mut naive = 0;
        for (j, (nj, uj)) in uses.iter().enumerate() {
            for (ni, ui) in &uses[..j] {
                let overlap = ui.addr < uj.addr + uj.len && uj.addr < ui.addr + ui.len;
                if overlap && ui.tag != uj.tag && !g.reaches(*ni, *nj) {
                    naive += 1;
                }
            }
        }
        prop_assert_eq!(d.race_count(), naive);
        prop_assert!(d.races().iter().all(|r| r.capture_id == Some(id)));
    }
}
