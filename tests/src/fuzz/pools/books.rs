//! What the private-pool harness keeps beside the allocator: a segment
//! source over the mock device (a pool backed by another allocator, here
//! the device's own `malloc` and `free`, with misbehaviour on request) and
//! the book a segment tracker keeps of the events it hears.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use cachalot_core::engine::{Snapshot, TraceAction};
use cachalot_core::{
    Backend, BackendError, DeviceAllocError, PoolId, SegmentEvent, SegmentSource, SegmentTracker,
};
use cachalot_mock::MockBackend;

/// How a pool's segment source behaves.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum SourceKind {
    /// Every segment from the device.
    Device,
    /// Every `n % 4 + 2`-th call answers the null address (out of memory,
    /// as PyTorch reads a pluggable allocator's null).
    NullEvery(u8),
    /// Every `n % 4 + 2`-th call answers an address 256 bytes into a
    /// device allocation (misaligned: the engine hands it back).
    MisalignedEvery(u8),
    /// Every `n % 4 + 2`-th call answers the address of a segment it gave
    /// before and still lends (overlapping: the engine refuses it and keeps
    /// it away from `free`).
    RepeatEvery(u8),
}

/// A segment source over the mock device: what it lends, by the address it
/// answered, with the device allocation under it (base, size).
pub struct FuzzSource {
    m: MockBackend,
    kind: SourceKind,
    calls: Mutex<u64>,
    lent: Mutex<BTreeMap<u64, (u64, u64)>>,
}

impl FuzzSource {
    /// A source of kind `kind` over `m`.
    pub fn new(m: MockBackend, kind: SourceKind) -> Self {
        Self {
            m,
            kind,
            calls: Mutex::new(0),
            lent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Segments lent and not taken back.
    pub fn lent(&self) -> usize {
        self.lent.lock().expect("source lock").len()
    }
}

impl SegmentSource for FuzzSource {
    fn alloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let n = {
            let mut c = self.calls.lock().expect("source lock");
            *c += 1;
            *c
        };
        let every = |k: u8| n.is_multiple_of(u64::from(k % 4) + 2);
        match self.kind {
            SourceKind::NullEvery(k) if every(k) => return Ok(0),
            SourceKind::RepeatEvery(k) if every(k) => {
                if let Some((&at, _)) = self.lent.lock().expect("source lock").iter().next() {
                    return Ok(at);
                }
            }
            _ => {}
        }
        let skew = match self.kind {
            SourceKind::MisalignedEvery(k) if every(k) => 256,
            _ => 0,
        };
        let alloc = size
            .checked_add(2 * skew)
            .ok_or(DeviceAllocError::OutOfMemory)?;
        let base = self.m.malloc(alloc)?;
        self.lent
            .lock()
            .expect("source lock")
            .insert(base + skew, (base, alloc));
        Ok(base + skew)
    }

    fn free(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut lent = self.lent.lock().expect("source lock");
        let Some(&(base, alloc)) = lent.get(&addr) else {
            panic!("the engine returned {addr:#x} ({size} bytes), which the source never lent");
        };
        assert!(
            size <= alloc && addr + size <= base + alloc,
            "the engine returned {addr:#x} with {size} bytes, lent with {alloc}"
        );
        // (a failure, as for a segment another process holds open, keeps it lent)
        self.m.free(base, alloc)?;
        lent.remove(&addr);
        Ok(())
    }
}

/// The segments a tracker has heard of: fixed segments by address (size,
/// pool), and the bytes mapped in each pool's expandable segments.
#[derive(Default)]
pub struct TrackerBook {
    fixed: BTreeMap<u64, (u64, PoolId)>,
    mapped: HashMap<PoolId, u64>,
    allocs: u64,
    frees: u64,
    wrong: Vec<String>,
}

impl TrackerBook {
    fn hear(&mut self, e: &SegmentEvent) {
        match e.action {
            TraceAction::SegmentAlloc => {
                self.allocs += 1;
                if let Some(old) = self.fixed.insert(e.addr, (e.size, e.pool)) {
                    self.wrong.push(format!(
                        "{e:?}: the segment was allocated already ({old:?})"
                    ));
                }
            }
            TraceAction::SegmentFree => {
                self.frees += 1;
                if self.fixed.remove(&e.addr) != Some((e.size, e.pool)) {
                    self.wrong
                        .push(format!("{e:?}: no such segment was heard of"));
                }
            }
            TraceAction::SegmentMap => *self.mapped.entry(e.pool).or_default() += e.size,
            TraceAction::SegmentUnmap => {
                let m = self.mapped.entry(e.pool).or_default();
                match m.checked_sub(e.size) {
                    Some(left) => *m = left,
                    None => self
                        .wrong
                        .push(format!("{e:?}: more unmapped than mapped ({m})")),
                }
            }
            other => self.wrong.push(format!("a tracker heard {other:?}")),
        }
    }

    /// Whether no segment is left as heard of (and nothing was heard
    /// wrong).
    pub fn is_empty(&self) -> bool {
        self.wrong.is_empty() && self.fixed.is_empty() && self.mapped.values().all(|&b| b == 0)
    }

    /// A tracker that files what it hears in `book`.
    pub fn tracker(book: &Arc<Mutex<Self>>) -> SegmentTracker {
        let book = book.clone();
        Arc::new(move |e: &SegmentEvent| book.lock().expect("tracker lock").hear(e))
    }

    /// Checks the book against snapshot `snap`: the segment allocations
    /// heard of minus the frees are its fixed segments, the bytes mapped
    /// are those of its expandable segments, pool by pool.
    pub fn check(&self, snap: &Snapshot, after: &dyn std::fmt::Debug) {
        assert!(
            self.wrong.is_empty(),
            "segment tracker after {after:?}: {}",
            self.wrong[0]
        );
        let fixed: BTreeMap<u64, (u64, PoolId)> = snap
            .segments
            .iter()
            .filter(|s| !s.is_expandable)
            .map(|s| (s.address, (s.total_size, s.pool_id)))
            .collect();
        assert_eq!(
            self.allocs - self.frees,
            fixed.len() as u64,
            "segment allocations heard of minus frees after {after:?}"
        );
        assert_eq!(self.fixed, fixed, "fixed segments heard of after {after:?}");
        let mut mapped: HashMap<PoolId, u64> = HashMap::new();
        for s in snap.segments.iter().filter(|s| s.is_expandable) {
            *mapped.entry(s.pool_id).or_default() += s.total_size;
        }
        let heard: HashMap<PoolId, u64> = self
            .mapped
            .iter()
            .filter(|&(_, &b)| b > 0)
            .map(|(&p, &b)| (p, b))
            .collect();
        assert_eq!(heard, mapped, "bytes mapped heard of after {after:?}");
    }
}
