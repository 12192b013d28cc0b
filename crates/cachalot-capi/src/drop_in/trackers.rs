//! Segment trackers (PyTorch's `attachAllocatorTraceTracker`, used by
//! ProcessGroupNCCL to register every segment with its communicators): a
//! process-wide list of C callbacks that see every segment event of every
//! device, devices used later included.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cachalot::DeviceAllocator;
use cachalot::core::engine::{SegmentEvent, SegmentTracker};
use parking_lot::RwLock;

use super::snapshot::{action_code, stream_value};
use crate::{Failure, existing_allocs, status};

/// A segment event (`cachalot_segment_event_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotSegmentEvent {
    /// PyTorch's `TraceEntry::Action` order: segment_alloc 3 (after the
    /// memory is obtained), segment_free 4 (before it is returned),
    /// segment_map 5, segment_unmap 6 (pages of an expandable segment).
    pub action: i32,
    /// Device index.
    pub device: i32,
    /// Start of the range.
    pub addr: u64,
    /// Bytes of the range.
    pub size: u64,
    /// The segment's stream (the raw handle value).
    pub stream: u64,
    /// The owning pool, first half ((0, 0): the default pools).
    pub pool_hi: u64,
    /// The owning pool, second half.
    pub pool_lo: u64,
}

/// A tracker callback.
pub type TrackerFn = unsafe extern "C" fn(ctx: *mut c_void, event: *const CachalotSegmentEvent);

/// Most trackers a process may attach (PyTorch has one per process group).
pub const MAX_TRACKERS: usize = 1024;

#[derive(Clone, Copy)]
struct Entry {
    f: TrackerFn,
    ctx: *mut c_void,
}

// SAFETY: the caller of `cachalot_attach_segment_tracker` guarantees the
// callback may be called with `ctx` from any thread, for ever.
unsafe impl Send for Entry {}
// SAFETY: as above; an entry is never changed after it is attached.
unsafe impl Sync for Entry {}

static TRACKERS: RwLock<Vec<Entry>> = RwLock::new(Vec::new());

/// The engine-side tracker of device `index`: every attached callback, in
/// order.
fn engine_tracker(index: u32) -> SegmentTracker {
    let device = i32::try_from(index).unwrap_or(i32::MAX);
    Arc::new(move |e: &SegmentEvent| {
        let list = TRACKERS.read();
        if list.is_empty() {
            return;
        }
        let ev = CachalotSegmentEvent {
            action: action_code(e.action),
            device,
            addr: e.addr,
            size: e.size,
            stream: stream_value(&e.stream),
            pool_hi: e.pool.0,
            pool_lo: e.pool.1,
        };
        for t in list.iter() {
            // SAFETY: attached with `cachalot_attach_segment_tracker`,
            // whose caller guarantees the call is valid from any thread;
            // `ev` lives across the call.
            unsafe { (t.f)(t.ctx, &ev) };
        }
    })
}

/// Gives device allocator `dev` the tracker that runs the attached
/// callbacks (every device gets it when first used).
pub(crate) fn install(dev: &DeviceAllocator) {
    let t = engine_tracker(dev.index());
    if let Some(a) = dev.as_mock() {
        a.set_segment_tracker(Some(t));
    } else if let Some(a) = dev.as_cuda() {
        a.set_segment_tracker(Some(t));
    }
}

/// Attaches `callback`, called with `ctx` for every segment event of every
/// device (those used later too) from now on, with cachalot's device lock
/// held: it must not call into cachalot. Callbacks cannot be detached (as
/// in PyTorch). At most [`MAX_TRACKERS`]; NULL is an error.
///
/// # Safety
/// `callback` may be called with `ctx` from any thread until the process
/// ends.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_attach_segment_tracker(
    callback: Option<TrackerFn>,
    ctx: *mut c_void,
) -> c_int {
    status("cachalot_attach_segment_tracker", || {
        let f = callback.ok_or_else(|| Failure::invalid("callback is NULL"))?;
        {
            let mut list = TRACKERS.write();
            if list.len() >= MAX_TRACKERS {
                return Err(Failure::invalid(format!(
                    "{MAX_TRACKERS} trackers are attached already"
                )));
            }
            list.push(Entry { f, ctx });
        }
        // devices in use got the engine tracker when first used; make sure
        for d in existing_allocs()? {
            install(d);
        }
        Ok(())
    })
}
