//! An open-addressing map from device address to block id, for the live
//! (handed-out) blocks: linear probing with backward-shift deletion, so the
//! constant insert/remove churn of an allocator leaves no tombstones and
//! never triggers rehashing in place.

use crate::engine::block::BlockId;

const EMPTY: u64 = 0;

/// Where [`AddrTable::find`] found an address (valid until the table
/// changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(usize);

/// Address → block id. Address 0 is never a key (it is the null allocation).
pub(crate) struct AddrTable {
    /// (address, block id) pairs: a probe touches one cache line.
    slots: Vec<(u64, BlockId)>,
    len: usize,
    mask: usize,
}

#[inline]
fn hash(addr: u64) -> usize {
    // addresses are multiples of 512: drop the zero bits, then Fibonacci
    // hashing; rotated so that `mask` keeps the product's bits from 32 up,
    // which depend on every input bit (the low bits depend on low bits only)
    let x = (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x.rotate_left(32) as usize
}

impl Default for AddrTable {
    fn default() -> Self {
        Self::with_capacity_pow2(64)
    }
}

impl AddrTable {
    fn with_capacity_pow2(cap: usize) -> Self {
        Self {
            slots: vec![(EMPTY, 0); cap],
            len: 0,
            mask: cap - 1,
        }
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The block id of `addr`.
    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        if addr == EMPTY {
            return None;
        }
        let mut i = hash(addr) & self.mask;
        loop {
            let (k, v) = self.slots[i];
            if k == addr {
                return Some(v);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Inserts or replaces `addr`.
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert_ne!(addr, EMPTY);
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        let mut i = hash(addr) & self.mask;
        loop {
            let k = self.slots[i].0;
            if k == EMPTY || k == addr {
                if k == EMPTY {
                    self.len += 1;
                }
                self.slots[i] = (addr, id);
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot and block id of `addr`, for [`Self::remove_at`] (a lookup,
    /// then a removal with no second probe).
    #[inline]
    pub fn find(&self, addr: u64) -> Option<(Slot, BlockId)> {
        if addr == EMPTY {
            return None;
        }
        let mut i = hash(addr) & self.mask;
        loop {
            let (k, v) = self.slots[i];
            if k == addr {
                return Some((Slot(i), v));
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `addr`, returning its block id.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        let (slot, _) = self.find(addr)?;
        Some(self.remove_at(slot))
    }

    /// Removes the entry at `slot` (from [`Self::find`], with no change to
    /// the table since), returning its block id.
    #[inline(always)]
    pub fn remove_at(&mut self, slot: Slot) -> BlockId {
        let i = slot.0;
        debug_assert_ne!(self.slots[i].0, EMPTY);
        let id = self.slots[i].1;
        self.len -= 1;
        // backward-shift: pull later entries of the probe run into the hole
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        loop {
            let k = self.slots[j].0;
            if k == EMPTY {
                break;
            }
            let home = hash(k) & self.mask;
            // move k into the hole if its home is not in (hole, j]
            let dist_j = j.wrapping_sub(home) & self.mask;
            let dist_hole = j.wrapping_sub(hole) & self.mask;
            if dist_j >= dist_hole {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.slots[hole].0 = EMPTY;
        id
    }

    #[cold]
    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_capacity_pow2(self.slots.len() * 2));
        for (k, v) in old.slots {
            if k != EMPTY {
                self.insert(k, v);
            }
        }
    }

    /// Every (address, block id).
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.slots.iter().copied().filter(|&(k, _)| k != EMPTY)
    }
}

/// The live map of the device: one [`AddrTable`] per shard part, an
/// address filed in the part of its block (`part_of(id)`), so that a part
/// moves with its shard. Lookups by address alone try every part (the
/// slow paths only; a shard's fast path looks in its own table).
pub(crate) struct Live {
    pub(super) parts: Vec<AddrTable>,
}

impl Live {
    /// `n` empty parts.
    pub fn new(n: usize) -> Self {
        Self {
            parts: (0..n).map(|_| AddrTable::default()).collect(),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.parts.iter().map(AddrTable::len).sum()
    }

    /// The block id of `addr`.
    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        self.parts.iter().find_map(|t| t.get(addr))
    }

    /// Inserts `addr` in the part of its block.
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        self.parts[crate::engine::block::part_of(id)].insert(addr, id);
    }

    /// Removes `addr`, returning its block id.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        self.parts.iter_mut().find_map(|t| t.remove(addr))
    }

    /// Every (address, block id).
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.parts.iter().flat_map(AddrTable::iter)
    }

    /// Whether every entry is in the part of its block.
    pub fn parts_consistent(&self) -> bool {
        self.parts.iter().enumerate().all(|(k, t)| {
            t.iter()
                .all(|(_, id)| crate::engine::block::part_of(id) == k)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hashmap_under_churn() {
        let mut t = AddrTable::default();
        let mut m: HashMap<u64, BlockId> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = ((x % 5000) + 1) * 512;
            if x & 7 == 0 {
                assert_eq!(t.remove(addr), m.remove(&addr));
            } else if x & 7 == 4 {
                // a lookup, then a removal at its slot
                let want = m.remove(&addr);
                assert_eq!(
                    t.find(addr)
                        .map(|(s, id)| (t.remove_at(s), id))
                        .map(|(a, b)| {
                            assert_eq!(a, b);
                            a
                        }),
                    want
                );
            } else {
                t.insert(addr, i);
                m.insert(addr, i);
            }
            assert_eq!(t.len(), m.len());
        }
        for (k, v) in &m {
            assert_eq!(t.get(*k), Some(*v));
        }
        assert_eq!(t.iter().count(), m.len());
        assert_eq!(t.get(0), None);
        assert_eq!(t.remove(0), None);
    }
}
