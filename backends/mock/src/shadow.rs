//! Shadow memory of the race checker: disjoint address pieces, each holding
//! the memory uses that may still conflict with a later use.

use std::collections::BTreeMap;

/// Who performed a use: an eager work item or a node of a capture graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// Work item `pos` (1-based) of stream `stream`.
    Work {
        /// Stream index.
        stream: u32,
        /// Position of the work item on that stream.
        pos: u64,
    },
    /// Node index inside the capture graph that owns the map.
    Node(u32),
}

/// One recorded memory use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Who used the memory.
    pub who: Who,
    /// The stream the use was issued on.
    pub stream: u32,
    /// The allocation tag the harness gave the use.
    pub tag: u64,
    /// First byte of the whole use.
    pub addr: u64,
    /// Length of the whole use.
    pub len: u64,
    /// Unique id of the use (for de-duplicating race reports).
    pub id: u64,
}

#[derive(Clone, Debug)]
struct Piece {
    end: u64,
    acc: Vec<Access>,
}

/// Disjoint pieces `[start, end)` of device memory with their live accesses.
#[derive(Debug, Default)]
pub struct PieceMap {
    pieces: BTreeMap<u64, Piece>,
}

impl PieceMap {
    fn split_at(&mut self, x: u64) {
        let tail = self.pieces.range_mut(..x).next_back().and_then(|(_, p)| {
            (p.end > x).then(|| {
                let t = Piece {
                    end: p.end,
                    acc: p.acc.clone(),
                };
                p.end = x;
                t
            })
        });
        if let Some(t) = tail {
            self.pieces.insert(x, t);
        }
    }

    /// Calls `keep` on every access overlapping `[lo, hi)` (possibly several
    /// times for one access that spans several pieces), drops those for which
    /// it returns false, then records `new` over `[lo, hi)` unless `store` is
    /// false.
    pub fn visit_insert(
        &mut self,
        lo: u64,
        hi: u64,
        new: Access,
        store: bool,
        mut keep: impl FnMut(&Access) -> bool,
    ) {
        if lo >= hi {
            return;
        }
        if !store {
            // Read-only pass: a piece may begin before `lo`.
            if let Some((_, p)) = self.pieces.range(..lo).next_back()
                && p.end > lo
            {
                p.acc.iter().for_each(|a| {
                    keep(a);
                });
            }
            for (_, p) in self.pieces.range(lo..hi) {
                p.acc.iter().for_each(|a| {
                    keep(a);
                });
            }
            return;
        }
        self.split_at(lo);
        self.split_at(hi);
        let mut gaps = Vec::new();
        let mut cur = lo;
        for (&s, p) in self.pieces.range(lo..hi) {
            if s > cur {
                gaps.push((cur, s));
            }
            cur = p.end;
        }
        if cur < hi {
            gaps.push((cur, hi));
        }
        for (s, e) in gaps {
            self.pieces.insert(
                s,
                Piece {
                    end: e,
                    acc: Vec::new(),
                },
            );
        }
        for (_, p) in self.pieces.range_mut(lo..hi) {
            p.acc.retain(&mut keep);
            p.acc.push(new);
        }
    }

    /// Forgets every access inside `[lo, hi)`.
    pub fn remove_range(&mut self, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        self.split_at(lo);
        self.split_at(hi);
        let keys: Vec<u64> = self.pieces.range(lo..hi).map(|(&k, _)| k).collect();
        for k in keys {
            self.pieces.remove(&k);
        }
    }

    /// Drops accesses for which `keep` is false, and empty pieces.
    pub fn sweep(&mut self, mut keep: impl FnMut(&Access) -> bool) {
        self.pieces.retain(|_, p| {
            p.acc.retain(&mut keep);
            !p.acc.is_empty()
        });
    }

    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Number of stored accesses (an access spanning k pieces counts k times).
    pub fn access_count(&self) -> usize {
        self.pieces.values().map(|p| p.acc.len()).sum()
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.pieces.clear();
    }
}
