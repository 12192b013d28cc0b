//! The simulated device address space and its placement policies.
//!
//! Free ranges ("holes") are kept twice: in a `BTreeMap` keyed by start (for
//! coalescing with neighbours) and in an arena treap keyed by start and
//! augmented with the largest hole length of each subtree, which answers
//! "lowest-address hole of at least `n` bytes" in `O(log n)` expected time.

use std::collections::BTreeMap;

/// Size of the chunks the CUDA 13 placement claims (32 MiB).
pub const CHUNK: u64 = 32 << 20;
/// Start alignment of segments of at least this size (2 MiB).
pub const BIG_ALIGN: u64 = 2 << 20;
/// Start alignment of smaller segments (512 B).
pub const SMALL_ALIGN: u64 = 512;

/// Where the simulated driver places new segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Placement {
    /// What the CUDA 13 driver was seen doing on an H200: a new segment first
    /// takes the lowest-address leftover hole that fits (space inside chunks
    /// already claimed: chunk tails and freed segments, coalesced); otherwise
    /// the driver claims `round_up(size, 32 MiB)` bytes of new 32 MiB-aligned
    /// chunks from the top of the address range going down and places the
    /// segment at the low end of that claim, the tail becoming a hole.
    /// Claimed chunks are never given back to the unclaimed range.
    #[default]
    Cuda13,
    /// Lowest-address first fit over the whole address range.
    Increasing,
}

/// Start alignment the mock applies to a segment of `size` bytes:
/// 2 MiB for segments of at least 2 MiB, 512 B otherwise.
pub fn alignment_for(size: u64) -> u64 {
    if size >= BIG_ALIGN {
        BIG_ALIGN
    } else {
        SMALL_ALIGN
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? & !(a - 1))
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct TNode {
    start: u64,
    len: u64,
    max: u64,
    prio: u64,
    l: u32,
    r: u32,
}

/// Treap of holes keyed by start, augmented with the max hole length.
#[derive(Debug)]
struct HoleTree {
    n: Vec<TNode>,
    free: Vec<u32>,
    root: u32,
    seed: u64,
}

impl HoleTree {
    fn new() -> Self {
        Self {
            n: Vec::new(),
            free: Vec::new(),
            root: NIL,
            seed: 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn next_prio(&mut self) -> u64 {
        // xorshift64*: deterministic.
        let mut x = self.seed;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.seed = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn max_of(&self, t: u32) -> u64 {
        if t == NIL { 0 } else { self.n[t as usize].max }
    }

    fn pull(&mut self, t: u32) {
        let node = self.n[t as usize];
        let m = node.len.max(self.max_of(node.l)).max(self.max_of(node.r));
        self.n[t as usize].max = m;
    }

    /// Splits `t` into (start < key, start >= key).
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        let node = self.n[t as usize];
        if node.start < key {
            let (a, b) = self.split(node.r, key);
            self.n[t as usize].r = a;
            self.pull(t);
            (t, b)
        } else {
            let (a, b) = self.split(node.l, key);
            self.n[t as usize].l = b;
            self.pull(t);
            (a, t)
        }
    }

    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.n[a as usize].prio > self.n[b as usize].prio {
            let r = self.n[a as usize].r;
            let m = self.merge(r, b);
            self.n[a as usize].r = m;
            self.pull(a);
            a
        } else {
            let l = self.n[b as usize].l;
            let m = self.merge(a, l);
            self.n[b as usize].l = m;
            self.pull(b);
            b
        }
    }

    fn insert(&mut self, start: u64, len: u64) {
        let prio = self.next_prio();
        let node = TNode {
            start,
            len,
            max: len,
            prio,
            l: NIL,
            r: NIL,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.n[i as usize] = node;
                i
            }
            None => {
                self.n.push(node);
                (self.n.len() - 1) as u32
            }
        };
        let (l, r) = self.split(self.root, start);
        let m = self.merge(l, idx);
        self.root = self.merge(m, r);
    }

    fn remove(&mut self, start: u64) {
        let (l, r) = self.split(self.root, start);
        let (mid, r2) = self.split(r, start.saturating_add(1));
        if mid != NIL {
            self.free.push(mid);
        }
        self.root = self.merge(l, r2);
    }

    /// Lowest-start hole with `start >= from` and `len >= min_len`.
    fn first_fit(&self, from: u64, min_len: u64) -> Option<(u64, u64)> {
        let t = self.find(self.root, from, min_len)?;
        let n = self.n[t as usize];
        Some((n.start, n.len))
    }

    fn find(&self, t: u32, from: u64, min_len: u64) -> Option<u32> {
        if t == NIL || self.n[t as usize].max < min_len {
            return None;
        }
        let node = self.n[t as usize];
        if node.start < from {
            return self.find(node.r, from, min_len);
        }
        if let Some(x) = self.find(node.l, from, min_len) {
            return Some(x);
        }
        if node.len >= min_len {
            return Some(t);
        }
        self.find(node.r, from, min_len)
    }
}

/// A contiguous device address range that segments are placed in.
#[derive(Debug)]
pub struct AddressSpace {
    policy: Placement,
    base: u64,
    end: u64,
    /// Cuda13: lowest claimed address (claims grow downward from `end`).
    frontier: u64,
    holes: BTreeMap<u64, u64>,
    tree: HoleTree,
}

impl AddressSpace {
    /// A space `[base, base + size)`; both are expected to be `CHUNK`-aligned.
    pub fn new(policy: Placement, base: u64, size: u64) -> Self {
        let end = base.saturating_add(size);
        let mut s = Self {
            policy,
            base,
            end,
            frontier: end,
            holes: BTreeMap::new(),
            tree: HoleTree::new(),
        };
        if policy == Placement::Increasing && end > base {
            s.insert_hole(base, end);
        }
        s
    }

    /// Lowest address of the range.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// One past the highest address of the range.
    pub fn end(&self) -> u64 {
        self.end
    }

    fn insert_hole(&mut self, start: u64, end: u64) {
        self.holes.insert(start, end);
        self.tree.insert(start, end - start);
    }

    fn remove_hole(&mut self, start: u64) {
        self.holes.remove(&start);
        self.tree.remove(start);
    }

    /// Adds a free range, coalescing it with adjacent holes.
    fn add_free(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&ps, &pe)) = self.holes.range(..start).next_back()
            && pe == start
        {
            self.remove_hole(ps);
            start = ps;
        }
        if let Some(&ne) = self.holes.get(&end) {
            self.remove_hole(end);
            end = ne;
        }
        self.insert_hole(start, end);
    }

    /// Places a segment of `size` bytes; `None` if the range has no room.
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        let align = alignment_for(size);
        let mut from = 0;
        while let Some((hs, hl)) = self.tree.first_fit(from, size) {
            let he = hs + hl;
            let a = align_up(hs, align)?;
            if let Some(ae) = a.checked_add(size)
                && ae <= he
            {
                self.remove_hole(hs);
                if a > hs {
                    self.insert_hole(hs, a);
                }
                if ae < he {
                    self.insert_hole(ae, he);
                }
                return Some(a);
            }
            from = hs + 1;
        }
        match self.policy {
            Placement::Increasing => None,
            Placement::Cuda13 => {
                let claim = align_up(size, CHUNK)?;
                if self.frontier - self.base < claim {
                    return None;
                }
                let old = self.frontier;
                let start = old - claim;
                self.frontier = start;
                self.add_free(start + size, old);
                Some(start)
            }
        }
    }

    /// Returns the range of a segment placed by [`Self::allocate`].
    pub fn release(&mut self, addr: u64, size: u64) {
        self.add_free(addr, addr.saturating_add(size));
    }

    /// The current holes, by address (for tests and debugging).
    #[cfg(test)]
    pub fn holes(&self) -> Vec<(u64, u64)> {
        self.holes.iter().map(|(&s, &e)| (s, e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn treap_first_fit_matches_naive() {
        let mut t = HoleTree::new();
        let mut naive: BTreeMap<u64, u64> = BTreeMap::new();
        let mut x: u64 = 12345;
        for i in 0..3000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let start = (x >> 20) % 100_000;
            if let std::collections::btree_map::Entry::Vacant(e) = naive.entry(start) {
                let len = (x >> 5) % 1000 + 1;
                e.insert(len);
                t.insert(start, len);
            } else if i % 3 == 0 {
                naive.remove(&start);
                t.remove(start);
            }
            let from = (x >> 33) % 100_000;
            let min = (x >> 40) % 1100;
            let want = naive
                .range(from..)
                .find(|(_, l)| **l >= min)
                .map(|(&s, &l)| (s, l));
            assert_eq!(t.first_fit(from, min), want);
        }
    }

    #[test]
    fn increasing_reuses_lowest_hole() {
        let base = 0x7f00_0000_0000;
        let mut s = AddressSpace::new(Placement::Increasing, base, 1 << 30);
        let a = s.allocate(4 * MIB).unwrap();
        let b = s.allocate(512).unwrap();
        let c = s.allocate(2 * MIB).unwrap();
        assert_eq!(a, base);
        assert_eq!(b, base + 4 * MIB);
        assert_eq!(c, base + 6 * MIB);
        s.release(a, 4 * MIB);
        assert_eq!(s.allocate(1024).unwrap(), base);
        s.release(base, 1024);
        s.release(b, 512);
        s.release(c, 2 * MIB);
        assert_eq!(s.holes(), vec![(base, base + (1 << 30))]);
    }
}
