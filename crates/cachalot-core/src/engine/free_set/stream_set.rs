//! One stream's free blocks: the size classes, a slot for the most
//! recently freed block, and the dormant whole segments.
#![forbid(unsafe_code)]

use super::size_tree::SizeTree;
use crate::engine::block::BlockId;

/// The (size, address) key of a free block, as one ordered number.
#[inline]
pub(super) fn fkey(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

#[inline]
pub(super) fn unkey(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

/// One stream's free blocks: the size-class structure plus one slot for the
/// most recently inserted block. A block that is freed and taken again at
/// once (the tensor freed and reallocated in the next iteration, the split
/// remainder merged back on free) comes and goes through the slot without
/// touching the classes; any other insert moves the slot's block into them.
/// Lookups consider both, so the set behaves exactly as one ordered set
/// keyed by (size, address).
#[derive(Default)]
pub(super) struct StreamSet {
    pub(super) tree: SizeTree,
    pub(super) recent: Option<(u128, BlockId)>,
    /// Dormant whole free segments, oldest first (`placement:steady`): the
    /// stream's segments once it has drained, taken again in creation order.
    pub(super) whole: Vec<Whole>,
    /// Blocks of this stream handed out from this pool and not yet back.
    pub(super) out: u32,
}

/// A dormant whole free segment in a [`StreamSet`]'s age-ordered list.
#[derive(Clone, Copy, Debug)]
pub(super) struct Whole {
    pub(super) seq: u64,
    pub(super) size: u64,
    pub(super) addr: u64,
    pub(super) id: BlockId,
}

impl StreamSet {
    #[inline]
    pub(super) fn insert(&mut self, k: u128, id: BlockId) {
        if let Some((ok, oid)) = self.recent.replace((k, id)) {
            let (sz, a) = unkey(ok);
            self.tree.insert(sz, a, oid);
        }
    }

    #[inline]
    pub(super) fn remove(&mut self, k: u128) -> Option<BlockId> {
        if let Some((rk, rid)) = self.recent
            && rk == k
        {
            self.recent = None;
            return Some(rid);
        }
        let (sz, a) = unkey(k);
        self.tree.remove(sz, a)
    }

    #[inline]
    pub(super) fn get(&self, k: u128) -> Option<BlockId> {
        match self.recent {
            Some((rk, rid)) if rk == k => Some(rid),
            _ => {
                let (sz, a) = unkey(k);
                self.tree.get(sz, a)
            }
        }
    }

    /// The smallest entry ≥ `k` (`k` has address 0) and whether it is the
    /// recent slot.
    #[inline(always)]
    pub(super) fn best(&self, k: u128) -> Option<(u128, BlockId, bool)> {
        let t = self
            .tree
            .first_at_least(unkey(k).0)
            .map(|(sz, a, id)| (fkey(sz, a), id, false));
        match (self.recent, t) {
            (Some((rk, rid)), t) if rk >= k && t.is_none_or(|t| rk < t.0) => Some((rk, rid, true)),
            (_, t) => t,
        }
    }

    /// The smallest entry ≥ `k`, address included (dormant entries aside).
    pub(super) fn first_at_least_key(&self, k: u128) -> Option<(u128, BlockId)> {
        let (size, addr) = unkey(k);
        let t = self
            .tree
            .first_at_least_key(size, addr)
            .map(|(sz, a, id)| (fkey(sz, a), id));
        match (self.recent, t) {
            (Some((rk, rid)), t) if rk >= k && t.is_none_or(|t| rk < t.0) => Some((rk, rid)),
            (_, t) => t,
        }
    }

    /// Removes and returns the smallest entry ≥ `k` if `accept` takes it.
    #[inline]
    pub(super) fn take_first_at_least(
        &mut self,
        k: u128,
        accept: impl FnOnce(u128) -> bool,
    ) -> Option<(u128, BlockId)> {
        let (bk, bid, recent) = self.best(k)?;
        if !accept(bk) {
            return None;
        }
        if recent {
            self.recent = None;
        } else {
            let (sz, a) = unkey(bk);
            self.tree.remove(sz, a);
        }
        Some((bk, bid))
    }

    /// Smallest key ≥ `k`.
    #[inline]
    pub(super) fn first_at_least(&self, k: u128) -> Option<(u128, BlockId)> {
        self.best(k).map(|(bk, id, _)| (bk, id))
    }

    pub(super) fn len(&self) -> usize {
        self.tree.len + usize::from(self.recent.is_some()) + self.whole.len()
    }

    pub(super) fn insert_whole(&mut self, w: Whole) {
        match self.whole.last() {
            Some(l) if l.seq > w.seq => {
                let at = self.whole.partition_point(|x| x.seq < w.seq);
                self.whole.insert(at, w);
            }
            _ => self.whole.push(w),
        }
    }

    pub(super) fn remove_whole(&mut self, seq: u64, addr: u64) -> Option<BlockId> {
        let at = self.whole.partition_point(|x| x.seq < seq);
        let w = self
            .whole
            .get(at)
            .filter(|w| w.seq == seq && w.addr == addr)?;
        let id = w.id;
        self.whole.remove(at);
        Some(id)
    }

    /// The smallest dormant segment ≥ `size` as (key, id), lowest address first.
    pub(super) fn best_whole(&self, size: u64) -> Option<(u128, BlockId)> {
        self.whole
            .iter()
            .filter(|w| w.size >= size)
            .map(|w| (fkey(w.size, w.addr), w.id))
            .min_by_key(|e| e.0)
    }

    /// Every entry, in key order.
    pub(super) fn sorted(&self) -> Vec<(u128, BlockId)> {
        let mut v: Vec<(u128, BlockId)> = Vec::with_capacity(self.len());
        self.tree.for_each(|sz, a, id| v.push((fkey(sz, a), id)));
        v.extend(self.whole.iter().map(|w| (fkey(w.size, w.addr), w.id)));
        if !self.whole.is_empty() {
            v.sort_unstable_by_key(|e| e.0);
        }
        if let Some(r) = self.recent {
            let at = v.partition_point(|e| e.0 < r.0);
            v.insert(at, r);
        }
        v
    }
}
