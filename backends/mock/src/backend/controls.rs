//! The test controls of [`MockBackend`]: inspection of memory and virtual
//! memory, simulated contents, failure injection, counters, streams and
//! work, the race checker, capture.

use super::*;

impl MockBackend {
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
