//! One stream's free blocks by size: segregated size classes (16 per power
//! of two) with a bitmap of the non-empty ones.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::engine::block::BlockId;

/// Size classes per power of two in [`SizeTree`] (as a log2).
const SUB_BITS: u32 = 4;
/// Number of size classes: 16 per power of two from 2^9 up to 2^63.
pub(super) const NCLASS: usize = ((64 - 9) << SUB_BITS) as usize;
/// Words of the non-empty-class bitmap.
const NWORDS: usize = NCLASS.div_ceil(64);
/// A class's sorted vector becomes a tree above this many blocks (and a
/// vector again below half of it), so repeated-size workloads with
/// thousands of equal-sized free blocks stay O(log n).
const FLAT_MAX: usize = 64;

/// The size class of a block size: monotone in the size, 16 classes per
/// power of two (sizes below 512 share class 0).
#[inline]
pub(super) fn class_of(size: u64) -> usize {
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

    /// The first entry at or after (size, addr).
    fn first_at_least_key(&self, size: u64, addr: u64) -> Option<Entry> {
        match self {
            Bin::Flat(v) => v
                .get(v.partition_point(|x| (x.size, x.addr) < (size, addr)))
                .copied(),
            Bin::Tree(t) => t
                .range((size, addr)..)
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
pub(super) struct SizeTree {
    bins: Vec<Bin>,
    bits: [u64; NWORDS],
    summary: u64,
    /// Number of blocks.
    pub(super) len: usize,
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
    pub(super) fn insert(&mut self, size: u64, addr: u64, id: BlockId) {
        let c = class_of(size);
        if self.bins.len() <= c {
            self.bins.resize_with(c + 1, Bin::default);
        }
        self.bins[c].insert(Entry { size, addr, id });
        self.mark(c);
        self.len += 1;
    }

    #[inline]
    pub(super) fn remove(&mut self, size: u64, addr: u64) -> Option<BlockId> {
        let c = class_of(size);
        let bin = self.bins.get_mut(c)?;
        let id = bin.remove(size, addr)?;
        if bin.len() == 0 {
            self.unmark(c);
        }
        self.len -= 1;
        Some(id)
    }

    pub(super) fn get(&self, size: u64, addr: u64) -> Option<BlockId> {
        self.bins.get(class_of(size))?.get(size, addr)
    }

    /// The smallest (size, address) with size ≥ `size`.
    #[inline]
    pub(super) fn first_at_least(&self, size: u64) -> Option<(u64, u64, BlockId)> {
        if self.len == 0 {
            // (a stream whose blocks are all out, or dormant: no bitmap scan)
            return None;
        }
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

    /// The first block at or after (size, addr) in (size, address) order.
    pub(super) fn first_at_least_key(&self, size: u64, addr: u64) -> Option<(u64, u64, BlockId)> {
        let c = class_of(size);
        let hit = if self.bits[c / 64] & (1 << (c % 64)) != 0 {
            self.bins[c].first_at_least_key(size, addr)
        } else {
            None
        };
        let e = match hit {
            Some(e) => e,
            None => self.bins[self.next_class(c + 1)?].first_at_least(0)?,
        };
        Some((e.size, e.addr, e.id))
    }

    pub(super) fn for_each(&self, mut f: impl FnMut(u64, u64, BlockId)) {
        for b in &self.bins {
            b.for_each(&mut f);
        }
    }
}
