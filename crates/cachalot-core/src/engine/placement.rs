//! Placement: which free block a request takes, and how blocks coming back
//! are filed. One fit rule ([`FitRule`]) for every search of the engine,
//! and the [`PlacementPolicy`] trait with its two implementations:
//! [`PyTorch`] (PyTorch's best fit over every free block) and [`Steady`]
//! (cachalot's default: a stream that drains the default pool files its
//! whole free segments as dormant, taken again oldest first, so repeated
//! work replays its earlier placement).
#![forbid(unsafe_code)]

use crate::backend::Backend;
use crate::config::{AllocatorConfig, Placement};
use crate::engine::block::{BState, BlockId};
use crate::engine::free_set::{Back, Found, FreeSet};
use crate::engine::pools::{DEFAULT_POOL, PoolIdx};
use crate::engine::state::{Inner, Params};

/// Which cached block sizes a request may take (PyTorch's oversize rules):
/// a block at least as large as the request; requests below
/// `max_split_size` never take oversize blocks; oversize requests take
/// blocks at most `max_non_split_rounding_size` larger.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FitRule {
    max_split: u64,
    max_non_split_rounding: u64,
}

impl FitRule {
    /// The rule of a configuration.
    #[inline]
    pub fn of(config: &AllocatorConfig) -> Self {
        Self {
            max_split: config.max_split_size,
            max_non_split_rounding: config.max_non_split_rounding_size,
        }
    }

    /// Whether a block of `block` bytes may serve a request of `request`
    /// bytes, given `block >= request`.
    #[inline]
    pub fn accepts(&self, request: u64, block: u64) -> bool {
        if request < self.max_split {
            block < self.max_split
        } else {
            block < request.saturating_add(self.max_non_split_rounding)
        }
    }

    /// Whether a block of `block` bytes may serve a request of `request` bytes.
    #[inline]
    pub fn fits(&self, request: u64, block: u64) -> bool {
        block >= request && self.accepts(request, block)
    }
}

/// A free block coming back to its pool's free set.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Returning<S> {
    pub stream: S,
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
    pub pool: PoolIdx,
    /// The segment's age when the block is its whole segment.
    pub whole: Option<u64>,
}

/// A placement policy: how a request finds its block and how returned
/// blocks are filed. The engine picks the implementation from the config's
/// `placement` at each call (it may change at run time).
pub(crate) trait PlacementPolicy {
    /// Takes the best block of `stream` for a request of `size` bytes out of
    /// `free`: the smallest that fits (lowest address first), else the
    /// oldest dormant whole segment that fits.
    #[inline]
    fn take<S: Copy + Ord>(
        &self,
        free: &mut FreeSet<S>,
        stream: S,
        size: u64,
        fit: FitRule,
    ) -> Option<Found> {
        free.take_first_at_least(stream, size, |b| fit.accepts(size, b))
    }

    /// Whether blocks returned to `pool` are watched for the stream
    /// draining it.
    fn watches_drain(&self, pool: PoolIdx) -> bool;

    /// Files a block coming back from its user.
    #[inline]
    fn on_return<S: Copy + Ord>(&self, free: &mut FreeSet<S>, r: Returning<S>) -> Back {
        let watch = self.watches_drain(r.pool);
        free.insert_back(r.stream, r.size, r.addr, r.id, watch, r.whole)
    }

    /// `stream` has no block of this pool out any more
    /// ([`Back::Drained`]): reorganise its free blocks; the ids of blocks
    /// made dormant go to `moved`. Nothing by default (a policy that does
    /// not watch drains is never told of one).
    fn on_drain<S: Copy + Ord>(
        &self,
        free: &mut FreeSet<S>,
        stream: S,
        whole_seq: impl Fn(BlockId) -> Option<u64>,
        moved: &mut Vec<BlockId>,
    ) {
        let _ = (free, stream, whole_seq, moved);
    }
}

/// PyTorch's placement: best fit over every free block of the stream.
pub(crate) struct PyTorch;

impl PlacementPolicy for PyTorch {
    #[inline]
    fn watches_drain(&self, _pool: PoolIdx) -> bool {
        false
    }
}

/// `placement:steady`: once a stream has no block out of the default pool
/// any more, its whole free segments become dormant: taken again oldest
/// first, and only when no other free block fits. A stream that runs the
/// same work again thus takes its segments in the order it created them and
/// replays its earlier placement, with no device call. (Private pools keep
/// PyTorch's placement.)
///
/// Why the replay is exact: say the first run created segments s1, s2, …
/// in that order and the second run has made the same choices so far.
/// Then the segments it has taken again are exactly those the first run
/// had created by now, in the same state, and every later one is still
/// dormant and whole. Best fit over the active blocks chooses as the
/// first run did; where the first run found nothing and created s(k+1)
/// (sized for this request), the oldest dormant segment that fits is
/// s(k+1) itself. A drain in the middle moves the same segments plus
/// later, younger ones, which come after them in age order.
pub(crate) struct Steady;

impl PlacementPolicy for Steady {
    #[inline]
    fn watches_drain(&self, pool: PoolIdx) -> bool {
        pool == DEFAULT_POOL
    }

    fn on_drain<S: Copy + Ord>(
        &self,
        free: &mut FreeSet<S>,
        stream: S,
        whole_seq: impl Fn(BlockId) -> Option<u64>,
        moved: &mut Vec<BlockId>,
    ) {
        free.make_dormant(stream, whole_seq, moved);
    }
}

/// Runs `$body` with `$p` bound to the policy the config names.
macro_rules! with_policy {
    ($placement:expr, $p:ident => $body:expr) => {
        match $placement {
            Placement::Steady => {
                let $p = Steady;
                $body
            }
            Placement::PyTorch => {
                let $p = PyTorch;
                $body
            }
        }
    };
}

impl<B: Backend> Inner<B> {
    /// PyTorch's `get_free_block`: takes the best cached block for `p`.
    #[inline]
    pub(super) fn get_free_block(&mut self, p: &Params<B::Stream>) -> Option<BlockId> {
        let gc_on =
            self.limits.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0;
        let fit = FitRule::of(&self.config);
        let placement = self.config.placement;
        let expandable = self.expandable_in(p.pool);
        let pool = self.pools.try_pool_mut(p.pool, p.small)?;
        if gc_on {
            pool.gc_calls += 1;
        }
        if expandable {
            return self.get_free_block_expandable(p, fit);
        }
        let found = with_policy!(placement, x => x.take(&mut pool.free, p.stream, p.size, fit))?;
        self.blocks[found.id].dormant = false;
        Some(found.id)
    }

    /// `get_free_block` with `expandable_segments:True`, as PyTorch 2.11:
    /// when the best fit is a block of an expandable segment, its size for
    /// the best fit is what it can grow to (its size plus the unmapped
    /// block after it), so later, larger blocks that can grow less are
    /// preferred; then the oversize rules apply to the block chosen.
    fn get_free_block_expandable(
        &mut self,
        p: &Params<B::Stream>,
        fit: FitRule,
    ) -> Option<BlockId> {
        let pool = self.pools.try_pool_mut(p.pool, p.small)?;
        let blocks = &self.blocks;
        let mut it = pool.free.first_at_least(p.stream, p.size)?;
        let grows = |id: BlockId| {
            let b = &blocks[id];
            b.size
                + if b.next != crate::engine::block::NIL && blocks[b.next].state == BState::Unmapped
                {
                    blocks[b.next].size
                } else {
                    0
                }
        };
        // (a block that cannot grow is the best already: every later one is
        // at least as large)
        while blocks[it.id].expandable && grows(it.id) > it.size {
            match pool.free.next_after(p.stream, it.size, it.addr) {
                Some(n) if grows(n.id) < grows(it.id) => it = n,
                _ => break,
            }
        }
        if !fit.accepts(p.size, it.size) {
            return None;
        }
        let whole = blocks[it.id].dormant_key();
        let removed = pool.free.remove(p.stream, it.size, it.addr, whole);
        debug_assert_eq!(removed, Some(it.id));
        pool.free.note_out(p.stream);
        self.blocks[it.id].dormant = false;
        Some(it.id)
    }

    /// Puts a free block in its pool's free set (keyed by its stream).
    #[inline]
    pub(super) fn insert_free(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (st, size, addr) = (b.stream, b.size, b.addr);
        let whole = b.dormant_key();
        let p = self.pools.pool_mut(b.pool, b.small);
        let gc = p.gc_calls;
        p.free.insert(st, size, addr, id, whole);
        let b = &mut self.blocks[id];
        b.gc_base = gc;
        b.state = BState::Free;
    }

    /// Takes a free block out of its pool's free set.
    #[inline]
    pub(super) fn remove_free(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (st, size, addr) = (b.stream, b.size, b.addr);
        let whole = b.dormant_key();
        let removed = self
            .pools
            .pool_mut(b.pool, b.small)
            .free
            .remove(st, size, addr, whole);
        debug_assert_eq!(removed, Some(id));
        self.blocks[id].dormant = false;
    }

    /// [`Inner::insert_free`] for a block coming back from its user, filed
    /// by the placement policy; a stream that drained its pool lets the
    /// policy reorganise its free blocks.
    #[inline]
    pub(super) fn insert_free_back(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        debug_assert!(!b.dormant);
        let r = Returning {
            stream: b.stream,
            size: b.size,
            addr: b.addr,
            id,
            pool: b.pool,
            whole: b.whole_seq(),
        };
        let small = b.small;
        let placement = self.config.placement;
        let p = self.pools.pool_mut(r.pool, small);
        let gc = p.gc_calls;
        let back = with_policy!(placement, x => x.on_return(&mut p.free, r));
        let b = &mut self.blocks[id];
        b.gc_base = gc;
        b.state = BState::Free;
        b.dormant = back == Back::Dormant;
        if back == Back::Drained {
            self.on_drain(r.pool, small, r.stream);
        }
    }

    /// The stream drained pool `pool`: the policy files its free blocks.
    #[cold]
    fn on_drain(&mut self, pool: PoolIdx, small: bool, stream: B::Stream) {
        let blocks = &self.blocks;
        let placement = self.config.placement;
        let mut moved = Vec::new();
        let free = &mut self.pools.pool_mut(pool, small).free;
        with_policy!(placement, x => x.on_drain(free, stream, |id| blocks[id].whole_seq(), &mut moved));
        for id in moved {
            self.blocks[id].dormant = true;
        }
    }

    /// The config now says `placement:pytorch`: every dormant block goes
    /// back among the free blocks (PyTorch's best fit sees them all).
    pub(super) fn wake_dormant(&mut self) {
        let mut woken = Vec::new();
        for pair in self.pools.iter_mut() {
            for pool in pair.both_mut() {
                woken.extend(pool.free.wake_all());
            }
        }
        for id in woken {
            self.blocks[id].dormant = false;
        }
    }
}
