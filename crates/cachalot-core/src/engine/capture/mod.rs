//! Reuse of blocks freed with cross-stream uses during graph capture
//! (PyTorch PR #158352 with #162186's terminals-as-markers and incremental
//! reachability), plus cachalot's `cross_stream` mode.
//!
//! A block freed during capture while it has cross-stream uses gets free
//! markers: the terminal node sets, at free time, of its allocation stream and
//! of every stream that used it. Every later node of a stream whose `visited`
//! set (ancestors-or-self of every terminal the stream has had in this
//! capture) holds all markers is ordered after every use of the block, so the
//! block may be reused by that stream.
//!
//! `pytorch` mode (PyTorch 2.11): only the block's allocation stream may
//! reclaim it (R2), at its mallocs.
//!
//! `cross_stream` mode adds, when a stream's own search misses:
//! * deferred blocks of other streams whose markers are all in the
//!   requesting stream's visited set;
//! * free blocks cached under other streams of the same capture. Every time
//!   memory of the capture becomes free (a free, a reclaim, a re-keying), the
//!   freed range is logged with the freeing stream's terminals at that moment
//!   (a snapshot); a later use of that memory by the freeing stream is
//!   ordered after them. A free block may move to another stream once every
//!   snapshot logged over its bytes is in that stream's visited set. Memory
//!   never freed in the capture (a fresh segment's remainder, or blocks left
//!   from an earlier capture into a shared pool) carries no captured use.
//!
//! Every capture-time check queries only the capture graph (terminal sets and
//! node dependencies), never an event.
//!
//! The parts: this file routes allocations to private pools (the capture
//! registry, PyTorch's `beginAllocateToPool`/`endAllocateToPool`) and holds
//! the capture state; `reach.rs` keeps each stream's visited set;
//! `cross_log.rs` the `cross_stream` free log; `reuse.rs` the reuse steps
//! of `malloc` and `free` during capture.
#![forbid(unsafe_code)]

mod cross_log;
mod reach;
mod reuse;

use crate::backend::{Backend, CaptureStatus, GraphCapture, NodeOf};
use crate::config::CaptureReuse;
use crate::engine::block::BlockId;
use crate::engine::pools::{DEFAULT_POOL, PoolId, PoolIdx};
use crate::engine::state::Inner;
use crate::error::{BackendError, CaptureError, Error};

use cross_log::CrossLog;
use reach::Reach;

pub(crate) use crate::engine::fast_map::FastMap;

/// Capture status and id of `stream`, its terminals written into
/// `terminals`: "not capturing" on a backend without capture.
#[inline]
pub(crate) fn capture_state<B: Backend>(
    backend: &B,
    stream: B::Stream,
    terminals: &mut Vec<NodeOf<B>>,
) -> Result<(CaptureStatus, u64), BackendError> {
    match backend.capture() {
        Some(c) => c.capture_state(stream, terminals),
        None => {
            terminals.clear();
            Ok((CaptureStatus::None, 0))
        }
    }
}

/// The capture id of `stream` if it is capturing (status active).
pub(crate) fn active_capture_id<B: Backend>(
    backend: &B,
    stream: B::Stream,
) -> Result<Option<u64>, BackendError> {
    let mut terminals = Vec::new();
    let (status, id) = capture_state(backend, stream, &mut terminals)?;
    Ok((status == CaptureStatus::Active).then_some(id))
}

/// The backend's capture interface; only asked for once a stream was seen
/// capturing, which a backend without capture never reports.
pub(super) fn graph<B: Backend>(backend: &B) -> Result<&B::Capture, Error> {
    backend
        .capture()
        .ok_or_else(|| CaptureError::Unsupported(backend.name()).into())
}

/// Which streams' allocations a capture routes to its pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolFilter<S> {
    /// Streams whose capture id (from the backend) equals this id.
    CaptureId(u64),
    /// Exactly these streams.
    Streams(Vec<S>),
    /// Streams capturing into the same capture as this stream. Register it
    /// *before* beginning the backend capture on the stream (as PyTorch
    /// calls `beginAllocateToPool` before `cudaStreamBeginCapture`); the
    /// capture id is learned at the first allocation.
    CaptureOf(S),
}

/// A capture (or pool context) registered with the allocator.
pub(crate) struct CaptureEntry<S> {
    pub pool: PoolId,
    pub filter: PoolFilter<S>,
    /// Capture id learned for `PoolFilter::CaptureOf`.
    pub resolved: Option<u64>,
}

/// A block freed with uses on other streams that no event covers yet:
/// freed during capture (waiting for its free markers or the capture's
/// end), or parked after an event-record failure (waiting for a device
/// sync).
pub(crate) struct Deferred<S, N> {
    pub block: BlockId,
    /// The block's stream (a pending block keeps its stream while deferred),
    /// kept here so scans for one stream's blocks stay in this vector.
    pub stream: S,
    /// Free markers; empty = wait for capture end.
    pub markers: Vec<N>,
}

/// Per-capture reuse context: for each stream, the set of graph nodes
/// known to precede its future work.
pub(crate) struct ReuseContext<S, N> {
    visited: Reach<S, N>,
    pool: PoolId,
    /// `cross_stream` mode's log of frees.
    cross: CrossLog<S, N>,
}

/// What one `malloc`'s capture steps learned of its stream, handed
/// explicitly from the reclaim step to the pool choice and the
/// cross-stream search, so that neither asks the backend again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MallocCtx<S> {
    /// The capture status and id the reclaim step got for its stream.
    queried: Option<(S, CaptureStatus, u64)>,
    /// (stream, capture, walked): the stream's terminals are in the
    /// scratch's `terminals`, and whether its visited set covers them.
    terminals: Option<(S, u64, bool)>,
}

impl<S> Default for MallocCtx<S> {
    fn default() -> Self {
        Self {
            queried: None,
            terminals: None,
        }
    }
}

/// Buffers the capture paths reuse, so that no operation allocates for a
/// backend query.
pub(crate) struct CaptureScratch<S, N> {
    /// The cross-stream search's buffers: each stream's next candidate, the
    /// blocks held out of the free set, and which streams capture here.
    heads: Vec<reuse::Head<S>>,
    held: Vec<reuse::Held<S>>,
    member: Vec<(S, bool)>,
    /// Terminals of the stream a malloc runs on.
    terminals: Vec<N>,
    /// Terminals of any other stream queried (free markers, logged frees,
    /// capture membership, the pool choice).
    other: Vec<N>,
}

impl<S, N> Default for CaptureScratch<S, N> {
    fn default() -> Self {
        Self {
            heads: Vec::new(),
            held: Vec::new(),
            member: Vec::new(),
            terminals: Vec::new(),
            other: Vec::new(),
        }
    }
}

/// Everything the engine keeps about graph captures.
pub(crate) struct CaptureState<S, N> {
    /// Registered captures (pool contexts), oldest first.
    captures: Vec<CaptureEntry<S>>,
    /// Blocks freed with uses no event covers yet.
    pub(in crate::engine) deferred: Vec<Deferred<S, N>>,
    /// Reuse contexts by capture id.
    contexts: FastMap<u64, ReuseContext<S, N>>,
    scratch: CaptureScratch<S, N>,
}

impl<S, N> Default for CaptureState<S, N> {
    fn default() -> Self {
        Self {
            captures: Vec::new(),
            deferred: Vec::new(),
            contexts: FastMap::default(),
            scratch: CaptureScratch::default(),
        }
    }
}

impl<S: Copy + Eq, N> CaptureState<S, N> {
    /// Whether any capture (pool context) is registered: allocations may be
    /// routed to a private pool and frees may be deferred.
    #[inline]
    pub fn is_active(&self) -> bool {
        !self.captures.is_empty()
    }

    /// Whether pool `id` has a capture registered.
    pub fn is_recording(&self, id: PoolId) -> bool {
        self.captures.iter().any(|c| c.pool == id)
    }

    /// Whether `block` is in the deferred list (the invariant checker).
    pub fn is_deferred(&self, block: BlockId) -> bool {
        self.deferred.iter().any(|d| d.block == block)
    }
}

impl<B: Backend> Inner<B> {
    /// The pool pair for an allocation on `stream` (spec 2.3): the newest
    /// registered capture whose filter matches, else the default pools.
    pub(super) fn choose_pool(
        &mut self,
        backend: &B,
        stream: B::Stream,
        ctx: &MallocCtx<B::Stream>,
    ) -> Result<PoolIdx, Error> {
        // status and id of `stream`: from this malloc's reclaim step if it
        // asked, else asked here once
        let mut mine: Option<(CaptureStatus, u64)> =
            ctx.queried.filter(|q| q.0 == stream).map(|q| (q.1, q.2));
        for ci in (0..self.capture.captures.len()).rev() {
            let hit = match self.capture.captures[ci].filter.clone() {
                PoolFilter::Streams(v) => v.contains(&stream),
                PoolFilter::CaptureId(id) => {
                    let info = match mine {
                        Some(i) => i,
                        None => *mine.insert(self.capture_status(backend, stream)?),
                    };
                    info.0 == CaptureStatus::Active && info.1 == id
                }
                PoolFilter::CaptureOf(origin) => {
                    let info = match mine {
                        Some(i) => i,
                        None => *mine.insert(self.capture_status(backend, stream)?),
                    };
                    if info.0 != CaptureStatus::Active {
                        false
                    } else {
                        let want = match self.capture.captures[ci].resolved {
                            Some(r) => r,
                            None => {
                                let Some(id) = active_capture_id(backend, origin)? else {
                                    continue;
                                };
                                self.capture.captures[ci].resolved = Some(id);
                                id
                            }
                        };
                        info.1 == want
                    }
                }
            };
            if hit {
                let pool = self.capture.captures[ci].pool;
                return Ok(self.pools.find(pool).expect("a registered capture's pool"));
            }
        }
        Ok(DEFAULT_POOL)
    }

    /// Capture status and id of `stream` (no allocation: the terminals go
    /// into a scratch buffer).
    pub(super) fn capture_status(
        &mut self,
        backend: &B,
        stream: B::Stream,
    ) -> Result<(CaptureStatus, u64), Error> {
        Ok(capture_state(
            backend,
            stream,
            &mut self.capture.scratch.other,
        )?)
    }

    /// PyTorch's `beginAllocateToPool`: routes allocations of streams
    /// matching `filter` to private pool `id` (created if new).
    pub(super) fn begin_allocate_to_pool(
        &mut self,
        id: PoolId,
        filter: PoolFilter<B::Stream>,
    ) -> Result<(), Error> {
        if id != (0, 0) && self.capture.is_recording(id) {
            return Err(CaptureError::AlreadyRecording(id).into());
        }
        self.pools.begin_use(id)?;
        self.capture.captures.push(CaptureEntry {
            pool: id,
            filter,
            resolved: None,
        });
        Ok(())
    }

    /// PyTorch's `endAllocateToPool`: stops routing to pool `id`.
    pub(super) fn end_allocate_to_pool(&mut self, backend: &B, id: PoolId) -> Result<(), Error> {
        let Some(pos) = self.capture.captures.iter().position(|c| c.pool == id) else {
            return Err(CaptureError::NotRecording(id).into());
        };
        self.capture.captures.remove(pos);
        self.capture.contexts.retain(|_, c| c.pool != id);
        let idx = self.pools.find(id).expect("a registered capture's pool");
        let mode = self.config.graph_capture_record_stream_reuse;
        // PyTorch #175817: the capture has ended, so every captured use of the
        // ending pool's deferred blocks is in the graph, before any later
        // capture into the pool: free them now (2.11 kept them until the
        // next malloc outside capture, which `pytorch` mode reproduces).
        if mode != CaptureReuse::PyTorch {
            let mut i = 0;
            while i < self.capture.deferred.len() {
                let bid = self.capture.deferred[i].block;
                let b = &mut self.blocks[bid];
                if b.pool == idx && b.has_no_other_uses() {
                    b.capture_uses.clear();
                    self.capture.deferred.swap_remove(i);
                    self.free_block(bid);
                } else {
                    i += 1;
                }
            }
        }
        // 2.11 frees no deferred block at capture end (`active` unchanged),
        // so a second capture into a shared pool cannot reuse them: `pytorch`
        // mode leaves them to the next malloc outside capture.
        if !self.capture.is_active() && mode != CaptureReuse::PyTorch {
            self.flush_deferred(backend)?;
        }
        Ok(())
    }

    /// Drops one use of private pool `id` (graph destroyed); at zero uses
    /// its free segments are released and the pool deleted once empty.
    pub(super) fn release_pool(&mut self, backend: &B, id: PoolId) -> Result<(), Error> {
        if self.pools.end_use(id)? && !self.capture.is_recording(id) {
            self.release_freeable_private_pools(backend);
            return self.release_failures.take();
        }
        Ok(())
    }

    /// Makes sure a reuse context exists for capture `capture`, which
    /// `stream` captures into; false when no registered pool matches.
    fn ensure_context(
        &mut self,
        backend: &B,
        stream: B::Stream,
        capture: u64,
    ) -> Result<bool, Error> {
        if self.capture.contexts.contains_key(&capture) {
            return Ok(true);
        }
        // A `CaptureOf` entry learns its capture id at the first allocation
        // routed to it; a block freed in capture before any allocation (a
        // default-pool block) must not wait for that.
        for ci in 0..self.capture.captures.len() {
            if let PoolFilter::CaptureOf(origin) = self.capture.captures[ci].filter
                && self.capture.captures[ci].resolved.is_none()
                && let Some(id) = active_capture_id(backend, origin)?
            {
                self.capture.captures[ci].resolved = Some(id);
            }
        }
        let pool = self.capture.captures.iter().rev().find_map(|c| {
            let hit = match &c.filter {
                PoolFilter::Streams(v) => v.contains(&stream),
                PoolFilter::CaptureId(id) => *id == capture,
                PoolFilter::CaptureOf(_) => c.resolved == Some(capture),
            };
            hit.then_some(c.pool)
        });
        let Some(pool) = pool else { return Ok(false) };
        self.capture.contexts.insert(
            capture,
            ReuseContext {
                visited: Reach::default(),
                pool,
                cross: CrossLog::default(),
            },
        );
        Ok(true)
    }
}
