//! The simulated virtual memory: address reservations, physical allocations
//! and the mappings between them.
//!
//! Reservations live in their own address range, above the segment range
//! ([`crate::MockConfig`] places it), so they never overlap a segment.
//! Physical allocations carry their simulated contents (a [`TagMap`] keyed
//! by offset), so data follows a physical allocation wherever it is mapped.

use std::collections::BTreeMap;
use std::fmt;

use cachalot_core::BackendError;

use crate::data::TagMap;
use crate::types::codes;

fn err(call: &'static str, code: i64, message: impl Into<String>) -> BackendError {
    BackendError::new("mock", call, code, message)
}

/// A handle to physical memory of a [`crate::MockBackend`]
/// (`VirtualMemory::Physical`).
///
/// `Clone` so that tests can exercise misuse (releasing twice, mapping a
/// released handle): a handle that is released, or belongs to another mock
/// device, is a [`codes::INVALID_RESOURCE_HANDLE`] error, never a panic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MockPhysical {
    pub(crate) instance: u64,
    pub(crate) id: u64,
    pub(crate) size: u64,
}

impl MockPhysical {
    /// The allocation's id, unique within its device (starts at 1).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The allocation's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// One live mapping, as [`crate::MockBackend::mappings`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MockMapping {
    /// First virtual address.
    pub addr: u64,
    /// Size in bytes (the whole physical allocation).
    pub size: u64,
    /// The id of the physical allocation mapped ([`MockPhysical::id`]).
    pub physical: u64,
    /// Whether `set_access` has made it accessible since it was mapped.
    pub accessible: bool,
}

/// What virtual memory a mock device holds: reservations, physical
/// allocations and mappings ([`crate::MockBackend::vmm_usage`]). All zero
/// when nothing leaked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VmmUsage {
    /// Live reservations.
    pub reservations: usize,
    /// Bytes of address space they hold.
    pub reserved_bytes: u64,
    /// Live physical allocations.
    pub physical: usize,
    /// Bytes of device memory they hold.
    pub physical_bytes: u64,
    /// Live mappings.
    pub mappings: usize,
    /// Bytes mapped.
    pub mapped_bytes: u64,
}

impl VmmUsage {
    /// Whether nothing is held: no reservation, no physical allocation, no
    /// mapping.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl fmt::Display for VmmUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reservation(s) of {} B, {} physical allocation(s) of {} B, {} mapping(s) of {} B",
            self.reservations,
            self.reserved_bytes,
            self.physical,
            self.physical_bytes,
            self.mappings,
            self.mapped_bytes
        )
    }
}

/// A live mapping.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub size: u64,
    pub phys: u64,
    pub access: bool,
    /// For each stream, the position of the last eager work that touched
    /// the mapping (0: none).
    pub last_use: Vec<u64>,
}

/// A live physical allocation.
#[derive(Debug)]
pub(crate) struct Phys {
    pub size: u64,
    /// Number of mappings of it.
    pub maps: usize,
    /// What eager work last wrote where, by offset in the allocation.
    pub data: TagMap,
    /// By stream index, the last eager use of this memory: (work position,
    /// 0 for none; the mapping it went through; its tag). Memory mapped at
    /// two places at once (an allocator's ghost mappings) is checked for
    /// races here: a use through one mapping while another stream's use
    /// through another is pending and not ordered before it.
    pub last_use: Vec<(u64, u64, u64)>,
}

/// A run of `[lo, hi)` in a reservation: mapped (by the mapping starting
/// at `Some(start)`) or not.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub lo: u64,
    pub hi: u64,
    pub mapping: Option<u64>,
}

/// The virtual-memory state of a device.
#[derive(Debug)]
pub(crate) struct Vmm {
    pub granularity: u64,
    /// `[start, end)` of the range reservations are placed in.
    pub range: (u64, u64),
    /// start -> size.
    pub reservations: BTreeMap<u64, u64>,
    /// start -> mapping.
    pub mappings: BTreeMap<u64, Mapping>,
    /// id -> allocation.
    pub physical: BTreeMap<u64, Phys>,
    pub next_physical: u64,
    pub physical_bytes: u64,
}

impl Vmm {
    pub fn new(granularity: u64, range: (u64, u64)) -> Self {
        Self {
            granularity,
            range,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            physical: BTreeMap::new(),
            next_physical: 1,
            physical_bytes: 0,
        }
    }

    /// Checks that `addr` and `size` are multiples of the granularity and
    /// `size` is not 0; returns the end of the range.
    pub fn aligned(&self, call: &'static str, addr: u64, size: u64) -> Result<u64, BackendError> {
        let g = self.granularity;
        let end = addr.checked_add(size);
        match end {
            Some(end) if size > 0 && addr.is_multiple_of(g) && size.is_multiple_of(g) => Ok(end),
            _ => Err(err(
                call,
                codes::INVALID_VALUE,
                format!(
                    "range of {size} bytes at {addr:#x} is empty, overflows or is not a multiple \
                     of the granularity ({g} bytes)"
                ),
            )),
        }
    }

    /// Checks a size for `reserve` / `create_physical`.
    pub fn check_size(&self, call: &'static str, size: u64) -> Result<(), BackendError> {
        let g = self.granularity;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(err(
                call,
                codes::INVALID_VALUE,
                format!("size {size} is not a positive multiple of the granularity ({g} bytes)"),
            ));
        }
        Ok(())
    }

    /// The reservation `(start, size)` containing all of `[lo, hi)`.
    pub fn reservation_of(&self, lo: u64, hi: u64) -> Option<(u64, u64)> {
        let (&s, &sz) = self.reservations.range(..=lo).next_back()?;
        (hi <= s + sz).then_some((s, sz))
    }

    /// Like [`Self::reservation_of`], an error when there is none.
    pub fn reserved(&self, call: &'static str, lo: u64, hi: u64) -> Result<(), BackendError> {
        match self.reservation_of(lo, hi) {
            Some(_) => Ok(()),
            None => Err(err(
                call,
                codes::INVALID_DEVICE_POINTER,
                format!("[{lo:#x}, {hi:#x}) is not inside one reservation of this mock device"),
            )),
        }
    }

    /// The lowest free, granularity-aligned start for `size` bytes of
    /// address space, if any.
    pub fn place(&self, size: u64) -> Option<u64> {
        let (start, end) = self.range;
        let mut at = start;
        for (&s, &sz) in &self.reservations {
            if s >= at && s - at >= size {
                return Some(at);
            }
            at = at.max(s + sz);
        }
        (end >= at && end - at >= size).then_some(at)
    }

    /// The mapped and unmapped runs of `[lo, hi)`, in address order.
    pub fn pieces(&self, lo: u64, hi: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut at = lo;
        let before = self
            .mappings
            .range(..lo)
            .next_back()
            .filter(|(s, m)| *s + m.size > lo)
            .map(|(&s, m)| (s, m.size));
        let inside = self.mappings.range(lo..hi).map(|(&s, m)| (s, m.size));
        for (s, sz) in before.into_iter().chain(inside) {
            if s > at {
                out.push(Piece {
                    lo: at,
                    hi: s,
                    mapping: None,
                });
            }
            let e = (s + sz).min(hi);
            out.push(Piece {
                lo: at.max(s),
                hi: e,
                mapping: Some(s),
            });
            at = e;
        }
        if at < hi {
            out.push(Piece {
                lo: at,
                hi,
                mapping: None,
            });
        }
        out
    }

    /// The starts of the mappings that make up exactly `[addr, addr +
    /// size)` (whole mappings, no gap), as `unmap` and `set_access` need.
    pub fn whole_mappings(
        &self,
        call: &'static str,
        addr: u64,
        size: u64,
    ) -> Result<Vec<u64>, BackendError> {
        let end = self.aligned(call, addr, size)?;
        self.reserved(call, addr, end)?;
        let mut starts = Vec::new();
        for p in self.pieces(addr, end) {
            let Some(s) = p.mapping else {
                return Err(err(
                    call,
                    codes::NOT_MAPPED,
                    format!("[{:#x}, {:#x}) is not mapped", p.lo, p.hi),
                ));
            };
            let m_end = s + self.mappings[&s].size;
            if s < addr || m_end > end {
                return Err(err(
                    call,
                    codes::INVALID_VALUE,
                    format!(
                        "[{addr:#x}, {end:#x}) covers part of the mapping [{s:#x}, {m_end:#x}); \
                         only whole mappings can be unmapped or made accessible"
                    ),
                ));
            }
            starts.push(s);
        }
        Ok(starts)
    }

    /// The physical allocation `p` names, an error when it is not a live one
    /// of this device.
    pub fn phys(
        &self,
        call: &'static str,
        instance: u64,
        p: &MockPhysical,
    ) -> Result<&Phys, BackendError> {
        let found = self.physical.get(&p.id).filter(|_| p.instance == instance);
        found.ok_or_else(|| {
            err(
                call,
                codes::INVALID_RESOURCE_HANDLE,
                format!(
                    "physical allocation {} is unknown, was released or belongs to another mock \
                     device",
                    p.id
                ),
            )
        })
    }

    /// Where virtual address `va`, inside the mapping starting at `start`,
    /// lands in its physical allocation: `(physical id, offset)`.
    pub fn translate(&self, start: u64, va: u64) -> (u64, u64) {
        (self.mappings[&start].phys, va - start)
    }

    pub fn usage(&self) -> VmmUsage {
        VmmUsage {
            reservations: self.reservations.len(),
            reserved_bytes: self.reservations.values().sum(),
            physical: self.physical.len(),
            physical_bytes: self.physical_bytes,
            mappings: self.mappings.len(),
            mapped_bytes: self.mappings.values().map(|m| m.size).sum(),
        }
    }
}
