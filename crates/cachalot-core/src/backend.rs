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

/// How [`Backend::update_capture_dependencies`] changes a stream's dependency set.
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
pub trait Backend: Send + Sync + 'static {
    /// A stream handle: cheap to copy, totally ordered (the free-block search
    /// is keyed by stream first) and hashable.
    type Stream: Copy + Eq + Ord + Hash + Debug + Send + Sync + 'static;
    /// An owned event. The engine pools events and destroys them with
    /// [`Backend::destroy_event`] when it is dropped or the cache is emptied.
    type Event: Send + 'static;
    /// The backend's device pointer type.
    type Ptr: DevicePointer;
    /// A node of a capture graph (use `()` for backends without capture).
    type Node: Copy + Eq + Hash + Debug + Send + Sync + 'static;

    /// Short backend name ("cuda", "hip", "level-zero", "mock").
    fn name(&self) -> &'static str;
    /// Index of the device this backend instance drives.
    fn device(&self) -> DeviceIndex;
    /// The stream used when the caller names none.
    fn default_stream(&self) -> Self::Stream;

    /// Allocates one raw segment of exactly `size` bytes (a multiple of 512).
    /// Must distinguish running out of memory from any other failure.
    fn malloc(&self, size: u64) -> Result<Self::Ptr, DeviceAllocError>;
    /// Returns a segment obtained from [`Backend::malloc`] with the same size.
    fn free(&self, ptr: Self::Ptr, size: u64) -> Result<(), BackendError>;
    /// Free and total device memory.
    fn memory_info(&self) -> Result<MemoryInfo, BackendError>;

    /// Creates an event without timing (the engine pools it).
    fn create_event(&self) -> Result<Self::Event, BackendError>;
    /// Destroys an event created by [`Backend::create_event`].
    fn destroy_event(&self, event: Self::Event) -> Result<(), BackendError>;
    /// Records `event` at the current tail of `stream`.
    fn record_event(&self, event: &Self::Event, stream: Self::Stream) -> Result<(), BackendError>;
    /// Whether all work captured by the last record of `event` has completed.
    fn query_event(&self, event: &Self::Event) -> Result<bool, BackendError>;
    /// Blocks the host until `event` has completed.
    fn synchronize_event(&self, event: &Self::Event) -> Result<(), BackendError>;
    /// Makes future work on `stream` wait for `event`.
    fn stream_wait_event(
        &self,
        stream: Self::Stream,
        event: &Self::Event,
    ) -> Result<(), BackendError>;
    /// Blocks the host until all work on the device has completed.
    fn synchronize_device(&self) -> Result<(), BackendError>;

    /// Whether the backend supports stream capture (graph) introspection.
    /// When false, the engine rejects capture calls with a typed error and the
    /// capture methods below are never called.
    fn supports_capture(&self) -> bool {
        false
    }
    /// Capture status, id and terminal node set of `stream`.
    fn capture_info(&self, stream: Self::Stream) -> Result<CaptureInfo<Self::Node>, BackendError> {
        let _ = stream;
        Ok(CaptureInfo::none())
    }
    /// Capture status and id of `stream`, its terminal node set written into
    /// `terminals` (cleared first; left empty when not capturing): the answer
    /// of [`Backend::capture_info`] without allocating. The engine's capture
    /// paths call this; backends override it to fill the buffer in place.
    fn capture_state(
        &self,
        stream: Self::Stream,
        terminals: &mut Vec<Self::Node>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        let info = self.capture_info(stream)?;
        terminals.clear();
        terminals.extend(info.terminals);
        Ok((info.status, info.id))
    }
    /// A small dense number of `node` within the graph of capture `capture`
    /// (its creation index, say), or `None` when the backend has none; the
    /// engine then numbers nodes itself. A backend numbers either every node
    /// of a capture's graph or none. Must be cheap and must not block: the
    /// engine calls it from inside [`Backend::walk_ancestors`]'s callback.
    fn node_index(&self, capture: u64, node: Self::Node) -> Option<u32> {
        let _ = (capture, node);
        None
    }
    /// Reverse walk of a capture graph: calls `visit` on every node of
    /// `from`, then on every direct dependency of each node for which `visit`
    /// returned true (a node to expand), until none is left. `visit` may call
    /// [`Backend::node_index`] and no other method (a backend may hold a lock
    /// during the walk). The default expands nodes one at a time with
    /// [`Backend::extend_node_dependencies`]; backends override it to walk
    /// their graph in one call.
    fn walk_ancestors<F: FnMut(Self::Node) -> bool>(
        &self,
        from: &[Self::Node],
        mut visit: F,
    ) -> Result<(), BackendError> {
        let mut stack: Vec<Self::Node> = from.iter().copied().filter(|&n| visit(n)).collect();
        let mut deps: Vec<Self::Node> = Vec::new();
        while let Some(n) = stack.pop() {
            deps.clear();
            self.extend_node_dependencies(n, &mut deps)?;
            for &d in &deps {
                if visit(d) {
                    stack.push(d);
                }
            }
        }
        Ok(())
    }
    /// Marks in `visited`, a bitset over the [`Backend::node_index`] numbers
    /// of capture `capture` (bit `i % 64` of word `i / 64`, grown as
    /// needed), the ancestors-or-self of `from`: a node is marked, and its
    /// dependencies looked at, only if it was not marked already. Returns
    /// false, having marked nothing, when the backend has no such walk for
    /// these nodes; the engine then walks with
    /// [`Backend::walk_ancestors`]. Backends that number nodes override it
    /// to walk their graph without a callback per node.
    fn mark_ancestors(
        &self,
        capture: u64,
        from: &[Self::Node],
        visited: &mut Vec<u64>,
    ) -> Result<bool, BackendError> {
        let _ = (capture, from, visited);
        Ok(false)
    }
    /// The direct dependencies (parents) of a graph node.
    fn node_dependencies(&self, node: Self::Node) -> Result<Vec<Self::Node>, BackendError> {
        let _ = node;
        Err(BackendError::unsupported(self.name(), "node_dependencies"))
    }
    /// Appends the direct dependencies of `node` to `out` (the engine's
    /// reverse walk calls this once per node; backends override it to avoid
    /// allocating a `Vec` per call).
    fn extend_node_dependencies(
        &self,
        node: Self::Node,
        out: &mut Vec<Self::Node>,
    ) -> Result<(), BackendError> {
        out.extend(self.node_dependencies(node)?);
        Ok(())
    }
    /// Adds an empty node depending on `deps` to the graph `stream` captures into.
    fn add_empty_node(
        &self,
        stream: Self::Stream,
        deps: &[Self::Node],
    ) -> Result<Self::Node, BackendError> {
        let _ = (stream, deps);
        Err(BackendError::unsupported(self.name(), "add_empty_node"))
    }
    /// Adds to or replaces the capture dependencies of `stream`.
    fn update_capture_dependencies(
        &self,
        stream: Self::Stream,
        nodes: &[Self::Node],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        let _ = (stream, nodes, mode);
        Err(BackendError::unsupported(
            self.name(),
            "update_capture_dependencies",
        ))
    }
}
