//! The simulated device: its state, the `Backend` impl, and (in the
//! submodules) memory, work, events, capture, the race checker and the
//! test controls.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use cachalot_core::rng::SplitMix64;
use cachalot_core::{
    Backend, BackendError, CaptureStatus, DependencyUpdate, DeviceAllocError, DeviceIndex,
    GraphCapture, MemoryInfo, VirtualMemory,
};
use parking_lot::Mutex;

use crate::config::MockConfig;
use crate::data::TagMap;
use crate::graph::{GraphData, GraphNode, MockGraph, MockNode, NodeKind};
use crate::shadow::{Access, PieceMap, Who};
use crate::space::{AddressSpace, Placement};
use crate::types::{
    CaptureMode, Completion, Failure, InvalidAccess, InvalidAccessKind, MallocFailure, MemUse,
    MockCall, MockCounters, MockEvent, MockStream, Race, Submitted, UseSite, codes,
};
use crate::vmm::{Mapping, MockMapping, MockPhysical, Phys, Vmm, VmmUsage};

mod capture;
mod controls;
mod events;
mod memory;
mod races;
mod work;

use races::{check_capture_use, check_physical_use, make_race};

const NAME: &str = "mock";

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

fn err(call: &'static str, code: i64, message: impl Into<String>) -> BackendError {
    BackendError::new(NAME, call, code, message)
}

/// The initial generator state of a completion mode.
fn seed_of(c: Completion) -> u64 {
    match c {
        Completion::Random { seed, .. } => seed,
        _ => 0,
    }
}

fn push_unique(v: &mut Vec<u32>, items: impl IntoIterator<Item = u32>) {
    for x in items {
        if !v.contains(&x) {
            v.push(x);
        }
    }
}

#[derive(Debug, Default)]
struct StreamState {
    submitted: u64,
    completed: u64,
    /// For every other stream, the last work position ordered before the
    /// next work submitted here.
    clock: Vec<u64>,
    /// `(first position, clock)` of each run of work with the same clock.
    epochs: VecDeque<(u64, Vec<u64>)>,
    capture: Option<u64>,
    terminals: Vec<u32>,
    /// `(position, due clock)` of work that completes late
    /// ([`Completion::Random`]), due clocks non-decreasing.
    due: VecDeque<(u64, u64)>,
}

#[derive(Clone, Debug)]
enum EventRecord {
    Never,
    Work {
        stream: usize,
        pos: u64,
        clock: Vec<u64>,
    },
    Captured {
        capture: u64,
        nodes: Vec<u32>,
    },
}

#[derive(Debug)]
struct CaptureState {
    origin: usize,
    status: CaptureStatus,
    reason: Option<String>,
    nodes: Vec<GraphNode>,
    members: BTreeSet<usize>,
    shadow: PieceMap,
}

struct State {
    instance: u64,
    placement: Placement,
    completion: Completion,
    /// State of the delay generator of [`Completion::Random`].
    rng: SplitMix64,
    /// The operation clock (see [`Completion::Random`]).
    now: u64,
    /// Smallest due clock of late work (`u64::MAX` when none).
    next_due: u64,
    capture_mode: CaptureMode,
    race_checking: bool,
    capacity: u64,
    external: u64,
    live: u64,
    space: AddressSpace,
    segments: BTreeMap<u64, u64>,
    streams: Vec<StreamState>,
    events: HashMap<u64, EventRecord>,
    next_event: u64,
    captures: BTreeMap<u64, CaptureState>,
    next_capture: u64,
    graphs: HashMap<u64, Weak<GraphData>>,
    shadow: PieceMap,
    shadow_inserts: usize,
    next_use: u64,
    races: Vec<Race>,
    counters: MockCounters,
    /// Calls of each [`MockCall`] so far.
    calls: [u64; MockCall::COUNT],
    /// One-shot injected failures of each call kind, by call number.
    failures: [BTreeMap<u64, Failure>; MockCall::COUNT],
    /// Failures injected into every call of a kind.
    always: [Option<Failure>; MockCall::COUNT],
    /// What eager work last wrote where.
    data: TagMap,
    /// The stack of `mark_ancestors`, kept between walks.
    mark_stack: Vec<u32>,
    /// `MockConfig::virtual_memory`.
    vmm_on: bool,
    /// The device index (`set_access` checks it).
    device: DeviceIndex,
    /// Reservations, physical allocations and mappings.
    vmm: Vmm,
    /// Eager uses of reserved bytes not mapped or not accessible.
    invalid: Vec<InvalidAccess>,
}

/// Where a memory use lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    /// Inside one live segment.
    Segment,
    /// Inside one reservation (mapped or not).
    Reserved,
}

impl State {
    fn new(cfg: &MockConfig) -> Self {
        let (base, size) = cfg.range();
        Self {
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            placement: cfg.placement,
            completion: cfg.completion,
            rng: SplitMix64::new(seed_of(cfg.completion)),
            now: 0,
            next_due: u64::MAX,
            capture_mode: cfg.capture_mode,
            race_checking: cfg.race_checking,
            capacity: cfg.total_memory,
            external: 0,
            live: 0,
            space: AddressSpace::new(cfg.placement, base, size),
            segments: BTreeMap::new(),
            streams: vec![StreamState::default()],
            events: HashMap::new(),
            next_event: 1,
            captures: BTreeMap::new(),
            next_capture: 1,
            graphs: HashMap::new(),
            shadow: PieceMap::default(),
            shadow_inserts: 0,
            next_use: 1,
            races: Vec::new(),
            counters: MockCounters::default(),
            calls: [0; MockCall::COUNT],
            failures: std::array::from_fn(|_| BTreeMap::new()),
            always: [None; MockCall::COUNT],
            data: TagMap::default(),
            mark_stack: Vec::new(),
            vmm_on: cfg.virtual_memory,
            device: cfg.device,
            vmm: Vmm::new(cfg.effective_granularity(), cfg.reservation_range()),
            invalid: Vec::new(),
        }
    }

    // ----- lookups -------------------------------------------------------

    fn stream_idx(&self, call: &'static str, s: MockStream) -> Result<usize, BackendError> {
        let i = s.0 as usize;
        if i < self.streams.len() {
            Ok(i)
        } else {
            Err(err(
                call,
                codes::INVALID_RESOURCE_HANDLE,
                format!("{s} was not created by this mock device"),
            ))
        }
    }

    fn event(&self, call: &'static str, e: &MockEvent) -> Result<&EventRecord, BackendError> {
        if e.instance != self.instance {
            return Err(err(
                call,
                codes::INVALID_RESOURCE_HANDLE,
                format!("event {} belongs to another mock device", e.id),
            ));
        }
        self.events.get(&e.id).ok_or_else(|| {
            err(
                call,
                codes::INVALID_RESOURCE_HANDLE,
                format!("event {} is unknown or was destroyed", e.id),
            )
        })
    }

    fn any_capture_active(&self) -> bool {
        self.captures
            .values()
            .any(|c| c.status == CaptureStatus::Active)
    }

    fn invalidate(&mut self, id: u64, reason: impl Into<String>) {
        if let Some(c) = self.captures.get_mut(&id)
            && c.status == CaptureStatus::Active
        {
            c.status = CaptureStatus::Invalidated;
            c.reason = Some(reason.into());
            self.counters.captures_invalidated += 1;
        }
    }

    fn invalidate_all(&mut self, reason: &str) {
        let ids: Vec<u64> = self.captures.keys().copied().collect();
        for id in ids {
            self.invalidate(id, reason);
        }
    }

    /// `Ok(None)` outside capture, `Ok(Some(id))` in an active capture, an
    /// error when the stream's capture was invalidated.
    fn active_capture(&self, call: &'static str, i: usize) -> Result<Option<u64>, BackendError> {
        let Some(id) = self.streams[i].capture else {
            return Ok(None);
        };
        match self.captures.get(&id) {
            Some(c) if c.status == CaptureStatus::Active => Ok(Some(id)),
            Some(c) => Err(err(
                call,
                codes::STREAM_CAPTURE_INVALIDATED,
                format!(
                    "capture {id} of stream{i} was invalidated: {}",
                    c.reason.as_deref().unwrap_or("unknown reason")
                ),
            )),
            None => Ok(None),
        }
    }

    fn check_nodes(
        &self,
        call: &'static str,
        id: u64,
        nodes: &[MockNode],
    ) -> Result<Vec<u32>, BackendError> {
        let n = self.captures.get(&id).map_or(0, |c| c.nodes.len());
        let mut out = Vec::with_capacity(nodes.len());
        for node in nodes {
            if node.capture != id || node.index as usize >= n {
                return Err(err(
                    call,
                    codes::INVALID_VALUE,
                    format!("{node:?} is not a node of the graph of capture {id}"),
                ));
            }
            push_unique(&mut out, [node.index]);
        }
        Ok(out)
    }

    fn in_segment(&self, lo: u64, hi: u64) -> bool {
        matches!(self.segments.range(..=lo).next_back(), Some((&s, &sz)) if hi <= s + sz)
    }

    /// Checks that a use lies inside one live segment or one reservation.
    fn check_use(&self, call: &'static str, u: &MemUse) -> Result<Region, BackendError> {
        let Some(end) = u.addr.checked_add(u.len).filter(|_| u.len > 0) else {
            return Err(err(
                call,
                codes::INVALID_VALUE,
                format!("invalid memory use of {} bytes at {:#x}", u.len, u.addr),
            ));
        };
        if self.in_segment(u.addr, end) {
            Ok(Region::Segment)
        } else if self.vmm.reservation_of(u.addr, end).is_some() {
            Ok(Region::Reserved)
        } else {
            Err(err(
                call,
                codes::INVALID_DEVICE_POINTER,
                format!(
                    "memory use [{:#x}, {end:#x}) (tag {}) is not inside a live segment or a \
                     reservation",
                    u.addr, u.tag
                ),
            ))
        }
    }

    /// What a checked use reads (see `MockBackend::read_tags`).
    fn read_data(
        &self,
        call: &'static str,
        u: &MemUse,
    ) -> Result<Vec<(u64, u64, Option<u64>)>, BackendError> {
        let (lo, hi) = (u.addr, u.addr + u.len);
        if self.check_use(call, u)? == Region::Segment {
            return Ok(self.data.read(lo, hi));
        }
        let mut out: Vec<(u64, u64, Option<u64>)> = Vec::new();
        for p in self.vmm.pieces(lo, hi) {
            let Some(start) = p.mapping else {
                return Err(err(
                    call,
                    codes::NOT_MAPPED,
                    format!("[{:#x}, {:#x}) is not mapped", p.lo, p.hi),
                ));
            };
            let (id, off) = self.vmm.translate(start, p.lo);
            let base = p.lo - off;
            let runs = self.vmm.physical[&id].data.read(off, off + (p.hi - p.lo));
            for (a, b, t) in runs {
                // Runs of one tag that continue across pages read as one.
                match out.last_mut() {
                    Some(last) if last.1 == a + base && last.2 == t => last.1 = b + base,
                    _ => out.push((a + base, b + base, t)),
                }
            }
        }
        Ok(out)
    }

    /// An eager use of reserved memory by work `pos` of stream `i`: writes
    /// its tag into the physical memory mapped there, marks the mappings it
    /// touches as used by that work, and reports the bytes it cannot access.
    fn touch_reserved(&mut self, i: usize, pos: u64, u: &MemUse) {
        let (lo, hi) = (u.addr, u.addr + u.len);
        for p in self.vmm.pieces(lo, hi) {
            let kind = match p.mapping {
                None => Some(InvalidAccessKind::Unmapped),
                Some(start) => {
                    let Some(m) = self.vmm.mappings.get_mut(&start) else {
                        continue;
                    };
                    if m.last_use.len() <= i {
                        m.last_use.resize(i + 1, 0);
                    }
                    m.last_use[i] = pos;
                    if m.access {
                        let (id, off) = (m.phys, p.lo - start);
                        if let Some(ph) = self.vmm.physical.get_mut(&id) {
                            if self.race_checking {
                                let piece = (p.lo, p.hi);
                                check_physical_use(
                                    &self.streams,
                                    &mut ph.last_use,
                                    &mut self.races,
                                    (i, pos, start, off),
                                    piece,
                                    u.tag,
                                );
                            }
                            ph.data.write(off, off + (p.hi - p.lo), u.tag);
                        }
                        None
                    } else {
                        Some(InvalidAccessKind::NoAccess)
                    }
                }
            };
            if let Some(kind) = kind {
                self.counters.invalid_accesses += 1;
                self.invalid.push(InvalidAccess {
                    site: UseSite {
                        stream: MockStream(i as u32),
                        at: Submitted::Work {
                            stream: MockStream(i as u32),
                            seq: pos,
                        },
                        tag: u.tag,
                        addr: u.addr,
                        len: u.len,
                    },
                    range: (p.lo, p.hi),
                    kind,
                });
            }
        }
    }

    /// Bytes of device memory in use: segments, physical memory and
    /// simulated external usage.
    fn used(&self) -> u64 {
        self.live
            .saturating_add(self.vmm.physical_bytes)
            .saturating_add(self.external)
    }
}

/// A simulated device. Cheap to clone: clones share one device, so a test
/// keeps a handle while the engine owns another.
///
/// See the [crate documentation](crate) for the model.
#[derive(Clone)]
pub struct MockBackend {
    device: DeviceIndex,
    /// `MockConfig::node_numbers` (read without the lock: `node_index` is
    /// called from inside walks).
    node_numbers: bool,
    /// `MockConfig::virtual_memory` (answers `Backend::virtual_memory`).
    virtual_memory: bool,
    inner: Arc<Mutex<State>>,
    /// [`MockBackend::set_malloc_hook`] (apart from `inner`: it runs with
    /// no lock of the mock held).
    malloc_hook: Arc<Mutex<Option<MallocHook>>>,
}

/// A function run at the start of every `malloc` with its size
/// ([`MockBackend::set_malloc_hook`]).
pub type MallocHook = Arc<dyn Fn(u64) + Send + Sync>;

impl fmt::Debug for MockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("MockBackend")
            .field("device", &self.device)
            .field("placement", &st.placement)
            .field("capacity", &st.capacity)
            .field("live_bytes", &st.live)
            .field("segments", &st.segments.len())
            .field("vmm", &st.vmm.usage())
            .field("streams", &st.streams.len())
            .field("events", &st.events.len())
            .field("captures_underway", &st.captures.len())
            .field("races", &st.races.len())
            .finish()
    }
}

impl MockBackend {
    /// A device of `capacity_bytes` with the defaults of [`MockConfig::new`].
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_config(MockConfig::new(capacity_bytes))
    }

    /// A device built from `config`.
    pub fn with_config(config: MockConfig) -> Self {
        Self {
            device: config.device,
            node_numbers: config.node_numbers,
            virtual_memory: config.virtual_memory,
            inner: Arc::new(Mutex::new(State::new(&config))),
            malloc_hook: Arc::new(Mutex::new(None)),
        }
    }

    /// Sets (or with `None` removes) a function that runs at the start of
    /// every `malloc` call, with its size, before the call is counted or
    /// can fail, and with no lock of the mock held: a test blocks it to
    /// hold a device allocation in flight (as a slow `cudaMalloc`), or
    /// looks at the device from it.
    pub fn set_malloc_hook(&self, hook: Option<MallocHook>) {
        *self.malloc_hook.lock() = hook;
    }

    /// Runs `f` under the lock, counting an error if it fails.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut st = self.inner.lock();
        let r = f(&mut st);
        if r.is_err() {
            st.counters.errors += 1;
        }
        r
    }

    /// Runs one call of the `Backend`/`GraphCapture` entry point `call`:
    /// advances the clock, counts it, fails it if a failure was injected,
    /// else runs `f`; counts a failure either way.
    fn call<T>(
        &self,
        call: MockCall,
        f: impl FnOnce(&mut State) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut st = self.inner.lock();
        let r = match st.enter(call) {
            Some(failure) => Err(st.injected_error(call, failure)),
            None => f(&mut st),
        };
        if r.is_err() {
            st.failed(call);
        }
        r
    }

    /// Like [`Self::call`] for an entry point that allocates (`malloc`,
    /// `reserve`, `create_physical`): an injected [`Failure::OutOfMemory`]
    /// is `DeviceAllocError::OutOfMemory`.
    fn alloc_call<T>(
        &self,
        call: MockCall,
        f: impl FnOnce(&mut State) -> Result<T, DeviceAllocError>,
    ) -> Result<T, DeviceAllocError> {
        let mut st = self.inner.lock();
        let r = match st.enter(call) {
            Some(Failure::OutOfMemory) => Err(DeviceAllocError::OutOfMemory),
            Some(f) => Err(DeviceAllocError::Backend(st.injected_error(call, f))),
            None => f(&mut st),
        };
        if r.is_err() {
            st.failed(call);
        }
        r
    }
}

impl Backend for MockBackend {
    type Stream = MockStream;
    type Event = MockEvent;
    type Ptr = u64;
    type Capture = Self;
    type VirtualMemory = Self;

    fn name(&self) -> &'static str {
        NAME
    }

    fn device(&self) -> DeviceIndex {
        self.device
    }

    fn default_stream(&self) -> MockStream {
        MockStream::DEFAULT
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let hook = self.malloc_hook.lock().clone();
        if let Some(hook) = hook {
            hook(size);
        }
        self.alloc_call(MockCall::Malloc, |st| st.malloc(size))
    }

    fn free(&self, ptr: u64, size: u64) -> Result<(), BackendError> {
        self.call(MockCall::Free, |st| st.free(ptr, size))
    }

    fn memory_info(&self) -> Result<MemoryInfo, BackendError> {
        self.call(MockCall::MemoryInfo, |st| {
            Ok(MemoryInfo {
                free: st.capacity.saturating_sub(st.used()),
                total: st.capacity,
            })
        })
    }

    fn create_event(&self) -> Result<MockEvent, BackendError> {
        self.call(MockCall::CreateEvent, |st| st.create_event())
    }

    fn destroy_event(&self, event: MockEvent) -> Result<(), BackendError> {
        self.call(MockCall::DestroyEvent, |st| st.destroy_event(&event))
    }

    fn record_event(&self, event: &MockEvent, stream: MockStream) -> Result<(), BackendError> {
        self.call(MockCall::RecordEvent, |st| st.record_event(event, stream))
    }

    fn query_event(&self, event: &MockEvent) -> Result<bool, BackendError> {
        self.call(MockCall::QueryEvent, |st| st.query_event(event))
    }

    fn query_stream(&self, stream: MockStream) -> Result<Option<bool>, BackendError> {
        self.call(MockCall::QueryStream, |st| {
            st.query_stream(stream).map(Some)
        })
    }

    fn synchronize_event(&self, event: &MockEvent) -> Result<(), BackendError> {
        self.call(MockCall::SynchronizeEvent, |st| st.synchronize_event(event))
    }

    fn stream_wait_event(&self, stream: MockStream, event: &MockEvent) -> Result<(), BackendError> {
        self.call(MockCall::StreamWaitEvent, |st| {
            st.stream_wait_event(stream, event)
        })
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.call(MockCall::SynchronizeDevice, |st| st.synchronize_device())
    }

    fn capture(&self) -> Option<&Self> {
        Some(self)
    }

    fn virtual_memory(&self) -> Option<&Self> {
        self.virtual_memory.then_some(self)
    }

    fn ipc(&self) -> Option<&dyn cachalot_core::IpcMemory> {
        Some(self)
    }
}

impl MockBackend {
    /// The device's instance number (unique in the process).
    pub(crate) fn instance(&self) -> u64 {
        self.inner.lock().instance
    }

    /// The size of the segment `malloc` returned at `base`, if live.
    pub(crate) fn segment_size(&self, base: u64) -> Option<u64> {
        self.inner.lock().segments.get(&base).copied()
    }
}
