//! The simulated contents of device memory: which allocation tag last wrote
//! each byte (the mock stores no bytes, only the tag of the last eager use of
//! every range).

use std::collections::BTreeMap;

/// Disjoint ranges `[start, end)` with the tag last written there; bytes in
/// no range were not written since their segment was allocated.
#[derive(Debug, Default)]
pub struct TagMap {
    /// start -> (end, tag)
    runs: BTreeMap<u64, (u64, u64)>,
}

impl TagMap {
    /// Splits the run containing `x` (if any) so that a run starts at `x`.
    fn split_at(&mut self, x: u64) {
        let tail = self.runs.range_mut(..x).next_back().and_then(|(_, r)| {
            (r.0 > x).then(|| {
                let t = (r.0, r.1);
                r.0 = x;
                t
            })
        });
        if let Some(t) = tail {
            self.runs.insert(x, t);
        }
    }

    /// Forgets what was written in `[lo, hi)`.
    pub fn clear(&mut self, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        self.split_at(lo);
        self.split_at(hi);
        let inside: Vec<u64> = self.runs.range(lo..hi).map(|(&s, _)| s).collect();
        for s in inside {
            self.runs.remove(&s);
        }
    }

    /// Records that `tag` was written over `[lo, hi)`.
    pub fn write(&mut self, lo: u64, hi: u64, tag: u64) {
        if lo >= hi {
            return;
        }
        self.clear(lo, hi);
        let (mut lo, mut hi) = (lo, hi);
        // Merge with equal-tagged neighbours so rewriting stays O(1) runs.
        if let Some((&s, &(e, t))) = self.runs.range(..lo).next_back()
            && e == lo
            && t == tag
        {
            self.runs.remove(&s);
            lo = s;
        }
        if let Some(&(e, t)) = self.runs.get(&hi)
            && t == tag
        {
            self.runs.remove(&hi);
            hi = e;
        }
        self.runs.insert(lo, (hi, tag));
    }

    /// The runs covering `[lo, hi)` in address order, gaps included as
    /// `None`, clipped to the range.
    pub fn read(&self, lo: u64, hi: u64) -> Vec<(u64, u64, Option<u64>)> {
        let mut out = Vec::new();
        if lo >= hi {
            return out;
        }
        let first = self
            .runs
            .range(..=lo)
            .next_back()
            .filter(|(_, r)| r.0 > lo)
            .map(|(&s, _)| s)
            .unwrap_or(lo);
        let mut at = lo;
        for (&s, &(e, t)) in self.runs.range(first..hi) {
            let s = s.max(lo);
            if s > at {
                out.push((at, s, None));
            }
            let e = e.min(hi);
            out.push((s, e, Some(t)));
            at = e;
        }
        if at < hi {
            out.push((at, hi, None));
        }
        out
    }

    /// Number of runs (for tests of the merging).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_overwrite_split_and_merge() {
        let mut m = TagMap::default();
        assert_eq!(m.read(0, 10), vec![(0, 10, None)]);
        m.write(0, 100, 1);
        m.write(40, 60, 2);
        assert_eq!(
            m.read(0, 100),
            vec![(0, 40, Some(1)), (40, 60, Some(2)), (60, 100, Some(1))]
        );
        assert_eq!(m.read(50, 70), vec![(50, 60, Some(2)), (60, 70, Some(1))]);
        m.write(40, 60, 1);
        assert_eq!(m.read(0, 100), vec![(0, 100, Some(1))]);
        assert_eq!(m.len(), 1, "equal neighbours merge");
        m.clear(10, 20);
        assert_eq!(
            m.read(0, 30),
            vec![(0, 10, Some(1)), (10, 20, None), (20, 30, Some(1))]
        );
        m.write(5, 25, 3);
        assert_eq!(
            m.read(0, 100),
            vec![(0, 5, Some(1)), (5, 25, Some(3)), (25, 100, Some(1))]
        );
        m.clear(0, 100);
        assert_eq!(m.len(), 0);
        assert_eq!(m.read(0, 5), vec![(0, 5, None)]);
    }
}
