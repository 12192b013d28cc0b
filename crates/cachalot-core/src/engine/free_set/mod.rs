//! Free blocks ordered by (stream, size, address), as PyTorch's free block
//! sets: one [`StreamSet`] per stream (size classes, a recently-freed slot,
//! and the dormant whole segments of `placement:steady`).
#![forbid(unsafe_code)]

mod size_tree;
mod stream_set;
#[cfg(test)]
mod tests;

use smallvec::SmallVec;
use stream_set::{StreamSet, Whole, fkey, unkey};

use crate::engine::block::BlockId;

/// A free block found in a set: its size, address and id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
}

/// Where a peeked block is in its stream's set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum At {
    Recent,
    Tree,
    Whole(usize),
}

/// A block [`FreeSet::peek_first_at_least`] found: the block, its
/// stream's set and where in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peeked {
    pub found: Found,
    set: usize,
    at: At,
}

/// A free block with its stream, as [`FreeSet::iter`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreeEntry<S> {
    pub stream: S,
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
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

/// One stream's free blocks in a [`FreeSet`] ([`FreeSet::sets`]).
#[derive(Clone, Copy)]
pub(crate) struct SetView<'a>(&'a StreamSet);

impl SetView<'_> {
    /// The smallest block with size ≥ `size`, lowest address first
    /// ([`FreeSet::first_at_least`]).
    #[inline]
    pub fn first_at_least(self, size: u64) -> Option<Found> {
        let set = self.0;
        let (k, id) = match (set.first_at_least(fkey(size, 0)), set.best_whole(size)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        let (size, addr) = unkey(k);
        Some(Found { size, addr, id })
    }

    /// The block next after `(size, addr)` in (size, address) order,
    /// dormant segments aside ([`FreeSet::next_after`]).
    #[inline]
    pub fn next_after(self, size: u64, addr: u64) -> Option<Found> {
        let (k, id) = self.0.first_at_least_key(fkey(size, addr + 1))?;
        let (size, addr) = unkey(k);
        Some(Found { size, addr, id })
    }
}

/// Free blocks ordered by (stream, size, address) as PyTorch's free set:
/// one [`StreamSet`] per stream, keyed by `size << 64 | address`.
pub(crate) struct FreeSet<S> {
    streams: Vec<(S, Box<StreamSet>)>,
    len: usize,
    /// Where [`FreeSet::hand_out`] handed each stream's set, in stream
    /// order: (stream, index of the set it went to).
    out_to: Vec<(S, u8)>,
}

impl<S> Default for FreeSet<S> {
    fn default() -> Self {
        Self {
            streams: Vec::new(),
            len: 0,
            out_to: Vec::new(),
        }
    }
}

impl<S: Copy + Ord> FreeSet<S> {
    #[inline]
    fn set(&self, s: S) -> Option<&StreamSet> {
        self.streams.iter().find(|e| e.0 == s).map(|e| &*e.1)
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
        self.streams.insert(at, (s, Box::default()));
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
    #[inline(always)]
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
    ) -> Option<Found> {
        let set = &mut *self.streams.iter_mut().find(|e| e.0 == s)?.1;
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
        let (size, addr) = unkey(k);
        Some(Found { size, addr, id })
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
    #[inline(always)]
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
    #[inline(never)]
    pub fn make_dormant(
        &mut self,
        s: S,
        seq: impl Fn(BlockId) -> Option<u64>,
        moved: &mut Vec<BlockId>,
    ) {
        let set = self.set_mut(s);
        let sorted = set.whole.len();
        // the whole segments go to the tail of the dormant list first (no
        // list of every block: no heap allocation), then out of the tree
        let (tree, whole) = (&set.tree, &mut set.whole);
        let mut file = |size, addr, id| {
            if let Some(q) = seq(id) {
                whole.push(Whole {
                    seq: q,
                    size,
                    addr,
                    id,
                });
            }
        };
        tree.for_each(&mut file);
        if let Some((k, id)) = set.recent {
            let (sz, a) = unkey(k);
            file(sz, a, id);
        }
        for k in sorted..set.whole.len() {
            let w = set.whole[k];
            let got = set.remove(fkey(w.size, w.addr));
            debug_assert_eq!(got, Some(w.id));
            moved.push(w.id);
        }
        if set.whole.len() > sorted {
            // the stable sort finds the sorted run and the new tail and merges
            // them (inserting each would be quadratic)
            set.whole.sort_by_key(|w| w.seq);
        }
    }

    /// Smallest block of stream `s` with size ≥ `size`, lowest address first.
    #[inline]
    pub fn first_at_least(&self, s: S, size: u64) -> Option<Found> {
        SetView(self.set(s)?).first_at_least(size)
    }

    /// The block of stream `s` next after `(size, addr)` in (size,
    /// address) order (dormant segments aside).
    #[inline]
    pub fn next_after(&self, s: S, size: u64, addr: u64) -> Option<Found> {
        SetView(self.set(s)?).next_after(size, addr)
    }

    /// Each stream that has a free block here, in stream order, with its
    /// blocks: a walk over every stream's blocks with no lookup of the
    /// stream (a search per stream would scan the streams again).
    pub fn sets(&self) -> impl Iterator<Item = (S, SetView<'_>)> + '_ {
        self.streams
            .iter()
            .filter(|e| e.1.len() > 0)
            .map(|e| (e.0, SetView(&e.1)))
    }

    /// Blocks of stream `s` with size in `[lo, hi)`, largest first.
    pub fn range_desc(&self, s: S, lo: u64, hi: u64) -> Vec<Found> {
        let (lo, hi) = (fkey(lo, 0), fkey(hi, 0));
        self.set(s).map_or_else(Vec::new, |m| {
            m.sorted()
                .into_iter()
                .rev()
                .filter(|e| e.0 >= lo && e.0 < hi)
                .map(|(k, id)| {
                    let (size, addr) = unkey(k);
                    Found { size, addr, id }
                })
                .collect()
        })
    }

    /// Every block as (stream, size, address, id), in (stream, size, address) order.
    pub fn iter(&self) -> impl Iterator<Item = FreeEntry<S>> + '_ {
        self.streams.iter().flat_map(|(s, m)| {
            m.sorted().into_iter().map(move |(k, id)| {
                let (size, addr) = unkey(k);
                FreeEntry {
                    stream: *s,
                    size,
                    addr,
                    id,
                }
            })
        })
    }

    /// The streams with a set (possibly empty), in order.
    pub fn streams(&self) -> impl Iterator<Item = S> + '_ {
        self.streams.iter().map(|e| e.0)
    }

    /// Hands every stream's set out, in stream order, to the set
    /// `to[route(s)]` (a shard's: appended, so a set that was empty stays
    /// in stream order; call [`FreeSet::sort_streams`] on any other), and
    /// notes where each went for [`FreeSet::take_back`]. No allocation once
    /// the vectors have grown, no search: one pass.
    pub fn hand_out(
        &mut self,
        to: &mut [Option<&mut FreeSet<S>>],
        mut route: impl FnMut(S) -> usize,
    ) {
        self.out_to.clear();
        for (s, set) in self.streams.drain(..) {
            let k = route(s);
            let dst = to[k]
                .as_deref_mut()
                .expect("the caller holds the shard of every stream");
            dst.len += set.len();
            dst.streams.push((s, set));
            self.out_to.push((s, k as u8));
        }
        self.len = 0;
    }

    /// Takes every stream's set of the sets `from` back (the reverse of
    /// [`FreeSet::hand_out`]), in stream order: the sets handed out are
    /// picked from their shards' sets in the order they went out (each
    /// shard's in stream order), so no sort is needed. A set a shard made
    /// meanwhile (a stream new to it) or one that was not handed out from
    /// here is appended, and only then are the sets sorted by stream.
    pub fn take_back(&mut self, from: &mut [Option<&mut FreeSet<S>>]) {
        let mut extra = !self.streams.is_empty();
        let mut drains: SmallVec<[_; 16]> = from
            .iter_mut()
            .map(|f| {
                f.as_deref_mut().map(|f| {
                    self.len += f.len;
                    f.len = 0;
                    f.streams.drain(..)
                })
            })
            .collect();
        let total: usize = drains.iter().flatten().map(|d| d.len()).sum();
        self.streams.reserve(total);
        for &(s, k) in &self.out_to {
            let Some(d) = drains.get_mut(k as usize).and_then(|d| d.as_mut()) else {
                continue;
            };
            // (a stream new to the shard comes before its next one; each
            // set moves once)
            while d.as_slice().first().is_some_and(|e| e.0 != s) {
                extra = true;
                self.streams.extend(d.next());
            }
            self.streams.extend(d.next());
        }
        self.out_to.clear();
        for d in drains.iter_mut().flatten() {
            for e in d {
                extra = true;
                self.streams.push(e);
            }
        }
        if extra {
            self.sort_streams();
        }
        debug_assert!(self.streams.is_sorted_by_key(|e| e.0));
    }

    /// Restores the stream order (after [`FreeSet::hand_out`] to a set
    /// that was not empty).
    pub fn sort_streams(&mut self) {
        self.streams.sort_unstable_by_key(|e| e.0);
    }

    /// Whether stream `s` has a set here.
    #[inline]
    pub fn has_stream(&self, s: S) -> bool {
        self.streams.iter().any(|e| e.0 == s)
    }

    /// What [`FreeSet::take_first_at_least`] would take, without taking
    /// it (take it with [`FreeSet::take_peeked`]).
    #[inline]
    pub fn peek_first_at_least(
        &self,
        s: S,
        size: u64,
        accept: impl Fn(u64) -> bool,
    ) -> Option<Peeked> {
        let si = self.streams.iter().position(|e| e.0 == s)?;
        let set = &self.streams[si].1;
        if let Some((k, id, recent)) = set.best(fkey(size, 0))
            && accept(unkey(k).0)
        {
            let (size, addr) = unkey(k);
            let at = if recent { At::Recent } else { At::Tree };
            return Some(Peeked {
                found: Found { size, addr, id },
                set: si,
                at,
            });
        }
        let pos = set
            .whole
            .iter()
            .position(|w| w.size >= size && accept(w.size))?;
        let w = set.whole[pos];
        Some(Peeked {
            found: Found {
                size: w.size,
                addr: w.addr,
                id: w.id,
            },
            set: si,
            at: At::Whole(pos),
        })
    }

    /// Takes the block [`FreeSet::peek_first_at_least`] found (the set
    /// unchanged since): exactly what `take_first_at_least` does.
    #[inline]
    pub fn take_peeked(&mut self, p: &Peeked) {
        let set = &mut self.streams[p.set].1;
        match p.at {
            At::Recent => set.recent = None,
            At::Tree => {
                let r = set.tree.remove(p.found.size, p.found.addr);
                debug_assert_eq!(r, Some(p.found.id));
            }
            At::Whole(pos) => {
                set.whole.remove(pos);
            }
        }
        set.out = set.out.saturating_add(1);
        self.len -= 1;
    }

    /// Inserts a free block of the set a [`Peeked`] came from (a split
    /// remainder: not dormant). (Inlined: the hit path's split.)
    #[inline(always)]
    pub fn insert_peeked(&mut self, p: &Peeked, size: u64, addr: u64, id: BlockId) {
        self.streams[p.set].1.insert(fkey(size, addr), id);
        self.len += 1;
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
