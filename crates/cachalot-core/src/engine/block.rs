//! The block: one piece of a segment, its life-cycle states, the slab that
//! holds every block, and the two structural edits of a segment's block
//! list (split a block in two, absorb a free neighbour).
#![forbid(unsafe_code)]

use std::ops::{Index, IndexMut};

use crate::engine::pools::PoolIdx;
use crate::stats::StatType;

/// Index of a block in the slab.
pub(crate) type BlockId = u32;
/// "No block".
pub(crate) const NIL: BlockId = u32::MAX;

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
    /// Address space of an expandable segment with no memory mapped
    /// (`expandable_segments:True`): kept in its pool's unmapped set, never
    /// in a free set.
    Unmapped,
    /// Slab slot not in use.
    Dead,
}

/// One block of a segment: the blocks of a segment tile it in address
/// order through `prev`/`next`.
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
    /// A block of an expandable segment.
    pub expandable: bool,
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
            expandable: false,
            stream_uses: Uses::default(),
            capture_uses: Uses::default(),
        }
    }

    /// Whether the block shares its segment with other blocks.
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

    /// The stats row of the block's pool (small or large).
    #[inline]
    pub fn stat_type(&self) -> StatType {
        StatType::of_pool(self.small)
    }

    /// Whether no stream but its own has a use of the block outstanding.
    #[inline]
    pub fn has_no_other_uses(&self) -> bool {
        self.stream_uses.is_empty() && self.event_count == 0
    }
}

/// Bits of a [`BlockId`] below the shard part (`id >> PART_SHIFT` is the
/// part of the slab that holds the block, see [`Blocks`]).
pub(crate) const PART_SHIFT: u32 = 27;
/// Block slots per part (bounded by host memory long before).
const PART_SLOTS: usize = 1 << PART_SHIFT;

/// The part of the slab that holds block `id`.
#[inline(always)]
pub(crate) fn part_of(id: BlockId) -> usize {
    (id >> PART_SHIFT) as usize
}

/// One part of the slab: the blocks of the segments of one shard's
/// streams, by id; dead slots are reused first. Ids carry the part in
/// their high bits, so a part can move between its shard and the device
/// (`shard/`) and its ids stay valid.
pub(crate) struct Slab<S> {
    part: u32,
    blocks: Vec<Block<S>>,
    free_slots: Vec<BlockId>,
    /// The free stamps of expandable blocks, by slot ([`Blocks::freed_at`]);
    /// kept beside the blocks so that a block stays as small as the fast
    /// path wants it, and in the part so that a shard's fast free can set
    /// them.
    stamps: Vec<u64>,
}

impl<S> Slab<S> {
    /// An empty part `part`.
    pub fn new(part: usize) -> Self {
        Self {
            part: part as u32,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            stamps: Vec::new(),
        }
    }

    /// [`Blocks::freed_at`] of `id`, a block of this part.
    #[inline]
    pub fn freed_at(&self, id: BlockId) -> u64 {
        debug_assert_eq!(part_of(id), self.part as usize, "block of another part");
        let slot = (id as usize) & (PART_SLOTS - 1);
        self.stamps.get(slot).copied().unwrap_or(0)
    }

    /// Sets [`Self::freed_at`] of `id`.
    #[inline]
    pub fn set_freed_at(&mut self, id: BlockId, stamp: u64) {
        debug_assert_eq!(part_of(id), self.part as usize, "block of another part");
        let slot = (id as usize) & (PART_SLOTS - 1);
        if self.stamps.len() <= slot {
            self.stamps.resize(slot + 1, 0);
        }
        self.stamps[slot] = stamp;
    }

    /// The part's index.
    #[inline]
    pub fn part(&self) -> usize {
        self.part as usize
    }

    /// Whether any slot holds a block.
    pub fn has_blocks(&self) -> bool {
        self.blocks.len() > self.free_slots.len()
    }
}

impl<S> Index<BlockId> for Slab<S> {
    type Output = Block<S>;
    #[inline]
    fn index(&self, id: BlockId) -> &Block<S> {
        debug_assert_eq!(part_of(id), self.part as usize, "block of another part");
        &self.blocks[(id as usize) & (PART_SLOTS - 1)]
    }
}

impl<S> IndexMut<BlockId> for Slab<S> {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block<S> {
        debug_assert_eq!(part_of(id), self.part as usize, "block of another part");
        &mut self.blocks[(id as usize) & (PART_SLOTS - 1)]
    }
}

impl<S: Copy> Slab<S> {
    /// Stores a block; returns its id.
    #[inline]
    pub fn insert(&mut self, b: Block<S>) -> BlockId {
        if let Some(id) = self.free_slots.pop() {
            self[id] = b;
            id
        } else {
            assert!(self.blocks.len() < PART_SLOTS - 1, "block slab part full");
            self.blocks.push(b);
            (self.part << PART_SHIFT) | (self.blocks.len() - 1) as BlockId
        }
    }

    /// Frees the slot of `id` (the block must be unlinked by the caller).
    #[inline(always)]
    pub fn remove(&mut self, id: BlockId) {
        let b = &mut self[id];
        b.state = BState::Dead;
        b.prev = NIL;
        b.next = NIL;
        b.stream_uses.clear();
        b.capture_uses.clear();
        self.free_slots.push(id);
    }

    /// Cuts `id` at `size`: `id` keeps its first `size` bytes and a new free
    /// block (same stream, pool and segment) takes the rest, linked after
    /// it. Returns the remainder's id.
    #[inline(always)]
    pub fn split(&mut self, id: BlockId, size: u64) -> BlockId {
        let b = &self[id];
        if let Some(&rid) = self.free_slots.last() {
            // a dead slot: its fields written in place (no block built and
            // copied; the dead slot holds no stream uses)
            let (addr, rest, stream, pool, small, next, seq, expandable) = (
                b.addr + size,
                b.size - size,
                b.stream,
                b.pool,
                b.small,
                b.next,
                b.seq,
                b.expandable,
            );
            self.free_slots.pop();
            let r = &mut self[rid];
            debug_assert!(r.state == BState::Dead && r.stream_uses.is_empty());
            debug_assert!(r.capture_uses.is_empty());
            r.addr = addr;
            r.size = rest;
            r.requested = 0;
            r.stream = stream;
            r.pool = pool;
            r.small = small;
            r.prev = id;
            r.next = next;
            r.state = BState::Free;
            r.event_count = 0;
            r.gc_base = 0;
            r.oversize = false;
            r.seq = seq;
            r.dormant = false;
            r.expandable = expandable;
            if next != NIL {
                self[next].prev = rid;
            }
            let b = &mut self[id];
            b.next = rid;
            b.size = size;
            return rid;
        }
        let rem = Block {
            seq: b.seq,
            expandable: b.expandable,
            ..Block::free(
                b.addr + size,
                b.size - size,
                b.stream,
                b.pool,
                b.small,
                id,
                b.next,
            )
        };
        let next = rem.next;
        let rid = self.insert(rem);
        if next != NIL {
            self[next].prev = rid;
        }
        let b = &mut self[id];
        b.next = rid;
        b.size = size;
        rid
    }

    /// `id` absorbs its next neighbour (already out of the free set), which
    /// is dropped; returns the absorbed size.
    #[inline(always)]
    pub fn absorb_next(&mut self, id: BlockId) -> u64 {
        let next = self[id].next;
        let (nsize, nnext) = (self[next].size, self[next].next);
        let b = &mut self[id];
        b.size += nsize;
        b.next = nnext;
        if nnext != NIL {
            self[nnext].prev = id;
        }
        self.remove(next);
        nsize
    }
}

/// Every block, by id: one [`Slab`] part per shard. A segment's blocks
/// all live in the part of the shard of the stream it was created for
/// (splits stay in their part), so split and merge never cross parts.
pub(crate) struct Blocks<S> {
    pub(super) parts: Vec<Slab<S>>,
}

impl<S> Blocks<S> {
    /// `n` empty parts.
    pub fn new(n: usize) -> Self {
        Self {
            parts: (0..n).map(Slab::new).collect(),
        }
    }

    /// The free stamp of expandable block `id` (cachalot's page
    /// recycling): the engine's count of expandable frees when it was last
    /// freed, the later of its parts' after a merge, its parent's after a
    /// split ([`Self::split`], [`Self::absorb_next`]). A completion fence
    /// of its stream with a stamp at least this one proves its pages have
    /// no work pending (`EventState::probe`). A block never handed out
    /// (fresh pages, nothing pending) may read any value: only splits,
    /// merges and frees of expandable blocks write it.
    #[inline]
    pub fn freed_at(&self, id: BlockId) -> u64 {
        self.parts[part_of(id)].freed_at(id)
    }

    /// Sets [`Self::freed_at`] of `id`.
    pub fn set_freed_at(&mut self, id: BlockId, stamp: u64) {
        self.parts[part_of(id)].set_freed_at(id, stamp)
    }
}

impl<S> Index<BlockId> for Blocks<S> {
    type Output = Block<S>;
    #[inline]
    fn index(&self, id: BlockId) -> &Block<S> {
        &self.parts[part_of(id)][id]
    }
}

impl<S> IndexMut<BlockId> for Blocks<S> {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block<S> {
        &mut self.parts[part_of(id)][id]
    }
}

impl<S: Copy> Blocks<S> {
    /// Stores a block in part `part`; returns its id.
    #[inline]
    pub fn insert(&mut self, part: usize, b: Block<S>) -> BlockId {
        self.parts[part].insert(b)
    }

    /// [`Slab::remove`].
    pub fn remove(&mut self, id: BlockId) {
        self.parts[part_of(id)].remove(id)
    }

    /// [`Slab::split`]; the remainder of an expandable block keeps its free
    /// stamp ([`Self::freed_at`]: its pages have the same past). The engine's
    /// splits and merges go through here; a shard's fast path uses the
    /// slab's own, which leave the stamp alone (it never sees an
    /// expandable block).
    #[inline]
    pub fn split(&mut self, id: BlockId, size: u64) -> BlockId {
        let rid = self.parts[part_of(id)].split(id, size);
        if self[id].expandable {
            self.set_freed_at(rid, self.freed_at(id));
        }
        rid
    }

    /// [`Slab::absorb_next`]; an expandable block takes the later free
    /// stamp of the two ([`Self::freed_at`]).
    pub fn absorb_next(&mut self, id: BlockId) -> u64 {
        let next = self[id].next;
        let stamp = self[id]
            .expandable
            .then(|| self.freed_at(id).max(self.freed_at(next)));
        let n = self.parts[part_of(id)].absorb_next(id);
        if let Some(stamp) = stamp {
            self.set_freed_at(id, stamp);
        }
        n
    }

    /// [`Slab::segment_blocks`].
    pub fn segment_blocks(&self, head: BlockId) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors((head != NIL).then_some(head), move |&id| {
            let n = self[id].next;
            (n != NIL).then_some(n)
        })
    }
}
