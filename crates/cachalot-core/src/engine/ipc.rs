//! Sharing an allocation with another process (PyTorch's `shareIpcHandle`
//! and `ExpandableSegment::share`): what the other process needs
//! to map the memory of a live allocation. A fixed segment is shared whole
//! by its interprocess handle ([`crate::IpcMemory::segment_handle`]), the
//! allocation at an offset into it; an expandable segment shares the
//! physical allocations (runs of pages) under the allocation, each by the
//! handle [`crate::VirtualMemory::export_physical`] gives, mapped
//! contiguously by the receiver ([`crate::IpcMemory::open_pages`] when they
//! are of one size, as PyTorch's pages are, [`crate::IpcMemory::open_runs`]
//! otherwise).
//!
//! The memory stays the allocation's as long as it is live: who frees it
//! decides when the other process is done (PyTorch keeps the producer's
//! block allocated until the consumer's reference count reaches zero).
#![forbid(unsafe_code)]

use crate::backend::{Backend, IPC_HANDLE_BYTES, VirtualMemory};
use crate::engine::CachingAllocator;
use crate::engine::segments::SegmentKind;
use crate::error::{BackendError, Error};

/// What another process needs to map a live allocation
/// ([`CachingAllocator::share`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharedMemory {
    /// A fixed segment's interprocess handle; the allocation starts
    /// `offset` bytes into the segment.
    Segment {
        /// The segment's handle.
        handle: [u8; IPC_HANDLE_BYTES],
        /// The allocation's offset in the segment.
        offset: u64,
    },
    /// The physical allocations under an allocation of an expandable
    /// segment, `page` bytes each, in address order, to be mapped
    /// contiguously; the allocation starts `offset` bytes into the first.
    Pages {
        /// Bytes of each physical allocation.
        page: u64,
        /// Their shareable handles (file descriptors of this process,
        /// valid while the memory is mapped here).
        handles: Vec<i32>,
        /// The allocation's offset in the first.
        offset: u64,
    },
    /// The physical allocations under an allocation of an expandable
    /// segment when they are not all of one size (cachalot's page runs:
    /// a fresh 6 MiB block is a run of two 2 MiB pages and a run of one),
    /// in address order, to be mapped contiguously; the allocation starts
    /// `offset` bytes into the first. PyTorch's wire format cannot carry
    /// this (one page size per handle): a process on cachalot opens it.
    Runs {
        /// Each physical allocation's shareable handle (a file descriptor
        /// of this process, valid while the memory is mapped here) and
        /// its bytes.
        runs: Vec<(i32, u64)>,
        /// The allocation's offset in the first.
        offset: u64,
    },
}

fn unsupported(backend: &'static str, what: &str) -> Error {
    Error::Backend(BackendError::new(
        backend,
        "share",
        0,
        format!("the {backend} backend cannot share {what} with another process"),
    ))
}

impl<B: Backend> CachingAllocator<B> {
    /// What another process needs to map the live allocation at `addr`
    /// (its start, as [`Self::allocate`] returned it). Another address is
    /// the typed error of a bad pointer ([`Error::UnknownPointer`]:
    /// "invalid device pointer"); a backend without interprocess sharing
    /// is an [`Error::Backend`]. An allocation of an expandable segment is
    /// [`SharedMemory::Pages`] when its physical allocations are of one
    /// size (always in PyTorch's mode), [`SharedMemory::Runs`] when not.
    pub fn share(&self, addr: u64) -> Result<SharedMemory, Error> {
        let name = self.backend.name();
        let g = self.lock();
        let Some(id) = g.live.get(addr) else {
            return Err(g.classify_bad_pointer(addr, false));
        };
        let (size, expandable) = (g.blocks[id].size, g.blocks[id].expandable);
        let (base, seg) = g.segments.find(addr).expect("a live block is in a segment");
        if !expandable {
            debug_assert!(matches!(seg.kind, SegmentKind::Fixed));
            let ipc = self
                .backend
                .ipc()
                .ok_or_else(|| unsupported(name, "memory"))?;
            let handle = ipc.segment_handle(base)?;
            return Ok(SharedMemory::Segment {
                handle,
                offset: addr - base,
            });
        }
        let vm = self
            .backend
            .virtual_memory()
            .ok_or_else(|| unsupported(name, "virtual memory"))?;
        if self.backend.ipc().is_none() {
            return Err(unsupported(name, "memory"));
        }
        let (_, e) = g.segments.expandable_at(addr);
        let lo = ((addr - e.start) / e.page) as usize;
        let hi = (addr + size - e.start).div_ceil(e.page) as usize;
        let mut first = None;
        let mut runs: Vec<(i32, u64)> = Vec::new();
        let mut i = lo;
        while i < hi {
            let Some((at, n)) = e.run_at(i) else {
                // (a live block's pages are mapped)
                return Err(Error::InvalidArgument(format!(
                    "allocation {addr:#x}: page {i} is not mapped"
                )));
            };
            first.get_or_insert(at);
            let (_, phys, _) = e.runs.get(&at).expect("run_at names a run");
            let fd = vm
                .export_physical(phys)?
                .ok_or_else(|| unsupported(name, "these pages"))?;
            runs.push((fd, n as u64 * e.page));
            i = at + n;
        }
        let first = first.expect("an allocation covers a page");
        let offset = addr - (e.start + first as u64 * e.page);
        let page = runs[0].1;
        Ok(if runs.iter().all(|r| r.1 == page) {
            SharedMemory::Pages {
                page,
                handles: runs.into_iter().map(|r| r.0).collect(),
                offset,
            }
        } else {
            SharedMemory::Runs { runs, offset }
        })
    }
}
