//! `cross_stream` mode's free log: the terminal snapshots of the streams at
//! the moments memory became free during a capture, and which snapshot last
//! covered each freed byte range.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::engine::capture::FastMap;

/// Per-stream state of the reclaim step: deferred blocks with markers
/// pushed so far, and the terminals and that count at the last check
/// (nothing changed = nothing new to reclaim).
pub(crate) struct StreamCheck<N> {
    pub(super) pushes: u64,
    pub(super) checked: Option<(Vec<N>, u64)>,
}

impl<N> Default for StreamCheck<N> {
    fn default() -> Self {
        Self {
            pushes: 0,
            checked: None,
        }
    }
}

/// `cross_stream` bookkeeping of one capture: terminal snapshots of the
/// streams at the moments memory became free, and which snapshot last
/// covered each freed byte range.
pub(crate) struct CrossLog<S, N> {
    /// Per stream, its terminal sets at free moments, oldest first (a
    /// stream's frontier only moves forward, so a later snapshot's ancestors
    /// include an earlier one's).
    pub(super) snaps: FastMap<S, Vec<(u32, u32)>>,
    /// The snapshots' nodes: `snaps` holds (start, length) ranges of it.
    pub(super) snap_nodes: Vec<N>,
    /// Disjoint freed ranges: start → (end, freeing stream, snapshot index).
    pub(super) ranges: BTreeMap<u64, (u64, S, u32)>,
    /// (requesting stream, freeing stream) → number of the freeing stream's
    /// snapshots known to lie in the requesting stream's visited set.
    pub(super) known: FastMap<(S, S), u32>,
    /// A free could not be logged: no free block moves across streams in
    /// this capture any more.
    pub(super) poisoned: bool,
    /// The reclaim step's state, per allocation stream.
    pub(super) checks: FastMap<S, StreamCheck<N>>,
    /// `log_range`'s buffer of range starts to remove.
    inside: Vec<u64>,
}

impl<S, N> Default for CrossLog<S, N> {
    fn default() -> Self {
        Self {
            snaps: FastMap::default(),
            snap_nodes: Vec::new(),
            ranges: BTreeMap::new(),
            known: FastMap::default(),
            poisoned: false,
            checks: FastMap::default(),
            inside: Vec::new(),
        }
    }
}

impl<S: Copy + Eq + std::hash::Hash, N: Copy + Eq> CrossLog<S, N> {
    /// The index of `stream`'s snapshot equal to `terminals` (appended if new).
    pub(super) fn snapshot(&mut self, stream: S, terminals: &[N]) -> u32 {
        let v = self.snaps.entry(stream).or_default();
        let same = v.last().is_some_and(|&(at, len)| {
            let l = &self.snap_nodes[at as usize..(at + len) as usize];
            l.len() == terminals.len() && terminals.iter().all(|t| l.contains(t))
        });
        if !same {
            v.push((self.snap_nodes.len() as u32, terminals.len() as u32));
            self.snap_nodes.extend_from_slice(terminals);
        }
        (v.len() - 1) as u32
    }

    /// Logs `[lo, hi)` as freed by `stream` whose terminals are `terminals`.
    pub(super) fn log_free(&mut self, lo: u64, hi: u64, stream: S, terminals: &[N]) {
        let idx = self.snapshot(stream, terminals);
        self.log_range(lo, hi, stream, idx);
    }

    /// Logs `[lo, hi)` as freed by `stream` at snapshot `idx`, replacing what
    /// was logged over those bytes. One backward walk over the ranges that
    /// end after `lo` finds everything to change: a range straddling `lo` is
    /// truncated in place, one starting at `lo` is overwritten in place, the
    /// others starting inside are removed, and the part of any range past
    /// `hi` is kept from `hi` on.
    pub(super) fn log_range(&mut self, lo: u64, hi: u64, stream: S, idx: u32) {
        let mut right: Option<(u64, S, u32)> = None;
        let mut at_lo = false;
        let mut inside = std::mem::take(&mut self.inside);
        inside.clear();
        for (&k, v) in self.ranges.range_mut(..hi).rev() {
            if v.0 <= lo {
                break;
            }
            if v.0 > hi {
                right = Some(*v);
            }
            if k < lo {
                v.0 = lo;
                break;
            }
            if k == lo {
                *v = (hi, stream, idx);
                at_lo = true;
            } else {
                inside.push(k);
            }
        }
        for &k in &inside {
            self.ranges.remove(&k);
        }
        self.inside = inside;
        if !at_lo {
            self.ranges.insert(lo, (hi, stream, idx));
        }
        if let Some(r) = right {
            self.ranges.insert(hi, r);
        }
    }

    /// The (stream, snapshot) entries logged over `[lo, hi)`.
    #[cfg(test)]
    fn entries(&self, lo: u64, hi: u64) -> Vec<(S, u32)> {
        let mut v = Vec::new();
        if let Some((_, &(e, st, ix))) = self.ranges.range(..lo).next_back()
            && e > lo
        {
            v.push((st, ix));
        }
        for (_, &(_, st, ix)) in self.ranges.range(lo..hi) {
            v.push((st, ix));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::CrossLog;

    /// The straightforward interval overwrite `log_range` must match.
    fn reference_log(
        m: &mut std::collections::BTreeMap<u64, (u64, u32, u32)>,
        lo: u64,
        hi: u64,
        v: (u32, u32),
    ) {
        if let Some((&s, &(e, st, ix))) = m.range(..lo).next_back()
            && e > lo
        {
            m.insert(s, (lo, st, ix));
            if e > hi {
                m.insert(hi, (e, st, ix));
            }
        }
        let inside: Vec<u64> = m.range(lo..hi).map(|(&k, _)| k).collect();
        for k in inside {
            if let Some((e, st, ix)) = m.remove(&k)
                && e > hi
            {
                m.insert(hi, (e, st, ix));
            }
        }
        m.insert(lo, (hi, v.0, v.1));
    }

    #[test]
    fn log_range_matches_the_reference_overwrite() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..50 {
            let mut l: CrossLog<u32, u32> = CrossLog::default();
            let mut r = std::collections::BTreeMap::new();
            for i in 0..400u32 {
                let lo = next(200);
                let hi = lo + 1 + next(40);
                let st = next(4) as u32;
                l.log_range(lo, hi, st, i);
                reference_log(&mut r, lo, hi, (st, i));
                assert_eq!(l.ranges, r);
            }
        }
    }

    #[test]
    fn log_ranges_stay_disjoint_and_newest_wins() {
        let mut l: CrossLog<u32, u32> = CrossLog::default();
        let a = l.snapshot(1, &[10]);
        l.log_range(0, 100, 1, a);
        let b = l.snapshot(1, &[11]);
        assert_eq!(l.snapshot(1, &[11]), b);
        l.log_range(20, 40, 1, b);
        assert_eq!(l.entries(0, 10), vec![(1, a)]);
        assert_eq!(l.entries(25, 30), vec![(1, b)]);
        assert_eq!(l.entries(30, 60), vec![(1, b), (1, a)]);
        let c = l.snapshot(2, &[12]);
        l.log_range(10, 120, 2, c);
        assert_eq!(l.entries(0, 200), vec![(1, a), (2, c)]);
        assert_eq!(l.entries(100, 110), vec![(2, c)]);
        assert!(l.entries(120, 130).is_empty());
    }
}
