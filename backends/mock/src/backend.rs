//! The simulated device: state, test controls and the `Backend` impl.

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

    // ----- memory --------------------------------------------------------

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceAllocError> {
        if size == 0 || !size.is_multiple_of(512) {
            return Err(DeviceAllocError::Backend(err(
                "malloc",
                codes::INVALID_VALUE,
                format!("size {size} is not a positive multiple of 512 bytes"),
            )));
        }
        if size > self.capacity.saturating_sub(self.used()) {
            return Err(DeviceAllocError::OutOfMemory);
        }
        let addr = self
            .space
            .allocate(size)
            .ok_or(DeviceAllocError::OutOfMemory)?;
        self.segments.insert(addr, size);
        self.live += size;
        Ok(addr)
    }

    fn free(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        match self.segments.get(&addr) {
            None => {
                let inside = self
                    .segments
                    .range(..addr)
                    .next_back()
                    .is_some_and(|(&s, &sz)| addr < s + sz);
                let what = if inside {
                    "points inside a segment, not at its start"
                } else {
                    "was not allocated by this mock device (or was already freed)"
                };
                return Err(err(
                    "free",
                    codes::INVALID_DEVICE_POINTER,
                    format!("pointer {addr:#x} {what}"),
                ));
            }
            Some(&sz) if sz != size => {
                return Err(err(
                    "free",
                    codes::INVALID_VALUE,
                    format!("segment {addr:#x} has {sz} bytes but was freed with size {size}"),
                ));
            }
            Some(_) => {}
        }
        crate::ipc::forget("free", self.instance, (false, addr))?;
        self.segments.remove(&addr);
        self.live -= size;
        self.space.release(addr, size);
        // cudaFree synchronises implicitly: uses of the old segment are over.
        self.shadow.remove_range(addr, addr + size);
        self.data.clear(addr, addr + size);
        Ok(())
    }

    // ----- virtual memory --------------------------------------------------

    fn vmm_enabled(&self, call: &'static str) -> Result<(), BackendError> {
        if self.vmm_on {
            Ok(())
        } else {
            Err(err(
                call,
                codes::NOT_SUPPORTED,
                "this mock device is configured without virtual memory",
            ))
        }
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceAllocError> {
        const CALL: &str = "reserve";
        self.vmm_enabled(CALL)?;
        self.vmm.check_size(CALL, size)?;
        let addr = self.vmm.place(size).ok_or(DeviceAllocError::OutOfMemory)?;
        self.vmm.reservations.insert(addr, size);
        Ok(addr)
    }

    fn unreserve(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        const CALL: &str = "unreserve";
        self.vmm_enabled(CALL)?;
        match self.vmm.reservations.get(&addr) {
            None => {
                return Err(err(
                    CALL,
                    codes::INVALID_DEVICE_POINTER,
                    format!("{addr:#x} is not the start of a reservation of this mock device"),
                ));
            }
            Some(&sz) if sz != size => {
                return Err(err(
                    CALL,
                    codes::INVALID_VALUE,
                    format!("reservation {addr:#x} has {sz} bytes but was unreserved with {size}"),
                ));
            }
            Some(_) => {}
        }
        let end = addr + size;
        if let Some((&s, m)) = self.vmm.mappings.range(addr..end).next() {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!(
                    "reservation [{addr:#x}, {end:#x}) still has [{s:#x}, {:#x}) mapped",
                    s + m.size
                ),
            ));
        }
        self.vmm.reservations.remove(&addr);
        Ok(())
    }

    fn create_physical(&mut self, size: u64) -> Result<MockPhysical, DeviceAllocError> {
        const CALL: &str = "create_physical";
        self.vmm_enabled(CALL)?;
        self.vmm.check_size(CALL, size)?;
        if size > self.capacity.saturating_sub(self.used()) {
            return Err(DeviceAllocError::OutOfMemory);
        }
        let id = self.vmm.next_physical;
        self.vmm.next_physical += 1;
        self.vmm.physical.insert(
            id,
            Phys {
                size,
                maps: 0,
                data: TagMap::default(),
                last_use: Vec::new(),
            },
        );
        self.vmm.physical_bytes += size;
        Ok(MockPhysical {
            instance: self.instance,
            id,
            size,
        })
    }

    fn release_physical(&mut self, p: &MockPhysical) -> Result<(), BackendError> {
        const CALL: &str = "release_physical";
        self.vmm_enabled(CALL)?;
        let ph = self.vmm.phys(CALL, self.instance, p)?;
        if ph.maps > 0 {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!(
                    "physical allocation {} is still mapped ({} mapping(s)); unmap it first",
                    p.id, ph.maps
                ),
            ));
        }
        let size = ph.size;
        crate::ipc::forget(CALL, self.instance, (true, p.id))?;
        self.vmm.physical.remove(&p.id);
        self.vmm.physical_bytes -= size;
        Ok(())
    }

    fn map(&mut self, addr: u64, size: u64, p: &MockPhysical) -> Result<(), BackendError> {
        const CALL: &str = "map";
        self.vmm_enabled(CALL)?;
        let ph = self.vmm.phys(CALL, self.instance, p)?;
        if ph.size != size {
            return Err(err(
                CALL,
                codes::INVALID_VALUE,
                format!(
                    "physical allocation {} has {} bytes but was mapped with size {size}",
                    p.id, ph.size
                ),
            ));
        }
        let end = self.vmm.aligned(CALL, addr, size)?;
        self.vmm.reserved(CALL, addr, end)?;
        if let Some(q) = self
            .vmm
            .pieces(addr, end)
            .iter()
            .find(|q| q.mapping.is_some())
        {
            return Err(err(
                CALL,
                codes::ALREADY_MAPPED,
                format!("[{:#x}, {:#x}) is already mapped", q.lo, q.hi),
            ));
        }
        self.vmm.mappings.insert(
            addr,
            Mapping {
                size,
                phys: p.id,
                access: false,
                last_use: Vec::new(),
            },
        );
        if let Some(ph) = self.vmm.physical.get_mut(&p.id) {
            ph.maps += 1;
        }
        Ok(())
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        const CALL: &str = "unmap";
        self.vmm_enabled(CALL)?;
        let starts = self.vmm.whole_mappings(CALL, addr, size)?;
        if starts.len() > 1 {
            return Err(err(
                CALL,
                codes::INVALID_VALUE,
                format!(
                    "[{addr:#x}, {:#x}) spans {} mappings; unmap one mapping per call \
                     (cuMemUnmap takes the whole range of one mapping)",
                    addr + size,
                    starts.len()
                ),
            ));
        }
        for &s in &starts {
            let m = &self.vmm.mappings[&s];
            let pending = m
                .last_use
                .iter()
                .enumerate()
                .find(|&(j, &pos)| self.streams.get(j).is_some_and(|st| pos > st.completed));
            if let Some((j, &pos)) = pending {
                self.counters.unmap_refused += 1;
                return Err(err(
                    CALL,
                    codes::NOT_READY,
                    format!(
                        "work #{pos} on stream{j}, not yet complete, touches the mapping \
                         [{s:#x}, {:#x}); synchronize before unmapping",
                        s + m.size
                    ),
                ));
            }
        }
        for s in starts {
            if let Some(m) = self.vmm.mappings.remove(&s)
                && let Some(ph) = self.vmm.physical.get_mut(&m.phys)
            {
                ph.maps -= 1;
            }
        }
        // Every use of the range has completed (checked above).
        self.shadow.remove_range(addr, addr + size);
        Ok(())
    }

    fn set_access(
        &mut self,
        addr: u64,
        size: u64,
        device: DeviceIndex,
    ) -> Result<(), BackendError> {
        const CALL: &str = "set_access";
        self.vmm_enabled(CALL)?;
        if device != self.device {
            return Err(err(
                CALL,
                codes::INVALID_DEVICE,
                format!(
                    "device {device} is not this mock device ({}); the mock has no peers",
                    self.device
                ),
            ));
        }
        for s in self.vmm.whole_mappings(CALL, addr, size)? {
            if let Some(m) = self.vmm.mappings.get_mut(&s) {
                m.access = true;
            }
        }
        Ok(())
    }

    // ----- work and completion ------------------------------------------

    /// Completes stream `s` up to position `p` and, first, everything that
    /// work depends on (cascading through stream waits).
    fn complete_to(&mut self, s: usize, p: u64) {
        let mut todo = vec![(s, p)];
        while let Some((s, p)) = todo.pop() {
            let Some(st) = self.streams.get_mut(s) else {
                continue;
            };
            let p = p.min(st.submitted);
            if st.completed >= p {
                continue;
            }
            if let Some((_, clock)) = st.epochs.iter().rev().find(|(f, _)| *f <= p) {
                for (j, &q) in clock.iter().enumerate() {
                    if j != s && q > 0 {
                        todo.push((j, q));
                    }
                }
            }
            st.completed = p;
            while st.epochs.len() > 1 && st.epochs[1].0 <= st.completed + 1 {
                st.epochs.pop_front();
            }
        }
    }

    /// Advances the operation clock by one and completes the late work that
    /// is due ([`Completion::Random`]).
    fn tick(&mut self) {
        self.now += 1;
        if self.now >= self.next_due {
            self.complete_due();
        }
    }

    fn complete_due(&mut self) {
        let now = self.now;
        let mut next = u64::MAX;
        for i in 0..self.streams.len() {
            let st = &mut self.streams[i];
            let mut upto = 0;
            while let Some(&(pos, due)) = st.due.front() {
                if pos > st.completed && due > now {
                    break;
                }
                if pos > st.completed {
                    upto = pos;
                }
                st.due.pop_front();
            }
            if upto > 0 {
                self.complete_to(i, upto);
            }
            if let Some(&(_, due)) = self.streams[i].due.front() {
                next = next.min(due);
            }
        }
        self.next_due = next;
    }

    /// Sets the completion mode; pending late work stays pending.
    fn set_completion(&mut self, completion: Completion) {
        self.completion = completion;
        self.rng = SplitMix64::new(seed_of(completion));
        for st in &mut self.streams {
            st.due.clear();
        }
        self.next_due = u64::MAX;
        if completion == Completion::Immediate {
            self.complete_all();
        }
    }

    // ----- calls and injected failures ------------------------------------

    /// Counts one call of `call` (clock, per-kind and [`MockCounters`]) and
    /// returns the failure to inject into it, if any.
    fn enter(&mut self, call: MockCall) -> Option<Failure> {
        self.tick();
        let c = &mut self.counters;
        let capturing = !self.captures.is_empty();
        match call {
            MockCall::Malloc => {
                c.malloc += 1;
                c.malloc_during_capture += u64::from(capturing);
            }
            MockCall::Free => {
                c.free += 1;
                c.free_during_capture += u64::from(capturing);
            }
            MockCall::MemoryInfo => c.memory_info += 1,
            MockCall::CreateEvent => c.create_event += 1,
            MockCall::DestroyEvent => c.destroy_event += 1,
            MockCall::RecordEvent => c.record_event += 1,
            MockCall::QueryEvent => c.query_event += 1,
            MockCall::QueryStream => c.query_stream += 1,
            MockCall::SynchronizeEvent => c.synchronize_event += 1,
            MockCall::StreamWaitEvent => c.stream_wait_event += 1,
            MockCall::SynchronizeDevice => c.synchronize_device += 1,
            MockCall::CaptureState => c.capture_info += 1,
            MockCall::ExtendNodeDependencies => c.node_dependencies += 1,
            MockCall::MarkAncestors => {}
            MockCall::AddEmptyNode => c.add_empty_node += 1,
            MockCall::UpdateCaptureDependencies => c.update_capture_dependencies += 1,
            MockCall::Granularity => c.granularity += 1,
            MockCall::Reserve => c.reserve += 1,
            MockCall::Unreserve => c.unreserve += 1,
            MockCall::CreatePhysical => c.create_physical += 1,
            MockCall::ReleasePhysical => c.release_physical += 1,
            MockCall::Map => c.map += 1,
            MockCall::Unmap => c.unmap += 1,
            MockCall::SetAccess => c.set_access += 1,
        }
        let k = call.index();
        self.calls[k] += 1;
        let f = self.failures[k].remove(&self.calls[k]).or(self.always[k]);
        if f.is_some() {
            self.counters.injected += 1;
        }
        f
    }

    /// Counts a failed call of `call` (any reason).
    fn failed(&mut self, call: MockCall) {
        let c = &mut self.counters;
        c.errors += 1;
        match call {
            MockCall::Malloc => c.malloc_failed += 1,
            MockCall::Free => c.free_failed += 1,
            MockCall::CreateEvent => c.create_event_failed += 1,
            MockCall::Reserve => c.reserve_failed += 1,
            MockCall::CreatePhysical => c.create_physical_failed += 1,
            _ => {}
        }
    }

    /// The error an injected `failure` of the current `call` returns.
    fn injected_error(&self, call: MockCall, failure: Failure) -> BackendError {
        let code = match failure {
            Failure::Backend(code) => code,
            Failure::OutOfMemory => codes::MEMORY_ALLOCATION,
        };
        err(
            call.name(),
            code,
            format!(
                "injected failure of {call} call #{}",
                self.calls[call.index()]
            ),
        )
    }

    fn complete_all(&mut self) {
        for i in 0..self.streams.len() {
            let p = self.streams[i].submitted;
            self.complete_to(i, p);
        }
    }

    fn submit(
        &mut self,
        call: &'static str,
        i: usize,
        kind: NodeKind,
        uses: Vec<MemUse>,
    ) -> Result<Submitted, BackendError> {
        self.tick();
        self.counters.launches += 1;
        for u in &uses {
            self.check_use(call, u)?;
        }
        match self.active_capture(call, i)? {
            Some(id) => Ok(self.add_node(id, i, kind, uses)),
            None => Ok(self.submit_eager(i, &uses)),
        }
    }

    fn submit_eager(&mut self, i: usize, uses: &[MemUse]) -> Submitted {
        let st = &mut self.streams[i];
        st.submitted += 1;
        let pos = st.submitted;
        if self.race_checking {
            for u in uses {
                self.check_eager_use(i, pos, u);
            }
        }
        for u in uses {
            if self.in_segment(u.addr, u.addr + u.len) {
                self.data.write(u.addr, u.addr + u.len, u.tag);
            } else {
                self.touch_reserved(i, pos, u);
            }
        }
        match self.completion {
            Completion::Immediate => self.complete_to(i, pos),
            Completion::Manual => {}
            Completion::Random { max_delay_ops, .. } => {
                let d = self.rng.next_u64() % (u64::from(max_delay_ops) + 1);
                let st = &mut self.streams[i];
                let due = st
                    .due
                    .back()
                    .map_or(0, |&(_, last)| last)
                    .max(self.now + 1 + d);
                st.due.push_back((pos, due));
                self.next_due = self.next_due.min(due);
            }
        }
        Submitted::Work {
            stream: MockStream(i as u32),
            seq: pos,
        }
    }

    fn check_eager_use(&mut self, b: usize, pos: u64, u: &MemUse) {
        let id = self.next_use;
        self.next_use += 1;
        let store = self.completion != Completion::Immediate;
        let new = Access {
            who: Who::Work {
                stream: b as u32,
                pos,
            },
            stream: b as u32,
            tag: u.tag,
            addr: u.addr,
            len: u.len,
            id,
        };
        let State {
            streams,
            shadow,
            races,
            ..
        } = self;
        let clock = &streams[b].clock;
        let mut reported: Vec<u64> = Vec::new();
        shadow.visit_insert(u.addr, u.addr + u.len, new, store, |x| {
            let Who::Work { stream: a, pos: pa } = x.who else {
                return true;
            };
            let a = a as usize;
            if streams.get(a).is_some_and(|s| s.completed >= pa) {
                return false;
            }
            let ordered = a == b || clock.get(a).copied().unwrap_or(0) >= pa;
            if ordered {
                // A later use with the same tag subsumes an ordered earlier one.
                return x.tag != u.tag;
            }
            if x.tag != u.tag && !reported.contains(&x.id) {
                reported.push(x.id);
                races.push(make_race(x, &new, None));
            }
            true
        });
        if store {
            self.shadow_inserts += 1;
            if self.shadow_inserts > 4096.max(2 * self.shadow.len()) {
                self.sweep();
            }
        }
    }

    fn sweep(&mut self) {
        self.shadow_inserts = 0;
        let streams = &self.streams;
        self.shadow.sweep(|x| match x.who {
            Who::Work { stream, pos } => streams
                .get(stream as usize)
                .is_some_and(|s| s.completed < pos),
            Who::Node(_) => false,
        });
    }

    fn add_node(&mut self, id: u64, i: usize, kind: NodeKind, uses: Vec<MemUse>) -> Submitted {
        let deps = std::mem::take(&mut self.streams[i].terminals);
        let Some(cap) = self.captures.get_mut(&id) else {
            return Submitted::Node(MockNode {
                capture: id,
                index: 0,
            });
        };
        let idx = cap.nodes.len() as u32;
        cap.nodes.push(GraphNode {
            kind,
            stream: Some(i as u32),
            deps,
            uses: uses.clone(),
        });
        self.streams[i].terminals = vec![idx];
        if self.race_checking {
            for u in &uses {
                let use_id = self.next_use;
                self.next_use += 1;
                check_capture_use(cap, id, idx, i, u, use_id, &mut self.races);
            }
        }
        Submitted::Node(MockNode {
            capture: id,
            index: idx,
        })
    }

    // ----- events --------------------------------------------------------

    fn create_event(&mut self) -> Result<MockEvent, BackendError> {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, EventRecord::Never);
        Ok(MockEvent {
            instance: self.instance,
            id,
        })
    }

    fn destroy_event(&mut self, e: &MockEvent) -> Result<(), BackendError> {
        self.event("destroy_event", e)?;
        self.events.remove(&e.id);
        Ok(())
    }

    fn record_event(&mut self, e: &MockEvent, s: MockStream) -> Result<(), BackendError> {
        self.event("record_event", e)?;
        let i = self.stream_idx("record_event", s)?;
        let rec = match self.active_capture("record_event", i)? {
            Some(capture) => EventRecord::Captured {
                capture,
                nodes: self.streams[i].terminals.clone(),
            },
            None => {
                let st = &self.streams[i];
                let mut clock = st.clock.clone();
                if clock.len() <= i {
                    clock.resize(i + 1, 0);
                }
                clock[i] = st.submitted;
                EventRecord::Work {
                    stream: i,
                    pos: st.submitted,
                    clock,
                }
            }
        };
        self.events.insert(e.id, rec);
        Ok(())
    }

    /// Common checks of `query_event`/`synchronize_event`; returns the
    /// `(stream, position)` the event waits for, if any.
    fn observable_event(
        &mut self,
        call: &'static str,
        e: &MockEvent,
    ) -> Result<Option<(usize, u64)>, BackendError> {
        let target = match self.event(call, e)? {
            EventRecord::Captured { capture, .. } => Err(*capture),
            EventRecord::Never => Ok(None),
            EventRecord::Work { stream, pos, .. } => Ok(Some((*stream, *pos))),
        };
        match target {
            Err(capture) => {
                self.invalidate(
                    capture,
                    format!("{call} on an event recorded during capture"),
                );
                Err(err(
                    call,
                    codes::CAPTURED_EVENT,
                    format!(
                        "event {} was last recorded in capture {capture}; it stands for no work",
                        e.id
                    ),
                ))
            }
            Ok(t) => {
                if self.capture_mode == CaptureMode::Global && self.any_capture_active() {
                    let reason =
                        format!("{call} while a capture is underway (global capture mode)");
                    self.invalidate_all(&reason);
                    return Err(err(call, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
                }
                Ok(t)
            }
        }
    }

    fn query_event(&mut self, e: &MockEvent) -> Result<bool, BackendError> {
        Ok(match self.observable_event("query_event", e)? {
            None => true,
            Some((s, p)) => self.streams[s].completed >= p,
        })
    }

    /// Whether all work submitted to `s` has completed. As CUDA's
    /// `cuStreamQuery`: prohibited on a capturing stream (the capture is
    /// invalidated) and, in the global capture mode, while any capture is
    /// underway (every capture is invalidated).
    fn query_stream(&mut self, s: MockStream) -> Result<bool, BackendError> {
        const CALL: &str = "query_stream";
        let i = self.stream_idx(CALL, s)?;
        if let Some(id) = self.active_capture(CALL, i)? {
            let reason = format!("{CALL} on capturing stream{i}");
            self.invalidate(id, reason.clone());
            return Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
        }
        if self.capture_mode == CaptureMode::Global && self.any_capture_active() {
            let reason = format!("{CALL} while a capture is underway (global capture mode)");
            self.invalidate_all(&reason);
            return Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
        }
        let st = &self.streams[i];
        Ok(st.completed >= st.submitted)
    }

    fn synchronize_event(&mut self, e: &MockEvent) -> Result<(), BackendError> {
        if let Some((s, p)) = self.observable_event("synchronize_event", e)? {
            self.complete_to(s, p);
        }
        Ok(())
    }

    fn stream_wait_event(&mut self, s: MockStream, e: &MockEvent) -> Result<(), BackendError> {
        const CALL: &str = "stream_wait_event";
        let rec = self.event(CALL, e)?.clone();
        let i = self.stream_idx(CALL, s)?;
        let mine = self.active_capture(CALL, i)?;
        match rec {
            EventRecord::Never => Ok(()),
            EventRecord::Work { clock, .. } => {
                if let Some(id) = mine {
                    self.invalidate(id, "a capturing stream waited on an uncaptured event");
                    return Err(err(
                        CALL,
                        codes::STREAM_CAPTURE_ISOLATION,
                        format!(
                            "{s} is capturing and event {} was recorded outside capture",
                            e.id
                        ),
                    ));
                }
                let st = &mut self.streams[i];
                if st.clock.len() < clock.len() {
                    st.clock.resize(clock.len(), 0);
                }
                for (c, q) in st.clock.iter_mut().zip(clock) {
                    *c = (*c).max(q);
                }
                let first = st.submitted + 1;
                match st.epochs.back_mut() {
                    Some((f, c)) if *f == first => c.clone_from(&st.clock),
                    _ => st.epochs.push_back((first, st.clock.clone())),
                }
                Ok(())
            }
            EventRecord::Captured { capture, nodes } => {
                let status = self.captures.get(&capture).map(|c| c.status);
                match status {
                    None => Err(err(
                        CALL,
                        codes::CAPTURED_EVENT,
                        format!(
                            "event {} was recorded in capture {capture}, which has ended",
                            e.id
                        ),
                    )),
                    Some(CaptureStatus::Active) => match mine {
                        Some(id) if id == capture => {
                            push_unique(&mut self.streams[i].terminals, nodes);
                            Ok(())
                        }
                        Some(id) => {
                            let reason = format!("captures {id} and {capture} would merge");
                            self.invalidate(id, reason.clone());
                            self.invalidate(capture, reason.clone());
                            Err(err(CALL, codes::STREAM_CAPTURE_MERGE, reason))
                        }
                        None if i == 0 => {
                            let reason = "the legacy default stream cannot join a capture";
                            self.invalidate(capture, reason);
                            Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason))
                        }
                        None => {
                            let st = &mut self.streams[i];
                            st.capture = Some(capture);
                            st.terminals.clear();
                            push_unique(&mut st.terminals, nodes);
                            if let Some(c) = self.captures.get_mut(&capture) {
                                c.members.insert(i);
                            }
                            Ok(())
                        }
                    },
                    Some(_) => Err(err(
                        CALL,
                        codes::STREAM_CAPTURE_INVALIDATED,
                        format!("event {} belongs to invalidated capture {capture}", e.id),
                    )),
                }
            }
        }
    }

    fn synchronize_device(&mut self) -> Result<(), BackendError> {
        if !self.captures.is_empty() {
            let reason = "synchronize_device while a capture is underway";
            self.invalidate_all(reason);
            return Err(err(
                "synchronize_device",
                codes::STREAM_CAPTURE_UNSUPPORTED,
                reason,
            ));
        }
        self.complete_all();
        Ok(())
    }

    // ----- capture -------------------------------------------------------

    fn capture_state(
        &self,
        s: MockStream,
        terminals: &mut Vec<MockNode>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        let i = self.stream_idx("capture_info", s)?;
        let st = &self.streams[i];
        terminals.clear();
        let Some(id) = st.capture else {
            return Ok((CaptureStatus::None, 0));
        };
        Ok(match self.captures.get(&id) {
            Some(c) if c.status == CaptureStatus::Active => {
                terminals.extend(
                    st.terminals
                        .iter()
                        .map(|&index| MockNode { capture: id, index }),
                );
                (CaptureStatus::Active, id)
            }
            Some(_) => (CaptureStatus::Invalidated, id),
            None => (CaptureStatus::None, 0),
        })
    }

    /// The walk of `GraphCapture::mark_ancestors` over the graph of capture
    /// `capture` while it is being captured (node numbers are indices);
    /// `None` when `from` holds a node of another graph or out of range.
    /// Returns the number of nodes expanded.
    fn mark_ancestors(
        &mut self,
        capture: u64,
        from: &[MockNode],
        bits: &mut Vec<u64>,
    ) -> Option<u64> {
        let nodes = &self.captures.get(&capture)?.nodes;
        if from
            .iter()
            .any(|n| n.capture != capture || n.index as usize >= nodes.len())
        {
            return None;
        }
        // Every index is below the node count: size the bitset once.
        let words = nodes.len().div_ceil(64);
        if bits.len() < words {
            bits.resize(words, 0);
        }
        let bits = &mut bits[..words];
        #[inline]
        fn mark(bits: &mut [u64], i: u32) -> bool {
            let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
            let old = bits[w];
            bits[w] = old | m;
            old & m == 0
        }
        let stack = &mut self.mark_stack;
        stack.clear();
        for n in from {
            if mark(bits, n.index) {
                stack.push(n.index);
            }
        }
        let mut expanded = 0;
        while let Some(i) = stack.pop() {
            expanded += 1;
            for &d in &nodes[i as usize].deps {
                if mark(bits, d) {
                    stack.push(d);
                }
            }
        }
        Some(expanded)
    }

    fn extend_node_dependencies(
        &mut self,
        node: MockNode,
        out: &mut Vec<MockNode>,
    ) -> Result<(), BackendError> {
        let map = |deps: &[u32], out: &mut Vec<MockNode>| {
            out.extend(deps.iter().map(|&index| MockNode {
                capture: node.capture,
                index,
            }));
        };
        let bad = |what: &str| {
            err(
                "node_dependencies",
                codes::INVALID_VALUE,
                format!("{node:?}: {what}"),
            )
        };
        if let Some(c) = self.captures.get(&node.capture) {
            let n = c
                .nodes
                .get(node.index as usize)
                .ok_or_else(|| bad("no such node in the capturing graph"))?;
            map(&n.deps, out);
            return Ok(());
        }
        match self.graphs.get(&node.capture).map(Weak::upgrade) {
            Some(Some(g)) => {
                let n = g
                    .nodes
                    .get(node.index as usize)
                    .ok_or_else(|| bad("no such node in the graph"))?;
                map(&n.deps, out);
                Ok(())
            }
            Some(None) => {
                self.graphs.remove(&node.capture);
                Err(bad("its graph was destroyed"))
            }
            None => Err(bad("unknown capture")),
        }
    }

    fn capturing_id(&self, call: &'static str, i: usize) -> Result<u64, BackendError> {
        match self.active_capture(call, i)? {
            Some(id) => Ok(id),
            None => Err(err(
                call,
                codes::ILLEGAL_STATE,
                format!("stream{i} is not capturing"),
            )),
        }
    }

    fn add_empty_node(
        &mut self,
        s: MockStream,
        deps: &[MockNode],
    ) -> Result<MockNode, BackendError> {
        const CALL: &str = "add_empty_node";
        let i = self.stream_idx(CALL, s)?;
        let id = self.capturing_id(CALL, i)?;
        let deps = self.check_nodes(CALL, id, deps)?;
        let cap = self
            .captures
            .get_mut(&id)
            .ok_or_else(|| err(CALL, codes::ILLEGAL_STATE, "capture vanished"))?;
        let index = cap.nodes.len() as u32;
        cap.nodes.push(GraphNode {
            kind: NodeKind::Empty,
            stream: None,
            deps,
            uses: Vec::new(),
        });
        Ok(MockNode { capture: id, index })
    }

    fn update_capture_dependencies(
        &mut self,
        s: MockStream,
        nodes: &[MockNode],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        const CALL: &str = "update_capture_dependencies";
        let i = self.stream_idx(CALL, s)?;
        let id = self.capturing_id(CALL, i)?;
        let nodes = self.check_nodes(CALL, id, nodes)?;
        let t = &mut self.streams[i].terminals;
        if mode == DependencyUpdate::Set {
            t.clear();
        }
        push_unique(t, nodes);
        Ok(())
    }

    fn begin_capture(&mut self, s: MockStream) -> Result<u64, BackendError> {
        const CALL: &str = "begin_capture";
        let i = self.stream_idx(CALL, s)?;
        if i == 0 {
            return Err(err(
                CALL,
                codes::STREAM_CAPTURE_UNSUPPORTED,
                "the legacy default stream cannot be captured",
            ));
        }
        if let Some(id) = self.streams[i].capture {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!("{s} is already capturing (capture {id})"),
            ));
        }
        let id = self.next_capture;
        self.next_capture += 1;
        self.captures.insert(
            id,
            CaptureState {
                origin: i,
                status: CaptureStatus::Active,
                reason: None,
                nodes: Vec::new(),
                members: BTreeSet::from([i]),
                shadow: PieceMap::default(),
            },
        );
        let st = &mut self.streams[i];
        st.capture = Some(id);
        st.terminals.clear();
        Ok(id)
    }

    fn end_capture(&mut self, s: MockStream) -> Result<MockGraph, BackendError> {
        const CALL: &str = "end_capture";
        let i = self.stream_idx(CALL, s)?;
        let Some(id) = self.streams[i].capture else {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!("{s} is not capturing"),
            ));
        };
        let origin = self.captures.get(&id).map_or(i, |c| c.origin);
        if origin != i {
            let reason = format!("end_capture on {s}, but capture {id} began on stream{origin}");
            self.invalidate(id, reason.clone());
            return Err(err(CALL, codes::STREAM_CAPTURE_UNMATCHED, reason));
        }
        let Some(cap) = self.captures.remove(&id) else {
            self.streams[i].capture = None;
            return Err(err(CALL, codes::ILLEGAL_STATE, "capture vanished"));
        };
        // Ancestors-or-self of the origin's terminals.
        let mut joined = vec![false; cap.nodes.len()];
        let mut stack: Vec<u32> = self.streams[i].terminals.clone();
        while let Some(n) = stack.pop() {
            if let Some(j) = joined.get_mut(n as usize)
                && !*j
            {
                *j = true;
                stack.extend(cap.nodes[n as usize].deps.iter().copied());
            }
        }
        let mut unjoined = None;
        for &m in &cap.members {
            let st = &mut self.streams[m];
            if m != i
                && unjoined.is_none()
                && st
                    .terminals
                    .iter()
                    .any(|&t| !joined.get(t as usize).copied().unwrap_or(false))
            {
                unjoined = Some(m);
            }
            st.capture = None;
            st.terminals.clear();
        }
        if cap.status != CaptureStatus::Active {
            return Err(err(
                CALL,
                codes::STREAM_CAPTURE_INVALIDATED,
                format!(
                    "capture {id} was invalidated: {}",
                    cap.reason.as_deref().unwrap_or("unknown reason")
                ),
            ));
        }
        if let Some(m) = unjoined {
            return Err(err(
                CALL,
                codes::STREAM_CAPTURE_UNJOINED,
                format!("stream{m} forked into capture {id} and was not joined back into {s}"),
            ));
        }
        let data = Arc::new(GraphData {
            capture_id: id,
            nodes: cap.nodes,
        });
        self.graphs.retain(|_, w| w.strong_count() > 0);
        self.graphs.insert(id, Arc::downgrade(&data));
        Ok(MockGraph { data })
    }
}

fn site(x: &Access, capture: Option<u64>) -> UseSite {
    let at = match (x.who, capture) {
        (Who::Work { stream, pos }, _) => Submitted::Work {
            stream: MockStream(stream),
            seq: pos,
        },
        (Who::Node(index), c) => Submitted::Node(MockNode {
            capture: c.unwrap_or(0),
            index,
        }),
    };
    UseSite {
        stream: MockStream(x.stream),
        at,
        tag: x.tag,
        addr: x.addr,
        len: x.len,
    }
}

/// A use by work `pos` of stream `i` of the physical memory at offset
/// `off` of the mapping at `start` (the piece `[lo, hi)` of the use):
/// checked against the other streams' last uses of that memory through
/// another mapping (`last_use`, by stream: position, mapping, tag), which
/// must be complete or ordered before it (memory mapped at two addresses,
/// as an allocator's ghost mappings); then recorded as this stream's last.
fn check_physical_use(
    streams: &[StreamState],
    last_use: &mut Vec<(u64, u64, u64)>,
    races: &mut Vec<Race>,
    (i, pos, start, off): (usize, u64, u64, u64),
    (lo, hi): (u64, u64),
    tag: u64,
) {
    let use_of = |stream: usize, pos: u64, tag: u64, addr: u64| Access {
        who: Who::Work {
            stream: stream as u32,
            pos,
        },
        stream: stream as u32,
        tag,
        addr,
        len: hi - lo,
        id: 0,
    };
    let clock = &streams[i].clock;
    for (a, &(pa, sa, ta)) in last_use.iter().enumerate() {
        let pending = pa > 0 && streams.get(a).is_some_and(|s| s.completed < pa);
        let ordered = clock.get(a).copied().unwrap_or(0) >= pa;
        if a != i && sa != start && ta != tag && pending && !ordered {
            // (the two addresses differ: the overlap is given as the later's)
            races.push(Race {
                earlier: site(&use_of(a, pa, ta, sa + off), None),
                later: site(&use_of(i, pos, tag, lo), None),
                overlap: (lo, hi),
                capture_id: None,
            });
        }
    }
    if last_use.len() <= i {
        last_use.resize(i + 1, (0, 0, 0));
    }
    last_use[i] = (pos, start, tag);
}

fn make_race(earlier: &Access, later: &Access, capture: Option<u64>) -> Race {
    Race {
        earlier: site(earlier, capture),
        later: site(later, capture),
        overlap: (
            earlier.addr.max(later.addr),
            (earlier.addr + earlier.len).min(later.addr + later.len),
        ),
        capture_id: capture,
    }
}

/// Checks a use of node `idx` against the other uses of the capture's graph:
/// overlapping uses with another tag must be ancestors of `idx`.
fn check_capture_use(
    cap: &mut CaptureState,
    id: u64,
    idx: u32,
    stream: usize,
    u: &MemUse,
    use_id: u64,
    races: &mut Vec<Race>,
) {
    let new = Access {
        who: Who::Node(idx),
        stream: stream as u32,
        tag: u.tag,
        addr: u.addr,
        len: u.len,
        id: use_id,
    };
    let mut cands: Vec<Access> = Vec::new();
    cap.shadow
        .visit_insert(u.addr, u.addr + u.len, new, true, |x| {
            if x.tag != u.tag && x.who != new.who && !cands.iter().any(|c| c.id == x.id) {
                cands.push(*x);
            }
            true
        });
    if cands.is_empty() {
        return;
    }
    let mut targets: HashSet<u32> = cands
        .iter()
        .filter_map(|c| match c.who {
            Who::Node(n) => Some(n),
            Who::Work { .. } => None,
        })
        .collect();
    let mut found: HashSet<u32> = HashSet::new();
    let mut seen = vec![false; cap.nodes.len()];
    let mut stack = vec![idx];
    while let Some(n) = stack.pop() {
        if targets.is_empty() {
            break;
        }
        for &d in &cap.nodes[n as usize].deps {
            if let Some(s) = seen.get_mut(d as usize)
                && !*s
            {
                *s = true;
                if targets.remove(&d) {
                    found.insert(d);
                }
                stack.push(d);
            }
        }
    }
    for c in &cands {
        if let Who::Node(n) = c.who
            && !found.contains(&n)
        {
            races.push(make_race(c, &new, Some(id)));
        }
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

    // ----- device and memory ---------------------------------------------

    /// The placement policy.
    pub fn placement(&self) -> Placement {
        self.inner.lock().placement
    }

    /// `(base, size)` of the simulated address range.
    pub fn address_range(&self) -> (u64, u64) {
        let st = self.inner.lock();
        (st.space.base(), st.space.end() - st.space.base())
    }

    /// Device capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.inner.lock().capacity
    }

    /// Changes the capacity; it may drop below the live bytes (then every
    /// `malloc` fails with OOM until enough is freed).
    pub fn set_capacity(&self, bytes: u64) {
        self.inner.lock().capacity = bytes;
    }

    /// Simulates `bytes` used by other processes: they count against the
    /// capacity and are not reported free.
    pub fn set_external_usage(&self, bytes: u64) {
        self.inner.lock().external = bytes;
    }

    /// Bytes in live segments.
    pub fn live_bytes(&self) -> u64 {
        self.inner.lock().live
    }

    /// Live segments as `(address, size)`, by address.
    pub fn live_segments(&self) -> Vec<(u64, u64)> {
        self.inner
            .lock()
            .segments
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect()
    }

    /// Number of live segments.
    pub fn segment_count(&self) -> usize {
        self.inner.lock().segments.len()
    }

    // ----- virtual memory ------------------------------------------------

    /// `[start, end)` of the address range reservations are placed in:
    /// right above the segment range ([`Self::address_range`]), so that no
    /// reservation overlaps a segment. With the default base it is the rest
    /// of the device's [`crate::DEVICE_ADDRESS_STRIDE`] span (empty, so that
    /// every `reserve` fails with OOM, when the segment range fills the
    /// span: capacities of 4 TiB and more; set a smaller
    /// [`MockConfig::address_space`] to make room); with a base of the
    /// caller's, `max(1 TiB, 4 × capacity)` bytes.
    pub fn reservation_range(&self) -> (u64, u64) {
        self.inner.lock().vmm.range
    }

    /// Bytes of device memory held by physical allocations (they count
    /// against the capacity, like segments; [`Self::live_bytes`] counts
    /// segments only).
    pub fn live_physical_bytes(&self) -> u64 {
        self.inner.lock().vmm.physical_bytes
    }

    /// Number of live physical allocations.
    pub fn physical_count(&self) -> usize {
        self.inner.lock().vmm.physical.len()
    }

    /// Live physical allocations as `(id, size)`, by id.
    pub fn live_physical(&self) -> Vec<(u64, u64)> {
        let st = self.inner.lock();
        st.vmm
            .physical
            .iter()
            .map(|(&id, p)| (id, p.size))
            .collect()
    }

    /// Live reservations as `(address, size)`, by address.
    pub fn live_reservations(&self) -> Vec<(u64, u64)> {
        let st = self.inner.lock();
        st.vmm.reservations.iter().map(|(&a, &s)| (a, s)).collect()
    }

    /// Number of live reservations.
    pub fn reservation_count(&self) -> usize {
        self.inner.lock().vmm.reservations.len()
    }

    /// Bytes of address space held by live reservations.
    pub fn reserved_bytes(&self) -> u64 {
        self.inner.lock().vmm.reservations.values().sum()
    }

    /// Live mappings, by address.
    pub fn mappings(&self) -> Vec<MockMapping> {
        let st = self.inner.lock();
        st.vmm
            .mappings
            .iter()
            .map(|(&addr, m)| MockMapping {
                addr,
                size: m.size,
                physical: m.phys,
                accessible: m.access,
            })
            .collect()
    }

    /// Number of live mappings.
    pub fn mapping_count(&self) -> usize {
        self.inner.lock().vmm.mappings.len()
    }

    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.inner
            .lock()
            .vmm
            .mappings
            .values()
            .map(|m| m.size)
            .sum()
    }

    /// Everything the device's virtual memory holds, in one snapshot.
    pub fn vmm_usage(&self) -> VmmUsage {
        self.inner.lock().vmm.usage()
    }

    /// The "nothing leaked" check of virtual memory: panics, listing what is
    /// left, unless no reservation, no physical allocation and no mapping
    /// is live.
    #[track_caller]
    pub fn assert_no_vmm_leaks(&self) {
        let st = self.inner.lock();
        let usage = st.vmm.usage();
        if !usage.is_empty() {
            let res: Vec<(u64, u64)> = st.vmm.reservations.iter().map(|(&a, &s)| (a, s)).collect();
            let phys: Vec<(u64, u64)> = st.vmm.physical.iter().map(|(&i, p)| (i, p.size)).collect();
            let maps: Vec<(u64, u64)> = st.vmm.mappings.iter().map(|(&a, m)| (a, m.phys)).collect();
            drop(st);
            panic!(
                "virtual memory leaked: {usage}; reservations (addr, size) {res:x?}, physical \
                 (id, size) {phys:?}, mappings (addr, physical id) {maps:x?}"
            );
        }
    }

    /// Every invalid access found so far (eager uses of reserved bytes not
    /// mapped, or mapped without access), in discovery order.
    pub fn invalid_accesses(&self) -> Vec<InvalidAccess> {
        self.inner.lock().invalid.clone()
    }

    /// Number of invalid accesses found so far.
    pub fn invalid_access_count(&self) -> usize {
        self.inner.lock().invalid.len()
    }

    /// Forgets the invalid accesses found so far.
    pub fn clear_invalid_accesses(&self) {
        self.inner.lock().invalid.clear();
    }

    // ----- simulated contents -----------------------------------------------

    /// What `[addr, addr + len)` holds: the mock stores no bytes, only the
    /// tag of the last eager use ([`Self::use_memory`], a graph launch) of
    /// every byte, recorded when the work is submitted (work on one stream
    /// runs in order; work of different streams that overlaps is a race the
    /// race checker reports). Returns `(start, end, tag)` runs in address
    /// order covering the range, `None` for bytes not written since their
    /// segment was allocated (freeing a segment forgets its contents; uses
    /// inside a capture write nothing until the graph is launched). The range
    /// must lie inside one live segment, as for a use, or inside one
    /// reservation with every byte mapped ([`codes::NOT_MAPPED`] otherwise).
    ///
    /// The contents of mapped bytes belong to the physical memory behind
    /// them: unmapping keeps them, mapping the same physical allocation
    /// elsewhere shows them there, releasing it forgets them. Writes through
    /// a mapping without access are lost (and reported,
    /// [`Self::invalid_accesses`]).
    pub fn read_tags(
        &self,
        addr: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64, Option<u64>)>, BackendError> {
        self.with(|st| st.read_data("read_tags", &MemUse { addr, len, tag: 0 }))
    }

    /// The tag last written at byte `addr` (see [`Self::read_tags`]); `None`
    /// when not written or not in a live segment.
    pub fn tag_at(&self, addr: u64) -> Option<u64> {
        let st = self.inner.lock();
        let u = MemUse {
            addr,
            len: 1,
            tag: 0,
        };
        st.read_data("tag_at", &u).ok()?.first().and_then(|r| r.2)
    }

    // ----- failure injection ----------------------------------------------
    //
    // Every fallible entry point the engine calls (each `MockCall`) can be
    // made to fail. Calls are numbered per kind from 1 since the device was
    // created (`call_count`); an injected failure fires when the call's
    // number comes up, before the call does anything (no state changes: a
    // failed `free` leaves the segment allocated, a failed `record_event`
    // leaves the event as it was, a failed `release_physical` leaves the
    // memory allocated, ...) and returns a typed error: `malloc`, `reserve`
    // and `create_physical` a `DeviceAllocError` (`OutOfMemory` or
    // `Backend`), every other call a `BackendError` whose `call` is
    // `MockCall::name`. A failed call
    // still counts in `counters()` (its call counter, `errors`, the
    // `*_failed` counter where there is one, and `injected`) and advances the
    // operation clock.
    //
    // A fault-injection matrix runs an operation once to learn how many
    // calls of each kind it makes (`call_count` before and after), then, on
    // a fresh device for each k, `fail_call_at(kind, k)` and the operation
    // again, checking the engine's error and its state.

    /// Makes the `n`-th call of `call` from now (1 = the next one) fail once
    /// with [`Failure::INJECTED`] (a `BackendError` with code
    /// [`codes::INJECTED`]; for `malloc`, `reserve` and `create_physical`,
    /// `DeviceAllocError::Backend`).
    /// `n = 0` is ignored. Injecting twice at the same call keeps the later
    /// failure.
    pub fn fail_call_at(&self, call: MockCall, n: u64) {
        self.fail_call_at_with(call, n, Failure::INJECTED);
    }

    /// Like [`Self::fail_call_at`] with the failure chosen (e.g.
    /// [`Failure::OutOfMemory`] for a `malloc` the engine treats as OOM).
    pub fn fail_call_at_with(&self, call: MockCall, n: u64, failure: Failure) {
        if n == 0 {
            return;
        }
        let mut st = self.inner.lock();
        let k = call.index();
        let at = st.calls[k] + n;
        st.failures[k].insert(at, failure);
    }

    /// Makes every call of `call` from now on fail with
    /// [`Failure::INJECTED`], until [`Self::clear_failures`] or
    /// [`Self::clear_failures_of`]. One-shot failures of the same kind take
    /// precedence when their call comes up.
    pub fn fail_call_always(&self, call: MockCall) {
        self.fail_call_always_with(call, Failure::INJECTED);
    }

    /// Like [`Self::fail_call_always`] with the failure chosen.
    pub fn fail_call_always_with(&self, call: MockCall, failure: Failure) {
        self.inner.lock().always[call.index()] = Some(failure);
    }

    /// Cancels the pending one-shot failures and the permanent failure of
    /// `call`.
    pub fn clear_failures_of(&self, call: MockCall) {
        let mut st = self.inner.lock();
        st.failures[call.index()].clear();
        st.always[call.index()] = None;
    }

    /// Cancels every pending injected failure, of every kind.
    pub fn clear_failures(&self) {
        for call in MockCall::ALL {
            self.clear_failures_of(call);
        }
    }

    /// One-shot failures of `call` injected and not yet fired.
    pub fn pending_failures(&self, call: MockCall) -> usize {
        self.inner.lock().failures[call.index()].len()
    }

    /// The permanent failure of `call`, if one is set.
    pub fn failing_always(&self, call: MockCall) -> Option<Failure> {
        self.inner.lock().always[call.index()]
    }

    /// Calls of `call` since the device was created, failed ones included
    /// (not reset by [`Self::reset_counters`]). This numbering is the one
    /// [`Self::fail_call_at`] counts in.
    pub fn call_count(&self, call: MockCall) -> u64 {
        self.inner.lock().calls[call.index()]
    }

    /// Makes the `n`-th future `malloc` call (1 = the next one) fail with
    /// `DeviceAllocError::OutOfMemory`. `n = 0` is ignored. Same as
    /// `fail_call_at_with(MockCall::Malloc, n, Failure::OutOfMemory)`.
    pub fn fail_malloc_at(&self, n: u64) {
        self.fail_malloc_at_with(n, MallocFailure::OutOfMemory);
    }

    /// Makes the `n`-th future `malloc` call fail the given way
    /// (`fail_call_at_with(MockCall::Malloc, n, failure)`).
    pub fn fail_malloc_at_with(&self, n: u64, failure: MallocFailure) {
        self.fail_call_at_with(MockCall::Malloc, n, failure);
    }

    /// Makes the `n`-th future `create_event` call fail (code
    /// [`codes::INJECTED`]; `fail_call_at(MockCall::CreateEvent, n)`).
    pub fn fail_create_event_at(&self, n: u64) {
        self.fail_call_at(MockCall::CreateEvent, n);
    }

    /// Makes the `n`-th future `free` call fail (code [`codes::INJECTED`]);
    /// the segment stays allocated (`fail_call_at(MockCall::Free, n)`).
    pub fn fail_free_at(&self, n: u64) {
        self.fail_call_at(MockCall::Free, n);
    }

    // ----- counters ------------------------------------------------------

    /// Call counters since creation or the last [`Self::reset_counters`].
    pub fn counters(&self) -> MockCounters {
        self.inner.lock().counters
    }

    /// Zeroes the call counters.
    pub fn reset_counters(&self) {
        self.inner.lock().counters = MockCounters::default();
    }

    /// Number of events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.inner.lock().events.len()
    }

    // ----- streams and work ------------------------------------------------

    /// Creates a new (non-blocking) stream.
    pub fn create_stream(&self) -> MockStream {
        let mut st = self.inner.lock();
        st.streams.push(StreamState::default());
        MockStream((st.streams.len() - 1) as u32)
    }

    /// Number of streams, the default one included.
    pub fn stream_count(&self) -> usize {
        self.inner.lock().streams.len()
    }

    /// Submits one unit of work (a kernel touching no tracked memory). In a
    /// capture it adds a kernel node instead.
    pub fn launch(&self, stream: MockStream) -> Result<Submitted, BackendError> {
        self.with(|st| {
            let i = st.stream_idx("launch", stream)?;
            st.submit("launch", i, NodeKind::Kernel, Vec::new())
        })
    }

    /// Submits one unit of work on `stream` that touches `[addr, addr+len)`
    /// on behalf of allocation `tag`, and checks it for races. The range
    /// must lie inside one live segment or one reservation, and `len` must
    /// not be 0; bytes of a reservation not mapped, or mapped without
    /// access, are reported ([`Self::invalid_accesses`]).
    pub fn use_memory(
        &self,
        stream: MockStream,
        addr: u64,
        len: u64,
        tag: u64,
    ) -> Result<Submitted, BackendError> {
        self.use_memory_multi(stream, &[MemUse { addr, len, tag }])
    }

    /// Like [`Self::use_memory`] for one kernel touching several ranges.
    pub fn use_memory_multi(
        &self,
        stream: MockStream,
        uses: &[MemUse],
    ) -> Result<Submitted, BackendError> {
        self.with(|st| {
            let i = st.stream_idx("use_memory", stream)?;
            st.submit("use_memory", i, NodeKind::Kernel, uses.to_vec())
        })
    }

    /// Launches `graph` on `stream`: outside capture, one unit of work
    /// carrying every use of the graph (checked against other streams'
    /// work); inside a capture, one child-graph node. Every use must still
    /// lie in a live segment or a reservation (as for [`Self::use_memory`]).
    pub fn launch_graph(
        &self,
        graph: &MockGraph,
        stream: MockStream,
    ) -> Result<Submitted, BackendError> {
        let uses: Vec<MemUse> = graph.uses().into_iter().map(|(_, u)| u).collect();
        self.with(|st| {
            let i = st.stream_idx("launch_graph", stream)?;
            st.submit("launch_graph", i, NodeKind::ChildGraph, uses)
        })
    }

    /// Completes all work submitted so far on `stream` (and what it waits on).
    pub fn complete(&self, stream: MockStream) -> Result<(), BackendError> {
        self.with(|st| {
            let i = st.stream_idx("complete", stream)?;
            let p = st.streams[i].submitted;
            st.complete_to(i, p);
            Ok(())
        })
    }

    /// Completes the next `n` pending units of work on `stream` (and what
    /// they wait on).
    pub fn complete_n(&self, stream: MockStream, n: u64) -> Result<(), BackendError> {
        self.with(|st| {
            let i = st.stream_idx("complete_n", stream)?;
            let p = st.streams[i].completed.saturating_add(n);
            st.complete_to(i, p);
            Ok(())
        })
    }

    /// Completes all submitted work on every stream.
    pub fn complete_all(&self) {
        self.inner.lock().complete_all();
    }

    /// Turns auto-completion on (completing everything pending now) or off:
    /// [`Completion::Immediate`] or [`Completion::Manual`].
    pub fn set_auto_complete(&self, on: bool) {
        self.set_completion(if on {
            Completion::Immediate
        } else {
            Completion::Manual
        });
    }

    /// Whether work completes as soon as it is submitted
    /// ([`Completion::Immediate`]).
    pub fn auto_complete(&self) -> bool {
        self.inner.lock().completion == Completion::Immediate
    }

    /// Changes when submitted work completes. [`Completion::Immediate`]
    /// completes everything pending now; work submitted before the change
    /// that has not completed stays pending until completed explicitly
    /// (it draws no delay); [`Completion::Random`] restarts its generator
    /// from the seed.
    pub fn set_completion(&self, completion: Completion) {
        self.inner.lock().set_completion(completion);
    }

    /// When submitted work completes.
    pub fn completion(&self) -> Completion {
        self.inner.lock().completion
    }

    /// The operation clock: calls of `Backend`/`GraphCapture` entry points
    /// plus submissions so far (see [`Completion::Random`]).
    pub fn op_clock(&self) -> u64 {
        self.inner.lock().now
    }

    /// Units of work submitted on `stream` so far.
    pub fn submitted(&self, stream: MockStream) -> Result<u64, BackendError> {
        self.with(|st| {
            let i = st.stream_idx("submitted", stream)?;
            Ok(st.streams[i].submitted)
        })
    }

    /// Units of work completed on `stream` so far.
    pub fn completed(&self, stream: MockStream) -> Result<u64, BackendError> {
        self.with(|st| {
            let i = st.stream_idx("completed", stream)?;
            Ok(st.streams[i].completed)
        })
    }

    /// Units of work submitted on `stream` and not completed.
    pub fn pending(&self, stream: MockStream) -> Result<u64, BackendError> {
        self.with(|st| {
            let i = st.stream_idx("pending", stream)?;
            let s = &st.streams[i];
            Ok(s.submitted - s.completed)
        })
    }

    /// Host waits for `stream` (`cudaStreamSynchronize`): completes its
    /// work. On a stream in a capture it fails and invalidates the capture.
    pub fn synchronize_stream(&self, stream: MockStream) -> Result<(), BackendError> {
        self.with(|st| {
            const CALL: &str = "synchronize_stream";
            let i = st.stream_idx(CALL, stream)?;
            if let Some(id) = st.streams[i].capture {
                let reason = format!("synchronize_stream on capturing {stream}");
                st.invalidate(id, reason.clone());
                return Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
            }
            let p = st.streams[i].submitted;
            st.complete_to(i, p);
            Ok(())
        })
    }

    // ----- race checker ------------------------------------------------------

    /// Every race found so far, in discovery order.
    pub fn races(&self) -> Vec<Race> {
        self.inner.lock().races.clone()
    }

    /// Number of races found so far.
    pub fn race_count(&self) -> usize {
        self.inner.lock().races.len()
    }

    /// Forgets the races found so far (the recorded uses stay).
    pub fn clear_races(&self) {
        self.inner.lock().races.clear();
    }

    /// Turns race checking on or off (off: uses are neither checked nor kept).
    pub fn set_race_checking(&self, on: bool) {
        let mut st = self.inner.lock();
        st.race_checking = on;
        if !on {
            st.shadow.clear();
        }
    }

    /// Number of eager uses the race checker still keeps (for tests of its
    /// pruning); a use spanning k address pieces counts k times.
    pub fn tracked_uses(&self) -> usize {
        self.inner.lock().shadow.access_count()
    }

    // ----- capture -------------------------------------------------------

    /// Begins capturing `stream` into a new graph; returns the capture id
    /// (from 1). Fails on the default stream or a stream already in a capture.
    pub fn begin_capture(&self, stream: MockStream) -> Result<u64, BackendError> {
        self.with(|st| {
            st.counters.begin_capture += 1;
            st.begin_capture(stream)
        })
    }

    /// Ends the capture `stream` began and returns its graph. Every stream
    /// of the capture stops capturing, even on error. Errors: not capturing
    /// ([`codes::ILLEGAL_STATE`]); `stream` did not begin the capture
    /// ([`codes::STREAM_CAPTURE_UNMATCHED`], invalidates it, the capture
    /// continues); the capture was invalidated
    /// ([`codes::STREAM_CAPTURE_INVALIDATED`]); a forked stream has a
    /// terminal node that is not an ancestor of the origin's terminals
    /// ([`codes::STREAM_CAPTURE_UNJOINED`]).
    pub fn end_capture(&self, stream: MockStream) -> Result<MockGraph, BackendError> {
        self.with(|st| {
            st.counters.end_capture += 1;
            st.end_capture(stream)
        })
    }

    /// Invalidates the capture `stream` belongs to, as a misuse would.
    pub fn invalidate_capture(&self, stream: MockStream) -> Result<(), BackendError> {
        self.with(|st| {
            let i = st.stream_idx("invalidate_capture", stream)?;
            let Some(id) = st.streams[i].capture else {
                return Err(err(
                    "invalidate_capture",
                    codes::ILLEGAL_STATE,
                    format!("{stream} is not capturing"),
                ));
            };
            st.invalidate(id, "invalidated by the test");
            Ok(())
        })
    }

    /// Why the capture of `stream` was invalidated, if it was.
    pub fn invalidation_reason(&self, stream: MockStream) -> Option<String> {
        let st = self.inner.lock();
        let id = st.streams.get(stream.0 as usize)?.capture?;
        st.captures.get(&id)?.reason.clone()
    }

    /// Number of captures begun and not yet ended (active or invalidated).
    pub fn captures_underway(&self) -> usize {
        self.inner.lock().captures.len()
    }

    /// Number of nodes in the graph the capture of `stream` is building.
    pub fn capture_node_count(&self, stream: MockStream) -> Option<usize> {
        let st = self.inner.lock();
        let id = st.streams.get(stream.0 as usize)?.capture?;
        Some(st.captures.get(&id)?.nodes.len())
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

/// Simulated virtual memory; see the [crate documentation](crate) for the
/// model and the errors of each misuse.
impl VirtualMemory for MockBackend {
    type Physical = MockPhysical;

    fn granularity(&self) -> Result<u64, BackendError> {
        self.call(MockCall::Granularity, |st| {
            st.vmm_enabled("granularity")?;
            Ok(st.vmm.granularity)
        })
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceAllocError> {
        self.alloc_call(MockCall::Reserve, |st| st.reserve(size))
    }

    fn unreserve(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.call(MockCall::Unreserve, |st| st.unreserve(addr, size))
    }

    fn create_physical(&self, size: u64) -> Result<MockPhysical, DeviceAllocError> {
        self.alloc_call(MockCall::CreatePhysical, |st| st.create_physical(size))
    }

    fn release_physical(&self, physical: MockPhysical) -> Result<(), BackendError> {
        self.call(MockCall::ReleasePhysical, |st| {
            st.release_physical(&physical)
        })
    }

    fn map(&self, addr: u64, size: u64, physical: &MockPhysical) -> Result<(), BackendError> {
        self.call(MockCall::Map, |st| st.map(addr, size, physical))
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.call(MockCall::Unmap, |st| st.unmap(addr, size))
    }

    fn set_access(&self, addr: u64, size: u64, device: DeviceIndex) -> Result<(), BackendError> {
        self.call(MockCall::SetAccess, |st| st.set_access(addr, size, device))
    }

    fn export_physical(&self, physical: &MockPhysical) -> Result<Option<i32>, BackendError> {
        let (instance, size) = {
            let st = self.inner.lock();
            st.vmm_enabled("export_physical")?;
            let ph = st.vmm.phys("export_physical", st.instance, physical)?;
            (st.instance, ph.size)
        };
        crate::ipc::export_physical(instance, physical.id, size).map(Some)
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

impl GraphCapture<MockStream> for MockBackend {
    type Node = MockNode;

    fn capture_state(
        &self,
        stream: MockStream,
        terminals: &mut Vec<MockNode>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        self.call(MockCall::CaptureState, |st| {
            st.capture_state(stream, terminals)
        })
    }

    fn node_index(&self, capture: u64, node: MockNode) -> Option<u32> {
        (self.node_numbers && node.capture == capture).then_some(node.index)
    }

    fn mark_ancestors(
        &self,
        capture: u64,
        from: &[MockNode],
        visited: &mut Vec<u64>,
    ) -> Result<bool, BackendError> {
        let numbered = self.node_numbers;
        self.call(MockCall::MarkAncestors, |st| {
            if !numbered {
                return Ok(false);
            }
            Ok(match st.mark_ancestors(capture, from, visited) {
                Some(expanded) => {
                    st.counters.node_dependencies += expanded;
                    true
                }
                None => false,
            })
        })
    }

    fn extend_node_dependencies(
        &self,
        node: MockNode,
        out: &mut Vec<MockNode>,
    ) -> Result<(), BackendError> {
        self.call(MockCall::ExtendNodeDependencies, |st| {
            st.extend_node_dependencies(node, out)
        })
    }

    fn add_empty_node(
        &self,
        stream: MockStream,
        deps: &[MockNode],
    ) -> Result<MockNode, BackendError> {
        self.call(MockCall::AddEmptyNode, |st| st.add_empty_node(stream, deps))
    }

    fn update_capture_dependencies(
        &self,
        stream: MockStream,
        nodes: &[MockNode],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        self.call(MockCall::UpdateCaptureDependencies, |st| {
            st.update_capture_dependencies(stream, nodes, mode)
        })
    }
}
