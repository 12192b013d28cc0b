//! The pool registry: the default pool pair and the private pools of
//! graph captures and `MemPool`s, their use counts, their options (a
//! segment source, `use_on_oom`, `no_split`), and private-pool deletion.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::engine::block::BlockId;
use crate::engine::free_set::FreeSet;
use crate::error::{BackendError, CaptureError, DeviceAllocError};

/// Where the segments of a private pool come from instead of the backend:
/// a user's allocator (PyTorch's `torch.cuda.MemPool(allocator=...)`,
/// whose pool takes every segment from a `CUDAPluggableAllocator`'s
/// functions). The engine calls it for whole segments only (rounded as
/// any segment of the pool), with its device lock held, except `alloc`
/// while `release_lock_on_device_malloc` is on (then, as PyTorch calls a
/// pool's allocator, with every lock of the engine released), and never maps
/// pages of such a pool (no expandable segments there). The pool holds the
/// source until it is deleted, after its last segment went back.
pub trait SegmentSource: Send + Sync {
    /// A new segment of `size` bytes: its device address, aligned to 512
    /// bytes and overlapping no other segment of the device.
    /// [`DeviceAllocError::OutOfMemory`] when there is none now (the
    /// allocation goes on down the out-of-memory ladder).
    fn alloc(&self, size: u64) -> Result<u64, DeviceAllocError>;
    /// Takes back segment `addr` of `size` bytes, which `alloc` gave.
    fn free(&self, addr: u64, size: u64) -> Result<(), BackendError>;
}

/// What a private pool was created with and may be set to.
#[derive(Clone, Default)]
pub(crate) struct PoolOptions {
    /// The pool's segments come from here (else from the backend).
    pub source: Option<Arc<dyn SegmentSource>>,
    /// The segments the source gave and has not taken back, by address:
    /// their sizes.
    pub sourced: BTreeMap<u64, u64>,
    /// Allocations of the default pools may take this pool's cached free
    /// blocks before the cache is released (PyTorch's `use_on_oom`).
    pub use_on_oom: bool,
    /// Blocks of this pool are never split (PyTorch's `no_split`).
    pub no_split: bool,
}

/// Index of a pool pair; 0 is the default pool pair.
pub(crate) type PoolIdx = u32;
/// A memory pool id as PyTorch's `MempoolId_t`; (0,0) is the default pool.
pub type PoolId = (u64, u64);
/// The default pool pair's index.
pub(crate) const DEFAULT_POOL: PoolIdx = 0;

/// One pool's free set and its GC counter.
pub(crate) struct BlockPool<S> {
    pub free: FreeSet<S>,
    /// Free-block searches so far (the GC's clock).
    pub gc_calls: u64,
    /// The unmapped blocks of the pool's expandable segments, by (stream,
    /// address) (PyTorch's `BlockPool::unmapped`).
    pub unmapped: BTreeMap<(S, u64), BlockId>,
}

impl<S> Default for BlockPool<S> {
    fn default() -> Self {
        Self {
            free: FreeSet::default(),
            gc_calls: 0,
            unmapped: BTreeMap::new(),
        }
    }
}

/// A small + large pool pair: the default pools or one private pool.
pub(crate) struct PoolPair<S> {
    id: PoolId,
    small: BlockPool<S>,
    large: BlockPool<S>,
    /// Graphs (or users) holding the pool; 0 = freeable. The default pool never reaches 0.
    use_count: u32,
    /// Segments owned by the pool.
    segments: u32,
    /// Device calls in flight for a segment of the pool, made with the
    /// lock released (`unlocked.rs`): the pool is not deleted under them.
    calls: u32,
    /// The pool's options.
    pub options: PoolOptions,
}

impl<S> PoolPair<S> {
    fn new(id: PoolId) -> Self {
        Self {
            id,
            small: BlockPool::default(),
            large: BlockPool::default(),
            use_count: 1,
            segments: 0,
            calls: 0,
            options: PoolOptions::default(),
        }
    }

    /// Whether the pool is held (a use count above zero; the default pool
    /// always is).
    pub fn in_use(&self) -> bool {
        self.use_count > 0
    }

    /// The pool's id.
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The small or the large pool.
    #[inline]
    pub fn get(&mut self, small: bool) -> &mut BlockPool<S> {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// The small or the large pool, shared.
    #[inline]
    pub fn get_ref(&self, small: bool) -> &BlockPool<S> {
        if small { &self.small } else { &self.large }
    }

    /// Both pools as (small?, pool).
    pub fn both(&self) -> [(bool, &BlockPool<S>); 2] {
        [(true, &self.small), (false, &self.large)]
    }

    /// Both pools, mutable.
    pub fn both_mut(&mut self) -> [&mut BlockPool<S>; 2] {
        [&mut self.small, &mut self.large]
    }

    /// Segments owned by the pool.
    pub fn segments(&self) -> u32 {
        self.segments
    }

    /// Device calls in flight for a segment of the pool.
    pub fn calls(&self) -> u32 {
        self.calls
    }
}

/// Every pool pair by index, and the index of each pool id.
pub(crate) struct Pools<S> {
    pairs: Vec<Option<PoolPair<S>>>,
    index: HashMap<PoolId, PoolIdx>,
}

impl<S> Default for Pools<S> {
    fn default() -> Self {
        let mut index = HashMap::new();
        index.insert((0, 0), DEFAULT_POOL);
        Self {
            pairs: vec![Some(PoolPair::new((0, 0)))],
            index,
        }
    }
}

impl<S> Pools<S> {
    /// The live pool pair `idx`.
    #[inline]
    pub fn pair(&self, idx: PoolIdx) -> &PoolPair<S> {
        self.pairs[idx as usize]
            .as_ref()
            .expect("block refers to a live pool")
    }

    /// The live pool pair `idx`, mutable.
    #[inline]
    pub fn pair_mut(&mut self, idx: PoolIdx) -> &mut PoolPair<S> {
        self.pairs[idx as usize]
            .as_mut()
            .expect("block refers to a live pool")
    }

    /// The small or large pool of pair `idx`.
    #[inline]
    pub fn pool(&self, idx: PoolIdx, small: bool) -> &BlockPool<S> {
        self.pair(idx).get_ref(small)
    }

    /// The small or large pool of pair `idx`, mutable.
    #[inline]
    pub fn pool_mut(&mut self, idx: PoolIdx, small: bool) -> &mut BlockPool<S> {
        self.pair_mut(idx).get(small)
    }

    /// The small or large pool of pair `idx` if the pair is live.
    #[inline]
    pub fn try_pool_mut(&mut self, idx: PoolIdx, small: bool) -> Option<&mut BlockPool<S>> {
        Some(self.pairs.get_mut(idx as usize)?.as_mut()?.get(small))
    }

    /// The index of pool `id`, if registered.
    #[inline]
    pub fn find(&self, id: PoolId) -> Option<PoolIdx> {
        self.index.get(&id).copied()
    }

    /// Every live pool pair with its index.
    pub fn iter(&self) -> impl Iterator<Item = (PoolIdx, &PoolPair<S>)> + '_ {
        self.pairs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i as PoolIdx, p.as_ref()?)))
    }

    /// Every live pool pair, mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut PoolPair<S>> + '_ {
        self.pairs.iter_mut().flatten()
    }

    /// Number of index slots (live or not).
    pub fn slots(&self) -> PoolIdx {
        self.pairs.len() as PoolIdx
    }

    /// Whether pair `idx` is a live private pool no one holds.
    pub fn is_freeable(&self, idx: PoolIdx) -> bool {
        matches!(&self.pairs[idx as usize], Some(p) if p.use_count == 0)
    }

    /// Counts a segment created for pair `idx`.
    #[inline]
    pub fn add_segment(&mut self, idx: PoolIdx) {
        self.pair_mut(idx).segments += 1;
    }

    /// Counts a segment of pair `idx` released.
    #[inline]
    pub fn remove_segment(&mut self, idx: PoolIdx) {
        self.pair_mut(idx).segments -= 1;
    }

    /// Counts a device call in flight for a segment of pair `idx`.
    pub fn start_call(&mut self, idx: PoolIdx) {
        self.pair_mut(idx).calls += 1;
    }

    /// Counts a device call of pair `idx` ended.
    pub fn end_call(&mut self, idx: PoolIdx) {
        self.pair_mut(idx).calls -= 1;
    }

    /// PyTorch's `createOrIncrefPool`: [`Self::begin_use`], and a new pool
    /// gets its segments from `source` when one is given. A source for a
    /// pool that exists already is refused, as PyTorch refuses it.
    pub fn create_or_incref(
        &mut self,
        id: PoolId,
        source: Option<Arc<dyn SegmentSource>>,
    ) -> Result<(), crate::error::Error> {
        if source.is_some() && self.find(id).is_some() {
            return Err(crate::error::Error::InvalidArgument(format!(
                "mempool {id:?} exists already: a segment source is given only when it is created"
            )));
        }
        self.begin_use(id)?;
        if source.is_some() {
            let idx = self.find(id).expect("begin_use registered it");
            self.pair_mut(idx).options.source = source;
        }
        Ok(())
    }

    /// Starts a use of private pool `id` (`beginAllocateToPool`): creates it
    /// when new, else adds a use. A pool whose uses all ended (freeable,
    /// awaiting deletion) cannot be used again.
    pub fn begin_use(&mut self, id: PoolId) -> Result<(), CaptureError> {
        if id == (0, 0) {
            return Err(CaptureError::ReservedPool(id));
        }
        if let Some(idx) = self.find(id) {
            let p = self.pair_mut(idx);
            if p.use_count == 0 {
                return Err(CaptureError::UnknownPool(id));
            }
            p.use_count += 1;
            return Ok(());
        }
        let idx = match self.pairs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.pairs.push(None);
                self.pairs.len() - 1
            }
        };
        self.pairs[idx] = Some(PoolPair::new(id));
        self.index.insert(id, idx as PoolIdx);
        Ok(())
    }

    /// Ends a use of private pool `id`; true when it has no uses left.
    pub fn end_use(&mut self, id: PoolId) -> Result<bool, CaptureError> {
        let Some(idx) = self.find(id) else {
            return Err(CaptureError::UnknownPool(id));
        };
        if idx == DEFAULT_POOL {
            return Err(CaptureError::ReservedPool(id));
        }
        let p = self.pair_mut(idx);
        if p.use_count == 0 {
            return Err(CaptureError::UnknownPool(id));
        }
        p.use_count -= 1;
        Ok(p.use_count == 0)
    }

    /// Deletes the freeable pair `idx` if it owns no segment any more
    /// and no device call for one is in flight.
    pub fn delete_if_empty(&mut self, idx: PoolIdx) {
        if let Some(p) = &self.pairs[idx as usize]
            && p.segments == 0
            && p.calls == 0
        {
            let id = p.id;
            self.pairs[idx as usize] = None;
            self.index.remove(&id);
        }
    }
}
