//! Small public value types of the mock: streams, events, work handles,
//! memory uses, races, counters, failure kinds and error codes.

use std::fmt;

use crate::graph::MockNode;

/// A simulated stream. Stream 0 is the default (legacy) stream; others come
/// from [`crate::MockBackend::create_stream`]. Using an index the backend
/// never created is an error, never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MockStream(pub u32);

impl MockStream {
    /// The default stream (index 0).
    pub const DEFAULT: MockStream = MockStream(0);

    /// The stream's index.
    pub fn index(self) -> u32 {
        self.0
    }
}

impl fmt::Display for MockStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream{}", self.0)
    }
}

/// A simulated event handle. `Clone` so that tests can exercise misuse
/// (using a destroyed event is a [`cachalot_core::BackendError`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MockEvent {
    pub(crate) instance: u64,
    pub(crate) id: u64,
}

impl MockEvent {
    /// The event's id, unique within its backend (starts at 1).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// What one submission produced: an eager work item or a captured node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Submitted {
    /// Work item `seq` (1-based, per stream) on `stream`, outside capture.
    Work {
        /// The stream.
        stream: MockStream,
        /// 1-based position of the work item on that stream.
        seq: u64,
    },
    /// A node added to the graph of a capture.
    Node(MockNode),
}

impl fmt::Display for Submitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Submitted::Work { stream, seq } => write!(f, "work #{seq} on {stream}"),
            Submitted::Node(n) => write!(f, "node {} of capture {}", n.index(), n.capture_id()),
        }
    }
}

/// One memory use: `[addr, addr + len)` touched on behalf of allocation `tag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemUse {
    /// First byte.
    pub addr: u64,
    /// Number of bytes (never 0).
    pub len: u64,
    /// Allocation tag chosen by the harness.
    pub tag: u64,
}

/// One side of a race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UseSite {
    /// The stream the use was issued on.
    pub stream: MockStream,
    /// The work item or graph node that performed it.
    pub at: Submitted,
    /// The use's allocation tag.
    pub tag: u64,
    /// First byte of the whole use.
    pub addr: u64,
    /// Length of the whole use.
    pub len: u64,
}

/// Two uses of overlapping memory with different tags that are not ordered
/// by happens-before (eager work) or by a path (inside one capture graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Race {
    /// The use submitted first.
    pub earlier: UseSite,
    /// The use whose submission revealed the race.
    pub later: UseSite,
    /// The overlapping byte range `[start, end)` of the two uses.
    pub overlap: (u64, u64),
    /// The capture id when both uses are nodes of one capture graph.
    pub capture_id: Option<u64>,
}

impl fmt::Display for Race {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "race on [{:#x}, {:#x}): tag {} ({} on {}) is unordered with tag {} ({} on {})",
            self.overlap.0,
            self.overlap.1,
            self.earlier.tag,
            self.earlier.at,
            self.earlier.stream,
            self.later.tag,
            self.later.at,
            self.later.stream,
        )?;
        if let Some(c) = self.capture_id {
            write!(f, " in capture {c}")?;
        }
        Ok(())
    }
}

/// Why an eager use of reserved memory was invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidAccessKind {
    /// The bytes lie in a reservation but no physical memory is mapped there.
    Unmapped,
    /// The bytes are mapped but `set_access` has not made them accessible.
    NoAccess,
}

/// An eager use ([`crate::MockBackend::use_memory`], a graph launch) that
/// touched reserved bytes not mapped, or mapped without access: on a real
/// device an illegal-address fault. The use is still submitted (it is work,
/// and the race checker sees it); it writes no data to those bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidAccess {
    /// The use, as the race checker names it.
    pub site: UseSite,
    /// The offending bytes `[start, end)` (one report per contiguous run).
    pub range: (u64, u64),
    /// Why they could not be accessed.
    pub kind: InvalidAccessKind,
}

impl fmt::Display for InvalidAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.kind {
            InvalidAccessKind::Unmapped => "not mapped",
            InvalidAccessKind::NoAccess => "mapped without access",
        };
        write!(
            f,
            "invalid access to [{:#x}, {:#x}) ({why}): tag {} ({} on {})",
            self.range.0, self.range.1, self.site.tag, self.site.at, self.site.stream,
        )
    }
}

/// Every fallible entry point of the `Backend`, `GraphCapture` and
/// `VirtualMemory` traits the engine calls, as named by the
/// failure-injection API ([`crate::MockBackend::fail_call_at`] and friends)
/// and by [`crate::MockBackend::call_count`].
///
/// The infallible entry points (`name`, `device`, `default_stream`,
/// `capture`, `virtual_memory`, `node_index`) and the mock's own test
/// controls (`launch`, `use_memory`, `begin_capture`, ...) cannot be made to
/// fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MockCall {
    /// `Backend::malloc`.
    Malloc,
    /// `Backend::free`.
    Free,
    /// `Backend::memory_info`.
    MemoryInfo,
    /// `Backend::create_event`.
    CreateEvent,
    /// `Backend::destroy_event`.
    DestroyEvent,
    /// `Backend::record_event`.
    RecordEvent,
    /// `Backend::query_event`.
    QueryEvent,
    /// `Backend::query_stream`.
    QueryStream,
    /// `Backend::synchronize_event`.
    SynchronizeEvent,
    /// `Backend::stream_wait_event`.
    StreamWaitEvent,
    /// `Backend::synchronize_device`.
    SynchronizeDevice,
    /// `GraphCapture::capture_state`.
    CaptureState,
    /// `GraphCapture::extend_node_dependencies`.
    ExtendNodeDependencies,
    /// `GraphCapture::mark_ancestors` (counted and failable even when the
    /// mock numbers no nodes and would answer `Ok(false)`).
    MarkAncestors,
    /// `GraphCapture::add_empty_node`.
    AddEmptyNode,
    /// `GraphCapture::update_capture_dependencies`.
    UpdateCaptureDependencies,
    /// `VirtualMemory::granularity`.
    Granularity,
    /// `VirtualMemory::reserve`.
    Reserve,
    /// `VirtualMemory::unreserve`.
    Unreserve,
    /// `VirtualMemory::create_physical`.
    CreatePhysical,
    /// `VirtualMemory::release_physical`.
    ReleasePhysical,
    /// `VirtualMemory::map`.
    Map,
    /// `VirtualMemory::unmap`.
    Unmap,
    /// `VirtualMemory::set_access`.
    SetAccess,
}

impl MockCall {
    /// Every call kind, in declaration order (for a test matrix).
    pub const ALL: [MockCall; 24] = [
        MockCall::Malloc,
        MockCall::Free,
        MockCall::MemoryInfo,
        MockCall::CreateEvent,
        MockCall::DestroyEvent,
        MockCall::RecordEvent,
        MockCall::QueryEvent,
        MockCall::QueryStream,
        MockCall::SynchronizeEvent,
        MockCall::StreamWaitEvent,
        MockCall::SynchronizeDevice,
        MockCall::CaptureState,
        MockCall::ExtendNodeDependencies,
        MockCall::MarkAncestors,
        MockCall::AddEmptyNode,
        MockCall::UpdateCaptureDependencies,
        MockCall::Granularity,
        MockCall::Reserve,
        MockCall::Unreserve,
        MockCall::CreatePhysical,
        MockCall::ReleasePhysical,
        MockCall::Map,
        MockCall::Unmap,
        MockCall::SetAccess,
    ];

    /// The virtual-memory calls (`VirtualMemory`), in declaration order.
    pub const VIRTUAL_MEMORY: [MockCall; 8] = [
        MockCall::Granularity,
        MockCall::Reserve,
        MockCall::Unreserve,
        MockCall::CreatePhysical,
        MockCall::ReleasePhysical,
        MockCall::Map,
        MockCall::Unmap,
        MockCall::SetAccess,
    ];

    /// The number of call kinds.
    pub const COUNT: usize = Self::ALL.len();

    /// The position of the kind in [`MockCall::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The method's name, as it appears in [`cachalot_core::BackendError::call`]
    /// of the errors the mock returns.
    pub fn name(self) -> &'static str {
        match self {
            MockCall::Malloc => "malloc",
            MockCall::Free => "free",
            MockCall::MemoryInfo => "memory_info",
            MockCall::CreateEvent => "create_event",
            MockCall::DestroyEvent => "destroy_event",
            MockCall::RecordEvent => "record_event",
            MockCall::QueryEvent => "query_event",
            MockCall::QueryStream => "query_stream",
            MockCall::SynchronizeEvent => "synchronize_event",
            MockCall::StreamWaitEvent => "stream_wait_event",
            MockCall::SynchronizeDevice => "synchronize_device",
            MockCall::CaptureState => "capture_state",
            MockCall::ExtendNodeDependencies => "extend_node_dependencies",
            MockCall::MarkAncestors => "mark_ancestors",
            MockCall::AddEmptyNode => "add_empty_node",
            MockCall::UpdateCaptureDependencies => "update_capture_dependencies",
            MockCall::Granularity => "granularity",
            MockCall::Reserve => "reserve",
            MockCall::Unreserve => "unreserve",
            MockCall::CreatePhysical => "create_physical",
            MockCall::ReleasePhysical => "release_physical",
            MockCall::Map => "map",
            MockCall::Unmap => "unmap",
            MockCall::SetAccess => "set_access",
        }
    }
}

impl fmt::Display for MockCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an injected failure fails.
///
/// * [`Failure::Backend`]: the call returns a
///   [`cachalot_core::BackendError`] with this code (`malloc`, `reserve`,
///   `create_physical`: `DeviceAllocError::Backend`). [`codes::INJECTED`] is the usual code.
/// * [`Failure::OutOfMemory`]: `malloc`, `reserve` and `create_physical`
///   return `DeviceAllocError::OutOfMemory`; any other call returns a
///   `BackendError` with code [`codes::MEMORY_ALLOCATION`] (a driver out of
///   memory inside e.g. `cudaEventCreate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// Out of memory (see the type's documentation).
    OutOfMemory,
    /// A `BackendError` with this code.
    Backend(i64),
}

impl Failure {
    /// `Failure::Backend(codes::INJECTED)`, what [`crate::MockBackend::fail_call_at`] injects.
    pub const INJECTED: Failure = Failure::Backend(codes::INJECTED);
}

/// The former name of [`Failure`] (from when only `malloc` could be made to
/// fail the chosen way).
pub type MallocFailure = Failure;

/// When submitted work (`launch`, `use_memory`, `launch_graph` outside
/// capture) completes. Whatever the mode, the test can complete work at any
/// time ([`crate::MockBackend::complete`], ...), host synchronisation
/// (`synchronize_event`, `synchronize_device`,
/// [`crate::MockBackend::synchronize_stream`]) completes what it waits for,
/// and completing work also completes the work it waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Completion {
    /// Work completes only when the test says so or the host synchronises.
    #[default]
    Manual,
    /// Work completes as soon as it is submitted (trace replays).
    Immediate,
    /// Late completion, deterministic from `seed`: the mock keeps an
    /// operation clock that advances by one at every call of a `Backend` or
    /// `GraphCapture` entry point (each [`MockCall`], failed calls included)
    /// and at every submission. A unit of work submitted at clock `t` draws
    /// a delay `d` in `0..=max_delay_ops` and completes at clock `t + 1 + d`
    /// — at the start of that operation, before it looks at anything — or
    /// later, since the work of one stream completes in order (a unit never
    /// completes before the one submitted before it on its stream). So no
    /// work ever completes while it is being submitted, and an event
    /// recorded after it may be found incomplete by the next
    /// `max_delay_ops + 1` operations. The same calls from the same seed
    /// complete the same work at the same points.
    Random {
        /// Seed of the delays.
        seed: u64,
        /// Largest extra delay, in operations.
        max_delay_ops: u32,
    },
}

/// How strictly the mock polices host calls while a capture is underway
/// (CUDA's `cudaStreamCaptureMode` of the capturing thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// CUDA's default: while any capture is active, `query_event`,
    /// `query_stream` and `synchronize_event` (on any event or stream) fail
    /// and invalidate every active capture. This is why PyTorch skips event
    /// processing during capture.
    #[default]
    Global,
    /// Only operations on events recorded inside a capture, and queries or
    /// synchronisation of capturing streams (or the device), are illegal.
    Relaxed,
}

/// Number of calls of each backend entry point (failed calls included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MockCounters {
    /// `malloc` calls.
    pub malloc: u64,
    /// `malloc` calls that failed (any reason).
    pub malloc_failed: u64,
    /// `malloc` calls made while a capture was underway.
    pub malloc_during_capture: u64,
    /// `free` calls.
    pub free: u64,
    /// `free` calls that failed.
    pub free_failed: u64,
    /// `free` calls made while a capture was underway.
    pub free_during_capture: u64,
    /// `memory_info` calls.
    pub memory_info: u64,
    /// `create_event` calls.
    pub create_event: u64,
    /// `create_event` calls that failed.
    pub create_event_failed: u64,
    /// `destroy_event` calls.
    pub destroy_event: u64,
    /// `record_event` calls.
    pub record_event: u64,
    /// `query_event` calls.
    pub query_event: u64,
    /// `query_stream` calls.
    pub query_stream: u64,
    /// `synchronize_event` calls.
    pub synchronize_event: u64,
    /// `stream_wait_event` calls.
    pub stream_wait_event: u64,
    /// `synchronize_device` calls.
    pub synchronize_device: u64,
    /// `capture_info` calls.
    pub capture_info: u64,
    /// `node_dependencies` calls.
    pub node_dependencies: u64,
    /// `add_empty_node` calls.
    pub add_empty_node: u64,
    /// `update_capture_dependencies` calls.
    pub update_capture_dependencies: u64,
    /// `begin_capture` calls.
    pub begin_capture: u64,
    /// `end_capture` calls.
    pub end_capture: u64,
    /// Submissions (`launch`, `use_memory`, `launch_graph`).
    pub launches: u64,
    /// Calls (of any kind above) that returned an error.
    pub errors: u64,
    /// Calls that returned an injected failure (counted in `errors` and the
    /// `*_failed` counters too).
    pub injected: u64,
    /// Captures invalidated (by misuse or `invalidate_capture`).
    pub captures_invalidated: u64,
    /// `VirtualMemory::unmap` calls refused because work touching the
    /// mapping had not completed (the caller did not wait for it: on a real
    /// GPU, pages pulled from under running work).
    pub unmap_refused: u64,
    /// `VirtualMemory::granularity` calls.
    pub granularity: u64,
    /// `VirtualMemory::reserve` calls.
    pub reserve: u64,
    /// `reserve` calls that failed (any reason).
    pub reserve_failed: u64,
    /// `VirtualMemory::unreserve` calls.
    pub unreserve: u64,
    /// `VirtualMemory::create_physical` calls.
    pub create_physical: u64,
    /// `create_physical` calls that failed (any reason).
    pub create_physical_failed: u64,
    /// `VirtualMemory::release_physical` calls.
    pub release_physical: u64,
    /// `VirtualMemory::map` calls.
    pub map: u64,
    /// `VirtualMemory::unmap` calls.
    pub unmap: u64,
    /// `VirtualMemory::set_access` calls.
    pub set_access: u64,
    /// Eager uses of reserved memory that touched a page not mapped, or
    /// mapped without access ([`crate::MockBackend::invalid_accesses`]).
    pub invalid_accesses: u64,
}

/// Error codes the mock puts in [`cachalot_core::BackendError::code`]; the
/// values are CUDA's `cudaError_t` values for the same conditions.
pub mod codes {
    /// Invalid argument (`cudaErrorInvalidValue`).
    pub const INVALID_VALUE: i64 = 1;
    /// Out of memory (`cudaErrorMemoryAllocation`); only in messages, OOM is
    /// reported as `DeviceAllocError::OutOfMemory`.
    pub const MEMORY_ALLOCATION: i64 = 2;
    /// Pointer not allocated by this device, or an address range not inside
    /// one reservation (`cudaErrorInvalidDevicePointer`).
    pub const INVALID_DEVICE_POINTER: i64 = 17;
    /// `set_access` for a device other than the mock's (`cudaErrorInvalidDevice`).
    pub const INVALID_DEVICE: i64 = 101;
    /// An interprocess handle of this very process (CUDA's
    /// `CUDA_ERROR_INVALID_CONTEXT` for `cuIpcOpenMemHandle`).
    pub const INVALID_CONTEXT: i64 = 201;
    /// `map` over pages already mapped (`cudaErrorAlreadyMapped`).
    pub const ALREADY_MAPPED: i64 = 208;
    /// `unmap`, `set_access` or `read_tags` over pages not mapped
    /// (`cudaErrorNotMapped`).
    pub const NOT_MAPPED: i64 = 211;
    /// `unmap` of pages that work not yet complete touches (`cudaErrorNotReady`).
    pub const NOT_READY: i64 = 600;
    /// A virtual-memory call on a mock configured without virtual memory
    /// (`cudaErrorNotSupported`).
    pub const NOT_SUPPORTED: i64 = 801;
    /// Unknown or destroyed stream or event (`cudaErrorInvalidResourceHandle`).
    pub const INVALID_RESOURCE_HANDLE: i64 = 400;
    /// Call illegal in the stream's state; also `unreserve` of a range with
    /// pages still mapped and `release_physical` of memory still mapped
    /// (`cudaErrorIllegalState`).
    pub const ILLEGAL_STATE: i64 = 401;
    /// Operation not permitted while capturing (`cudaErrorStreamCaptureUnsupported`).
    pub const STREAM_CAPTURE_UNSUPPORTED: i64 = 900;
    /// The capture was invalidated (`cudaErrorStreamCaptureInvalidated`).
    pub const STREAM_CAPTURE_INVALIDATED: i64 = 901;
    /// Two independent captures would merge (`cudaErrorStreamCaptureMerge`).
    pub const STREAM_CAPTURE_MERGE: i64 = 902;
    /// Capture ended on a stream that did not begin it (`cudaErrorStreamCaptureUnmatched`).
    pub const STREAM_CAPTURE_UNMATCHED: i64 = 903;
    /// A forked stream was not joined back (`cudaErrorStreamCaptureUnjoined`).
    pub const STREAM_CAPTURE_UNJOINED: i64 = 904;
    /// Dependency on uncaptured work (`cudaErrorStreamCaptureIsolation`).
    pub const STREAM_CAPTURE_ISOLATION: i64 = 905;
    /// Operation on an event recorded in a capture (`cudaErrorCapturedEvent`).
    pub const CAPTURED_EVENT: i64 = 907;
    /// A failure injected by the test (`cudaErrorUnknown`).
    pub const INJECTED: i64 = 999;
}
