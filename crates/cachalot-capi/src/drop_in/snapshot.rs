//! The memory history and snapshots: blocks, segments and trace entries as
//! C structs, owned by the snapshot until it is freed.

use super::*;

/// A block of a snapshot segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotBlock {
    /// Device address.
    pub address: u64,
    /// Block size.
    pub size: u64,
    /// Requested bytes (0 when inactive).
    pub requested_size: u64,
    /// 0 = active_allocated, 1 = active_pending_free, 2 = inactive.
    pub state: i32,
    /// Zero.
    pub reserved: i32,
    /// The `data` of the context its allocation was made with (see
    /// [`crate::history`]), NULL when none; valid until the snapshot is freed.
    pub context: *mut c_void,
}

/// A segment of a snapshot; its blocks are `blocks[first_block ..
/// first_block + num_blocks]` of the snapshot, in address order, tiling it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotSegment {
    /// Device address.
    pub address: u64,
    /// Segment size.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// The stream (the raw `cudaStream_t` value; the mock's index).
    pub stream: u64,
    /// Owning pool id, first half ((0, 0): the default pools).
    pub pool_hi: u64,
    /// Owning pool id, second half.
    pub pool_lo: u64,
    /// Index of the segment's first block in the snapshot's blocks.
    pub first_block: u64,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Device index.
    pub device: i32,
    /// 1 for a small-pool segment.
    pub is_small: i32,
    /// 1 for a mapped range of an expandable segment.
    pub is_expandable: i32,
    /// Zero.
    pub reserved: i32,
    /// The `data` of the context the segment was allocated with, NULL when
    /// none; valid until the snapshot is freed.
    pub context: *mut c_void,
}

/// A memory-history entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotTrace {
    /// PyTorch's `TraceEntry::Action` order: alloc 0, free_requested 1,
    /// free_completed 2, segment_alloc 3, segment_free 4, segment_map 5,
    /// segment_unmap 6, snapshot 7, oom 8.
    pub action: i32,
    /// Device index.
    pub device: i32,
    /// Address (device free bytes for oom).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream (raw handle value).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// The `data` of the entry's context, NULL when none; valid until the
    /// snapshot is freed.
    pub context: *mut c_void,
    /// The recording thread's compile context (NUL-terminated), NULL when
    /// none (PyTorch: `"N/A"`).
    pub compile_context: *const c_char,
    /// The recording thread's user metadata (NUL-terminated), NULL when
    /// none (PyTorch: `""`).
    pub user_metadata: *const c_char,
}

/// A snapshot (`cachalot_snapshot_t`): arrays owned by cachalot until
/// [`cachalot_snapshot_free`].
#[repr(C)]
#[derive(Debug)]
pub struct CachalotSnapshot {
    /// Segments, by address.
    pub segments: *const CachalotSegment,
    /// Number of segments.
    pub num_segments: usize,
    /// Blocks of every segment.
    pub blocks: *const CachalotBlock,
    /// Number of blocks.
    pub num_blocks: usize,
    /// History entries, oldest first (none when the history is off or
    /// traces were not asked for).
    pub traces: *const CachalotTrace,
    /// Number of history entries.
    pub num_traces: usize,
    /// The config's `max_split_size` in bytes (`u64::MAX`: unlimited).
    pub max_split_size: u64,
    /// `garbage_collection_threshold`.
    pub garbage_collection_threshold: f64,
    /// 1 when expandable segments are on.
    pub expandable_segments: i32,
    /// 1 unless `graph_capture_record_stream_reuse` is off.
    pub graph_capture_record_stream_reuse: i32,
    /// `roundup_power2_divisions` per power-of-two interval.
    pub roundup_power2_divisions: [u64; 16],
    /// The last configuration string (NUL-terminated).
    pub last_config: *const c_char,
    /// `record_function` annotations, oldest first (none when the history
    /// is off or traces were not asked for).
    pub annotations: *const crate::history::CachalotAnnotation,
    /// Number of annotations.
    pub num_annotations: usize,
}

#[repr(C)]
struct OwnedSnapshot {
    public: CachalotSnapshot,
    segments: Vec<CachalotSegment>,
    blocks: Vec<CachalotBlock>,
    traces: Vec<CachalotTrace>,
    last_config: CString,
    /// The strings and annotations the arrays point to; the engine's
    /// snapshot, whose contexts the `context` pointers are.
    extras: crate::history::SnapshotExtras,
}

pub(super) fn action_code(a: TraceAction) -> i32 {
    match a {
        TraceAction::Alloc => 0,
        TraceAction::FreeRequested => 1,
        TraceAction::FreeCompleted => 2,
        TraceAction::SegmentAlloc => 3,
        TraceAction::SegmentFree => 4,
        TraceAction::SegmentMap => 5,
        TraceAction::SegmentUnmap => 6,
        TraceAction::Snapshot => 7,
        TraceAction::Oom => 8,
    }
}

fn state_code(s: BlockState) -> i32 {
    match s {
        BlockState::ActiveAllocated => 0,
        BlockState::ActivePendingFree => 1,
        BlockState::Inactive => 2,
    }
}

pub(super) fn stream_value(debug: &str) -> u64 {
    cachalot::export::stream_number(debug) as u64
}

fn build_snapshot(dev: &DeviceAllocator, pool: PoolId, include_traces: bool) -> Box<OwnedSnapshot> {
    let snap = dev.snapshot();
    let cfg = dev.config();
    let ctx = |c: &Option<cachalot::HistoryContext>| crate::history::context_data(c.as_ref());
    let mut extras = crate::history::SnapshotExtras::default();
    let mut segments = Vec::new();
    let mut blocks = Vec::new();
    for s in snap
        .segments
        .iter()
        .filter(|s| pool == DEFAULT_POOL || s.pool_id == pool)
    {
        let first = blocks.len() as u64;
        blocks.extend(s.blocks.iter().map(|b| CachalotBlock {
            address: b.address,
            size: b.size,
            requested_size: b.requested_size,
            state: state_code(b.state),
            reserved: 0,
            context: ctx(&b.context),
        }));
        segments.push(CachalotSegment {
            address: s.address,
            total_size: s.total_size,
            allocated_size: s.allocated_size,
            active_size: s.active_size,
            requested_size: s.requested_size,
            stream: stream_value(&s.stream),
            pool_hi: s.pool_id.0,
            pool_lo: s.pool_id.1,
            first_block: first,
            num_blocks: s.blocks.len() as u64,
            device: i32::try_from(s.device).unwrap_or(i32::MAX),
            is_small: i32::from(s.is_small),
            is_expandable: i32::from(s.is_expandable),
            reserved: 0,
            context: ctx(&s.context),
        });
    }
    let device = i32::try_from(dev.index()).unwrap_or(i32::MAX);
    let traces: Vec<CachalotTrace> = if include_traces {
        snap.traces
            .iter()
            .map(|t| CachalotTrace {
                action: action_code(t.action),
                device,
                addr: t.addr,
                size: t.size,
                stream: stream_value(&t.stream),
                time_us: t.time_us,
                context: ctx(&t.context),
                compile_context: extras.intern(t.compile_context.as_ref()),
                user_metadata: extras.intern(t.user_metadata.as_ref()),
            })
            .collect()
    } else {
        Vec::new()
    };
    if include_traces {
        extras.annotations(&snap.annotations, device);
    }
    let (config, last_config) = CachalotConfigInfo::of(&cfg);
    let mut owned = Box::new(OwnedSnapshot {
        public: CachalotSnapshot {
            segments: std::ptr::null(),
            num_segments: segments.len(),
            blocks: std::ptr::null(),
            num_blocks: blocks.len(),
            traces: std::ptr::null(),
            num_traces: traces.len(),
            max_split_size: config.max_split_size,
            garbage_collection_threshold: config.garbage_collection_threshold,
            expandable_segments: config.expandable_segments,
            graph_capture_record_stream_reuse: config.graph_capture_record_stream_reuse,
            roundup_power2_divisions: config.roundup_power2_divisions,
            last_config: std::ptr::null(),
            annotations: std::ptr::null(),
            num_annotations: 0,
        },
        segments,
        blocks,
        traces,
        last_config,
        extras,
    });
    owned.extras.keep(snap);
    (owned.public.annotations, owned.public.num_annotations) = owned.extras.annotation_array();
    owned.public.segments = owned.segments.as_ptr();
    owned.public.blocks = owned.blocks.as_ptr();
    owned.public.traces = owned.traces.as_ptr();
    owned.public.last_config = owned.last_config.as_ptr();
    owned
}

/// Writes a snapshot of `device` to `*out`: every segment (or, for a pool
/// id other than `(0, 0)`, that pool's segments) with its blocks, and,
/// when `include_traces` is non-zero, the memory history. Release it with
/// [`cachalot_snapshot_free`]. A device not in use yet (no allocator)
/// writes NULL (and opens nothing).
///
/// # Safety
/// `out` is NULL (an error) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_snapshot(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    include_traces: c_int,
    out: *mut *mut CachalotSnapshot,
) -> c_int {
    status("cachalot_snapshot", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let Some(dev) = existing_alloc(device)? else {
            // SAFETY: non-NULL and valid for writes by the caller's contract.
            unsafe { out.write(std::ptr::null_mut()) };
            return Ok(());
        };
        let owned = build_snapshot(dev, pool_id(pool_hi, pool_lo), include_traces != 0);
        // `public` is the first field of the repr(C) `OwnedSnapshot`: the
        // pointer to it is the pointer to the whole.
        let p = Box::into_raw(owned).cast::<CachalotSnapshot>();
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(p) };
        Ok(())
    })
}

/// Releases a snapshot from [`cachalot_snapshot`] (NULL is a no-op).
///
/// # Safety
/// `s` is NULL or a snapshot returned by [`cachalot_snapshot`] and not yet
/// released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_snapshot_free(s: *mut CachalotSnapshot) {
    entry("cachalot_snapshot_free", false, (), || {
        if !s.is_null() {
            // SAFETY: by the caller's contract `s` came from `Box::into_raw`
            // of an `OwnedSnapshot` (whose first field it points to) in
            // `cachalot_snapshot`, and is released once.
            drop(unsafe { Box::from_raw(s.cast::<OwnedSnapshot>()) });
        }
        Ok(())
    })
}
