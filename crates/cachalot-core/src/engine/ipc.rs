//! Sharing an allocation with another process (PyTorch's `shareIpcHandle`
//! and `ExpandableSegment::share`): what the other process needs
//! to map the memory of a live allocation. A fixed segment is shared whole
//! by its interprocess handle ([`crate::IpcMemory::segment_handle`]), the
//! allocation at an offset into it; an expandable segment shares the
//! physical allocations (runs of pages) under the allocation, each by the
//! handle [`crate::VirtualMemory::export_physical`] gives, mapped
//! contiguously by the receiver ([`crate::IpcMemory::open_pages`]).
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
    /// is an [`Error::Backend`]. An allocation of an expandable segment
    /// whose pages are physical allocations of different sizes (cachalot's
    /// page runs) cannot be described as pages of one size: an
    /// [`Error::InvalidArgument`] naming the configurations that share
    /// every allocation.
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
        let (mut first, mut pages) = (None, None);
        let mut handles = Vec::new();
        let mut i = lo;
        while i < hi {
            let Some((at, n)) = e.run_at(i) else {
                // (a live block's pages are mapped)
                return Err(Error::InvalidArgument(format!(
                    "allocation {addr:#x}: page {i} is not mapped"
                )));
            };
            first.get_or_insert(at);
            let want = *pages.get_or_insert(n);
            if want != n {
                return Err(Error::InvalidArgument(format!(
                    "cannot share the allocation at {addr:#x} ({size} bytes) as pages of one \
                     size: its pages belong to physical allocations of {want} and {n} pages \
                     (cachalot's page runs); `placement:pytorch` or \
                     `expandable_segments:False` shares every allocation"
                )));
            }
            let (_, phys, _) = e.runs.get(&at).expect("run_at names a run");
            let fd = vm
                .export_physical(phys)?
                .ok_or_else(|| unsupported(name, "these pages"))?;
            handles.push(fd);
            i = at + n;
        }
        let first = first.expect("an allocation covers a page");
        let page = pages.expect("an allocation covers a page") as u64 * e.page;
        Ok(SharedMemory::Pages {
            page,
            handles,
            offset: addr - (e.start + first as u64 * e.page),
        })
    }
}
