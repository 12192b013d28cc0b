//! The caching engine: [`CachingAllocator`], generic over a [`Backend`].
//!
//! Behaviour follows PyTorch 2.11's native `CUDACachingAllocator` (see the
//! spec in `shared/spec/pytorch-allocator.md`): size rounding, small and large
//! pools, best fit by (stream, size, address), splitting and coalescing,
//! oversize blocks, per-stream reuse, `record_stream` with end-of-life events,
//! garbage collection, the memory fraction, the OOM ladder and `empty_cache`.
//! Deviations from PyTorch are bug fixes, each marked in a comment.
//!
//! The engine is one module per idea; `README.md` in this folder lists
//! them, with the data flow of one `malloc` and one `free` through them and
//! where each PyTorch concept lives.

mod accounting;
mod addr_table;
mod block;
mod capture;
mod checkpoint;
mod events;
mod expandable;
mod fast_map;
mod free_set;
pub mod history;
mod invariants;
mod ipc;
mod locks;
mod placement;
mod pool_ops;
mod pools;
mod reclaim;
pub mod rounding;
mod segments;
mod shard;
mod snapshot;
mod stat_log;
mod state;
mod sync;
mod unlocked;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;

use self::sync::Mutex;

use crate::backend::Backend;
use crate::config::AllocatorConfig;
use crate::error::{Error, OomReport};
use crate::stats::DeviceStats;

pub use capture::PoolFilter;
pub use checkpoint::{
    CheckpointBlock, CheckpointDelta, CheckpointSegment, CheckpointState, PoolCheckpoint,
};
pub use history::{
    ActionSet, Annotation, HistoryConfig, HistoryContext, RecordContext, TraceAction, TraceEntry,
};
pub use ipc::SharedMemory;
use locks::{Padded, ShardLock};
pub use pool_ops::{SegmentEvent, SegmentTracker};
pub use pools::{PoolId, SegmentSource};
use shard::{SHARDS, Shard};
pub use snapshot::{BlockSnapshot, BlockState, SegmentSnapshot, Snapshot};
pub use stat_log::{set_stats_thread, stats_thread_enabled, stats_thread_windows};
use state::{AllocOutcome, Inner};

/// A callback run on out-of-memory, after the lock is dropped and before the
/// error is returned. It runs with no allocator lock held, so it may call
/// back into the allocator (allocate, free, `memory_stats`, `empty_cache`,
/// add or remove observers).
pub type OomObserver = Arc<dyn Fn(&OomReport) + Send + Sync>;

/// The handle of a registered OOM observer
/// ([`CachingAllocator::remove_oom_observer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObserverId(u64);

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// A fresh user pool id `(0, n)`, like `torch.cuda.graph_pool_handle()`.
pub fn graph_pool_handle() -> PoolId {
    (0, NEXT_POOL.fetch_add(1, Ordering::Relaxed))
}

static NEXT_ALLOCATOR: AtomicU64 = AtomicU64::new(1);

/// How the calling thread's allocations and frees were served since it
/// started: on its stream's shard alone, or on the device path (the device
/// lock and every shard lock), and how often a full stat log was taken out
/// (the device lock, and each shard lock in turn, briefly). Thread-local and
/// always on; [`crate::replay::threads_bench`] reports the shares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// Served on the shard alone.
    pub fast: u64,
    /// Served on the device path.
    pub device: u64,
    /// Full stat logs taken out by this thread.
    pub flushes: u64,
}

impl PathCounts {
    /// The calling thread's counts.
    pub fn this_thread() -> Self {
        let [fast, device, flushes] = shard::PATHS.with(|c| c.get());
        Self {
            fast,
            device,
            flushes,
        }
    }

    /// The counts since `earlier` (of the same thread).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            fast: self.fast.saturating_sub(earlier.fast),
            device: self.device.saturating_sub(earlier.device),
            flushes: self.flushes.saturating_sub(earlier.flushes),
        }
    }

    /// The sum of two counts.
    pub fn plus(&self, other: &Self) -> Self {
        Self {
            fast: self.fast + other.fast,
            device: self.device + other.device,
            flushes: self.flushes + other.flushes,
        }
    }
}

/// A caching device-memory allocator for one device.
///
/// Thread-safe, and sharded by stream (`docs/design-shards.md`): a cache
/// hit and a plain free take only the lock of their stream's shard, so
/// threads on different streams do not contend; everything else takes the
/// device lock and then every shard lock. `allocate` on a cache hit does no
/// heap allocation and calls no backend function.
pub struct CachingAllocator<B: Backend> {
    backend: B,
    /// The device lock: the engine's state, with the shards' parts moved
    /// in while a [`DeviceGuard`](locks::DeviceGuard) is held.
    inner: Mutex<Inner<B>>,
    /// The shard locks; taken after `inner`, in index order, on the device
    /// path; alone on the fast path.
    shards: Box<[ShardLock<B::Stream>]>,
    /// The flushed windows of stat logs waiting to be folded, and the spare
    /// logs (a leaf lock: `stat_log::Folds`).
    folds: Arc<Mutex<stat_log::Folds>>,
    /// The shared mirror of the shards' fast operations while one thread
    /// runs them on several streams (`shard::Logging::Shared`; owned by
    /// that thread, no lock), folded at check-in.
    shared: Padded<shard::SharedMirror>,
    /// This allocator's key in the thread-local shard hints.
    id: u64,
    /// Whether the fast path is on (set by the device path at every
    /// check-out): while it is off, operations go to the device at once.
    fast: AtomicBool,
    observers: RwLock<Vec<(ObserverId, OomObserver)>>,
    next_observer: AtomicU64,
}

impl<B: Backend> std::fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("backend", &self.backend.name())
            .field("device", &self.backend.device())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// An allocator over `backend` configured from the environment
    /// (`CACHALOT_ALLOC_CONF`, then PyTorch's variables).
    pub fn new(backend: B) -> Result<Self, Error> {
        let config = AllocatorConfig::from_env()?;
        Self::with_config(backend, config)
    }

    /// An allocator over `backend` with an explicit configuration.
    pub fn with_config(backend: B, mut config: AllocatorConfig) -> Result<Self, Error> {
        let has_vmm = backend.virtual_memory().is_some();
        if config.expandable_segments && config.expandable_segments_given && !has_vmm {
            return Err(crate::config::expandable_unsupported().into());
        }
        config.resolve_expandable(has_vmm);
        let total = backend.memory_info()?.total;
        let id = NEXT_ALLOCATOR.fetch_add(1, Ordering::Relaxed);
        let mut inner = Inner::new(config, total);
        let mut shards: Vec<Shard<B::Stream>> =
            (0..SHARDS).map(|k| Shard::new(k, &inner.config)).collect();
        let mut refs: Vec<Option<&mut Shard<B::Stream>>> = shards.iter_mut().map(Some).collect();
        inner.occupied = 0;
        inner.check_out(&mut refs);
        Ok(Self {
            inner: Mutex::new(inner),
            shards: shards.into_iter().map(|s| Padded(Mutex::new(s))).collect(),
            folds: Arc::new(Mutex::new(stat_log::Folds::default())),
            shared: Padded(shard::SharedMirror::default()),
            id,
            fast: AtomicBool::new(false),
            backend,
            observers: RwLock::new(Vec::new()),
            next_observer: AtomicU64::new(1),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Allocates `size` bytes for use on `stream`. Returns the device address;
    /// a request of 0 bytes returns the null address 0 without touching the
    /// cache (as PyTorch). Requests ≥ 2^60 bytes are [`Error::NeverFits`].
    pub fn allocate(&self, size: u64, stream: B::Stream) -> Result<u64, Error> {
        if size == 0 {
            return Ok(0);
        }
        if size >= rounding::MAX_REQUEST {
            return Err(Error::NeverFits {
                requested: size,
                reason: "tried to allocate more than 1EB memory".into(),
                report: None,
            });
        }
        let key = shard::stream_key(self.id, &stream);
        if self.fast.load(Ordering::Relaxed)
            && let Some(k) = shard::hint_get(key)
            && let Ok(addr) = self.fast_op(k, |sh| sh.try_alloc(size, stream, &self.shared.0))
        {
            return Ok(addr);
        }
        shard::count_path(shard::DEVICE);
        let (outcome, k) = {
            let mut g = self.lock();
            let k = g.shard_of(stream);
            shard::hint_set(key, k);
            (g.malloc(&self.backend, size, stream)?, k)
        };
        self.finish_alloc(outcome, k, size)
    }

    /// The end of a device-path allocation: the address owned by shard `k`,
    /// or the out-of-memory error (observers notified first); a device
    /// call to make with the lock released first (`unlocked.rs`).
    pub(in crate::engine) fn finish_alloc(
        &self,
        outcome: AllocOutcome<B::Stream>,
        k: usize,
        size: u64,
    ) -> Result<u64, Error> {
        match outcome {
            AllocOutcome::Call(call) => {
                // (no lock is held here: the call is made unlocked)
                let next = self.device_call(*call)?;
                self.finish_alloc(next, k, size)
            }
            AllocOutcome::Ok(addr) => {
                shard::owner_set(addr, k);
                Ok(addr)
            }
            AllocOutcome::Oom { report, never_fits } => {
                tracing::warn!(%report, "out of memory");
                self.notify_oom(&report);
                if never_fits {
                    Err(Error::NeverFits {
                        requested: size,
                        reason: report.to_string(),
                        report: Some(report),
                    })
                } else {
                    Err(Error::OutOfMemory(report))
                }
            }
        }
    }

    /// Frees an address returned by [`Self::allocate`]. Freeing the null
    /// address is a no-op. If the block was used on other streams
    /// ([`Self::record_stream`]) it is reused only after their work completes.
    pub fn free(&self, addr: u64) -> Result<(), Error> {
        if addr == 0 {
            return Ok(());
        }
        // the shard of this thread's allocation at `addr` if remembered,
        // else the shard it used last; then the others it used
        if !self.fast.load(Ordering::Relaxed) {
            return self.free_on_device(addr);
        }
        let Some(k) = shard::owner_get(addr).or_else(|| shard::hint_shard(0)) else {
            return self.free_on_device(addr);
        };
        match self.try_free_on(k, addr) {
            Ok(()) => Ok(()),
            Err(shard::Miss::Device) => self.free_on_device(addr),
            Err(_) => self.free_other_shards(addr, k),
        }
    }

    /// A free on shard `k` alone ([`Self::fast_op`]).
    #[inline]
    fn try_free_on(&self, k: usize, addr: u64) -> Result<(), shard::Miss> {
        self.fast_op(k, |sh| sh.try_free(addr, &self.shared.0))
    }

    /// A fast operation `op` on shard `k` ([`Self::shard_op`]); when it met
    /// another shard's on the shared mirror the shards log from then on,
    /// and when the shard's logs are both full they are taken out; then
    /// `op` is tried once more. Counts the operation as fast when it ran.
    #[inline]
    fn fast_op<T>(
        &self,
        k: usize,
        op: impl Fn(&mut Shard<B::Stream>) -> Result<T, shard::Miss> + Copy,
    ) -> Result<T, shard::Miss> {
        match self.shard_op(k, op) {
            Ok(v) => {
                shard::count_path(shard::FAST);
                Ok(v)
            }
            Err(miss) => self.fast_retry(k, op, miss),
        }
    }

    /// [`Self::fast_op`] after `op` missed with `miss`: tried once more
    /// when that may help (the shards log now, or the logs were taken out).
    #[cold]
    #[inline(never)]
    fn fast_retry<T>(
        &self,
        k: usize,
        op: impl Fn(&mut Shard<B::Stream>) -> Result<T, shard::Miss> + Copy,
        miss: shard::Miss,
    ) -> Result<T, shard::Miss> {
        let mut r = Err(miss);
        if miss == shard::Miss::Thread {
            self.handover();
            r = self.shard_op(k, op);
        }
        if matches!(r, Err(shard::Miss::Full)) {
            self.flush_logs();
            r = self.shard_op(k, op);
        }
        if r.is_ok() {
            shard::count_path(shard::FAST);
        }
        r
    }

    /// A thread's fast operation found the shared mirror another thread's
    /// (`shard::SharedMirror`): the device path folds it, then hands it
    /// over (the next fast operation's thread claims it), unless this is
    /// the [`shard::SHORT_TURNS`]-th short turn in a row (its owner ran
    /// fewer than [`shard::SHORT_TURN`] fast operations since it claimed
    /// it): then the threads run at once, operation by operation, and the
    /// shards are checked out again to log (`shard::Logging::Log`), for
    /// good.
    #[cold]
    #[inline(never)]
    fn handover(&self) {
        let mut g = self.lock();
        if g.multi_thread {
            return;
        }
        if self.shared.0.ops() < shard::SHORT_TURN {
            g.short_turns += 1;
        } else {
            g.short_turns = 0;
        }
        if g.short_turns >= shard::SHORT_TURNS {
            tracing::debug!(
                "fast operations of two threads take turns: the shards log from now on"
            );
            g.multi_thread = true;
        } else {
            // (folded by `lock`, which holds every shard a fast operation
            // can write from)
            self.shared.0.reset();
            g.handovers += 1;
        }
    }

    /// Makes the shards log their fast operations from now on
    /// (`shard::Logging::Log`), for good.
    #[cold]
    fn start_logging(&self) {
        let mut g = self.lock();
        if !g.multi_thread {
            tracing::debug!("fast operations of two threads met: the shards log from now on");
            g.multi_thread = true;
        }
    }

    /// Whether the shards log their fast operations' stat transitions
    /// (several threads' fast operations took turns operation by
    /// operation), rather than sum them in
    /// a mirror (one shard out, or one thread on several streams). A
    /// testing hook (`docs/design-shards.md`, "One thread, several
    /// streams").
    #[doc(hidden)]
    pub fn shards_log(&self) -> bool {
        self.lock().multi_thread
    }

    /// Blocks lent from one stream to another so far (cachalot's
    /// expandable mode, `docs/design-expandable.md` "Cross-stream
    /// lending"), and of those the ones the borrowing stream waited for. A
    /// testing and reporting hook.
    #[doc(hidden)]
    pub fn lent_blocks(&self) -> (u64, u64) {
        let g = self.lock();
        (g.lent, g.lent_waits)
    }

    /// How far past the allocated peak reserved memory may grow before
    /// pages recycle now, bytes (cachalot's expandable mode,
    /// `docs/design-expandable.md` "A move budget": 1/50 of the allocated
    /// peak, doubled while page moves cost more than their budget, up to
    /// 1/11). A testing and reporting hook.
    #[doc(hidden)]
    pub fn recycling_allowance(&self) -> u64 {
        let g = self.lock();
        let live = g.stats.allocated_bytes.all().peak.max(0) as u64;
        g.recycling.allowance(live)
    }

    /// Ghost mappings kept now (cachalot's expandable mode,
    /// `docs/design-expandable.md` "Ghost mappings"): recycled memory still
    /// mapped at an old place, where it can come back with no driver call.
    /// A testing and reporting hook.
    #[doc(hidden)]
    pub fn ghost_mappings(&self) -> usize {
        self.lock().segments.ghost_count
    }

    /// The times the shared mirror passed from one thread to another
    /// (`docs/design-shards.md`, "One thread, several streams"). A testing
    /// hook.
    #[doc(hidden)]
    pub fn shared_mirror_handovers(&self) -> u64 {
        self.lock().handovers
    }

    /// Makes the shards log from now on, as after two threads' fast
    /// operations took turns on the shared mirror. A testing hook: the logs and
    /// their flushes run on one thread, deterministically.
    #[doc(hidden)]
    pub fn force_shard_logs(&self) {
        self.start_logging();
    }

    /// [`Self::free`] on the device path.
    #[cold]
    fn free_on_device(&self, addr: u64) -> Result<(), Error> {
        shard::count_path(shard::DEVICE);
        self.lock().free(&self.backend, addr)
    }

    /// [`Self::free`] of an address not on shard `first`, tried first:
    /// the other shards this thread used, else the device.
    #[cold]
    fn free_other_shards(&self, addr: u64, first: usize) -> Result<(), Error> {
        let mut tried = [usize::MAX; shard::HINTS + 1];
        tried[0] = first;
        for i in 0..shard::HINTS {
            let Some(k) = shard::hint_shard(i) else { break };
            if tried.contains(&k) {
                continue;
            }
            tried[i + 1] = k;
            match self.try_free_on(k, addr) {
                Ok(()) => return Ok(()),
                Err(shard::Miss::Device) => break,
                Err(_) => {}
            }
        }
        self.free_on_device(addr)
    }

    /// Marks the allocation at `addr` as used on `stream`, so that its memory
    /// is not reused before `stream`'s work queued up to its free completes.
    pub fn record_stream(&self, addr: u64, stream: B::Stream) -> Result<(), Error> {
        if addr == 0 {
            return Ok(());
        }
        self.lock().record_stream(&self.backend, addr, stream)
    }

    /// The size of the block handed out at `addr` (the rounded size, or the
    /// whole block when it was not split), if `addr` is a live allocation.
    pub fn block_size(&self, addr: u64) -> Option<u64> {
        let g = self.lock();
        g.live.get(addr).map(|id| g.blocks[id].size)
    }

    /// Releases every whole free segment of the default pools (and of private
    /// pools no graph holds) back to the device, after waiting for pending
    /// end-of-life events. Inside a capture only freeable private pools are
    /// released.
    pub fn empty_cache(&self) -> Result<(), Error> {
        self.lock().empty_cache(&self.backend)
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        self.lock().stats.clone()
    }

    /// The flat, sorted statistics map with PyTorch's 122 keys.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().to_flat()
    }

    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&self) {
        self.lock().stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&self) {
        self.lock().stats.reset_accumulated();
    }

    /// The current configuration.
    pub fn config(&self) -> AllocatorConfig {
        self.lock().config.clone()
    }

    /// Re-parses a config string at run time (PyTorch's
    /// `_accelerator_setAllocatorSettings`). On error nothing changes.
    pub fn set_config(&self, config: &str) -> Result<(), Error> {
        let has_vmm = self.backend.virtual_memory().is_some();
        self.lock().set_config(config, has_vmm)
    }

    /// Caps this allocator at `fraction` of the device's total memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        self.lock().set_memory_fraction(fraction)
    }

    /// Registers a callback run on every out-of-memory error; returns its
    /// handle for [`Self::remove_oom_observer`].
    pub fn add_oom_observer(&self, observer: OomObserver) -> ObserverId {
        let id = ObserverId(self.next_observer.fetch_add(1, Ordering::Relaxed));
        self.observers.write().push((id, observer));
        id
    }

    /// Unregisters an observer; false when `id` is not registered (any more).
    pub fn remove_oom_observer(&self, id: ObserverId) -> bool {
        let mut list = self.observers.write();
        let before = list.len();
        list.retain(|e| e.0 != id);
        list.len() != before
    }

    /// Runs every observer registered now, on a copy of the list: no lock
    /// of this allocator is held while user code runs.
    #[cold]
    fn notify_oom(&self, report: &OomReport) {
        let list: Vec<OomObserver> = self.observers.read().iter().map(|e| e.1.clone()).collect();
        for o in list {
            o(report);
        }
    }

    /// Routes allocations of streams matching `filter` to the private pool
    /// `pool` (created if new, else its use count grows), as PyTorch's
    /// `beginAllocateToPool`. Call before beginning the backend capture.
    pub fn begin_allocate_to_pool(
        &self,
        pool: PoolId,
        filter: PoolFilter<B::Stream>,
    ) -> Result<(), Error> {
        if self.backend.capture().is_none()
            && matches!(filter, PoolFilter::CaptureId(_) | PoolFilter::CaptureOf(_))
        {
            return Err(crate::error::CaptureError::Unsupported(self.backend.name()).into());
        }
        self.lock().begin_allocate_to_pool(pool, filter)
    }

    /// Stops routing allocations to `pool` (PyTorch's `endAllocateToPool`).
    /// Call after the backend capture has ended.
    pub fn end_allocate_to_pool(&self, pool: PoolId) -> Result<(), Error> {
        self.lock().end_allocate_to_pool(&self.backend, pool)
    }

    /// Drops one use of a private pool (graph destroyed). At zero uses its free
    /// segments are released, and the pool is deleted once it owns none.
    pub fn release_pool(&self, pool: PoolId) -> Result<(), Error> {
        self.lock().release_pool(&self.backend, pool)
    }

    /// Ends an abandoned or invalidated capture: stops routing to the pool and
    /// drops the capture's use of it, so it does not leak (PyTorch #190308).
    pub fn abandon_capture(&self, pool: PoolId) -> Result<(), Error> {
        let mut g = self.lock();
        g.end_allocate_to_pool(&self.backend, pool)?;
        g.release_pool(&self.backend, pool)
    }

    /// Checks every bookkeeping invariant (tests call it after each operation).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.lock().check_invariants()
    }

    /// Largest free cached block over all pools (PyTorch's `cacheInfo`).
    pub fn largest_free_block(&self) -> u64 {
        let g = self.lock();
        g.pools
            .iter()
            .flat_map(|(_, p)| p.both())
            .flat_map(|(_, pool)| pool.free.iter())
            .map(|e| e.size)
            .max()
            .unwrap_or(0)
    }

    /// Live allocations as (address, block size).
    pub fn live_allocations(&self) -> Vec<(u64, u64)> {
        let g = self.lock();
        let mut v: Vec<(u64, u64)> = g
            .live
            .iter()
            .map(|(a, id)| (a, g.blocks[id].size))
            .collect();
        v.sort_unstable();
        v
    }
}

impl<B: Backend> Drop for CachingAllocator<B> {
    fn drop(&mut self) {
        let shards: Vec<&mut Shard<B::Stream>> = self
            .shards
            .iter_mut()
            .map(|s| sync::get_mut(&mut s.0))
            .collect();
        let g = sync::get_mut(&mut self.inner);
        let mut shards: Vec<Option<&mut Shard<B::Stream>>> = shards.into_iter().map(Some).collect();
        g.check_in(&mut shards);
        if let Err(e) = g.release_all_on_drop(&self.backend) {
            tracing::error!(%e, "releasing device memory on drop failed");
        }
    }
}
