//! The fault-injection matrix: every public engine operation, run in a state
//! where it calls the backend, with each backend call it makes failing in
//! turn (the k-th call of that kind, for every k the operation makes).
//!
//! After each failing run: the invariant checker holds; an operation that
//! returned an error left the program's allocations (live blocks and the
//! allocated counters) unchanged, or, for a release path that went past a
//! failed free, reports exactly what it could not release; a
//! retry with no failure succeeds; and at the end nothing is leaked (no
//! device segment, no event). The table of outcomes is printed
//! (`cargo test --test fault_matrix -- --nocapture`) and kept in
//! `docs/reliability.md`.

use cachalot_conformance::mock::{FIXED, MIB};
use cachalot_core::{
    AllocatorConfig, Backend, CachingAllocator, Error, PoolFilter, PoolId, graph_pool_handle,
};
use cachalot_mock::{MockBackend, MockCall, MockConfig, MockStream};

/// The allocated counters (name, value) and the live allocations.
type Observable = (Vec<(String, i64)>, Vec<(u64, u64)>);

/// A fresh device and allocator for one run.
struct World {
    m: MockBackend,
    a: CachingAllocator<MockBackend>,
    s0: MockStream,
    side: MockStream,
    /// Live allocations the setup made (freed at the end).
    live: Vec<u64>,
    /// A pool the setup began (ended at the end).
    pool: Option<PoolId>,
}

impl World {
    /// Fixed segments (`FIXED` added to `config`): the matrix counts
    /// `Malloc` and `Free`, the calls of fixed segments.
    fn new(capacity: u64, config: &str) -> Self {
        let m = MockConfig::new(capacity).auto_complete(false).build();
        let config = if config.is_empty() {
            FIXED.to_string()
        } else {
            format!("{config},{FIXED}")
        };
        let a = CachingAllocator::with_config(m.clone(), AllocatorConfig::parse(&config).unwrap())
            .unwrap();
        let (s0, side) = (m.create_stream(), m.create_stream());
        Self {
            m,
            a,
            s0,
            side,
            live: Vec::new(),
            pool: None,
        }
    }

    fn check(&self, what: &str) {
        if let Err(e) = self.a.check_invariants() {
            panic!("{what}: invariant violated: {e}");
        }
    }

    /// What a failed atomic operation must leave unchanged: the program's
    /// allocations (addresses, sizes, the allocated counters). The cache may
    /// have changed on the way (the OOM ladder releases cached segments and
    /// waits for pending frees before its last device call, as PyTorch's).
    fn observable(&self) -> Observable {
        let stats = self
            .a
            .memory_stats()
            .into_iter()
            .filter(|(k, _)| {
                (k.starts_with("allocated_bytes.")
                    || k.starts_with("allocation.")
                    || k.starts_with("oversize_allocations."))
                    && k.ends_with(".current")
            })
            .collect();
        (stats, self.a.live_allocations())
    }

    /// Frees what is live, ends a capture, completes all work, empties the
    /// cache and drops the allocator: nothing may be left on the device but
    /// the events whose `destroy_event` was failed (`destroy_event`
    /// consumes its event: the engine does not retry it).
    fn teardown(mut self, what: &str, refused_destroys: u64) {
        self.m.clear_failures();
        if let Some(pool) = self.pool.take() {
            let _ = self.m.end_capture(self.s0);
            self.a.end_allocate_to_pool(pool).unwrap();
            self.a.release_pool(pool).unwrap();
        }
        for p in std::mem::take(&mut self.live) {
            // a free the operation already did is a typed error here
            let _ = self.a.free(p);
        }
        self.m.complete_all();
        self.a
            .empty_cache()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        self.check(what);
        let m = self.m.clone();
        drop(self.a);
        assert_eq!(m.segment_count(), 0, "{what}: a segment leaked");
        assert_eq!(
            m.live_events() as u64,
            refused_destroys,
            "{what}: an event leaked"
        );
    }
}

/// How an operation may fail.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An error leaves everything as it was.
    Atomic,
    /// A release path: it goes on past a failed free and reports it.
    Release,
}

/// One operation of the matrix: its setup and the operation.
struct Case {
    name: &'static str,
    kind: Kind,
    setup: fn() -> World,
    op: fn(&mut World) -> Result<(), Error>,
}

fn alloc_miss() -> World {
    World::new(256 * MIB, "")
}

fn op_alloc(w: &mut World) -> Result<(), Error> {
    let p = w.a.allocate(8 * MIB, w.s0)?;
    w.live.push(p);
    Ok(())
}

/// Two cached 40 MiB segments on a 100 MiB device; a 60 MiB request must
/// release cached memory (the OOM ladder), with events pending on one.
fn ladder() -> World {
    let w = World::new(100 * MIB, "");
    let a = w.a.allocate(40 * MIB, w.s0).unwrap();
    let b = w.a.allocate(40 * MIB, w.s0).unwrap();
    w.a.record_stream(b, w.side).unwrap();
    w.m.launch(w.side).unwrap();
    w.a.free(a).unwrap();
    w.a.free(b).unwrap();
    w
}

fn op_alloc_60(w: &mut World) -> Result<(), Error> {
    let p = w.a.allocate(60 * MIB, w.s0)?;
    w.live.push(p);
    Ok(())
}

/// An allocation that can never fit (the OOM report asks for memory info):
/// the expected OOM counts as success here; any other error is the
/// operation failing.
fn op_oom(w: &mut World) -> Result<(), Error> {
    match w.a.allocate(200 * MIB, w.s0) {
        Err(Error::OutOfMemory(_) | Error::NeverFits { .. }) => Ok(()),
        Ok(p) => {
            w.live.push(p);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A live block used on a busy side stream: its free records events.
fn used_elsewhere() -> World {
    let mut w = World::new(256 * MIB, "");
    let p = w.a.allocate(8 * MIB, w.s0).unwrap();
    let third = w.m.create_stream();
    for s in [w.side, third] {
        w.a.record_stream(p, s).unwrap();
        w.m.launch(s).unwrap();
    }
    w.live.push(p);
    w
}

fn op_free(w: &mut World) -> Result<(), Error> {
    let p = w.live[0];
    w.a.free(p)?;
    w.live.clear();
    Ok(())
}

/// A block freed with pending events: the next allocation queries them.
fn pending_events() -> World {
    let mut w = used_elsewhere();
    let p = w.live.pop().unwrap();
    w.a.free(p).unwrap();
    w.m.complete_all();
    w
}

/// Cached segments, one with pending events: empty_cache syncs, frees and
/// destroys events.
fn cached() -> World {
    let w = ladder();
    let c = w.a.allocate(4 * MIB, w.s0).unwrap();
    w.a.free(c).unwrap();
    w
}

fn op_empty_cache(w: &mut World) -> Result<(), Error> {
    w.a.empty_cache()
}

/// A capture into a private pool on `s0`, with a block used on the side
/// stream inside the capture.
fn capturing() -> World {
    let mut w = World::new(256 * MIB, "graph_capture_record_stream_reuse:True");
    let pool = graph_pool_handle();
    w.a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(w.s0))
        .unwrap();
    w.m.begin_capture(w.s0).unwrap();
    w.pool = Some(pool);
    let p = w.a.allocate(MIB, w.s0).unwrap();
    w.live.push(p);
    w
}

fn op_capture_alloc(w: &mut World) -> Result<(), Error> {
    let p = w.a.allocate(2 * MIB, w.s0)?;
    w.live.push(p);
    Ok(())
}

/// In capture: a block recorded on a side stream that forked from the
/// capture stream; its free takes free markers, the next malloc reclaims.
fn capturing_with_uses() -> World {
    let w = capturing();
    let p = w.live[0];
    wait(&w.m, w.side, w.s0);
    w.m.use_memory(w.side, p, MIB, 1).unwrap();
    w.a.record_stream(p, w.side).unwrap();
    wait(&w.m, w.s0, w.side);
    w
}

/// `waiter.wait_stream(other)` through an event.
fn wait(m: &MockBackend, waiter: MockStream, other: MockStream) {
    let e = m.create_event().unwrap();
    m.record_event(&e, other).unwrap();
    m.stream_wait_event(waiter, &e).unwrap();
    m.destroy_event(e).unwrap();
}

fn op_capture_free_then_alloc(w: &mut World) -> Result<(), Error> {
    let p = w.live[0];
    w.a.free(p)?;
    w.live.clear();
    let q = w.a.allocate(MIB, w.s0)?;
    w.live.push(q);
    Ok(())
}

fn op_end_and_release_pool(w: &mut World) -> Result<(), Error> {
    for p in std::mem::take(&mut w.live) {
        w.a.free(p)?;
    }
    let pool = w.pool.take().unwrap();
    w.m.end_capture(w.s0).unwrap();
    w.a.end_allocate_to_pool(pool)?;
    w.a.release_pool(pool)
}

const CASES: &[Case] = &[
    Case {
        name: "allocate (miss)",
        kind: Kind::Atomic,
        setup: alloc_miss,
        op: op_alloc,
    },
    Case {
        name: "allocate (OOM ladder)",
        kind: Kind::Atomic,
        setup: ladder,
        op: op_alloc_60,
    },
    Case {
        name: "allocate (never fits)",
        kind: Kind::Atomic,
        setup: ladder,
        op: op_oom,
    },
    Case {
        name: "free (used on 2 streams)",
        kind: Kind::Atomic,
        setup: used_elsewhere,
        op: op_free,
    },
    Case {
        name: "allocate (events pending)",
        kind: Kind::Atomic,
        setup: pending_events,
        op: op_alloc,
    },
    Case {
        name: "empty_cache",
        kind: Kind::Release,
        setup: cached,
        op: op_empty_cache,
    },
    Case {
        name: "allocate (in capture)",
        kind: Kind::Atomic,
        setup: capturing,
        op: op_capture_alloc,
    },
    Case {
        name: "free + allocate (capture reuse)",
        kind: Kind::Release,
        setup: capturing_with_uses,
        op: op_capture_free_then_alloc,
    },
    Case {
        name: "end capture + release_pool",
        kind: Kind::Release,
        setup: capturing,
        op: op_end_and_release_pool,
    },
];

/// The outcome of one cell.
fn cell(case: &Case, call: MockCall) -> String {
    // how many calls of this kind the operation makes
    let mut w = (case.setup)();
    let before = w.m.call_count(call);
    (case.op)(&mut w).unwrap_or_else(|e| panic!("{}: fails with no injection: {e}", case.name));
    let n = w.m.call_count(call) - before;
    w.check(case.name);
    w.teardown(case.name, 0);
    if n == 0 {
        return "–".into();
    }
    let (mut errors, mut absorbed) = (0, 0);
    for k in 1..=n {
        let what = format!("{} with {call:?} #{k} failing", case.name);
        let mut w = (case.setup)();
        let snapshot = w.observable();
        let injected = w.m.counters().injected;
        w.m.fail_call_at(call, k);
        let r = (case.op)(&mut w);
        let fired = w.m.counters().injected - injected;
        w.check(&what);
        match r {
            Ok(()) => absorbed += 1,
            Err(e) => {
                errors += 1;
                if case.kind == Kind::Atomic {
                    assert_eq!(
                        w.observable(),
                        snapshot,
                        "{what}: failed with {e} but changed the allocator"
                    );
                } else if let Error::ReleaseFailed { segments, .. } = &e {
                    assert!(*segments > 0, "{what}: {e}");
                }
                // a retry with nothing failing succeeds
                w.m.clear_failures();
                if case.kind == Kind::Atomic {
                    (case.op)(&mut w).unwrap_or_else(|e| panic!("{what}: retry failed: {e}"));
                    w.check(&what);
                }
            }
        }
        let refused = if call == MockCall::DestroyEvent {
            fired
        } else {
            0
        };
        w.teardown(&what, refused);
    }
    match (errors, absorbed) {
        (0, a) => format!("ok×{a}"),
        (e, 0) => format!("E×{e}"),
        (e, a) => format!("E×{e} ok×{a}"),
    }
}

#[test]
fn every_operation_with_every_backend_call_failing() {
    let mut table = String::from("| operation |");
    for call in MockCall::ALL {
        table += &format!(" {} |", call.name());
    }
    table += "\n|---|";
    table += &"---|".repeat(MockCall::ALL.len());
    table += "\n";
    let mut exercised = 0;
    for case in CASES {
        table += &format!("| {} |", case.name);
        for call in MockCall::ALL {
            let c = cell(case, call);
            if c != "–" {
                exercised += 1;
            }
            table += &format!(" {c} |");
        }
        table += "\n";
    }
    println!("{table}");
    // every backend call the engine makes is failed in some operation
    for call in [
        MockCall::Malloc,
        MockCall::Free,
        MockCall::MemoryInfo,
        MockCall::CreateEvent,
        MockCall::DestroyEvent,
        MockCall::RecordEvent,
        MockCall::QueryEvent,
        MockCall::SynchronizeEvent,
        MockCall::CaptureState,
    ] {
        assert!(
            CASES.iter().any(|c| cell(c, call) != "–"),
            "no operation calls {call:?}"
        );
    }
    assert!(exercised >= 15, "only {exercised} cells exercised");
}
