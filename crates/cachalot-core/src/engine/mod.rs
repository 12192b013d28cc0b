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
mod events;
mod expandable;
mod free_set;
pub mod history;
mod invariants;
mod placement;
mod pools;
mod reclaim;
pub mod rounding;
mod segments;
mod snapshot;
mod state;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::backend::Backend;
use crate::config::AllocatorConfig;
use crate::error::{Error, OomReport};
use crate::stats::DeviceStats;

pub use capture::PoolFilter;
pub use history::{HistoryConfig, TraceAction, TraceEntry};
pub use pools::PoolId;
pub use snapshot::{BlockSnapshot, BlockState, SegmentSnapshot, Snapshot};
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

/// A caching device-memory allocator for one device.
///
/// Thread-safe: every operation takes one short lock. `allocate` on a cache
/// hit does no heap allocation and calls no backend function (unless blocks
/// with cross-stream uses are waiting for their events).
pub struct CachingAllocator<B: Backend> {
    backend: B,
    inner: Mutex<Inner<B>>,
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

/// Spins before parking on a contended lock. Critical sections are a few
/// hundred nanoseconds, far shorter than a futex sleep and wake-up, so
/// waiting threads spin (reading, not writing, the lock word) for a while
/// first; after about this many spins they park as usual.
const SPIN_LIMIT: u32 = 4000;

impl<B: Backend> CachingAllocator<B> {
    #[inline]
    fn lock(&self) -> MutexGuard<'_, Inner<B>> {
        match self.inner.try_lock() {
            Some(g) => g,
            None => self.lock_contended(),
        }
    }

    #[cold]
    fn lock_contended(&self) -> MutexGuard<'_, Inner<B>> {
        for _ in 0..SPIN_LIMIT {
            std::hint::spin_loop();
            if !self.inner.is_locked()
                && let Some(g) = self.inner.try_lock()
            {
                return g;
            }
        }
        self.inner.lock()
    }

    /// An allocator over `backend` configured from the environment
    /// (`CACHALOT_ALLOC_CONF`, then PyTorch's variables).
    pub fn new(backend: B) -> Result<Self, Error> {
        let config = AllocatorConfig::from_env()?;
        Self::with_config(backend, config)
    }

    /// An allocator over `backend` with an explicit configuration.
    pub fn with_config(backend: B, config: AllocatorConfig) -> Result<Self, Error> {
        if config.expandable_segments && backend.virtual_memory().is_none() {
            return Err(crate::config::expandable_unsupported().into());
        }
        let total = backend.memory_info()?.total;
        Ok(Self {
            inner: Mutex::new(Inner::new(config, total)),
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
            });
        }
        let outcome = self.lock().malloc(&self.backend, size, stream)?;
        match outcome {
            AllocOutcome::Ok(addr) => Ok(addr),
            AllocOutcome::Oom { report, never_fits } => {
                tracing::warn!(%report, "out of memory");
                self.notify_oom(&report);
                if never_fits {
                    Err(Error::NeverFits {
                        requested: size,
                        reason: report.to_string(),
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
        self.lock().free(&self.backend, addr)
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

    /// A snapshot of every segment and block, with the memory history
    /// (empty when the history is off) and the device index.
    pub fn snapshot(&self) -> Snapshot {
        let mut g = self.lock();
        if g.history.is_some() {
            g.trace(TraceAction::Snapshot, 0, 0, self.backend.default_stream());
        }
        let mut s = g.snapshot();
        s.device = self.backend.device();
        for seg in &mut s.segments {
            seg.device = s.device;
        }
        s.traces = g
            .history
            .as_ref()
            .map_or_else(Vec::new, |h| h.ring.iter().cloned().collect());
        s
    }

    /// Turns the memory history on (`Some`, clearing it when the settings
    /// change) or off (`None`, which also clears it).
    pub fn record_memory_history(&self, config: Option<HistoryConfig>) {
        let mut g = self.lock();
        g.history = match (config, g.history.take()) {
            (None, _) => None,
            (Some(c), Some(h)) if h.config == c => Some(h),
            (Some(c), _) => Some(Box::new(history::History::new(c))),
        };
    }

    /// The entries of the memory history, oldest first.
    pub fn memory_history(&self) -> Vec<TraceEntry> {
        self.inner
            .lock()
            .history
            .as_ref()
            .map_or_else(Vec::new, |h| h.ring.iter().cloned().collect())
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
        let g = self.inner.get_mut();
        if let Err(e) = g.release_all_on_drop(&self.backend) {
            tracing::error!(%e, "releasing device memory on drop failed");
        }
    }
}
