//! Mock-device helpers for the engine's tests.

use cachalot_core::replay::{ReplayReport, Trace, replay};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator};
use cachalot_mock::{MockBackend, MockConfig, MockStream};

use crate::Harness;

/// 2^20.
pub const MIB: u64 = 1 << 20;
/// 2^30.
pub const GIB: u64 = 1 << 30;
/// Fixed segments (PyTorch's default mode with cachalot's placement): the
/// config of the tests written for segments that never grow, since the
/// default on a backend with virtual memory is expandable segments.
pub const FIXED: &str = "expandable_segments:False";
/// Total memory of an NVIDIA H200 as the driver reports it.
pub const H200_BYTES: u64 = 150_754_820_096;

/// A mock device and an allocator over it, checking invariants after every
/// operation made through these helpers.
pub struct Dev {
    /// The mock (a clone shares the device).
    pub m: MockBackend,
    /// The allocator under test.
    pub a: CachingAllocator<MockBackend>,
}

impl Dev {
    fn build(config: &str, capacity: u64, auto: bool) -> Self {
        let m = MockConfig::new(capacity).auto_complete(auto).build();
        let a = CachingAllocator::with_config(
            m.clone(),
            AllocatorConfig::parse(config).expect("config"),
        )
        .expect("allocator");
        Self { m, a }
    }
    /// 80 GiB, work completes at once.
    pub fn new(config: &str) -> Self {
        Self::build(config, 80 * GIB, true)
    }
    /// Given capacity, work completes at once.
    pub fn with_capacity(config: &str, capacity: u64) -> Self {
        Self::build(config, capacity, true)
    }
    /// 80 GiB, work completes only when the test says so.
    pub fn manual(config: &str) -> Self {
        Self::build(config, 80 * GIB, false)
    }
    /// Given capacity, work completes only when the test says so.
    pub fn manual_with_capacity(config: &str, capacity: u64) -> Self {
        Self::build(config, capacity, false)
    }
    /// The default stream.
    pub fn s0(&self) -> MockStream {
        self.m.default_stream()
    }
    /// A new stream.
    pub fn stream(&self) -> MockStream {
        self.m.create_stream()
    }
    /// Allocates on the default stream (panics on error: tests only).
    pub fn alloc(&self, size: u64) -> u64 {
        self.alloc_on(size, self.s0())
    }
    /// Allocates on `stream`.
    pub fn alloc_on(&self, size: u64, stream: MockStream) -> u64 {
        let p = self.a.allocate(size, stream).expect("allocation");
        self.check();
        p
    }
    /// Frees and checks.
    pub fn free(&self, p: u64) {
        self.a.free(p).expect("free");
        self.check();
    }
    /// Drops the allocator (its segments go back to the device), then
    /// checks that no virtual-memory handle or address range leaked.
    pub fn drop_without_vmm_leaks(self) {
        let m = self.m.clone();
        drop(self);
        m.assert_no_vmm_leaks();
    }
    /// Runs the invariant checker.
    pub fn check(&self) {
        check(&self.a);
    }
}

/// Runs the invariant checker of `a` (panics on a violation: tests only).
pub fn check(a: &CachingAllocator<MockBackend>) {
    if let Err(e) = a.check_invariants() {
        panic!("invariant violated: {e}");
    }
}

/// Replays `trace` on an H200-sized auto-completing mock with `config`, as
/// `cca_replay.cpp` does on the GPU.
pub fn replay_on_mock(trace: &Trace, passes: usize, config: &str) -> ReplayReport {
    let m = MockConfig::new(H200_BYTES).auto_complete(true).build();
    let config = AllocatorConfig::parse(config).expect("config");
    let a = CachingAllocator::with_config(m.clone(), config).expect("allocator");
    let streams: Vec<MockStream> = std::iter::once(m.default_stream())
        .chain((1..16).map(|_| m.create_stream()))
        .collect();
    let r = replay(&a, &streams, trace, passes, |_| {}).expect("replay");
    a.check_invariants().expect("invariants after replay");
    r
}

/// The mock as a conformance-suite [`Harness`]: streams are kept busy by
/// unfinished work until released.
pub struct MockHarness;

impl Harness for MockHarness {
    type B = MockBackend;
    type OwnedStream = MockStream;

    fn name(&self) -> &'static str {
        "mock"
    }
    fn backend(&self) -> MockBackend {
        MockConfig::new(16 * GIB).auto_complete(false).build()
    }
    fn new_stream(&self, backend: &MockBackend) -> MockStream {
        backend.create_stream()
    }
    fn handle(&self, s: &MockStream) -> MockStream {
        *s
    }
    fn make_busy(&self, backend: &MockBackend, stream: MockStream) {
        backend.launch(stream).expect("launch");
    }
    fn release(&self, backend: &MockBackend, stream: MockStream) {
        backend.complete(stream).expect("complete");
    }
    fn fill(&self, backend: &MockBackend, addr: u64, len: u64, value: u8, stream: MockStream) {
        backend
            .use_memory(stream, addr, len, u64::from(value))
            .expect("use");
    }
    fn can_read(&self) -> bool {
        true
    }
    /// The tags last written over the range, one byte each (0 where nothing
    /// was written since the segment was allocated; `fill` writes values
    /// from 1).
    fn read(&self, backend: &MockBackend, addr: u64, len: u64) -> Option<Vec<u8>> {
        backend.synchronize_device().expect("sync");
        let mut out = Vec::with_capacity(len as usize);
        for (start, end, tag) in backend.read_tags(addr, len).expect("read") {
            let byte = tag.map_or(0, |t| u8::try_from(t).expect("fill writes byte tags"));
            out.resize(out.len() + (end - start) as usize, byte);
        }
        Some(out)
    }
}
