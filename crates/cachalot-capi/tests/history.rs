//! The memory history with the caller's contexts (`cachalot_capi::history`),
//! as the PyTorch shim drives it, on the mock backend: contexts kept with
//! blocks, segments and entries at PyTorch's levels and released exactly
//! once; `skip_actions`; settings kept when turned on again; compile
//! contexts, user metadata and annotations in snapshots; the profiler's
//! lookups; bad input as typed errors.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Mutex;

use cachalot_capi::drop_in::*;
use cachalot_capi::history::*;
use cachalot_capi::*;

mod common;
use common::*;

/// Contexts made and released, by id (the `data` pointer is a boxed id).
static RELEASED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

unsafe extern "C" fn release(data: *mut c_void) {
    // SAFETY: `data` is a `Box<u64>` made by `context` below, released once.
    let id = unsafe { Box::from_raw(data.cast::<u64>()) };
    RELEASED.lock().unwrap().push(*id);
}

/// A context whose `data` points to `id` (the pointer identifies it).
fn context(id: u64) -> (CachalotContext, *mut c_void) {
    let data = Box::into_raw(Box::new(id)).cast::<c_void>();
    (
        CachalotContext {
            data,
            release: Some(release),
        },
        data,
    )
}

fn released(id: u64) -> usize {
    RELEASED
        .lock()
        .unwrap()
        .iter()
        .filter(|&&r| r == id)
        .count()
}

fn configure(enabled: bool, level: c_int, clear: bool, skip: &[&CStr]) -> c_int {
    let ptrs: Vec<*const c_char> = skip.iter().map(|s| s.as_ptr()).collect();
    // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated strings.
    unsafe {
        cachalot_history_configure(
            -1,
            c_int::from(enabled),
            u64::MAX,
            level,
            c_int::from(clear),
            if ptrs.is_empty() {
                null()
            } else {
                ptrs.as_ptr()
            },
            ptrs.len(),
        )
    }
}

/// Allocates with `ctx` as the thread's context, as the shim does.
fn alloc_with(size: usize, ctx: Option<CachalotContext>) -> *mut c_void {
    if let Some(c) = ctx {
        assert_eq!(cachalot_context_enter(c), CACHALOT_OK);
    }
    let mut p = null_mut();
    // SAFETY: `p` is a valid out-pointer.
    let rc = unsafe { cachalot_alloc(size, 0, null_mut(), &mut p) };
    if ctx.is_some() {
        cachalot_context_exit();
    }
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
    p
}

fn free_with(p: *mut c_void, ctx: Option<CachalotContext>) {
    if let Some(c) = ctx {
        assert_eq!(cachalot_context_enter(c), CACHALOT_OK);
    }
    let rc = cachalot_raw_delete(p, 0);
    if ctx.is_some() {
        cachalot_context_exit();
    }
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
}

/// What these tests read of a snapshot besides its blocks, segments and traces.
impl Snap {
    fn annotations(&self) -> Vec<HashMap<String, String>> {
        let s = self.get();
        // SAFETY: cachalot's array, valid while the snapshot lives.
        let list = unsafe { std::slice::from_raw_parts(s.annotations, s.num_annotations) };
        list.iter()
            .map(|a| {
                (0..a.num_pairs)
                    .map(|i| {
                        // SAFETY: `num_pairs` NUL-terminated keys and values.
                        unsafe {
                            (
                                cstr(*a.keys.add(i)).unwrap(),
                                cstr(*a.values.add(i)).unwrap(),
                            )
                        }
                    })
                    .collect()
            })
            .collect()
    }
    fn block_at(&self, p: *mut c_void) -> CachalotBlock {
        *self
            .blocks()
            .iter()
            .find(|b| b.address == p.addr() as u64 && b.state == 0)
            .expect("the live block")
    }
}

/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

const ALLOC: i32 = 0;
const FREE_REQUESTED: i32 = 1;
const FREE_COMPLETED: i32 = 2;
const SEGMENT_ALLOC: i32 = 3;
const SEGMENT_MAP: i32 = 5;
const SEGMENT_UNMAP: i32 = 6;

#[test]
fn contexts_follow_pytorchs_levels_and_are_released_once() {
    let _g = setup();
    // level all: blocks, entries of allocations and frees
    assert_eq!(configure(true, 3, true, &[]), CACHALOT_OK);
    let (a, a_data) = context(1);
    let (f, f_data) = context(2);
    let p = alloc_with(3000, Some(a));
    let snap = Snap::take(0, 0, true);
    assert_eq!(
        snap.block_at(p).context,
        a_data,
        "the block keeps its context"
    );
    let seg = snap
        .segments()
        .iter()
        .find(|s| (s.address..s.address + s.total_size).contains(&(p.addr() as u64)))
        .unwrap();
    assert!(
        seg.context.is_null(),
        "as PyTorch's: the split gives the segment's start to a new block, without the segment's context"
    );
    let t = snap.traces();
    let e = t
        .iter()
        .find(|t| t.action == ALLOC && t.addr == p.addr() as u64)
        .unwrap();
    assert_eq!((e.context, e.size), (a_data, 3000));
    assert!(
        t.iter()
            .any(|t| (t.action == SEGMENT_ALLOC || t.action == SEGMENT_MAP) && t.context == a_data)
    );
    drop(snap);
    assert_eq!(released(1), 0, "kept by the block and entries");
    free_with(p, Some(f));
    let snap = Snap::take(0, 0, true);
    let frees: Vec<_> = snap
        .traces()
        .iter()
        .filter(|t| {
            t.addr == p.addr() as u64 && (t.action == FREE_REQUESTED || t.action == FREE_COMPLETED)
        })
        .map(|t| t.context)
        .collect();
    assert_eq!(
        frees,
        vec![f_data, f_data],
        "the free's own context at level all"
    );
    assert!(
        snap.blocks()
            .iter()
            .all(|b| b.state != 0 || b.context.is_null())
    );
    drop(snap);
    // off: every context goes, each released once
    assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
    assert_eq!((released(1), released(2)), (1, 1));
    // a context passed while the history is off is released right away
    let (c, _) = context(3);
    let q = alloc_with(100, Some(c));
    assert_eq!(released(3), 1);
    free_with(q, None);
}

#[test]
fn alloc_level_keeps_the_allocation_context_for_frees_and_state_keeps_none_in_entries() {
    let _g = setup();
    // level alloc: a free without its own context carries the block's
    assert_eq!(configure(true, 2, true, &[]), CACHALOT_OK);
    let (a, a_data) = context(10);
    let p = alloc_with(5000, Some(a));
    free_with(p, None);
    {
        let snap = Snap::take(0, 0, true);
        let ctxs: Vec<_> = snap
            .traces()
            .iter()
            .filter(|t| t.addr == p.addr() as u64 && t.action <= FREE_COMPLETED)
            .map(|t| (t.action, t.context))
            .collect();
        assert_eq!(
            ctxs,
            vec![
                (ALLOC, a_data),
                (FREE_REQUESTED, a_data),
                (FREE_COMPLETED, a_data)
            ]
        );
    }
    // level state: the block has its context, no entry has one
    assert_eq!(configure(true, 1, true, &[]), CACHALOT_OK);
    let (b, b_data) = context(11);
    let q = alloc_with(7000, Some(b));
    {
        let snap = Snap::take(0, 0, true);
        assert_eq!(snap.block_at(q).context, b_data);
        assert!(snap.traces().iter().all(|t| t.context.is_null()));
    }
    free_with(q, None);
    assert_eq!(
        released(11),
        1,
        "freed block, no entry holding it: released"
    );
    // level never: nothing kept
    assert_eq!(configure(true, 0, true, &[]), CACHALOT_OK);
    let (c, _) = context(12);
    let r = alloc_with(9000, Some(c));
    assert_eq!(released(12), 1);
    assert!(Snap::take(0, 0, true).block_at(r).context.is_null());
    free_with(r, None);
    assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
}

#[test]
fn turning_it_on_again_keeps_entries_and_clear_drops_them() {
    let _g = setup();
    assert_eq!(configure(true, 3, true, &[]), CACHALOT_OK);
    let (a, a_data) = context(20);
    let p = alloc_with(1 << 20, Some(a));
    // PyTorch's test_memory_plots_history_context: context=None, then on again
    assert_eq!(configure(true, 0, false, &[]), CACHALOT_OK);
    let q = alloc_with(1 << 20, None);
    assert_eq!(configure(true, 3, false, &[]), CACHALOT_OK);
    {
        let snap = Snap::take(0, 0, true);
        assert!(
            snap.traces()
                .iter()
                .any(|t| t.action == ALLOC && t.context == a_data),
            "the first allocation's entry survived"
        );
        assert!(
            snap.traces()
                .iter()
                .any(|t| t.action == ALLOC && t.addr == q.addr() as u64 && t.context.is_null())
        );
    }
    assert_eq!(configure(true, 3, true, &[]), CACHALOT_OK);
    assert!(Snap::take(0, 0, true).traces().is_empty(), "cleared");
    assert_eq!(
        Snap::take(0, 0, true).block_at(p).context,
        a_data,
        "live blocks keep theirs"
    );
    free_with(p, None);
    free_with(q, None);
    assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
    assert_eq!(released(20), 1);
}

#[test]
fn skip_actions_are_not_recorded_and_unknown_ones_refused() {
    let _g = setup();
    for skip in [
        vec![c"free_requested"],
        vec![c"free_requested", c"free_completed"],
        vec![c"alloc"],
        vec![
            c"segment_alloc",
            c"segment_free",
            c"segment_map",
            c"segment_unmap",
        ],
    ] {
        assert_eq!(
            configure(true, 3, true, &skip),
            CACHALOT_OK,
            "{}",
            last_error()
        );
        let p = alloc_with(4 << 20, None);
        free_with(p, None);
        assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
        let snap = Snap::take(0, 0, true);
        let names = [
            "alloc",
            "free_requested",
            "free_completed",
            "segment_alloc",
            "segment_free",
            "segment_map",
            "segment_unmap",
            "snapshot",
            "oom",
        ];
        let seen: Vec<&str> = snap
            .traces()
            .iter()
            .map(|t| names[t.action as usize])
            .collect();
        for s in &skip {
            assert!(!seen.contains(&s.to_str().unwrap()), "{skip:?}: {seen:?}");
        }
        assert!(!seen.is_empty(), "{skip:?}");
    }
    // nothing changes on a refused call
    let rc = configure(true, 3, true, &[c"alloc", c"free"]);
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("Unknown TraceEntry action: free"),
        "{}",
        last_error()
    );
    let p = alloc_with(4 << 20, None);
    free_with(p, None);
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
    assert!(
        !Snap::take(0, 0, true)
            .traces()
            .iter()
            .any(|t| (SEGMENT_ALLOC..=SEGMENT_UNMAP).contains(&t.action)),
        "the previous skip set (the segment actions) still holds"
    );
    assert_eq!(
        configure(true, 4, false, &[]),
        CACHALOT_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        configure(true, -1, false, &[]),
        CACHALOT_ERR_INVALID_ARGUMENT
    );
    let many = vec![c"alloc"; MAX_SKIP_ACTIONS + 1];
    assert_eq!(
        configure(true, 3, false, &many),
        CACHALOT_ERR_INVALID_ARGUMENT
    );
    // SAFETY: NULL with a count: refused before reading.
    let rc = unsafe { cachalot_history_configure(-1, 1, 10, 3, 0, null(), 2) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
    let mut on = 1;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { cachalot_history_enabled(0, &mut on) }, CACHALOT_OK);
    assert_eq!(on, 0);
}

#[test]
fn compile_context_user_metadata_and_annotations() {
    let _g = setup();
    // (PyTorch ignores compile contexts pushed while the history is off)
    // SAFETY: NUL-terminated literals.
    unsafe {
        assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
        assert_eq!(
            cachalot_history_push_compile_context(c"ignored".as_ptr()),
            CACHALOT_OK
        );
        assert_eq!(configure(true, 3, true, &[]), CACHALOT_OK);
        assert_eq!(
            cachalot_history_set_user_metadata(c"metadata test".as_ptr()),
            CACHALOT_OK
        );
        assert_eq!(
            CStr::from_ptr(cachalot_history_user_metadata()),
            c"metadata test"
        );
        assert_eq!(
            cachalot_history_push_compile_context(c"Torch-Compiled Region: 0/0".as_ptr()),
            CACHALOT_OK
        );
    }
    let p = alloc_with(1000, None);
    cachalot_history_pop_compile_context();
    let q = alloc_with(2000, None);
    // SAFETY: NUL-terminated literal.
    let rc = unsafe { cachalot_history_set_user_metadata(c"".as_ptr()) };
    assert_eq!(rc, CACHALOT_OK);
    let r = alloc_with(3000, None);
    let (k, v) = (
        [c"name".as_ptr(), c"stage".as_ptr()],
        [c"fwd".as_ptr(), c"START".as_ptr()],
    );
    // SAFETY: two keys and two values.
    let rc = unsafe { cachalot_history_record_annotation(0, k.as_ptr(), v.as_ptr(), 2) };
    assert_eq!(rc, CACHALOT_OK);
    {
        let snap = Snap::take(0, 0, true);
        let entry = |x: *mut c_void| {
            let t = snap
                .traces()
                .iter()
                .find(|t| t.action == ALLOC && t.addr == x.addr() as u64)
                .unwrap();
            // SAFETY: NULL or strings owned by the snapshot.
            unsafe { (cstr(t.compile_context), cstr(t.user_metadata)) }
        };
        let meta = Some("metadata test".to_string());
        assert_eq!(
            entry(p),
            (Some("Torch-Compiled Region: 0/0".into()), meta.clone())
        );
        assert_eq!(entry(q), (None, meta));
        assert_eq!(entry(r), (None, None));
        let ann = snap.annotations();
        assert_eq!(ann.len(), 1);
        assert_eq!(ann[0]["name"], "fwd");
        assert_eq!(ann[0]["stage"], "START");
    }
    // bounded input
    let many = vec![c"x".as_ptr(); MAX_ANNOTATION_PAIRS + 1];
    // SAFETY: `many` holds that many strings.
    let rc =
        unsafe { cachalot_history_record_annotation(0, many.as_ptr(), many.as_ptr(), many.len()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    let long = std::ffi::CString::new(vec![b'a'; MAX_HISTORY_STRING + 1]).unwrap();
    // SAFETY: a NUL-terminated string; NULL refused.
    unsafe {
        assert_eq!(
            cachalot_history_set_user_metadata(long.as_ptr()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_history_push_compile_context(null()),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
    }
    for x in [p, q, r] {
        free_with(x, None);
    }
    assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
    // annotations are not kept while off
    // SAFETY: two keys and two values.
    let rc = unsafe { cachalot_history_record_annotation(0, k.as_ptr(), v.as_ptr(), 2) };
    assert_eq!(rc, CACHALOT_OK);
    assert!(Snap::take(0, 0, true).annotations().is_empty());
}

#[test]
fn nested_contexts_restore_the_outer_one() {
    let _g = setup();
    assert_eq!(configure(true, 3, true, &[]), CACHALOT_OK);
    let (outer, outer_data) = context(30);
    let (inner, inner_data) = context(31);
    assert_eq!(cachalot_context_enter(outer), CACHALOT_OK);
    let p = alloc_with(100, Some(inner));
    let q = alloc_with(200, None);
    cachalot_context_exit();
    cachalot_context_exit(); // unbalanced: a no-op
    {
        let snap = Snap::take(0, 0, true);
        assert_eq!(snap.block_at(p).context, inner_data);
        assert_eq!(snap.block_at(q).context, outer_data);
    }
    free_with(p, None);
    free_with(q, None);
    assert_eq!(configure(false, 0, false, &[]), CACHALOT_OK);
    assert_eq!((released(30), released(31)), (1, 1));
    // depth is bounded; a refused context is still released
    let mut entered = 0;
    for i in 0..=MAX_CONTEXT_DEPTH as u64 {
        let (c, _) = context(1000 + i);
        if cachalot_context_enter(c) == CACHALOT_OK {
            entered += 1;
        }
    }
    assert_eq!(entered, MAX_CONTEXT_DEPTH);
    assert_eq!(released(1000 + MAX_CONTEXT_DEPTH as u64), 1);
    for _ in 0..entered {
        cachalot_context_exit();
    }
    assert_eq!(released(1000), 1);
}

#[test]
fn profiler_lookups() {
    let _g = setup();
    let p = alloc_with(3000, None);
    let (mut dev, mut size) = (-1, 0u64);
    // SAFETY: valid out-pointers.
    let rc = unsafe { cachalot_block_lookup(p, &mut dev, &mut size) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!((dev, size), (0, 3072));
    let (mut allocated, mut reserved) = (0u64, 0u64);
    // SAFETY: valid out-pointers.
    let rc = unsafe { cachalot_memory_totals(0, &mut allocated, &mut reserved) };
    assert_eq!(rc, CACHALOT_OK);
    assert!(
        allocated >= 3072 && reserved >= allocated,
        "{allocated} {reserved}"
    );
    free_with(p, None);
    // SAFETY: valid out-pointers; NULL ones refused.
    unsafe {
        assert_eq!(
            cachalot_block_lookup(p, &mut dev, &mut size),
            CACHALOT_ERR_INVALID_POINTER
        );
        assert_eq!(
            cachalot_block_lookup(p, null_mut(), &mut size),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_memory_totals(0, null_mut(), &mut reserved),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            cachalot_memory_totals(99, &mut allocated, &mut reserved),
            CACHALOT_ERR_INVALID_ARGUMENT
        );
    }
}
