//! The device-agnostic backend trait that every accelerator implements.
//!
//! A backend is deliberately thin: raw segment allocation, memory info,
//! events and (optionally) stream-capture introspection. All caching policy
//! lives in [`crate::CachingAllocator`]. Backends never pool events
//! themselves: the engine keeps a free list of events and recycles them, so a
//! free with `record_stream` uses costs no event creation in steady state.
#![forbid(unsafe_code)]

use std::fmt::Debug;
use std::hash::Hash;

use crate::error::{BackendError, DeviceAllocError};

/// Index of a device as the backend numbers them (0-based).
pub type DeviceIndex = u32;

/// A device address as a backend represents it.
///
/// The engine does its bookkeeping on plain `u64` addresses; a backend's own
/// pointer type converts to and from that representation losslessly.
pub trait DevicePointer: Copy + Eq + Hash + Debug + Send + Sync + 'static {
    /// The numeric device address.
    fn addr(self) -> u64;
    /// Rebuilds the pointer from an address previously returned by [`Self::addr`].
    fn from_addr(addr: u64) -> Self;
}

impl DevicePointer for u64 {
    #[inline]
    fn addr(self) -> u64 {
        self
    }
    #[inline]
    fn from_addr(addr: u64) -> Self {
        addr
    }
}

/// Free and total device memory, in bytes, as the driver reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// Bytes currently free on the device (all processes counted).
    pub free: u64,
    /// Total bytes of device memory.
    pub total: u64,
}

/// Capture status of a stream (CUDA's `cudaStreamCaptureStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CaptureStatus {
    /// The stream is not capturing.
    #[default]
    None,
    /// The stream is capturing into a graph.
    Active,
    /// The capture was invalidated by an illegal operation; it must be ended.
    Invalidated,
}

/// Capture state of a stream with, when active, its capture id and the
/// stream's current terminal node set (the nodes the next captured operation
/// on this stream will depend on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureInfo<N> {
    /// Capture status.
    pub status: CaptureStatus,
    /// Capture id (never 0 while capturing; 0 when not capturing).
    pub id: u64,
    /// Terminal node set of the stream (empty when not capturing).
    pub terminals: Vec<N>,
}

impl<N> CaptureInfo<N> {
    /// The info of a stream that is not capturing.
    pub fn none() -> Self {
        Self {
            status: CaptureStatus::None,
            id: 0,
            terminals: Vec::new(),
        }
    }
}

/// How [`GraphCapture::update_capture_dependencies`] changes a stream's dependency set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependencyUpdate {
    /// Add the given nodes to the stream's terminal set.
    Add,
    /// Replace the stream's terminal set with the given nodes.
    Set,
}

/// One accelerator device as seen by the caching engine.
///
/// Implementations must be cheap to call from many threads (`Send + Sync`);
/// the engine calls [`Backend::malloc`] and [`Backend::free`] only on cache
/// misses and releases, and the event methods only for blocks with
/// cross-stream uses.
///
/// Two capabilities are optional, each behind an associated type and an
/// accessor that answers `None` when the device lacks it: graph capture
/// ([`Backend::Capture`], [`NoCapture`] for backends without it) and
/// virtual memory ([`Backend::VirtualMemory`], [`NoVirtualMemory`]).
pub trait Backend: Send + Sync + 'static {
    /// A stream handle: cheap to copy, totally ordered (the free-block search
    /// is keyed by stream first) and hashable.
    type Stream: Copy + Eq + Ord + Hash + Debug + Send + Sync + 'static;
    /// An owned event. The engine pools events and destroys them with
    /// [`Backend::destroy_event`] when it is dropped or the cache is emptied.
    type Event: Send + 'static;
    /// The backend's device pointer type.
    type Ptr: DevicePointer;
    /// Stream-capture introspection ([`GraphCapture`]); [`NoCapture`] for
    /// backends that cannot capture. Backends that can usually name `Self`.
    type Capture: GraphCapture<Self::Stream>;
    /// Virtual-memory management ([`VirtualMemory`]); [`NoVirtualMemory`]
    /// for backends without it.
    type VirtualMemory: VirtualMemory;

    /// Short backend name ("cuda", "hip", "level-zero", "mock").
    fn name(&self) -> &'static str;
    /// Index of the device this backend instance drives.
    fn device(&self) -> DeviceIndex;
    /// The stream used when the caller names none.
    fn default_stream(&self) -> Self::Stream;

    /// Allocates one raw segment of exactly `size` bytes (a multiple of 512).
    /// Must distinguish running out of memory from any other failure.
    /// With `release_lock_on_device_malloc` on, the engine calls it with
    /// none of its locks held, alongside other threads' calls.
    fn malloc(&self, size: u64) -> Result<Self::Ptr, DeviceAllocError>;
    /// Returns a segment obtained from [`Backend::malloc`] with the same size.
    fn free(&self, ptr: Self::Ptr, size: u64) -> Result<(), BackendError>;
    /// Free and total device memory.
    fn memory_info(&self) -> Result<MemoryInfo, BackendError>;

    /// Creates an event without timing (the engine pools it).
    fn create_event(&self) -> Result<Self::Event, BackendError>;
    /// Destroys an event created by [`Backend::create_event`]. The event is
    /// consumed: on an error the engine does not retry (the backend has
    /// destroyed it or keeps it).
    fn destroy_event(&self, event: Self::Event) -> Result<(), BackendError>;
    /// Records `event` at the current tail of `stream`.
    fn record_event(&self, event: &Self::Event, stream: Self::Stream) -> Result<(), BackendError>;
    /// Whether all work captured by the last record of `event` has completed.
    fn query_event(&self, event: &Self::Event) -> Result<bool, BackendError>;
    /// Blocks the host until `event` has completed.
    fn synchronize_event(&self, event: &Self::Event) -> Result<(), BackendError>;
    /// Whether all work submitted to `stream` so far has completed
    /// (`cuStreamQuery`), without an event: `Ok(None)` when the backend
    /// cannot tell (the default; the engine then records an event). The
    /// engine never asks about a stream while a capture is underway (the
    /// query is prohibited there, and in CUDA's global capture mode it
    /// invalidates the capture).
    fn query_stream(&self, stream: Self::Stream) -> Result<Option<bool>, BackendError> {
        let _ = stream;
        Ok(None)
    }
    /// Makes future work on `stream` wait for `event`.
    fn stream_wait_event(
        &self,
        stream: Self::Stream,
        event: &Self::Event,
    ) -> Result<(), BackendError>;
    /// Blocks the host until all work on the device has completed.
    fn synchronize_device(&self) -> Result<(), BackendError>;

    /// The capture interface, or `None` when this device cannot capture
    /// (always `None` with [`NoCapture`]). When `None`, the engine rejects
    /// capture-id pool filters with a typed error and treats every stream as
    /// not capturing.
    fn capture(&self) -> Option<&Self::Capture> {
        None
    }

    /// The virtual-memory interface, or `None` when this device has none.
    fn virtual_memory(&self) -> Option<&Self::VirtualMemory> {
        None
    }

    /// Sharing device memory with other processes ([`IpcMemory`]), or
    /// `None` when this device cannot (the default).
    fn ipc(&self) -> Option<&dyn IpcMemory> {
        None
    }
}

/// Bytes of a segment's interprocess handle (CUDA's `cudaIpcMemHandle_t`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Sharing device memory between processes (CUDA IPC): the handle of a
/// segment that [`Backend::malloc`] made, and, in the process that
/// receives it, the mapping of such a segment or of another process's
/// physical pages (exported with [`VirtualMemory::export_physical`]).
/// Optional: [`Backend::ipc`].
pub trait IpcMemory: Send + Sync {
    /// The interprocess handle of the segment [`Backend::malloc`] returned
    /// at `base` (CUDA's `cuIpcGetMemHandle`).
    fn segment_handle(&self, base: u64) -> Result<[u8; IPC_HANDLE_BYTES], BackendError>;

    /// Opens another process's segment handle in this process (CUDA's
    /// `cuIpcOpenMemHandle`); returns where it is mapped. A handle is
    /// opened once per process (the caller keeps count).
    fn open_segment(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64, BackendError>;

    /// Unmaps a segment [`Self::open_segment`] opened.
    fn close_segment(&self, addr: u64) -> Result<(), BackendError>;

    /// Maps, contiguously and in order, the physical allocations that
    /// process `pid` exported as shareable handles (POSIX file descriptors
    /// of that process), each `(handle, its bytes)`; returns the mapping's
    /// start.
    fn open_runs(&self, pid: i32, runs: &[(i32, u64)]) -> Result<u64, BackendError>;

    /// [`Self::open_runs`] of physical allocations of `page` bytes each
    /// (PyTorch's expandable segments share pages of one size).
    fn open_pages(&self, pid: i32, page: u64, handles: &[i32]) -> Result<u64, BackendError> {
        let runs: Vec<(i32, u64)> = handles.iter().map(|&h| (h, page)).collect();
        self.open_runs(pid, &runs)
    }

    /// Unmaps and releases a mapping [`Self::open_runs`] made.
    fn close_pages(&self, addr: u64) -> Result<(), BackendError>;
}

/// The node type of a backend's capture graphs.
pub type NodeOf<B> = <<B as Backend>::Capture as GraphCapture<<B as Backend>::Stream>>::Node;

/// Stream-capture (graph) introspection for streams of type `S`: what the
/// engine needs to route allocations to private pools and to reuse blocks
/// freed during a capture (PyTorch PR #158352).
///
/// Required: [`GraphCapture::capture_state`] (status, id and terminal nodes
/// of a stream), [`GraphCapture::extend_node_dependencies`] (the step of the
/// engine's reverse walk over the graph) and the two graph edits. Optional,
/// as one fast path: [`GraphCapture::node_index`] together with
/// [`GraphCapture::mark_ancestors`], for backends that number their nodes
/// and can walk their graph in one call. [`CaptureQuery`] adds allocating
/// conveniences on top.
pub trait GraphCapture<S>: Send + Sync {
    /// A node of a capture graph.
    type Node: Copy + Eq + Hash + Debug + Send + Sync + 'static;

    /// Capture status and id of `stream`, its terminal node set (the nodes
    /// the next captured operation on it will depend on) written into
    /// `terminals`: cleared first, left empty when not capturing. Must not
    /// allocate beyond growing `terminals`.
    fn capture_state(
        &self,
        stream: S,
        terminals: &mut Vec<Self::Node>,
    ) -> Result<(CaptureStatus, u64), BackendError>;

    /// Appends the direct dependencies (parents) of `node` to `out`.
    fn extend_node_dependencies(
        &self,
        node: Self::Node,
        out: &mut Vec<Self::Node>,
    ) -> Result<(), BackendError>;

    /// Adds an empty node depending on `deps` to the graph `stream` captures into.
    fn add_empty_node(&self, stream: S, deps: &[Self::Node]) -> Result<Self::Node, BackendError>;

    /// Adds to or replaces the capture dependencies of `stream`.
    fn update_capture_dependencies(
        &self,
        stream: S,
        nodes: &[Self::Node],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError>;

    /// Fast path, part 1: a small dense number of `node` within the graph
    /// of capture `capture` (its creation index, say), or `None` when the
    /// backend has none; the engine then numbers nodes itself. A backend
    /// numbers either every node of a capture's graph or none. Must be
    /// cheap and must not block.
    fn node_index(&self, capture: u64, node: Self::Node) -> Option<u32> {
        let _ = (capture, node);
        None
    }

    /// Fast path, part 2: marks in `visited`, a bitset over the
    /// [`GraphCapture::node_index`] numbers of capture `capture` (bit
    /// `i % 64` of word `i / 64`, grown as needed), the ancestors-or-self of
    /// `from`: a node is marked, and its dependencies looked at, only if it
    /// was not marked already. Returns false, having marked nothing, when
    /// the backend cannot walk these nodes so; the engine then walks with
    /// [`GraphCapture::extend_node_dependencies`].
    fn mark_ancestors(
        &self,
        capture: u64,
        from: &[Self::Node],
        visited: &mut Vec<u64>,
    ) -> Result<bool, BackendError> {
        let _ = (capture, from, visited);
        Ok(false)
    }
}

/// Allocating conveniences over every [`GraphCapture`] (for tests and tools;
/// the engine uses the buffer-filling methods). Implemented for all capture
/// types; not meant to be implemented by backends.
pub trait CaptureQuery<S>: GraphCapture<S> {
    /// Capture status, id and terminal node set of `stream`.
    fn capture_info(&self, stream: S) -> Result<CaptureInfo<Self::Node>, BackendError> {
        let mut terminals = Vec::new();
        let (status, id) = self.capture_state(stream, &mut terminals)?;
        Ok(CaptureInfo {
            status,
            id,
            terminals,
        })
    }

    /// The direct dependencies (parents) of a graph node.
    fn node_dependencies(&self, node: Self::Node) -> Result<Vec<Self::Node>, BackendError> {
        let mut out = Vec::new();
        self.extend_node_dependencies(node, &mut out)?;
        Ok(out)
    }
}

impl<S, C: GraphCapture<S> + ?Sized> CaptureQuery<S> for C {}

/// The capture type of backends that cannot capture: it has no values, so
/// [`Backend::capture`] can only answer `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCapture {}

impl<S> GraphCapture<S> for NoCapture {
    type Node = ();

    fn capture_state(
        &self,
        _stream: S,
        _terminals: &mut Vec<()>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        match *self {}
    }

    fn extend_node_dependencies(&self, _node: (), _out: &mut Vec<()>) -> Result<(), BackendError> {
        match *self {}
    }

    fn add_empty_node(&self, _stream: S, _deps: &[()]) -> Result<(), BackendError> {
        match *self {}
    }

    fn update_capture_dependencies(
        &self,
        _stream: S,
        _nodes: &[()],
        _mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        match *self {}
    }
}

/// Virtual-memory management (CUDA's `cuMem*`, HIP's `hipMem*`, Level
/// Zero's `zeVirtualMem*`/`zePhysicalMem*`): reserve an address range, back
/// parts of it with physical pages, and make them accessible. The engine's
/// expandable segments build on it; backends without it name
/// [`NoVirtualMemory`].
///
/// Every size and offset is a multiple of [`VirtualMemory::granularity`].
pub trait VirtualMemory: Send + Sync {
    /// A handle to physical memory (CUDA's `CUmemGenericAllocationHandle`).
    type Physical: Send + 'static;

    /// The mapping granularity in bytes (a power of two).
    fn granularity(&self) -> Result<u64, BackendError>;
    /// Reserves `size` bytes of virtual address space; returns its start.
    fn reserve(&self, size: u64) -> Result<u64, DeviceAllocError>;
    /// Returns a range obtained from [`VirtualMemory::reserve`] (nothing mapped in it).
    fn unreserve(&self, addr: u64, size: u64) -> Result<(), BackendError>;
    /// Creates `size` bytes of physical memory on the device.
    fn create_physical(&self, size: u64) -> Result<Self::Physical, DeviceAllocError>;
    /// Releases physical memory (once it is mapped nowhere).
    fn release_physical(&self, physical: Self::Physical) -> Result<(), BackendError>;
    /// Maps `physical` (all of it, `size` bytes) at `addr` in a reserved range.
    fn map(&self, addr: u64, size: u64, physical: &Self::Physical) -> Result<(), BackendError>;
    /// Unmaps `[addr, addr + size)`.
    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError>;
    /// Makes `[addr, addr + size)` readable and writable from `device`.
    fn set_access(&self, addr: u64, size: u64, device: DeviceIndex) -> Result<(), BackendError>;

    /// A handle another process can map `physical` with (a POSIX file
    /// descriptor of this process, owned by `physical` and valid until it
    /// is released), for [`IpcMemory::open_pages`]; `Ok(None)` when this
    /// memory cannot be shared (the default).
    fn export_physical(&self, physical: &Self::Physical) -> Result<Option<i32>, BackendError> {
        let _ = physical;
        Ok(None)
    }
}

/// The virtual-memory type of backends without it: it has no values, so
/// [`Backend::virtual_memory`] can only answer `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoVirtualMemory {}

impl VirtualMemory for NoVirtualMemory {
    type Physical = ();

    fn granularity(&self) -> Result<u64, BackendError> {
        match *self {}
    }
    fn reserve(&self, _size: u64) -> Result<u64, DeviceAllocError> {
        match *self {}
    }
    fn unreserve(&self, _addr: u64, _size: u64) -> Result<(), BackendError> {
        match *self {}
    }
    fn create_physical(&self, _size: u64) -> Result<(), DeviceAllocError> {
        match *self {}
    }
    fn release_physical(&self, _physical: ()) -> Result<(), BackendError> {
        match *self {}
    }
    fn map(&self, _addr: u64, _size: u64, _physical: &()) -> Result<(), BackendError> {
        match *self {}
    }
    fn unmap(&self, _addr: u64, _size: u64) -> Result<(), BackendError> {
        match *self {}
    }
    fn set_access(&self, _addr: u64, _size: u64, _device: DeviceIndex) -> Result<(), BackendError> {
        match *self {}
    }
}
