//! The memory history with callers' contexts (PyTorch's
//! `_record_memory_history(context=..., skip_actions=...)`), on the mock:
//! which contexts blocks, segments and entries keep at each level, when
//! they are dropped, `skip_actions`, settings changed while on, PyTorch's
//! entry sizes and the snapshot's own entry, compile contexts, user
//! metadata and annotations; and the fast path back once it is off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cachalot_conformance::mock::{Dev, MIB};
use cachalot_core::PathCounts;
use cachalot_core::engine::history::{
    self, ActionSet, HistoryConfig, HistoryContext, RecordContext, TraceAction, with_context,
};
use cachalot_core::engine::{BlockState, Snapshot, TraceEntry};

const FIXED: &str = "expandable_segments:False";

/// A context whose drop is counted.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn ctx() -> (HistoryContext, Arc<AtomicUsize>) {
    let dropped = Arc::new(AtomicUsize::new(0));
    (HistoryContext::new(Counted(dropped.clone())), dropped)
}

fn on(d: &Dev, level: RecordContext) {
    d.a.record_memory_history(Some(HistoryConfig {
        record_context: level,
        ..HistoryConfig::default()
    }));
    d.a.clear_memory_history();
}

fn block_ctx(s: &Snapshot, addr: u64) -> Option<HistoryContext> {
    s.segments
        .iter()
        .flat_map(|g| &g.blocks)
        .find(|b| b.address == addr && b.state == BlockState::ActiveAllocated)
        .expect("the live block")
        .context
        .clone()
}

fn entries(s: &Snapshot, action: TraceAction, addr: u64) -> Vec<&TraceEntry> {
    s.traces
        .iter()
        .filter(|t| t.action == action && t.addr == addr)
        .collect()
}

#[test]
fn level_all_keeps_the_allocation_context_with_block_segment_and_entries() {
    let d = Dev::new(FIXED);
    on(&d, RecordContext::All);
    let (a, a_dropped) = ctx();
    let (f, f_dropped) = ctx();
    let p = with_context(Some(a.clone()), || d.alloc(3000));
    let s = d.a.snapshot();
    assert_eq!(block_ctx(&s, p), Some(a.clone()));
    let seg = s
        .segments
        .iter()
        .find(|g| g.blocks.iter().any(|b| b.address == p))
        .unwrap();
    assert_eq!(
        seg.context, None,
        "as PyTorch's: the split gives the segment's start to a new block, without the segment's context"
    );
    let e = entries(&s, TraceAction::Alloc, p);
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].size, e[0].context.clone()), (3000, Some(a.clone())));
    assert_eq!(
        entries(&s, TraceAction::SegmentAlloc, seg.address)[0].context,
        Some(a.clone())
    );
    drop(s);
    with_context(Some(f.clone()), || d.free(p));
    let s = d.a.snapshot();
    for action in [TraceAction::FreeRequested, TraceAction::FreeCompleted] {
        let e = entries(&s, action, p);
        assert_eq!(e.len(), 1, "{action:?}");
        assert_eq!(e[0].context, Some(f.clone()), "the free's own context");
        assert_eq!(e[0].size, 3000, "PyTorch's size: the request's");
    }
    drop((s, a, f));
    assert_eq!(
        a_dropped.load(Ordering::SeqCst),
        0,
        "held by entries and the segment"
    );
    d.a.record_memory_history(None);
    assert_eq!(
        (
            a_dropped.load(Ordering::SeqCst),
            f_dropped.load(Ordering::SeqCst)
        ),
        (1, 1),
        "off: every context dropped once"
    );
    d.check();
}

#[test]
fn alloc_level_frees_carry_the_blocks_context_and_state_level_keeps_none_in_entries() {
    let d = Dev::new(FIXED);
    on(&d, RecordContext::Alloc);
    let (a, _) = ctx();
    let p = with_context(Some(a.clone()), || d.alloc(5000));
    d.free(p);
    let s = d.a.snapshot();
    for action in [TraceAction::FreeRequested, TraceAction::FreeCompleted] {
        assert_eq!(
            entries(&s, action, p)[0].context,
            Some(a.clone()),
            "{action:?}"
        );
    }
    on(&d, RecordContext::State);
    let (b, b_dropped) = ctx();
    let q = with_context(Some(b.clone()), || d.alloc(7000));
    let s = d.a.snapshot();
    assert_eq!(block_ctx(&s, q), Some(b.clone()));
    assert!(s.traces.iter().all(|t| t.context.is_none()));
    drop((s, b));
    d.free(q);
    assert_eq!(
        b_dropped.load(Ordering::SeqCst),
        1,
        "freed: nothing holds it"
    );
    on(&d, RecordContext::Never);
    let (c, c_dropped) = ctx();
    let r = with_context(Some(c), || d.alloc(9000));
    assert_eq!(c_dropped.load(Ordering::SeqCst), 1, "never: not kept");
    assert_eq!(block_ctx(&d.a.snapshot(), r), None);
    d.free(r);
}

#[test]
fn segment_release_carries_the_segments_context_or_the_callers() {
    let d = Dev::new(FIXED);
    on(&d, RecordContext::All);
    let (a, _) = ctx();
    let p = with_context(Some(a.clone()), || d.alloc(30 * MIB));
    let snap = d.a.snapshot();
    let seg = snap.segments[0].address;
    assert_eq!(
        snap.segments[0].context,
        Some(a.clone()),
        "the whole segment is one block: its context stays with the segment"
    );
    drop(snap);
    d.free(p);
    d.a.empty_cache().unwrap();
    let s = d.a.snapshot();
    assert_eq!(
        entries(&s, TraceAction::SegmentFree, seg)[0].context,
        Some(a.clone())
    );
    // the caller's own context wins (PyTorch: empty_cache gathers at "all")
    let (e, _) = ctx();
    let q = d.alloc(30 * MIB);
    let seg = d.a.snapshot().segments[0].address;
    d.free(q);
    with_context(Some(e.clone()), || d.a.empty_cache().unwrap());
    let s = d.a.snapshot();
    assert_eq!(
        entries(&s, TraceAction::SegmentFree, seg)
            .last()
            .unwrap()
            .context,
        Some(e)
    );
}

#[test]
fn skip_actions_leave_the_ring_but_not_the_contexts() {
    let d = Dev::new(FIXED);
    let skip = ActionSet::parse(["alloc", "free_requested"]).unwrap();
    d.a.record_memory_history(Some(HistoryConfig {
        skip_actions: skip,
        ..HistoryConfig::default()
    }));
    let (a, _) = ctx();
    let p = with_context(Some(a.clone()), || d.alloc(1000));
    let s = d.a.snapshot();
    assert_eq!(block_ctx(&s, p), Some(a.clone()), "kept with the block");
    d.free(p);
    let s = d.a.snapshot();
    let seen: Vec<_> = s.traces.iter().map(|t| t.action).collect();
    assert!(!seen.contains(&TraceAction::Alloc) && !seen.contains(&TraceAction::FreeRequested));
    let done = entries(&s, TraceAction::FreeCompleted, p);
    assert_eq!(
        done[0].context,
        Some(a),
        "the block's context, though its alloc entry was skipped"
    );
    let err = ActionSet::parse(["alloc", "free"]).unwrap_err().to_string();
    assert!(err.contains("Unknown TraceEntry action: free"), "{err}");
    assert_eq!(TraceAction::parse("oom").unwrap(), TraceAction::Oom);
    for a in TraceAction::ALL {
        assert_eq!(TraceAction::parse(a.as_str()).unwrap(), a);
        assert!(ActionSet::EMPTY.with(a).contains(a));
    }
}

#[test]
fn settings_change_while_on_keeps_entries_and_the_snapshot_entry_comes_after_its_copy() {
    let d = Dev::new(FIXED);
    on(&d, RecordContext::All);
    let (a, _) = ctx();
    let p = with_context(Some(a.clone()), || d.alloc(1 << 20));
    // context=None while on (PyTorch's test_memory_plots_history_context)
    d.a.record_memory_history(Some(HistoryConfig {
        record_context: RecordContext::Never,
        ..HistoryConfig::default()
    }));
    let (b, _) = ctx();
    let q = with_context(Some(b), || d.alloc(1 << 20));
    on_keep(&d, RecordContext::All);
    let s = d.a.snapshot();
    assert_eq!(
        entries(&s, TraceAction::Alloc, p)[0].context,
        Some(a.clone())
    );
    assert_eq!(entries(&s, TraceAction::Alloc, q)[0].context, None);
    assert!(
        !s.traces.iter().any(|t| t.action == TraceAction::Snapshot),
        "a snapshot never holds its own entry"
    );
    let active: u64 = s.segments.iter().map(|g| g.active_size).sum();
    let again = d.a.snapshot();
    let last = again.traces.last().unwrap();
    assert_eq!(
        (last.action, last.addr, last.size),
        (TraceAction::Snapshot, 0, active)
    );
    // a smaller capacity keeps the newest
    d.a.record_memory_history(Some(HistoryConfig {
        max_entries: 2,
        ..HistoryConfig::default()
    }));
    assert_eq!(d.a.memory_history().len(), 2);
    assert_eq!(d.a.memory_history()[1].action, TraceAction::Snapshot);
    d.free(p);
    d.free(q);
    d.check();
}

fn on_keep(d: &Dev, level: RecordContext) {
    d.a.record_memory_history(Some(HistoryConfig {
        record_context: level,
        ..HistoryConfig::default()
    }));
}

#[test]
fn compile_context_user_metadata_and_annotations() {
    let d = Dev::new(FIXED);
    on(&d, RecordContext::All);
    history::set_user_metadata("metadata test");
    history::push_compile_context("Torch-Compiled Region: 0/0");
    let p = d.alloc(1000);
    history::pop_compile_context();
    history::pop_compile_context(); // none left: a no-op
    let q = d.alloc(2000);
    assert_eq!(history::user_metadata(), "metadata test");
    history::set_user_metadata("");
    let r = d.alloc(3000);
    let s = d.a.snapshot();
    let of = |x| {
        let e = entries(&s, TraceAction::Alloc, x)[0];
        (
            e.compile_context.as_deref().map(str::to_string),
            e.user_metadata.as_deref().map(str::to_string),
        )
    };
    let meta = Some("metadata test".to_string());
    assert_eq!(
        of(p),
        (Some("Torch-Compiled Region: 0/0".into()), meta.clone())
    );
    assert_eq!(of(q), (None, meta));
    assert_eq!(of(r), (None, None));
    // on another thread: its own (none)
    let other = std::thread::scope(|sc| {
        sc.spawn(|| {
            let x = d.alloc(4000);
            let e = d.a.memory_history();
            d.free(x);
            e.into_iter()
                .rev()
                .find(|t| t.action == TraceAction::Alloc)
                .map(|t| t.user_metadata)
        })
        .join()
        .unwrap()
    });
    assert_eq!(other, Some(None));
    for i in 0..5 {
        d.a.record_annotation(vec![("name".into(), format!("step{i}"))]);
    }
    d.a.record_memory_history(Some(HistoryConfig {
        max_entries: 3,
        ..HistoryConfig::default()
    }));
    let s = d.a.snapshot();
    let names: Vec<_> = s
        .annotations
        .iter()
        .map(|a| a.metadata[0].1.clone())
        .collect();
    assert_eq!(names, ["step2", "step3", "step4"], "bounded by max_entries");
    d.a.record_memory_history(None);
    d.a.record_annotation(vec![("name".into(), "off".into())]);
    assert!(d.a.snapshot().annotations.is_empty());
    for x in [p, q, r] {
        d.free(x);
    }
}

/// With the history off again, an allocation and free take the fast path
/// (one shard lock) as before it was on: nothing of it is left to pay.
#[test]
fn history_off_gives_the_fast_path_back() {
    let d = Dev::new(FIXED);
    let warm = d.alloc(1000);
    d.free(warm);
    on(&d, RecordContext::All);
    let before = PathCounts::this_thread();
    let p = d.alloc(1000);
    d.free(p);
    let paths = PathCounts::this_thread().since(&before);
    assert_eq!(paths.fast, 0, "history on: every operation on the device");
    d.a.record_memory_history(None);
    let p = d.alloc(1000);
    d.free(p);
    let before = PathCounts::this_thread();
    let p = d.alloc(1000);
    d.free(p);
    let paths = PathCounts::this_thread().since(&before);
    assert_eq!((paths.fast, paths.device), (2, 0));
}

/// Microseconds since the Unix epoch, now.
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[test]
fn entry_times_are_the_system_clock_in_microseconds_in_order() {
    let d = Dev::new(FIXED);
    on(&d, RecordContext::Never);
    let before = wall_us();
    let p = d.alloc(3000);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mid = wall_us();
    std::thread::sleep(std::time::Duration::from_millis(5));
    d.free(p);
    let q = d.alloc(5 * MIB);
    d.free(q);
    let after = wall_us();
    // read twice: the times of an entry do not move between readings
    let (s, t) = (d.a.snapshot(), d.a.memory_history());
    let times: Vec<u64> = s
        .traces
        .iter()
        .filter(|e| e.action != TraceAction::Snapshot)
        .map(|e| e.time_us)
        .collect();
    assert!(times.len() >= 5, "{times:?}");
    assert!(times.is_sorted(), "{times:?}");
    // within a millisecond of the system clock around them (the line
    // through the start and the reading rounds to microseconds)
    assert!(
        times[0] + 1000 >= before && *times.last().unwrap() <= after + 1000,
        "{before} <= {times:?} <= {after}"
    );
    let alloc_p = entries(&s, TraceAction::Alloc, p)[0].time_us;
    let free_p = entries(&s, TraceAction::FreeRequested, p)[0].time_us;
    assert!(
        alloc_p <= mid && free_p + 1000 >= mid,
        "{alloc_p} <= {mid} <= {free_p}"
    );
    assert!(
        free_p - alloc_p >= 20_000,
        "the 20 ms sleep between them: {free_p} - {alloc_p}"
    );
    let again: Vec<u64> = t
        .iter()
        .filter(|e| e.action != TraceAction::Snapshot)
        .map(|e| e.time_us)
        .collect();
    for (a, b) in times.iter().zip(&again) {
        assert!(a.abs_diff(*b) <= 2, "{times:?} / {again:?}");
    }
    d.a.record_memory_history(None);
    d.check();
}
