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

    /// Changes the hole keyed `key` in place to `(start, len)`. The caller
    /// guarantees that `start` keeps the key order (no other hole starts
    /// between `key` and `start`). Returns false if there is no such hole.
    fn update(&mut self, key: u64, start: u64, len: u64) -> bool {
        let root = self.root;
        self.update_in(root, key, start, len)
    }

    fn update_in(&mut self, t: u32, key: u64, start: u64, len: u64) -> bool {
        if t == NIL {
            return false;
        }
        let node = self.n[t as usize];
        let found = if key < node.start {
            self.update_in(node.l, key, start, len)
        } else if key > node.start {
            self.update_in(node.r, key, start, len)
        } else {
            self.n[t as usize].start = start;
            self.n[t as usize].len = len;
            true
        };
        if found {
            self.pull(t);
        }
        found
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

    /// Moves or resizes the hole starting at `key` to `[start, end)` in
    /// place (key order must be preserved).
    fn update_hole(&mut self, key: u64, start: u64, end: u64) {
        if key != start {
            self.holes.remove(&key);
        }
        self.holes.insert(start, end);
        let ok = self.tree.update(key, start, end - start);
        debug_assert!(ok, "hole {key:#x} missing from the tree");
    }

    /// Adds a free range, coalescing it with adjacent holes.
    fn add_free(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let pred = self
            .holes
            .range(..start)
            .next_back()
            .filter(|&(_, &pe)| pe == start)
            .map(|(&ps, _)| ps);
        let succ = self.holes.get(&end).copied();
        match (pred, succ) {
            (Some(ps), Some(ne)) => {
                self.remove_hole(end);
                self.update_hole(ps, ps, ne);
            }
            (Some(ps), None) => self.update_hole(ps, ps, end),
            (None, Some(ne)) => self.update_hole(end, start, ne),
            (None, None) => self.insert_hole(start, end),
        }
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
                match (a > hs, ae < he) {
                    (false, false) => self.remove_hole(hs),
                    (false, true) => self.update_hole(hs, ae, he),
                    (true, tail) => {
                        self.update_hole(hs, hs, a);
                        if tail {
                            self.insert_hole(ae, he);
                        }
                    }
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
            } else if let Some(len) = naive.get_mut(&start) {
                // Resize in place (keeps the key order).
                *len = (x >> 11) % 1000 + 1;
                assert!(t.update(start, start, *len));
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

    /// Naive reference: sorted free list, linear first fit.
    struct Naive {
        policy: Placement,
        base: u64,
        frontier: u64,
        free: Vec<(u64, u64)>,
    }

    impl Naive {
        fn new(policy: Placement, base: u64, size: u64) -> Self {
            let free = if policy == Placement::Increasing {
                vec![(base, base + size)]
            } else {
                Vec::new()
            };
            Self {
                policy,
                base,
                frontier: base + size,
                free,
            }
        }

        fn add(&mut self, s: u64, e: u64) {
            self.free.push((s, e));
            self.free.sort();
            let mut out: Vec<(u64, u64)> = Vec::new();
            for &(s, e) in &self.free {
                match out.last_mut() {
                    Some(last) if last.1 == s => last.1 = e,
                    _ => out.push((s, e)),
                }
            }
            self.free = out;
        }

        fn allocate(&mut self, size: u64) -> Option<u64> {
            let al = alignment_for(size);
            for k in 0..self.free.len() {
                let (s, e) = self.free[k];
                let a = s.div_ceil(al) * al;
                if a + size <= e {
                    self.free.remove(k);
                    if s < a {
                        self.add(s, a);
                    }
                    if a + size < e {
                        self.add(a + size, e);
                    }
                    return Some(a);
                }
            }
            if self.policy == Placement::Increasing {
                return None;
            }
            let claim = size.div_ceil(CHUNK) * CHUNK;
            if self.frontier - self.base < claim {
                return None;
            }
            let old = self.frontier;
            self.frontier -= claim;
            if self.frontier + size < old {
                self.add(self.frontier + size, old);
            }
            Some(self.frontier)
        }
    }

    #[test]
    fn address_space_matches_naive_model() {
        for policy in [Placement::Cuda13, Placement::Increasing] {
            let base = 0x7f00_0000_0000;
            let size = 4096 * MIB;
            let mut s = AddressSpace::new(policy, base, size);
            let mut n = Naive::new(policy, base, size);
            let mut live: Vec<(u64, u64)> = Vec::new();
            let mut x: u64 = 99;
            for _ in 0..4000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = x >> 16;
                if r % 5 < 2 && !live.is_empty() {
                    let (a, sz) = live.swap_remove((r as usize / 5) % live.len());
                    s.release(a, sz);
                    n.add(a, a + sz);
                } else {
                    let sz = match r % 3 {
                        0 => ((r >> 8) % 8 + 1) * 512,
                        1 => ((r >> 8) % 40 + 1) * 2 * MIB,
                        _ => ((r >> 8) % 20000 + 1) * 2048,
                    };
                    let got = s.allocate(sz);
                    assert_eq!(got, n.allocate(sz), "{policy:?} size {sz}");
                    if let Some(a) = got {
                        live.push((a, sz));
                    }
                }
                assert_eq!(s.holes(), n.free);
            }
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
