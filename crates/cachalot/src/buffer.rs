//! [`DeviceBuffer`]: a safe RAII allocation freed on drop.

use std::fmt;
use std::sync::Arc;

use cachalot_core::{DeviceIndex, Error};

use crate::device::{DeviceAllocator, Stream};

/// Device memory from a caching allocator, returned to the cache when dropped.
///
/// The buffer holds only the device address; reading or writing the memory
/// is the job of the caller's kernels and copies. Dropping it is PyTorch's
/// tensor deallocation: the block goes back to the cache at once, or, if
/// [`DeviceBuffer::record_stream`] marked uses on other streams, once their
/// work queued up to the drop has completed.
pub struct DeviceBuffer {
    alloc: Arc<DeviceAllocator>,
    ptr: u64,
    size: u64,
    stream: Stream,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device())
            .field("stream", &self.stream.slot())
            .finish()
    }
}

impl DeviceBuffer {
    pub(crate) fn from_parts(
        alloc: Arc<DeviceAllocator>,
        ptr: u64,
        size: u64,
        stream: Stream,
    ) -> Self {
        Self {
            alloc,
            ptr,
            size,
            stream,
        }
    }

    /// Allocates `size` bytes on the current device's default stream, from
    /// the global allocator (initializing it if needed).
    pub fn new(size: u64) -> Result<Self, Error> {
        let alloc = crate::allocator(None)?;
        let s = alloc.default_stream();
        alloc.allocate(size, s)
    }

    /// Allocates `size` bytes for use on `stream`, from the global allocator
    /// of the stream's device.
    pub fn on_stream(size: u64, stream: Stream) -> Result<Self, Error> {
        crate::allocator(Some(stream.device()))?.allocate(size, stream)
    }

    /// The device address (0 for a 0-byte buffer).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The requested size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The device index.
    pub fn device(&self) -> DeviceIndex {
        self.alloc.index()
    }

    /// The stream the buffer was allocated for.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The allocator the buffer came from.
    pub fn allocator(&self) -> &Arc<DeviceAllocator> {
        &self.alloc
    }

    /// Marks the buffer as used on `stream` (PyTorch's
    /// `Tensor.record_stream`), so that its memory is not reused before the
    /// work queued on `stream` up to the buffer's drop has completed.
    pub fn record_stream(&self, stream: Stream) -> Result<(), Error> {
        self.alloc.record_stream(self.ptr, stream)
    }

    /// Gives up ownership: the caller must free the address with
    /// [`DeviceAllocator::raw_free`] (or [`crate::raw_free`]).
    pub fn into_raw(mut self) -> u64 {
        std::mem::take(&mut self.ptr)
    }

    /// Frees the buffer now, returning any error (dropping it logs errors).
    pub fn free(mut self) -> Result<(), Error> {
        let p = std::mem::take(&mut self.ptr);
        self.alloc.raw_free(p)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let p = std::mem::take(&mut self.ptr);
        if p != 0
            && let Err(e) = self.alloc.raw_free(p)
        {
            tracing::error!(%e, ptr = p, "freeing a DeviceBuffer failed");
        }
    }
}
