//! The engine's bookkeeping: blocks, segments, pools, events and stats.
//! Everything here runs under the allocator's lock.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::backend::{Backend, DevicePointer};
use crate::config::{AllocatorConfig, CaptureReuse, Placement};
use crate::engine::history::{History, TraceAction};
use crate::engine::rounding::{
    MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_SIZE, allocation_size, round_size,
};
use crate::error::{BackendError, CaptureError, DeviceAllocError, Error, OomReport};
use crate::stats::{DeviceStats, StatType};

/// Index of a block in the slab.
pub(crate) type BlockId = u32;
/// "No block".
pub(crate) const NIL: BlockId = u32::MAX;
/// Index of a pool pair; 0 is the default pool pair.
pub(crate) type PoolIdx = u32;
/// A memory pool id as PyTorch's `MempoolId_t`; (0,0) is the default pool.
pub type PoolId = (u64, u64);

/// The streams a block is used on besides its own: almost always none, so
/// kept out of line (one pointer in the block instead of a `Vec`).
#[derive(Clone, Debug)]
#[allow(
    clippy::box_collection,
    reason = "one pointer in every block, a Vec only when used"
)]
pub(crate) struct Uses<S>(Option<Box<Vec<S>>>);

impl<S> Default for Uses<S> {
    fn default() -> Self {
        Self(None)
    }
}

impl<S: Copy> Uses<S> {
    /// Adds a stream.
    pub fn push(&mut self, s: S) {
        self.0.get_or_insert_with(Default::default).push(s);
    }
    /// Adds streams.
    pub fn extend_from_slice(&mut self, v: &[S]) {
        if !v.is_empty() {
            self.0
                .get_or_insert_with(Default::default)
                .extend_from_slice(v);
        }
    }
    /// Removes every stream.
    #[inline]
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

impl<S> std::ops::Deref for Uses<S> {
    type Target = [S];
    #[inline]
    fn deref(&self) -> &[S] {
        self.0.as_deref().map_or(&[], |v| v.as_slice())
    }
}

/// Life-cycle state of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BState {
    /// Cached in its pool's free set.
    Free,
    /// Handed out to the caller.
    Allocated,
    /// Freed by the caller, waiting for events or for a capture to allow it.
    Pending,
    /// Slab slot not in use.
    Dead,
}

#[derive(Clone, Debug)]
pub(crate) struct Block<S> {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: S,
    pub pool: PoolIdx,
    pub small: bool,
    pub prev: BlockId,
    pub next: BlockId,
    pub state: BState,
    pub event_count: u32,
    pub gc_base: u64,
    /// Counted in `oversize_allocations` when handed out (the threshold may
    /// change at run time; the flag keeps the stat balanced).
    pub oversize: bool,
    /// Creation order of the block's segment (every block of a segment has it).
    pub seq: u64,
    /// A whole free segment filed in its stream's dormant list.
    pub dormant: bool,
    /// Streams recorded with `record_stream` (outside capture or before it).
    pub stream_uses: Uses<S>,
    /// Streams recorded while a capture was underway.
    pub capture_uses: Uses<S>,
}

impl<S> Block<S> {
    /// A free block with no requests, events or stream uses.
    #[inline]
    pub fn free(
        addr: u64,
        size: u64,
        stream: S,
        pool: PoolIdx,
        small: bool,
        prev: BlockId,
        next: BlockId,
    ) -> Self {
        Self {
            addr,
            size,
            requested: 0,
            stream,
            pool,
            small,
            prev,
            next,
            state: BState::Free,
            event_count: 0,
            gc_base: 0,
            oversize: false,
            seq: 0,
            dormant: false,
            stream_uses: Uses::default(),
            capture_uses: Uses::default(),
        }
    }

    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// The segment's age if this block is the whole segment.
    #[inline]
    pub fn whole_seq(&self) -> Option<u64> {
        (!self.is_split()).then_some(self.seq)
    }

    /// The key under which this free block is filed apart as a dormant
    /// whole segment: its segment's age.
    #[inline]
    pub fn dormant_key(&self) -> Option<u64> {
        self.dormant.then_some(self.seq)
    }
    #[inline]
    pub fn stat_type(&self) -> StatType {
        StatType::of_pool(self.small)
    }
}

#[inline]
fn fkey(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

#[inline]
fn unkey(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

/// Size classes per power of two in [`SizeTree`] (as a log2).
const SUB_BITS: u32 = 4;
/// Number of size classes: 16 per power of two from 2^9 up to 2^63.
const NCLASS: usize = ((64 - 9) << SUB_BITS) as usize;
/// Words of the non-empty-class bitmap.
const NWORDS: usize = NCLASS.div_ceil(64);
/// A class's sorted vector becomes a tree above this many blocks (and a
/// vector again below half of it), so repeated-size workloads with
/// thousands of equal-sized free blocks stay O(log n).
const FLAT_MAX: usize = 64;

/// The size class of a block size: monotone in the size, 16 classes per
/// power of two (sizes below 512 share class 0).
#[inline]
fn class_of(size: u64) -> usize {
    let s = size.max(512);
    let l = 63 - s.leading_zeros();
    (((l - 9) << SUB_BITS) | ((s >> (l - SUB_BITS)) as u32 & ((1 << SUB_BITS) - 1))) as usize
}

/// One free block in a size class.
#[derive(Clone, Copy, Debug)]
struct Entry {
    size: u64,
    addr: u64,
    id: BlockId,
}

impl Entry {
    #[inline]
    fn key(&self) -> (u64, u64) {
        (self.size, self.addr)
    }
}

/// The free blocks of one size class in (size, address) order: a sorted
/// vector while short, a tree when long.
enum Bin {
    Flat(Vec<Entry>),
    Tree(BTreeMap<(u64, u64), BlockId>),
}

impl Default for Bin {
    fn default() -> Self {
        Bin::Flat(Vec::new())
    }
}

impl Bin {
    #[inline]
    fn len(&self) -> usize {
        match self {
            Bin::Flat(v) => v.len(),
            Bin::Tree(t) => t.len(),
        }
    }

    #[inline]
    fn insert(&mut self, e: Entry) {
        match self {
            Bin::Flat(v) => {
                match v.last() {
                    None => v.push(e),
                    Some(l) if l.key() < e.key() => v.push(e),
                    _ => {
                        let at = v.partition_point(|x| x.key() < e.key());
                        v.insert(at, e);
                    }
                }
                if v.len() > FLAT_MAX {
                    *self = Bin::Tree(v.iter().map(|x| (x.key(), x.id)).collect());
                }
            }
            Bin::Tree(t) => {
                t.insert(e.key(), e.id);
            }
        }
    }

    #[inline]
    fn remove(&mut self, size: u64, addr: u64) -> Option<BlockId> {
        match self {
            Bin::Flat(v) => {
                // most classes hold one block: no search, no shift
                if v.len() == 1 {
                    return (v[0].key() == (size, addr)).then(|| v.pop().map(|e| e.id))?;
                }
                let at = v.partition_point(|x| x.key() < (size, addr));
                v.get(at).filter(|x| x.key() == (size, addr))?;
                Some(v.remove(at).id)
            }
            Bin::Tree(t) => {
                let id = t.remove(&(size, addr))?;
                if t.len() < FLAT_MAX / 2 {
                    let v = t
                        .iter()
                        .map(|(&(size, addr), &id)| Entry { size, addr, id })
                        .collect();
                    *self = Bin::Flat(v);
                }
                Some(id)
            }
        }
    }

    fn get(&self, size: u64, addr: u64) -> Option<BlockId> {
        match self {
            Bin::Flat(v) => v
                .binary_search_by_key(&(size, addr), Entry::key)
                .ok()
                .map(|at| v[at].id),
            Bin::Tree(t) => t.get(&(size, addr)).copied(),
        }
    }

    /// The smallest entry with a size ≥ `size`.
    #[inline]
    fn first_at_least(&self, size: u64) -> Option<Entry> {
        match self {
            Bin::Flat(v) => v.get(v.partition_point(|x| x.size < size)).copied(),
            Bin::Tree(t) => t
                .range((size, 0)..)
                .next()
                .map(|(&(size, addr), &id)| Entry { size, addr, id }),
        }
    }

    fn for_each(&self, f: &mut impl FnMut(u64, u64, BlockId)) {
        match self {
            Bin::Flat(v) => v.iter().for_each(|e| f(e.size, e.addr, e.id)),
            Bin::Tree(t) => t.iter().for_each(|(&(s, a), &id)| f(s, a, id)),
        }
    }
}

/// Free blocks ordered by (size, address): segregated size classes (16 per
/// power of two, each a short sorted vector) with a two-level bitmap of the
/// non-empty ones. Best fit is one class lookup plus, when that class has no
/// block large enough, one bitmap scan to the next non-empty class; inserts
/// and removals move a few entries of one short vector instead of walking
/// and rebalancing a tree. The order is exactly PyTorch's (size, address)
/// set order.
struct SizeTree {
    bins: Vec<Bin>,
    bits: [u64; NWORDS],
    summary: u64,
    len: usize,
}

impl Default for SizeTree {
    fn default() -> Self {
        Self {
            bins: Vec::new(),
            bits: [0; NWORDS],
            summary: 0,
            len: 0,
        }
    }
}

impl SizeTree {
    #[inline]
    fn mark(&mut self, c: usize) {
        self.bits[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }

    #[inline]
    fn unmark(&mut self, c: usize) {
        self.bits[c / 64] &= !(1 << (c % 64));
        if self.bits[c / 64] == 0 {
            self.summary &= !(1 << (c / 64));
        }
    }

    /// The first non-empty class ≥ `from`.
    #[inline]
    fn next_class(&self, from: usize) -> Option<usize> {
        if from >= NCLASS {
            return None;
        }
        let w = from / 64;
        let m = self.bits[w] & (!0u64 << (from % 64));
        if m != 0 {
            return Some(w * 64 + m.trailing_zeros() as usize);
        }
        let s = self.summary & (!0u64).checked_shl(w as u32 + 1).unwrap_or(0);
        if s == 0 {
            return None;
        }
        let w = s.trailing_zeros() as usize;
        Some(w * 64 + self.bits[w].trailing_zeros() as usize)
    }

    #[inline]
    fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let c = class_of(size);
        if self.bins.len() <= c {
            self.bins.resize_with(c + 1, Bin::default);
        }
        self.bins[c].insert(Entry { size, addr, id });
        self.mark(c);
        self.len += 1;
    }

    #[inline]
    fn remove(&mut self, size: u64, addr: u64) -> Option<BlockId> {
        let c = class_of(size);
        let bin = self.bins.get_mut(c)?;
        let id = bin.remove(size, addr)?;
        if bin.len() == 0 {
            self.unmark(c);
        }
        self.len -= 1;
        Some(id)
    }

    fn get(&self, size: u64, addr: u64) -> Option<BlockId> {
        self.bins.get(class_of(size))?.get(size, addr)
    }

    /// The smallest (size, address) with size ≥ `size`.
    #[inline]
    fn first_at_least(&self, size: u64) -> Option<(u64, u64, BlockId)> {
        let c = class_of(size);
        let hit = if self.bits[c / 64] & (1 << (c % 64)) != 0 {
            self.bins[c].first_at_least(size)
        } else {
            None
        };
        let e = match hit {
            Some(e) => e,
            None => self.bins[self.next_class(c + 1)?].first_at_least(0)?,
        };
        Some((e.size, e.addr, e.id))
    }

    fn for_each(&self, mut f: impl FnMut(u64, u64, BlockId)) {
        for b in &self.bins {
            b.for_each(&mut f);
        }
    }
}

/// One stream's free blocks: the size-class structure plus one slot for the
/// most recently inserted block. A block that is freed and taken again at
/// once (the tensor freed and reallocated in the next iteration, the split
/// remainder merged back on free) comes and goes through the slot without
/// touching the classes; any other insert moves the slot's block into them.
/// Lookups consider both, so the set behaves exactly as one ordered set
/// keyed by (size, address).
#[derive(Default)]
struct StreamSet {
    tree: SizeTree,
    recent: Option<(u128, BlockId)>,
    /// Dormant whole free segments, oldest first (`placement:steady`): the
    /// stream's segments once it has drained, taken again in creation order.
    whole: Vec<Whole>,
    /// Blocks of this stream handed out from this pool and not yet back.
    out: u32,
}

/// What [`FreeSet::insert_back`] did with a block coming back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// Filed among the free blocks.
    Kept,
    /// Filed in the dormant list (the stream drained; it was the only block).
    Dormant,
    /// Filed among the free blocks; the stream drained the pool.
    Drained,
}

/// A dormant whole free segment in a [`StreamSet`]'s age-ordered list.
#[derive(Clone, Copy, Debug)]
struct Whole {
    seq: u64,
    size: u64,
    addr: u64,
    id: BlockId,
}

impl StreamSet {
    #[inline]
    fn insert(&mut self, k: u128, id: BlockId) {
        if let Some((ok, oid)) = self.recent.replace((k, id)) {
            let (sz, a) = unkey(ok);
            self.tree.insert(sz, a, oid);
        }
    }

    #[inline]
    fn remove(&mut self, k: u128) -> Option<BlockId> {
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
    fn get(&self, k: u128) -> Option<BlockId> {
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
    #[inline]
    fn best(&self, k: u128) -> Option<(u128, BlockId, bool)> {
        let t = self
            .tree
            .first_at_least(unkey(k).0)
            .map(|(sz, a, id)| (fkey(sz, a), id, false));
        match (self.recent, t) {
            (Some((rk, rid)), t) if rk >= k && t.is_none_or(|t| rk < t.0) => Some((rk, rid, true)),
            (_, t) => t,
        }
    }

    /// Removes and returns the smallest entry ≥ `k` if `accept` takes it.
    #[inline]
    fn take_first_at_least(
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
    fn first_at_least(&self, k: u128) -> Option<(u128, BlockId)> {
        self.best(k).map(|(bk, id, _)| (bk, id))
    }

    fn len(&self) -> usize {
        self.tree.len + usize::from(self.recent.is_some()) + self.whole.len()
    }

    fn insert_whole(&mut self, w: Whole) {
        match self.whole.last() {
            Some(l) if l.seq > w.seq => {
                let at = self.whole.partition_point(|x| x.seq < w.seq);
                self.whole.insert(at, w);
            }
            _ => self.whole.push(w),
        }
    }

    fn remove_whole(&mut self, seq: u64, addr: u64) -> Option<BlockId> {
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
    fn best_whole(&self, size: u64) -> Option<(u128, BlockId)> {
        self.whole
            .iter()
            .filter(|w| w.size >= size)
            .map(|w| (fkey(w.size, w.addr), w.id))
            .min_by_key(|e| e.0)
    }

    /// Every entry, in key order.
    fn sorted(&self) -> Vec<(u128, BlockId)> {
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
/// Free blocks ordered by (stream, size, address) as PyTorch's free set:
/// one [`StreamSet`] per stream, keyed by `size << 64 | address`.
pub(crate) struct FreeSet<S> {
    streams: Vec<(S, StreamSet)>,
    len: usize,
}

impl<S> Default for FreeSet<S> {
    fn default() -> Self {
        Self {
            streams: Vec::new(),
            len: 0,
        }
    }
}

impl<S: Copy + Ord> FreeSet<S> {
    #[inline]
    fn set(&self, s: S) -> Option<&StreamSet> {
        self.streams.iter().find(|e| e.0 == s).map(|e| &e.1)
    }

    #[inline]
    fn set_mut(&mut self, s: S) -> &mut StreamSet {
        let i = match self.streams.iter().position(|e| e.0 == s) {
            Some(i) => i,
            None => self.add_stream(s),
        };
        &mut self.streams[i].1
    }

    #[cold]
    fn add_stream(&mut self, s: S) -> usize {
        let at = self.streams.partition_point(|e| e.0 < s);
        self.streams.insert(at, (s, StreamSet::default()));
        at
    }

    /// Inserts a free block (the key must not be present). `whole`: the
    /// segment's age for a dormant whole segment (kept apart, oldest first),
    /// `None` for any other block.
    #[inline]
    pub fn insert(&mut self, s: S, size: u64, addr: u64, id: BlockId, whole: Option<u64>) {
        debug_assert!(self.get(s, size, addr).is_none());
        let set = self.set_mut(s);
        match whole {
            None => set.insert(fkey(size, addr), id),
            Some(seq) => set.insert_whole(Whole {
                seq,
                size,
                addr,
                id,
            }),
        }
        self.len += 1;
    }

    /// Removes a free block; `whole` as given to [`FreeSet::insert`].
    #[inline]
    pub fn remove(&mut self, s: S, size: u64, addr: u64, whole: Option<u64>) -> Option<BlockId> {
        let set = self.set_mut(s);
        let r = match whole {
            None => set.remove(fkey(size, addr)),
            Some(seq) => set.remove_whole(seq, addr),
        };
        if r.is_some() {
            self.len -= 1;
        }
        r
    }

    /// The block stored under this key.
    pub fn get(&self, s: S, size: u64, addr: u64) -> Option<BlockId> {
        let set = self.set(s)?;
        set.get(fkey(size, addr)).or_else(|| {
            set.whole
                .iter()
                .find(|w| w.size == size && w.addr == addr)
                .map(|w| w.id)
        })
    }

    /// Removes and returns the smallest block of stream `s` with size ≥
    /// `size` (lowest address first) if `accept(block size)` holds; failing
    /// that, the oldest dormant segment with size ≥ `size` that `accept`
    /// takes. The block counts as handed out ([`FreeSet::note_out`]).
    #[inline]
    pub fn take_first_at_least(
        &mut self,
        s: S,
        size: u64,
        accept: impl Fn(u64) -> bool,
    ) -> Option<(u64, u64, BlockId)> {
        let set = &mut self.streams.iter_mut().find(|e| e.0 == s)?.1;
        let (k, id) = match set.take_first_at_least(fkey(size, 0), |k| accept(unkey(k).0)) {
            Some(hit) => hit,
            None => {
                // `placement:steady`: the oldest dormant segment that fits
                let at = set
                    .whole
                    .iter()
                    .position(|w| w.size >= size && accept(w.size))?;
                let w = set.whole.remove(at);
                (fkey(w.size, w.addr), w.id)
            }
        };
        set.out = set.out.saturating_add(1);
        self.len -= 1;
        let (sz, a) = unkey(k);
        Some((sz, a, id))
    }

    /// Counts a block of stream `s` handed out from this pool.
    #[inline]
    pub fn note_out(&mut self, s: S) {
        let set = self.set_mut(s);
        set.out = set.out.saturating_add(1);
    }

    /// Counts a block of stream `s` back without inserting it (its stream changes).
    pub fn note_back_only(&mut self, s: S) {
        let set = self.set_mut(s);
        set.out = set.out.saturating_sub(1);
    }

    /// Inserts a block handed out earlier and counts it back. `steady`:
    /// `placement:steady` applies to this pool; `whole`: the block's segment
    /// age when it is a whole segment. When none of the stream's blocks is
    /// out any more (the stream has drained this pool), a whole segment
    /// that is the only active free block goes straight to the dormant list
    /// ([`Back::Dormant`]); otherwise the caller makes the set dormant
    /// ([`Back::Drained`]).
    #[inline]
    pub fn insert_back(
        &mut self,
        s: S,
        size: u64,
        addr: u64,
        id: BlockId,
        steady: bool,
        whole: Option<u64>,
    ) -> Back {
        debug_assert!(self.get(s, size, addr).is_none());
        self.len += 1;
        let set = self.set_mut(s);
        set.out = set.out.saturating_sub(1);
        if set.out == 0 && steady {
            if let Some(seq) = whole
                && set.tree.len == 0
                && set.recent.is_none()
            {
                set.insert_whole(Whole {
                    seq,
                    size,
                    addr,
                    id,
                });
                return Back::Dormant;
            }
            set.insert(fkey(size, addr), id);
            return Back::Drained;
        }
        set.insert(fkey(size, addr), id);
        Back::Kept
    }

    /// Checks that the dormant lists are in age order and hold exactly the
    /// blocks flagged dormant (`info(id)` = (dormant flag, segment age)).
    pub fn check_dormant(&self, info: impl Fn(BlockId) -> (bool, u64)) -> Result<(), String> {
        for (_, set) in &self.streams {
            if !set.whole.is_sorted_by_key(|w| w.seq) {
                return Err("dormant list out of age order".into());
            }
            for w in &set.whole {
                if info(w.id) != (true, w.seq) {
                    return Err(format!("block {} in a dormant list is not dormant", w.id));
                }
            }
            let mut bad = None;
            set.tree.for_each(|_, _, id| {
                if info(id).0 {
                    bad = Some(id);
                }
            });
            if let Some((_, id)) = set.recent
                && info(id).0
            {
                bad = Some(id);
            }
            if let Some(id) = bad {
                return Err(format!("dormant block {id} outside its dormant list"));
            }
        }
        Ok(())
    }

    /// Moves every dormant segment back among the other free blocks; returns their ids.
    pub fn wake_all(&mut self) -> Vec<BlockId> {
        let mut woken = Vec::new();
        for (_, set) in &mut self.streams {
            for w in std::mem::take(&mut set.whole) {
                set.insert(fkey(w.size, w.addr), w.id);
                woken.push(w.id);
            }
        }
        woken
    }

    /// Blocks of stream `s` out of this pool (see [`FreeSet::note_out`]).
    pub fn out(&self, s: S) -> u32 {
        self.set(s).map_or(0, |set| set.out)
    }

    /// Moves the blocks of stream `s` for which `seq` gives a segment age
    /// (whole free segments) to the dormant list; appends their ids to `moved`.
    pub fn make_dormant(
        &mut self,
        s: S,
        seq: impl Fn(BlockId) -> Option<u64>,
        moved: &mut Vec<BlockId>,
    ) {
        let set = self.set_mut(s);
        let mut all = Vec::with_capacity(set.tree.len + 1);
        set.tree.for_each(|sz, a, id| all.push((sz, a, id)));
        if let Some((k, id)) = set.recent {
            let (sz, a) = unkey(k);
            all.push((sz, a, id));
        }
        let sorted = set.whole.len();
        for (size, addr, id) in all {
            if let Some(q) = seq(id) {
                let got = set.remove(fkey(size, addr));
                debug_assert_eq!(got, Some(id));
                set.whole.push(Whole {
                    seq: q,
                    size,
                    addr,
                    id,
                });
                moved.push(id);
            }
        }
        if set.whole.len() > sorted {
            // the stable sort finds the sorted run and the new tail and merges
            // them (inserting each would be quadratic)
            set.whole.sort_by_key(|w| w.seq);
        }
    }

    /// Smallest block of stream `s` with size ≥ `size`, lowest address first.
    #[inline]
    pub fn first_at_least(&self, s: S, size: u64) -> Option<(u64, u64, BlockId)> {
        let set = self.set(s)?;
        let (k, id) = match (set.first_at_least(fkey(size, 0)), set.best_whole(size)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let (sz, a) = unkey(k);
        Some((sz, a, id))
    }

    /// Blocks of stream `s` with size in `[lo, hi)`, largest first.
    pub fn range_desc(&self, s: S, lo: u64, hi: u64) -> Vec<(u64, u64, BlockId)> {
        let (lo, hi) = (fkey(lo, 0), fkey(hi, 0));
        self.set(s).map_or_else(Vec::new, |m| {
            m.sorted()
                .into_iter()
                .rev()
                .filter(|e| e.0 >= lo && e.0 < hi)
                .map(|(k, id)| {
                    let (sz, a) = unkey(k);
                    (sz, a, id)
                })
                .collect()
        })
    }

    /// Every block as (stream, size, address, id), in (stream, size, address) order.
    pub fn iter(&self) -> impl Iterator<Item = (S, u64, u64, BlockId)> + '_ {
        self.streams.iter().flat_map(|(s, m)| {
            m.sorted().into_iter().map(move |(k, id)| {
                let (sz, a) = unkey(k);
                (*s, sz, a, id)
            })
        })
    }

    /// The streams with a set (possibly empty), in order.
    pub fn streams(&self) -> impl Iterator<Item = S> + '_ {
        self.streams.iter().map(|e| e.0)
    }

    /// Number of free blocks.
    pub fn len(&self) -> usize {
        debug_assert_eq!(
            self.len,
            self.streams.iter().map(|e| e.1.len()).sum::<usize>()
        );
        self.len
    }
}

/// One pool's free set and its GC counter.
pub(crate) struct BlockPool<S> {
    pub free: FreeSet<S>,
    pub gc_calls: u64,
}

impl<S> Default for BlockPool<S> {
    fn default() -> Self {
        Self {
            free: FreeSet::default(),
            gc_calls: 0,
        }
    }
}

/// A small + large pool pair: the default pools or one private pool.
pub(crate) struct PoolPair<S> {
    pub id: PoolId,
    pub small: BlockPool<S>,
    pub large: BlockPool<S>,
    /// Graphs (or users) holding the pool; 0 = freeable. The default pool never reaches 0.
    pub use_count: u32,
    /// Segments owned by the pool.
    pub segments: u32,
}

impl<S> PoolPair<S> {
    #[inline]
    pub fn get(&mut self, small: bool) -> &mut BlockPool<S> {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }
    pub fn get_ref(&self, small: bool) -> &BlockPool<S> {
        if small { &self.small } else { &self.large }
    }
}

/// A device segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub size: u64,
    pub head: BlockId,
    /// Counted in `oversize_segments`.
    pub oversize: bool,
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

/// A block freed during capture with cross-stream uses.
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
    pub visited: crate::engine::capture::Reach<S, N>,
    pub pool: PoolId,
    /// `cross_stream` mode's log of frees (see `capture.rs`).
    pub cross: crate::engine::capture::CrossLog<S, N>,
}

/// Parameters of one allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params<S> {
    pub stream: S,
    pub requested: u64,
    pub size: u64,
    pub alloc_size: u64,
    pub pool: PoolIdx,
    pub small: bool,
}

/// Outcome of the pre-lock checks of `malloc`.
pub(crate) enum AllocOutcome {
    Ok(u64),
    Oom(Box<OomReport>, bool),
}

/// A stream's FIFO of (event, block) in record order.
pub(crate) type EventQueue<B> = (
    <B as Backend>::Stream,
    VecDeque<(<B as Backend>::Event, BlockId)>,
);

pub(crate) struct Inner<B: Backend> {
    pub blocks: Vec<Block<B::Stream>>,
    pub free_slots: Vec<BlockId>,
    pub pools: Vec<Option<PoolPair<B::Stream>>>,
    pub pool_index: HashMap<PoolId, PoolIdx>,
    pub segments: BTreeMap<u64, Segment>,
    pub live: crate::engine::addr_table::AddrTable,
    pub stats: DeviceStats,
    pub config: AllocatorConfig,
    /// Per-stream FIFOs of (event, block) in record order.
    pub event_queues: Vec<EventQueue<B>>,
    pub outstanding_events: usize,
    pub event_pool: Vec<B::Event>,
    pub captures: Vec<CaptureEntry<B::Stream>>,
    pub deferred: Vec<Deferred<B::Stream, crate::backend::NodeOf<B>>>,
    pub reuse_contexts:
        crate::engine::capture::FastMap<u64, ReuseContext<B::Stream, crate::backend::NodeOf<B>>>,
    /// Buffers of the capture paths (`capture.rs`).
    pub capture_scratch:
        crate::engine::capture::CaptureScratch<B::Stream, crate::backend::NodeOf<B>>,
    pub total_memory: u64,
    pub memory_fraction: f64,
    pub allowed_max: Option<u64>,
    /// Memory history, `None` when off.
    pub history: Option<Box<History>>,
    /// Segments created so far (each segment's `seq`).
    pub next_seq: u64,
}

impl<B: Backend> Inner<B> {
    pub fn new(config: AllocatorConfig, total_memory: u64) -> Self {
        let stats = DeviceStats {
            max_split_size: config.max_split_size_stat(),
            ..DeviceStats::default()
        };
        let mut pool_index = HashMap::new();
        pool_index.insert((0, 0), 0);
        let mut s = Self {
            blocks: Vec::new(),
            free_slots: Vec::new(),
            pools: vec![Some(PoolPair {
                id: (0, 0),
                small: BlockPool::default(),
                large: BlockPool::default(),
                use_count: 1,
                segments: 0,
            })],
            pool_index,
            segments: BTreeMap::new(),
            live: Default::default(),
            stats,
            event_queues: Vec::new(),
            outstanding_events: 0,
            event_pool: Vec::new(),
            captures: Vec::new(),
            deferred: Vec::new(),
            reuse_contexts: Default::default(),
            capture_scratch: Default::default(),
            total_memory,
            memory_fraction: config.per_process_memory_fraction,
            allowed_max: None,
            history: None,
            next_seq: 0,
            config,
        };
        s.update_allowed();
        s
    }

    pub fn update_allowed(&mut self) {
        self.allowed_max = if self.memory_fraction < 1.0 {
            Some((self.memory_fraction * self.total_memory as f64) as u64)
        } else {
            None
        };
    }

    /// Appends a history entry when the history is on (one branch when off).
    #[inline]
    pub fn trace(&mut self, action: TraceAction, addr: u64, size: u64, stream: B::Stream) {
        if let Some(h) = self.history.as_mut() {
            h.push(action, addr, size, format!("{stream:?}"));
        }
    }

    // ----- slab -----

    fn new_block(&mut self, b: Block<B::Stream>) -> BlockId {
        if let Some(id) = self.free_slots.pop() {
            self.blocks[id as usize] = b;
            id
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as BlockId
        }
    }

    fn drop_block(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.state = BState::Dead;
        b.prev = NIL;
        b.next = NIL;
        b.stream_uses.clear();
        b.capture_uses.clear();
        self.free_slots.push(id);
    }

    #[inline]
    pub fn pool_mut(&mut self, idx: PoolIdx) -> &mut PoolPair<B::Stream> {
        self.pools[idx as usize]
            .as_mut()
            .expect("block refers to a live pool")
    }

    /// Puts a free block in its pool's free set (keyed by its stream).
    #[inline]
    pub(crate) fn insert_free(&mut self, id: BlockId) {
        let b = &self.blocks[id as usize];
        let (st, size, addr) = (b.stream, b.size, b.addr);
        let (pool, small) = (b.pool, b.small);
        let whole = b.dormant_key();
        let p = self.pool_mut(pool).get(small);
        let gc = p.gc_calls;
        p.free.insert(st, size, addr, id, whole);
        let b = &mut self.blocks[id as usize];
        b.gc_base = gc;
        b.state = BState::Free;
    }

    /// [`Inner::insert_free`] for a block coming back from its user (see
    /// [`FreeSet::insert_back`]).
    #[inline]
    fn insert_free_back(&mut self, id: BlockId) -> Back {
        let b = &self.blocks[id as usize];
        debug_assert!(!b.dormant);
        let (st, size, addr) = (b.stream, b.size, b.addr);
        let (pool, small) = (b.pool, b.small);
        // placement:steady applies to the default pool
        let steady = pool == 0 && self.config.placement == Placement::Steady;
        let whole = b.whole_seq();
        let p = self.pool_mut(pool).get(small);
        let gc = p.gc_calls;
        let back = p.free.insert_back(st, size, addr, id, steady, whole);
        let b = &mut self.blocks[id as usize];
        b.gc_base = gc;
        b.state = BState::Free;
        b.dormant = back == Back::Dormant;
        back
    }

    #[inline]
    pub(crate) fn remove_free(&mut self, id: BlockId) {
        let b = &self.blocks[id as usize];
        let (st, size, addr) = (b.stream, b.size, b.addr);
        let (pool, small) = (b.pool, b.small);
        let whole = b.dormant_key();
        let removed = self
            .pool_mut(pool)
            .get(small)
            .free
            .remove(st, size, addr, whole);
        debug_assert_eq!(removed, Some(id));
        self.blocks[id as usize].dormant = false;
    }

    // ----- pool choice -----

    /// The pool pair for an allocation on `stream` (spec 2.3).
    pub fn choose_pool(&mut self, backend: &B, stream: B::Stream) -> Result<PoolIdx, Error> {
        // status and id of `stream`: from this malloc's reclaim step if it
        // asked, else asked here once
        let mut mine: Option<(crate::backend::CaptureStatus, u64)> = self
            .capture_scratch
            .queried
            .take()
            .filter(|q| q.0 == stream)
            .map(|q| (q.1, q.2));
        for ci in (0..self.captures.len()).rev() {
            let hit = match self.captures[ci].filter.clone() {
                PoolFilter::Streams(v) => v.contains(&stream),
                PoolFilter::CaptureId(id) => {
                    let info = match mine {
                        Some(i) => i,
                        None => *mine.insert(self.capture_status(backend, stream)?),
                    };
                    info.0 == crate::backend::CaptureStatus::Active && info.1 == id
                }
                PoolFilter::CaptureOf(origin) => {
                    let info = match mine {
                        Some(i) => i,
                        None => *mine.insert(self.capture_status(backend, stream)?),
                    };
                    if info.0 != crate::backend::CaptureStatus::Active {
                        false
                    } else {
                        let id = info.1;
                        let want = match self.captures[ci].resolved {
                            Some(r) => r,
                            None => {
                                let Some(id) =
                                    crate::engine::capture::active_capture_id(backend, origin)?
                                else {
                                    continue;
                                };
                                self.captures[ci].resolved = Some(id);
                                id
                            }
                        };
                        id == want
                    }
                }
            };
            let c = &self.captures[ci];
            if hit {
                return Ok(self.pool_index[&c.pool]);
            }
        }
        Ok(0)
    }

    /// Capture status and id of `stream` (no allocation: the terminals go
    /// into a scratch buffer).
    pub(crate) fn capture_status(
        &mut self,
        backend: &B,
        stream: B::Stream,
    ) -> Result<(crate::backend::CaptureStatus, u64), Error> {
        Ok(crate::engine::capture::capture_state(
            backend,
            stream,
            &mut self.capture_scratch.other,
        )?)
    }

    // ----- the allocation path -----

    pub fn params(&self, size: u64, stream: B::Stream, pool: PoolIdx) -> Params<B::Stream> {
        let rounded = round_size(size, &self.config);
        Params {
            stream,
            requested: size,
            size: rounded,
            alloc_size: allocation_size(rounded, &self.config),
            pool,
            small: rounded <= SMALL_SIZE,
        }
    }

    /// PyTorch's `get_free_block`.
    #[inline]
    pub fn get_free_block(&mut self, p: &Params<B::Stream>) -> Option<BlockId> {
        let gc_on = self.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0;
        let max_split = self.config.max_split_size;
        let max_nsr = self.config.max_non_split_rounding_size;
        let pool = self.pools[p.pool as usize].as_mut()?.get(p.small);
        if gc_on {
            pool.gc_calls += 1;
        }
        let size = p.size;
        // oversize rules: small requests never take oversize blocks; oversize
        // requests take blocks at most `max_non_split_rounding` larger
        let accept = |bsize: u64| {
            if size < max_split {
                bsize < max_split
            } else {
                bsize < size.saturating_add(max_nsr)
            }
        };
        let (_, _, id) = pool.free.take_first_at_least(p.stream, size, accept)?;
        self.blocks[id as usize].dormant = false;
        Some(id)
    }

    /// Gets a new segment from the device (PyTorch's `alloc_block`).
    /// `Ok(None)` = out of memory (retry may help); `Err` = other driver error.
    pub fn alloc_block(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        let size = p.alloc_size;
        if let Some(max) = self.allowed_max
            && self.stats.reserved_bytes.all().current as u64 + size > max
        {
            return Ok(None);
        }
        let ptr = match backend.malloc(size) {
            Ok(ptr) => ptr.addr(),
            Err(DeviceAllocError::OutOfMemory) => return Ok(None),
            Err(DeviceAllocError::Backend(e)) => return Err(e.into()),
        };
        let st = StatType::of_pool(p.small);
        self.stats.segment.update(st, 1);
        self.stats.reserved_bytes.update(st, size as i64);
        let oversize = size >= self.config.max_split_size;
        if oversize {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.pool_mut(p.pool).segments += 1;
        self.next_seq += 1;
        let id = self.new_block(Block {
            seq: self.next_seq,
            ..Block::free(ptr, size, p.stream, p.pool, p.small, NIL, NIL)
        });
        self.segments.insert(
            ptr,
            Segment {
                size,
                head: id,
                oversize,
            },
        );
        self.pool_mut(p.pool).get(p.small).free.note_out(p.stream);
        self.trace(TraceAction::SegmentAlloc, ptr, size, p.stream);
        tracing::debug!(size, ptr, "device segment allocated");
        Ok(Some(id))
    }

    fn should_split(&self, b: &Block<B::Stream>, size: u64) -> bool {
        let remaining = b.size - size;
        if b.small {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Hands out `id` for `p` (PyTorch's `alloc_found_block`); returns the address.
    pub fn alloc_found_block(&mut self, id: BlockId, p: &Params<B::Stream>) -> u64 {
        let st = StatType::of_pool(p.small);
        let already_split = self.blocks[id as usize].is_split();
        if self.should_split(&self.blocks[id as usize], p.size) {
            let b = &self.blocks[id as usize];
            let rem = Block::free(
                b.addr + p.size,
                b.size - p.size,
                b.stream,
                b.pool,
                b.small,
                id,
                b.next,
            );
            let rem = Block { seq: b.seq, ..rem };
            let rem_size = rem.size;
            let next = rem.next;
            let rid = self.new_block(rem);
            if next != NIL {
                self.blocks[next as usize].prev = rid;
            }
            let b = &mut self.blocks[id as usize];
            b.next = rid;
            b.size = p.size;
            self.insert_free(rid);
            if already_split {
                self.stats.inactive_split_bytes.update(st, -(p.size as i64));
            } else {
                self.stats.inactive_split_bytes.update(st, rem_size as i64);
                self.stats.inactive_split.update(st, 1);
            }
        } else if already_split {
            let size = self.blocks[id as usize].size as i64;
            self.stats.inactive_split_bytes.update(st, -size);
            self.stats.inactive_split.update(st, -1);
        }
        let oversize = self.blocks[id as usize].size >= self.config.max_split_size;
        let b = &mut self.blocks[id as usize];
        b.state = BState::Allocated;
        b.requested = p.requested;
        b.oversize = oversize;
        let (addr, size) = (b.addr, b.size);
        self.live.insert(addr, id);
        let s = &mut self.stats;
        s.allocation.increase(st, 1);
        s.allocated_bytes.increase(st, size as i64);
        s.active.increase(st, 1);
        s.active_bytes.increase(st, size as i64);
        s.requested_bytes.increase(st, p.requested as i64);
        if oversize {
            s.oversize_allocations.increase(1);
        }
        if self.history.is_some() {
            self.trace(TraceAction::Alloc, addr, size, p.stream);
        }
        addr
    }

    /// `id` absorbs its next neighbour (already out of the free set), which
    /// is dropped; returns the absorbed size.
    fn absorb_next(&mut self, id: BlockId) -> u64 {
        let next = self.blocks[id as usize].next;
        let (nsize, nnext) = (
            self.blocks[next as usize].size,
            self.blocks[next as usize].next,
        );
        let b = &mut self.blocks[id as usize];
        b.size += nsize;
        b.next = nnext;
        if nnext != NIL {
            self.blocks[nnext as usize].prev = id;
        }
        self.drop_block(next);
        nsize
    }

    /// Returns a block to its pool, merging with free neighbours (PyTorch's `free_block`).
    pub fn free_block(&mut self, mut id: BlockId) -> BlockId {
        let b = &self.blocks[id as usize];
        let st = b.stat_type();
        let orig_size = b.size as i64;
        let requested = b.requested as i64;
        if self.history.is_some() {
            let (a, sz, s) = (b.addr, b.size, b.stream);
            self.trace(TraceAction::FreeCompleted, a, sz, s);
        }
        let b = &self.blocks[id as usize];
        let mut net_split: i64 = 0;
        let mut net_split_bytes: i64 = 0;
        // merge with the previous block: the previous block absorbs this one
        let prev = b.prev;
        let stream = b.stream;
        // Neighbours merge only when free and of the same stream (blocks of one
        // segment differ in stream only after cross-stream capture reuse).
        if prev != NIL
            && self.blocks[prev as usize].state == BState::Free
            && self.blocks[prev as usize].stream == stream
        {
            self.remove_free(prev);
            net_split -= 1;
            net_split_bytes -= self.blocks[prev as usize].size as i64;
            self.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks[id as usize].next;
        if next != NIL
            && self.blocks[next as usize].state == BState::Free
            && self.blocks[next as usize].stream == stream
        {
            self.remove_free(next);
            net_split -= 1;
            net_split_bytes -= self.absorb_next(id) as i64;
        }
        {
            let b = &mut self.blocks[id as usize];
            b.requested = 0;
            b.event_count = 0;
        }
        if self.insert_free_back(id) == Back::Drained {
            let b = &self.blocks[id as usize];
            self.make_dormant(b.pool, b.small, stream);
        }
        if self.blocks[id as usize].is_split() {
            net_split += 1;
            net_split_bytes += self.blocks[id as usize].size as i64;
        }
        let s = &mut self.stats;
        if net_split != 0 || net_split_bytes != 0 {
            s.inactive_split.update(st, net_split);
            s.inactive_split_bytes.update(st, net_split_bytes);
        }
        s.active.decrease(st, 1);
        s.active_bytes.decrease(st, orig_size);
        s.requested_bytes.decrease(st, requested);
        id
    }

    /// `placement:steady`: the stream has no block out of this default pool
    /// any more, so its whole free segments become dormant: taken again
    /// oldest first, and only when no other free block fits. A stream that
    /// runs the same work again thus takes its segments in the order it
    /// created them and replays its earlier placement, with no device call.
    /// (Private pools keep PyTorch's placement.)
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
    #[cold]
    fn make_dormant(&mut self, pool: PoolIdx, small: bool, stream: B::Stream) {
        let blocks = &self.blocks;
        let mut moved = Vec::new();
        self.pools[pool as usize]
            .as_mut()
            .expect("live pool")
            .get(small)
            .free
            .make_dormant(stream, |id| blocks[id as usize].whole_seq(), &mut moved);
        for id in moved {
            self.blocks[id as usize].dormant = true;
        }
    }

    /// Returns a whole free segment to the device (PyTorch's `release_block`).
    pub fn release_block(&mut self, backend: &B, id: BlockId) -> Result<(), Error> {
        let b = &self.blocks[id as usize];
        debug_assert!(!b.is_split() && b.state == BState::Free);
        let (addr, size, small, pool, stream) = (b.addr, b.size, b.small, b.pool, b.stream);
        backend.free(B::Ptr::from_addr(addr), size)?;
        self.trace(TraceAction::SegmentFree, addr, size, stream);
        self.remove_free(id);
        let seg = self.segments.remove(&addr);
        let st = StatType::of_pool(small);
        self.stats.segment.update(st, -1);
        self.stats.reserved_bytes.update(st, -(size as i64));
        if seg.is_some_and(|s| s.oversize) {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        self.pool_mut(pool).segments -= 1;
        self.drop_block(id);
        tracing::debug!(size, addr, "device segment released");
        Ok(())
    }

    /// Releases every unsplit free block of one block pool.
    fn release_blocks(&mut self, backend: &B, pool: PoolIdx, small: bool) -> Result<(), Error> {
        let ids: Vec<BlockId> = match self.pools[pool as usize].as_ref() {
            Some(p) => p.get_ref(small).free.iter().map(|e| e.3).collect(),
            None => return Ok(()),
        };
        for id in ids {
            if !self.blocks[id as usize].is_split() {
                self.release_block(backend, id)?;
            }
        }
        Ok(())
    }

    /// Whether every piece of work submitted to `stream` so far has completed
    /// (an event recorded now is already complete).
    fn stream_is_idle(&mut self, backend: &B, stream: B::Stream) -> Result<bool, Error> {
        let ev = self.get_event(backend)?;
        let r = backend
            .record_event(&ev, stream)
            .and_then(|()| backend.query_event(&ev));
        self.event_pool.push(ev);
        Ok(r?)
    }

    /// [`Self::stream_is_idle`], asked once per stream within one operation.
    fn stream_is_idle_cached(
        &mut self,
        backend: &B,
        seen: &mut Vec<(B::Stream, bool)>,
        s: B::Stream,
    ) -> Result<bool, Error> {
        if let Some(e) = seen.iter().find(|e| e.0 == s) {
            return Ok(e.1);
        }
        let ok = self.stream_is_idle(backend, s)?;
        seen.push((s, ok));
        Ok(ok)
    }

    /// Releases every unsplit free block of the default pools.
    fn release_default_pools(&mut self, backend: &B) -> Result<(), Error> {
        self.release_blocks(backend, 0, false)?;
        self.release_blocks(backend, 0, true)
    }

    /// cachalot extension (`idle_stream_reuse`): the best-fitting whole free
    /// segment of the same pool cached under another, idle stream, re-keyed
    /// to `p`'s stream. Safe because an idle stream has no unfinished work,
    /// so no earlier use of the segment can still run. Only unsplit segments
    /// move (taking blocks out of split segments fragmented them and cost
    /// memory on `side_stream_pipeline`); blocks merge only within one
    /// stream, and `empty_cache` merges free neighbours of idle streams.
    fn take_idle_block(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        let max_split = self.config.max_split_size;
        let max_nsr = self.config.max_non_split_rounding_size;
        let pool = self.pools[p.pool as usize]
            .as_ref()
            .expect("live pool")
            .get_ref(p.small);
        let mut cands: Vec<(u64, u64, B::Stream, BlockId)> = Vec::new();
        for (s, size, addr, id) in pool.free.iter() {
            if s == p.stream
                || size < p.size
                || self.blocks[id as usize].is_split()
                || (p.size < max_split && size >= max_split)
                || (p.size >= max_split && size >= p.size.saturating_add(max_nsr))
            {
                continue;
            }
            cands.push((size, addr, s, id));
        }
        if cands.is_empty() {
            return Ok(None);
        }
        cands.sort_unstable_by_key(|c| (c.0, c.1));
        let mut idle: Vec<(B::Stream, bool)> = Vec::new();
        for (_, _, s, id) in cands {
            let ok = self.stream_is_idle_cached(backend, &mut idle, s)?;
            if ok {
                self.remove_free(id);
                self.blocks[id as usize].stream = p.stream;
                self.pool_mut(p.pool).get(p.small).free.note_out(p.stream);
                tracing::debug!(?s, to = ?p.stream, "reusing an idle stream's cached segment");
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Merges adjacent free blocks of different streams when every stream
    /// involved is idle (undoing the splits left by `take_idle_block`).
    fn merge_idle_neighbours(&mut self, backend: &B) -> Result<(), Error> {
        let heads: Vec<BlockId> = self.segments.values().map(|s| s.head).collect();
        let mut idle: Vec<(B::Stream, bool)> = Vec::new();
        for head in heads {
            let mut id = head;
            while id != NIL {
                let next = self.blocks[id as usize].next;
                if next == NIL {
                    break;
                }
                let (a, b) = (&self.blocks[id as usize], &self.blocks[next as usize]);
                if a.state != BState::Free || b.state != BState::Free || a.stream == b.stream {
                    id = next;
                    continue;
                }
                let mut both = true;
                for s in [a.stream, b.stream] {
                    both &= self.stream_is_idle_cached(backend, &mut idle, s)?;
                }
                if !both {
                    id = next;
                    continue;
                }
                // re-key `next` to this block's stream and merge it in
                self.remove_free(id);
                self.remove_free(next);
                let st = self.blocks[id as usize].stat_type();
                self.absorb_next(id);
                // two inactive split blocks became one (or an unsplit segment)
                self.stats.inactive_split.update(st, -2);
                self.stats
                    .inactive_split_bytes
                    .update(st, -((self.blocks[id as usize].size) as i64));
                if self.blocks[id as usize].is_split() {
                    self.stats.inactive_split.update(st, 1);
                    self.stats
                        .inactive_split_bytes
                        .update(st, self.blocks[id as usize].size as i64);
                }
                self.insert_free(id);
                // stay on `id`: it may merge with its new next neighbour too
            }
        }
        Ok(())
    }

    /// PyTorch's `release_available_cached_blocks` (only with `max_split_size` set).
    pub fn release_available_cached_blocks(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<bool, Error> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let target = p.size.max(max_split);
        let pool = self.pools[p.pool as usize]
            .as_ref()
            .expect("live pool")
            .get_ref(p.small);
        // a single block of this stream large enough?
        if let Some((_, _, id)) = pool.free.first_at_least(p.stream, target)
            && !self.blocks[id as usize].is_split()
        {
            self.release_block(backend, id)?;
            return Ok(true);
        }
        // otherwise release oversize blocks of this stream, largest first
        let candidates: Vec<BlockId> = pool
            .free
            .range_desc(p.stream, max_split, target)
            .into_iter()
            .map(|e| e.2)
            .filter(|&id| !self.blocks[id as usize].is_split())
            .collect();
        let total: u64 = candidates
            .iter()
            .map(|&id| self.blocks[id as usize].size)
            .sum();
        if total < target {
            return Ok(false);
        }
        let mut released = 0;
        for id in candidates {
            if released >= target {
                break;
            }
            released += self.blocks[id as usize].size;
            self.release_block(backend, id)?;
        }
        Ok(true)
    }

    /// PyTorch's `release_cached_blocks` for the default id: sync all events
    /// (outside capture), release unsplit free blocks of the default pools and
    /// of freeable private pools.
    pub fn release_cached_blocks(&mut self, backend: &B) -> Result<(), Error> {
        if self.captures.is_empty() {
            self.synchronize_and_free_events(backend, None)?;
            if self.config.idle_stream_reuse {
                self.merge_idle_neighbours(backend)?;
            }
            self.release_default_pools(backend)?;
        }
        self.release_freeable_private_pools(backend)
    }

    pub fn release_freeable_private_pools(&mut self, backend: &B) -> Result<(), Error> {
        for idx in 1..self.pools.len() as PoolIdx {
            let freeable = matches!(&self.pools[idx as usize], Some(p) if p.use_count == 0);
            if !freeable {
                continue;
            }
            self.release_blocks(backend, idx, false)?;
            self.release_blocks(backend, idx, true)?;
            let p = self.pools[idx as usize].as_ref().expect("checked");
            if p.segments == 0 {
                let id = p.id;
                self.pools[idx as usize] = None;
                self.pool_index.remove(&id);
            }
        }
        Ok(())
    }

    /// PyTorch's `garbage_collect_cached_blocks` (only with a fraction and a threshold).
    pub fn garbage_collect(&mut self, backend: &B) -> Result<(), Error> {
        let Some(max) = self.allowed_max else {
            return Ok(());
        };
        let threshold = (self.config.garbage_collection_threshold * max as f64) as u64;
        let total = self.stats.reserved_bytes.all().current as u64;
        if total <= threshold {
            return Ok(());
        }
        let target = total - threshold;
        let pool = &self.pools[0].as_ref().expect("default pool").large;
        let calls = pool.gc_calls;
        let mut cands: Vec<(BlockId, u64)> = pool
            .free
            .iter()
            .map(|e| e.3)
            .filter(|&id| !self.blocks[id as usize].is_split())
            .map(|id| (id, calls - self.blocks[id as usize].gc_base))
            .collect();
        let mut total_age: u64 = cands.iter().map(|c| c.1).sum();
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && !cands.is_empty() {
            let age_threshold = total_age / cands.len() as u64;
            freed_any = false;
            let mut keep = Vec::with_capacity(cands.len());
            for (id, age) in cands {
                if age >= age_threshold {
                    freed_any = true;
                    reclaimed += self.blocks[id as usize].size;
                    total_age -= age;
                    self.release_block(backend, id)?;
                } else {
                    keep.push((id, age));
                }
            }
            cands = keep;
        }
        Ok(())
    }

    // ----- events -----

    fn get_event(&mut self, backend: &B) -> Result<B::Event, BackendError> {
        match self.event_pool.pop() {
            Some(e) => Ok(e),
            None => backend.create_event(),
        }
    }

    /// Records an end-of-life event on every stream the block was used on.
    pub fn insert_events(&mut self, backend: &B, id: BlockId) -> Result<(), Error> {
        let uses = std::mem::take(&mut self.blocks[id as usize].stream_uses);
        for (i, &s) in uses.iter().enumerate() {
            let recorded = match self.get_event(backend) {
                Ok(e) => match backend.record_event(&e, s) {
                    Ok(()) => Ok(e),
                    Err(err) => {
                        self.event_pool.push(e);
                        Err(err)
                    }
                },
                Err(err) => Err(err),
            };
            let ev = match recorded {
                Ok(e) => e,
                Err(err) => {
                    // Keep the block safe: remaining streams go back to its uses
                    // and it is parked as deferred until a device-wide sync.
                    let b = &mut self.blocks[id as usize];
                    b.stream_uses.extend_from_slice(&uses[i..]);
                    if b.event_count == 0 {
                        let stream = self.blocks[id as usize].stream;
                        self.deferred.push(Deferred {
                            block: id,
                            stream,
                            markers: Vec::new(),
                        });
                    }
                    return Err(err.into());
                }
            };
            self.blocks[id as usize].event_count += 1;
            self.outstanding_events += 1;
            match self.event_queues.iter_mut().find(|(qs, _)| *qs == s) {
                Some((_, q)) => q.push_back((ev, id)),
                None => {
                    let mut q = VecDeque::new();
                    q.push_back((ev, id));
                    self.event_queues.push((s, q));
                }
            }
        }
        Ok(())
    }

    fn event_done(&mut self, id: BlockId) {
        self.outstanding_events -= 1;
        let b = &mut self.blocks[id as usize];
        b.event_count -= 1;
        if b.event_count == 0 && b.stream_uses.is_empty() {
            self.free_block(id);
        }
    }

    /// Flushes blocks deferred during a capture once no capture is underway
    /// (PyTorch 1.1 item 3): streams recorded during capture are dropped.
    pub fn flush_deferred(&mut self, backend: &B) -> Result<(), Error> {
        if self.deferred.is_empty() || !self.captures.is_empty() {
            return Ok(());
        }
        let deferred = std::mem::take(&mut self.deferred);
        let mut result = Ok(());
        for d in deferred {
            let b = &mut self.blocks[d.block as usize];
            b.capture_uses.clear();
            if b.state != BState::Pending {
                continue;
            }
            if b.stream_uses.is_empty() {
                if b.event_count == 0 {
                    self.free_block(d.block);
                }
            } else if let Err(e) = self.insert_events(backend, d.block) {
                result = Err(e);
            }
        }
        result
    }

    /// PyTorch's `process_events`: frees blocks whose events have completed.
    #[inline]
    pub fn process_events(&mut self, backend: &B) -> Result<(), Error> {
        if !self.deferred.is_empty() {
            self.flush_deferred(backend)?;
        }
        if self.outstanding_events == 0 {
            return Ok(());
        }
        for qi in 0..self.event_queues.len() {
            while let Some((ev, _)) = self.event_queues[qi].1.front() {
                if !backend.query_event(ev)? {
                    break;
                }
                let (ev, id) = self.event_queues[qi].1.pop_front().expect("front exists");
                self.event_pool.push(ev);
                self.event_done(id);
            }
        }
        Ok(())
    }

    /// Synchronizes outstanding events (all, or those of blocks of one pool)
    /// and frees their blocks. Counts one `num_sync_all_streams`.
    pub fn synchronize_and_free_events(
        &mut self,
        backend: &B,
        pool: Option<PoolIdx>,
    ) -> Result<(), Error> {
        self.stats.num_sync_all_streams += 1;
        self.flush_deferred(backend)?;
        // Blocks parked after an event-record failure have no events: a device
        // sync certifies their uses are over.
        if self.captures.is_empty() {
            let stranded: Vec<BlockId> = self
                .deferred
                .iter()
                .filter(|d| self.blocks[d.block as usize].state == BState::Pending)
                .map(|d| d.block)
                .collect();
            if !stranded.is_empty() {
                backend.synchronize_device()?;
                self.deferred.clear();
                for id in stranded {
                    let b = &mut self.blocks[id as usize];
                    b.stream_uses.clear();
                    if b.event_count == 0 {
                        self.free_block(id);
                    }
                }
            }
        }
        for qi in 0..self.event_queues.len() {
            let mut keep = VecDeque::new();
            while let Some((ev, id)) = self.event_queues[qi].1.pop_front() {
                if pool.is_some_and(|p| self.blocks[id as usize].pool != p) {
                    keep.push_back((ev, id));
                    continue;
                }
                if let Err(e) = backend.synchronize_event(&ev) {
                    self.event_queues[qi].1.push_front((ev, id));
                    while let Some(k) = keep.pop_back() {
                        self.event_queues[qi].1.push_front(k);
                    }
                    return Err(e.into());
                }
                self.event_pool.push(ev);
                self.event_done(id);
            }
            self.event_queues[qi].1 = keep;
        }
        Ok(())
    }

    /// Destroys pooled events (empty_cache and drop).
    pub fn destroy_pooled_events(&mut self, backend: &B) -> Result<(), Error> {
        while let Some(e) = self.event_pool.pop() {
            backend.destroy_event(e)?;
        }
        Ok(())
    }

    // ----- public operations (called under the lock) -----

    /// The whole malloc sequence of spec 2.8. `Ok(AllocOutcome::Oom)` when
    /// nothing worked (the caller reports it after dropping the lock).
    pub fn malloc(
        &mut self,
        backend: &B,
        size: u64,
        stream: B::Stream,
    ) -> Result<AllocOutcome, Error> {
        debug_assert!(size > 0 && size < MAX_REQUEST);
        if self.captures.is_empty() {
            self.process_events(backend)?;
        } else {
            // nothing from an earlier malloc reaches this one's pool choice
            self.capture_scratch.queried = None;
            if self.config.graph_capture_record_stream_reuse != CaptureReuse::Off {
                self.reclaim_in_capture(backend, stream)?;
            }
        }
        let pool = if self.captures.is_empty() {
            0
        } else {
            self.choose_pool(backend, stream)?
        };
        let p = self.params(size, stream, pool);
        if let Some(id) = self.get_free_block(&p) {
            return Ok(AllocOutcome::Ok(self.alloc_found_block(id, &p)));
        }
        if !self.captures.is_empty()
            && let Some(id) = self.cross_stream_reuse(backend, &p)?
        {
            self.pool_mut(p.pool).get(p.small).free.note_out(p.stream);
            return Ok(AllocOutcome::Ok(self.alloc_found_block(id, &p)));
        }
        self.malloc_slow(backend, &p)
    }

    #[cold]
    fn malloc_slow(&mut self, backend: &B, p: &Params<B::Stream>) -> Result<AllocOutcome, Error> {
        if self.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0 {
            self.garbage_collect(backend)?;
        }
        let mut found = None;
        if self.config.idle_stream_reuse && self.captures.is_empty() {
            found = self.take_idle_block(backend, p)?;
        }
        if found.is_none() {
            found = self.alloc_block(backend, p)?;
        }
        if found.is_none() && self.release_available_cached_blocks(backend, p)? {
            found = self.alloc_block(backend, p)?;
        }
        if found.is_none() && self.captures.is_empty() {
            // Last attempt: synchronize every event, then (fixing PyTorch
            // #189504) search the free blocks again before releasing the cache.
            self.stats.num_alloc_retries += 1;
            self.synchronize_and_free_events(backend, None)?;
            found = self.get_free_block(p);
            if found.is_none() {
                self.release_default_pools(backend)?;
                self.release_freeable_private_pools(backend)?;
                found = self.alloc_block(backend, p)?;
            }
        }
        match found {
            Some(id) => Ok(AllocOutcome::Ok(self.alloc_found_block(id, p))),
            None => {
                self.stats.num_ooms += 1;
                let report = self.oom_report(backend, p);
                self.trace(TraceAction::Oom, report.device_free, p.alloc_size, p.stream);
                let never = p.alloc_size > self.allowed_max.unwrap_or(self.total_memory);
                Ok(AllocOutcome::Oom(Box::new(report), never))
            }
        }
    }

    pub fn oom_report(&self, backend: &B, p: &Params<B::Stream>) -> OomReport {
        let info = backend.memory_info().unwrap_or_default();
        let mut private_cached = 0u64;
        let mut per_stream: BTreeMap<String, u64> = BTreeMap::new();
        let mut largest = [0u64; 2];
        let mut releasable = 0u64;
        for (i, pp) in self.pools.iter().enumerate() {
            let Some(pp) = pp else { continue };
            for (small, pool) in [(true, &pp.small), (false, &pp.large)] {
                for (s, size, _, id) in pool.free.iter() {
                    *per_stream.entry(format!("{s:?}")).or_default() += size;
                    if i == 0 {
                        let l = &mut largest[usize::from(!small)];
                        *l = (*l).max(size);
                        if !self.blocks[id as usize].is_split() {
                            releasable += size;
                        }
                    } else {
                        private_cached += size;
                    }
                }
            }
        }
        let reserved = self.stats.reserved_bytes.all().current as u64;
        let allocated = self.stats.allocated_bytes.all().current as u64 + private_cached;
        let limit = self.allowed_max.map_or(info.free + releasable, |m| {
            m.saturating_sub(reserved) + releasable
        });
        OomReport {
            backend: backend.name(),
            device: backend.device(),
            requested: p.requested,
            rounded: p.size,
            segment_size: p.alloc_size,
            total: info.total.max(self.total_memory),
            device_free: info.free,
            allowed: self.allowed_max,
            allocated,
            private_pool_cached: private_cached,
            reserved,
            largest_free_small: largest[0],
            largest_free_large: largest[1],
            cached_per_stream: per_stream.into_iter().collect(),
            fits_after_empty_cache: limit >= p.alloc_size,
        }
    }

    /// The caller's free of `addr`.
    pub fn free(&mut self, backend: &B, addr: u64) -> Result<(), Error> {
        let Some(id) = self.live.remove(addr) else {
            return Err(self.classify_bad_pointer(addr, true));
        };
        if self.history.is_some() {
            let b = &self.blocks[id as usize];
            let (a, sz, s) = (b.addr, b.size, b.stream);
            self.trace(TraceAction::FreeRequested, a, sz, s);
        }
        let b = &mut self.blocks[id as usize];
        debug_assert_eq!(b.state, BState::Allocated);
        let st = b.stat_type();
        let size = b.size;
        let oversize = std::mem::take(&mut b.oversize);
        let s = &mut self.stats;
        s.allocation.decrease(st, 1);
        s.allocated_bytes.decrease(st, size as i64);
        if oversize {
            s.oversize_allocations.decrease(1);
        }
        let b = &mut self.blocks[id as usize];
        if b.stream_uses.is_empty() && b.capture_uses.is_empty() {
            if self.captures.is_empty() {
                self.free_block(id);
                return Ok(());
            }
            return self.free_in_capture(backend, id);
        }
        b.state = BState::Pending;
        if !self.captures.is_empty() {
            let markers = if self.config.graph_capture_record_stream_reuse != CaptureReuse::Off {
                self.free_markers(backend, id)?
            } else {
                Vec::new()
            };
            let stream = self.blocks[id as usize].stream;
            self.deferred.push(Deferred {
                block: id,
                stream,
                markers,
            });
            Ok(())
        } else {
            self.blocks[id as usize].capture_uses.clear();
            if self.blocks[id as usize].stream_uses.is_empty() {
                self.free_block(id);
                Ok(())
            } else {
                self.insert_events(backend, id)
            }
        }
    }

    /// A block with no other-stream uses freed while a capture is underway:
    /// it may first adopt free neighbours of other streams (`cross_stream`),
    /// and its free is logged for cross-stream reuse.
    #[cold]
    fn free_in_capture(&mut self, backend: &B, id: BlockId) -> Result<(), Error> {
        self.adopt_free_neighbours(backend, id)?;
        let id = self.free_block(id);
        self.note_capture_free(backend, id);
        Ok(())
    }

    /// Unknown pointer vs double free (the pointer lies in one of our segments).
    pub fn classify_bad_pointer(&self, addr: u64, is_free: bool) -> Error {
        let inside = self
            .segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, seg)| addr < start + seg.size);
        match (inside, is_free) {
            (false, _) => Error::UnknownPointer(addr),
            (true, true) => Error::DoubleFree(addr),
            (true, false) => Error::NotLive(addr),
        }
    }

    pub fn record_stream(&mut self, addr: u64, stream: B::Stream) -> Result<(), Error> {
        let Some(id) = self.live.get(addr) else {
            return Err(self.classify_bad_pointer(addr, false));
        };
        let capturing = !self.captures.is_empty();
        let b = &mut self.blocks[id as usize];
        if stream == b.stream {
            return Ok(());
        }
        if capturing {
            if !b.capture_uses.contains(&stream) {
                b.capture_uses.push(stream);
            }
        } else if !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        Ok(())
    }

    pub fn empty_cache(&mut self, backend: &B) -> Result<(), Error> {
        self.release_cached_blocks(backend)?;
        if self.captures.is_empty() {
            self.destroy_pooled_events(backend)?;
        }
        Ok(())
    }

    pub fn set_config(&mut self, s: &str) -> Result<(), Error> {
        self.config.apply(s)?;
        self.memory_fraction = self.config.per_process_memory_fraction;
        self.update_allowed();
        if self.config.placement == Placement::PyTorch {
            // PyTorch's best fit sees every free block
            let mut woken = Vec::new();
            for pool in self.pools.iter_mut().flatten() {
                woken.extend(pool.small.free.wake_all());
                woken.extend(pool.large.free.wake_all());
            }
            for id in woken {
                self.blocks[id as usize].dormant = false;
            }
        }
        Ok(())
    }

    pub fn set_memory_fraction(&mut self, f: f64) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&f) || f.is_nan() {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {f} is outside [0, 1]"
            )));
        }
        self.memory_fraction = f;
        self.update_allowed();
        Ok(())
    }

    // ----- capture state machine -----

    pub fn begin_allocate_to_pool(
        &mut self,
        id: PoolId,
        filter: PoolFilter<B::Stream>,
    ) -> Result<(), Error> {
        if id == (0, 0) {
            return Err(CaptureError::ReservedPool(id).into());
        }
        if self.captures.iter().any(|c| c.pool == id) {
            return Err(CaptureError::AlreadyRecording(id).into());
        }
        match self.pool_index.get(&id) {
            Some(&idx) => {
                let p = self.pool_mut(idx);
                if p.use_count == 0 {
                    return Err(CaptureError::UnknownPool(id).into());
                }
                p.use_count += 1;
            }
            None => {
                let idx = match self.pools.iter().position(Option::is_none) {
                    Some(i) => i,
                    None => {
                        self.pools.push(None);
                        self.pools.len() - 1
                    }
                };
                self.pools[idx] = Some(PoolPair {
                    id,
                    small: BlockPool::default(),
                    large: BlockPool::default(),
                    use_count: 1,
                    segments: 0,
                });
                self.pool_index.insert(id, idx as PoolIdx);
            }
        }
        self.captures.push(CaptureEntry {
            pool: id,
            filter,
            resolved: None,
        });
        Ok(())
    }

    pub fn end_allocate_to_pool(&mut self, backend: &B, id: PoolId) -> Result<(), Error> {
        let Some(pos) = self.captures.iter().position(|c| c.pool == id) else {
            return Err(CaptureError::NotRecording(id).into());
        };
        self.captures.remove(pos);
        self.reuse_contexts.retain(|_, c| c.pool != id);
        let idx = self.pool_index[&id];
        // PyTorch #175817: the capture has ended, so every captured use of the
        // ending pool's deferred blocks is in the graph, before any later
        // capture into the pool: free them now (2.11 kept them until the
        // next malloc outside capture, which `pytorch` mode reproduces).
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::PyTorch {
            let mut i = 0;
            while i < self.deferred.len() {
                let bid = self.deferred[i].block;
                let b = &mut self.blocks[bid as usize];
                if b.pool == idx && b.stream_uses.is_empty() && b.event_count == 0 {
                    b.capture_uses.clear();
                    self.deferred.swap_remove(i);
                    self.free_block(bid);
                } else {
                    i += 1;
                }
            }
        }
        // 2.11 frees no deferred block at capture end (`active` unchanged),
        // so a second capture into a shared pool cannot reuse them: `pytorch`
        // mode leaves them to the next malloc outside capture.
        if self.captures.is_empty()
            && self.config.graph_capture_record_stream_reuse != CaptureReuse::PyTorch
        {
            self.flush_deferred(backend)?;
        }
        Ok(())
    }

    pub fn release_pool(&mut self, backend: &B, id: PoolId) -> Result<(), Error> {
        let Some(&idx) = self.pool_index.get(&id) else {
            return Err(CaptureError::UnknownPool(id).into());
        };
        if idx == 0 {
            return Err(CaptureError::ReservedPool(id).into());
        }
        let p = self.pool_mut(idx);
        if p.use_count == 0 {
            return Err(CaptureError::UnknownPool(id).into());
        }
        p.use_count -= 1;
        if p.use_count == 0 && !self.captures.iter().any(|c| c.pool == id) {
            self.release_freeable_private_pools(backend)?;
        }
        Ok(())
    }
}

impl<B: Backend> Inner<B> {
    /// Returns every segment and event to the backend (allocator dropped).
    pub fn release_all_on_drop(&mut self, backend: &B) -> Result<(), Error> {
        let mut first_err: Option<Error> = None;
        let mut keep = |r: Result<(), Error>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        if !self.segments.is_empty() || self.outstanding_events > 0 {
            keep(backend.synchronize_device().map_err(Error::from));
        }
        for (_, q) in std::mem::take(&mut self.event_queues) {
            for (ev, _) in q {
                keep(backend.destroy_event(ev).map_err(Error::from));
            }
        }
        self.outstanding_events = 0;
        keep(self.destroy_pooled_events(backend));
        for (addr, seg) in std::mem::take(&mut self.segments) {
            keep(
                backend
                    .free(B::Ptr::from_addr(addr), seg.size)
                    .map_err(Error::from),
            );
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A small deterministic generator (no dependency on the proptest crate here).
    fn lcg(x: &mut u64) -> u64 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *x >> 33
    }

    #[test]
    fn size_classes_are_monotone_and_in_range() {
        let mut last = 0;
        for s in (0..1u64 << 22).step_by(512).chain([u64::MAX / 2, u64::MAX]) {
            let c = class_of(s);
            assert!(c >= last, "class of {s} went down");
            assert!(c < NCLASS);
            last = c;
        }
        assert_eq!(class_of(0), class_of(512));
        assert_ne!(class_of(1 << 20), class_of((1 << 20) + (1 << 16)));
    }

    /// The free set against an ordered set model: random inserts, removals,
    /// best-fit takes and lookups, with sizes drawn from a few (to fill one
    /// class past the vector-to-tree threshold and back) and from many.
    #[test]
    fn free_set_matches_an_ordered_set() {
        for (seed, distinct) in [(1u64, 3u64), (2, 40), (3, 5000)] {
            let mut rng = seed;
            let mut set: FreeSet<u8> = FreeSet::default();
            let mut model: BTreeSet<(u8, u64, u64)> = BTreeSet::new();
            let mut next_addr = 0u64;
            for step in 0..20_000u32 {
                let stream = (lcg(&mut rng) % 2) as u8;
                let size = 512 * (1 + lcg(&mut rng) % distinct) * (1 + lcg(&mut rng) % 3);
                match lcg(&mut rng) % 4 {
                    0 | 1 => {
                        next_addr += 1 << 20;
                        set.insert(stream, size, next_addr, step, None);
                        model.insert((stream, size, next_addr));
                    }
                    2 => {
                        let want = model.range((stream, size, 0)..).next().copied();
                        let want = want.filter(|e| e.0 == stream);
                        let got = set.take_first_at_least(stream, size, |_| true);
                        assert_eq!(got.map(|g| (g.0, g.1)), want.map(|w| (w.1, w.2)));
                        if let Some(w) = want {
                            model.remove(&w);
                        }
                    }
                    _ => {
                        if let Some(&e) = model
                            .iter()
                            .nth(lcg(&mut rng) as usize % model.len().max(1))
                        {
                            assert!(set.get(e.0, e.1, e.2).is_some());
                            assert!(set.remove(e.0, e.1, e.2, None).is_some());
                            assert!(set.remove(e.0, e.1, e.2, None).is_none());
                            model.remove(&e);
                        }
                    }
                }
                assert_eq!(set.len(), model.len());
            }
            let all: Vec<_> = set.iter().map(|(s, sz, a, _)| (s, sz, a)).collect();
            assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }
}
