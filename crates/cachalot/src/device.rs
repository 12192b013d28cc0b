//! One device's allocator over the backend chosen at run time:
//! [`DeviceAllocator`], backend-neutral [`Stream`]s, and the dispatch enum.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cachalot_core::engine::{HistoryConfig, ObserverId, OomObserver, Snapshot, TraceEntry};
use cachalot_core::replay::{MAX_TRACE_STREAMS, ReplayError, ReplayReport, ThreadsReport, Trace};
use cachalot_core::{
    AllocatorConfig, Backend, CachingAllocator, DeviceIndex, DeviceStats, Error, MemoryInfo,
    OomReport,
};
use cachalot_mock::MockBackend;
use parking_lot::{Mutex, RwLock};

use crate::backend::{BackendKind, FacadeBackend, MockSettings};
use crate::buffer::DeviceBuffer;
use crate::summary;

/// Most streams [`DeviceAllocator::replay`] creates for one trace: the most
/// distinct streams a parsed trace may use
/// ([`cachalot_core::replay::MAX_TRACE_STREAMS`]). A trace using more is an
/// error, never folded onto fewer streams.
pub const MAX_REPLAY_STREAMS: u32 = MAX_TRACE_STREAMS;

/// Most threads [`DeviceAllocator::threads_bench`] runs (each on a new stream).
pub const MAX_BENCH_THREADS: usize = 256;

/// A backend-neutral stream handle: a device index and the stream's slot in
/// that device's stream table (slot 0 is the backend's default stream).
///
/// Cheap to copy; valid for the [`DeviceAllocator`] that made it (and, for
/// the global allocators, for the life of the process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stream {
    device: DeviceIndex,
    slot: u32,
}

impl Stream {
    /// The default stream of `device` (always valid).
    pub const fn default_for(device: DeviceIndex) -> Self {
        Self { device, slot: 0 }
    }

    /// The device the stream belongs to.
    pub fn device(self) -> DeviceIndex {
        self.device
    }

    /// The stream's slot in its device's stream table (0 = default stream).
    pub fn slot(self) -> u32 {
        self.slot
    }

    /// Whether this is the device's default stream.
    pub fn is_default(self) -> bool {
        self.slot == 0
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {} stream {}", self.device, self.slot)
    }
}

/// The caching allocator of one backend with the device's stream table.
pub(crate) struct Engine<B: FacadeBackend> {
    // Declared first: dropped (releasing memory) before the streams it may use.
    alloc: CachingAllocator<B>,
    streams: RwLock<Vec<B::Stream>>,
    owned: Mutex<Vec<B::Owned>>,
}

impl<B: FacadeBackend> Engine<B> {
    fn new(backend: B, config: Option<AllocatorConfig>) -> Result<Self, Error> {
        let default = backend.default_stream();
        let alloc = match config {
            Some(c) => CachingAllocator::with_config(backend, c)?,
            None => CachingAllocator::new(backend)?,
        };
        Ok(Self {
            alloc,
            streams: RwLock::new(vec![default]),
            owned: Mutex::new(Vec::new()),
        })
    }

    #[inline]
    fn stream(&self, slot: u32) -> Result<B::Stream, Error> {
        self.streams
            .read()
            .get(slot as usize)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("unknown stream slot {slot}")))
    }

    fn new_stream(&self) -> Result<u32, Error> {
        let (s, owned) = self.alloc.backend().create_stream()?;
        let mut table = self.streams.write();
        let slot = u32::try_from(table.len())
            .map_err(|_| Error::InvalidArgument("too many streams".into()))?;
        table.push(s);
        if let Some(o) = owned {
            self.owned.lock().push(o);
        }
        Ok(slot)
    }

    fn stream_handle(&self, slot: u32) -> Result<u64, Error> {
        self.stream(slot).map(B::stream_handle)
    }

    fn stream_count(&self) -> usize {
        self.streams.read().len()
    }

    fn allocate(&self, size: u64, slot: u32) -> Result<u64, Error> {
        let s = self.stream(slot)?;
        self.alloc.allocate(size, s)
    }

    fn record_stream(&self, ptr: u64, slot: u32) -> Result<(), Error> {
        let s = self.stream(slot)?;
        self.alloc.record_stream(ptr, s)
    }

    fn replay(
        &self,
        trace: &Trace,
        passes: usize,
        slots: &[u32],
        progress: &mut dyn FnMut(usize),
    ) -> Result<ReplayReport, ReplayError> {
        let streams = slots
            .iter()
            .map(|&s| self.stream(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ReplayError::whole(trace, e))?;
        cachalot_core::replay::replay(&self.alloc, &streams, trace, passes, progress)
    }

    fn threads_bench(&self, slots: &[u32], ops: u64) -> Result<ThreadsReport, Error> {
        let streams = slots
            .iter()
            .map(|&s| self.stream(s))
            .collect::<Result<Vec<_>, _>>()?;
        cachalot_core::replay::threads_bench(&self.alloc, &streams, ops)
    }
}

/// The dispatch enum: one variant per compiled-in backend.
pub(crate) enum AnyAllocator {
    Mock(Engine<MockBackend>),
    #[cfg(feature = "cuda")]
    Cuda(Engine<cachalot_cuda::CudaBackend>),
    #[cfg(feature = "hip")]
    Hip(Engine<cachalot_hip::HipBackend>),
    #[cfg(feature = "level-zero")]
    LevelZero(Engine<cachalot_level_zero::LevelZeroBackend>),
}

/// Runs `$body` with `$e` bound to the variant's `Engine<B>`.
///
/// Why a macro and not a dispatch trait (`enum_dispatch` style): every
/// public method of [`DeviceAllocator`] is one `dispatch!` line that calls
/// the generic `Engine<B>` or `CachingAllocator<B>` method directly, and the
/// arm is monomorphized per backend exactly as `enum_dispatch`'s generated
/// `match` would be (no vtable either way). A trait over `Engine<B>` would
/// add a third copy of each of those ~25 signatures (trait declaration,
/// impl for `Engine<B>`, the `DeviceAllocator` method that stays public),
/// and every `CachingAllocator` method reached through `e.alloc` would need
/// a forwarding method in it; the `#[cfg(feature)]` variants stay in this
/// one place instead of on the enum, the trait impl and the macro input.
/// Revisit if a second enum needs the same dispatch.
macro_rules! dispatch {
    ($any:expr, $e:ident => $body:expr) => {
        match $any {
            AnyAllocator::Mock($e) => $body,
            #[cfg(feature = "cuda")]
            AnyAllocator::Cuda($e) => $body,
            #[cfg(feature = "hip")]
            AnyAllocator::Hip($e) => $body,
            #[cfg(feature = "level-zero")]
            AnyAllocator::LevelZero($e) => $body,
        }
    };
}

// Streams the caller owns, for the C ABI (`cachalot-capi`); after `dispatch!`.
mod foreign;

/// The caching allocator of one device, over the backend chosen at run time.
///
/// Get the process-wide one with [`crate::allocator`], or open a private one
/// with [`DeviceAllocator::open`] / [`DeviceAllocator::with_mock`].
pub struct DeviceAllocator {
    index: DeviceIndex,
    kind: BackendKind,
    inner: AnyAllocator,
}

impl fmt::Debug for DeviceAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAllocator")
            .field("device", &self.index)
            .field("backend", &self.kind)
            .finish_non_exhaustive()
    }
}

impl DeviceAllocator {
    /// Opens device `index` of backend `kind` with `config` (or, when
    /// `None`, the configuration from the environment: `CACHALOT_ALLOC_CONF`,
    /// then PyTorch's variables). This allocator is private to the caller,
    /// not the global one. Mock devices use [`MockSettings::from_env`].
    pub fn open(
        kind: BackendKind,
        index: DeviceIndex,
        config: Option<AllocatorConfig>,
    ) -> Result<Arc<Self>, Error> {
        let inner = match kind {
            BackendKind::Mock => {
                let settings = MockSettings::from_env()?;
                if index >= settings.devices {
                    return Err(Error::InvalidArgument(format!(
                        "mock device index {index} out of range ({} device(s))",
                        settings.devices
                    )));
                }
                AnyAllocator::Mock(Engine::new(settings.backend(index), config)?)
            }
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => AnyAllocator::Cuda(Engine::new(
                cachalot_cuda::CudaBackend::new(index)?,
                config,
            )?),
            #[cfg(feature = "hip")]
            BackendKind::Hip => {
                AnyAllocator::Hip(Engine::new(cachalot_hip::HipBackend::new(index)?, config)?)
            }
            #[cfg(feature = "level-zero")]
            BackendKind::LevelZero => AnyAllocator::LevelZero(Engine::new(
                cachalot_level_zero::LevelZeroBackend::new(index)?,
                config,
            )?),
            #[allow(unreachable_patterns)]
            other => return Err(other.not_compiled()),
        };
        Ok(Arc::new(Self { index, kind, inner }))
    }

    /// An allocator over a mock device the caller configured (e.g. with a
    /// chosen capacity or placement).
    pub fn with_mock(
        backend: MockBackend,
        config: Option<AllocatorConfig>,
    ) -> Result<Arc<Self>, Error> {
        let index = backend.device();
        Ok(Arc::new(Self {
            index,
            kind: BackendKind::Mock,
            inner: AnyAllocator::Mock(Engine::new(backend, config)?),
        }))
    }

    /// The device index.
    pub fn index(&self) -> DeviceIndex {
        self.index
    }

    /// The backend kind.
    pub fn backend_kind(&self) -> BackendKind {
        self.kind
    }

    /// The typed allocator when the backend is the mock.
    pub fn as_mock(&self) -> Option<&CachingAllocator<MockBackend>> {
        #[allow(irrefutable_let_patterns)]
        if let AnyAllocator::Mock(e) = &self.inner {
            Some(&e.alloc)
        } else {
            None
        }
    }

    /// The typed allocator when the backend is CUDA.
    #[cfg(feature = "cuda")]
    pub fn as_cuda(&self) -> Option<&CachingAllocator<cachalot_cuda::CudaBackend>> {
        match &self.inner {
            AnyAllocator::Cuda(e) => Some(&e.alloc),
            _ => None,
        }
    }

    /// The typed allocator when the backend is HIP.
    #[cfg(feature = "hip")]
    pub fn as_hip(&self) -> Option<&CachingAllocator<cachalot_hip::HipBackend>> {
        match &self.inner {
            AnyAllocator::Hip(e) => Some(&e.alloc),
            _ => None,
        }
    }

    /// The typed allocator when the backend is Level Zero.
    #[cfg(feature = "level-zero")]
    pub fn as_level_zero(
        &self,
    ) -> Option<&CachingAllocator<cachalot_level_zero::LevelZeroBackend>> {
        match &self.inner {
            AnyAllocator::LevelZero(e) => Some(&e.alloc),
            _ => None,
        }
    }

    fn check_stream(&self, stream: Stream) -> Result<u32, Error> {
        if stream.device != self.index {
            return Err(Error::InvalidArgument(format!(
                "{stream} used with the allocator of device {}",
                self.index
            )));
        }
        Ok(stream.slot)
    }

    /// The backend's default stream of this device.
    pub fn default_stream(&self) -> Stream {
        Stream::default_for(self.index)
    }

    /// Creates a new stream owned by this allocator (destroyed when it is dropped).
    pub fn new_stream(&self) -> Result<Stream, Error> {
        let slot = dispatch!(&self.inner, e => e.new_stream())?;
        Ok(Stream {
            device: self.index,
            slot,
        })
    }

    /// `n` streams: the default stream first, then streams of the table in
    /// order, created as needed.
    pub fn streams(&self, n: usize) -> Result<Vec<Stream>, Error> {
        while dispatch!(&self.inner, e => e.stream_count()) < n {
            self.new_stream()?;
        }
        Ok((0..n as u32)
            .map(|slot| Stream {
                device: self.index,
                slot,
            })
            .collect())
    }

    /// The native handle of `stream` as a number (the `cudaStream_t` /
    /// `hipStream_t` / command-list value; the mock's stream index), for FFI.
    pub fn stream_handle(&self, stream: Stream) -> Result<u64, Error> {
        let slot = self.check_stream(stream)?;
        dispatch!(&self.inner, e => e.stream_handle(slot))
    }

    /// Allocates `size` bytes for use on `stream`, freed when the returned
    /// buffer is dropped.
    pub fn allocate(self: &Arc<Self>, size: u64, stream: Stream) -> Result<DeviceBuffer, Error> {
        let ptr = self.raw_alloc(size, stream)?;
        Ok(DeviceBuffer::from_parts(self.clone(), ptr, size, stream))
    }

    /// Allocates `size` bytes for use on `stream` and returns the raw device
    /// address (0 for a request of 0 bytes). Free it with [`Self::raw_free`].
    pub fn raw_alloc(&self, size: u64, stream: Stream) -> Result<u64, Error> {
        let slot = self.check_stream(stream)?;
        dispatch!(&self.inner, e => e.allocate(size, slot))
    }

    /// Frees an address returned by [`Self::raw_alloc`] (0 is a no-op).
    pub fn raw_free(&self, ptr: u64) -> Result<(), Error> {
        dispatch!(&self.inner, e => e.alloc.free(ptr))
    }

    /// Marks the allocation at `ptr` as used on `stream` (PyTorch's
    /// `record_stream`): its memory is not reused before the work queued on
    /// `stream` up to its free has completed.
    pub fn record_stream(&self, ptr: u64, stream: Stream) -> Result<(), Error> {
        let slot = self.check_stream(stream)?;
        dispatch!(&self.inner, e => e.record_stream(ptr, slot))
    }

    /// The block size behind a live allocation.
    pub fn block_size(&self, ptr: u64) -> Option<u64> {
        dispatch!(&self.inner, e => e.alloc.block_size(ptr))
    }

    /// Releases every unused cached segment to the device.
    pub fn empty_cache(&self) -> Result<(), Error> {
        dispatch!(&self.inner, e => e.alloc.empty_cache())
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        dispatch!(&self.inner, e => e.alloc.stats())
    }

    /// The flat, sorted statistics with PyTorch's 122 keys.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().to_flat()
    }

    /// [`Self::memory_stats`] nested at the dots of its keys
    /// (`torch.cuda.memory_stats_as_nested_dict`).
    pub fn memory_stats_as_nested_dict(&self) -> BTreeMap<String, crate::memory::NestedStat> {
        crate::memory::nest_stats(&self.memory_stats())
    }

    /// Peaks := current values.
    pub fn reset_peak_memory_stats(&self) {
        dispatch!(&self.inner, e => e.alloc.reset_peak_stats())
    }

    /// Cumulative counters := 0.
    pub fn reset_accumulated_memory_stats(&self) {
        dispatch!(&self.inner, e => e.alloc.reset_accumulated_stats())
    }

    /// Free and total device memory as the driver reports them.
    pub fn memory_info(&self) -> Result<MemoryInfo, Error> {
        Ok(dispatch!(&self.inner, e => e.alloc.backend().memory_info())?)
    }

    /// The allocator configuration.
    pub fn config(&self) -> AllocatorConfig {
        dispatch!(&self.inner, e => e.alloc.config())
    }

    /// Applies a config string at run time (on error nothing changes).
    pub fn set_config(&self, config: &str) -> Result<(), Error> {
        dispatch!(&self.inner, e => e.alloc.set_config(config))
    }

    /// `torch.cuda.set_per_process_memory_fraction` for this device: caps
    /// the allocator at `fraction` (in `[0, 1]`, else an error and nothing
    /// changes) of the device memory.
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        dispatch!(&self.inner, e => e.alloc.set_memory_fraction(fraction))
    }

    /// The old name of [`Self::set_per_process_memory_fraction`].
    #[deprecated(
        since = "0.1.0",
        note = "use `set_per_process_memory_fraction` (torch.cuda's name)"
    )]
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        self.set_per_process_memory_fraction(fraction)
    }

    /// Registers a callback run on every out-of-memory error of this device,
    /// before the error returns.
    /// Returns its handle for [`Self::remove_oom_observer`]. The observer
    /// runs with no allocator lock held and may call back into it.
    pub fn add_oom_observer(
        &self,
        observer: impl Fn(&OomReport) + Send + Sync + 'static,
    ) -> ObserverId {
        self.add_oom_observer_arc(Arc::new(observer))
    }

    pub(crate) fn add_oom_observer_arc(&self, observer: OomObserver) -> ObserverId {
        dispatch!(&self.inner, e => e.alloc.add_oom_observer(observer))
    }

    /// Unregisters an observer of this device; false when not registered.
    pub fn remove_oom_observer(&self, id: ObserverId) -> bool {
        dispatch!(&self.inner, e => e.alloc.remove_oom_observer(id))
    }

    /// Turns the memory history on (`Some`; while on, new settings keep the
    /// entries, as PyTorch's) or off (`None`, clearing it).
    pub fn record_memory_history(&self, config: Option<HistoryConfig>) {
        dispatch!(&self.inner, e => e.alloc.record_memory_history(config))
    }

    /// Drops the memory history's entries, keeping it on
    /// (`clear_history=True`).
    pub fn clear_memory_history(&self) {
        dispatch!(&self.inner, e => e.alloc.clear_memory_history())
    }

    /// The settings of the memory history, `None` when it is off.
    pub fn history_config(&self) -> Option<HistoryConfig> {
        dispatch!(&self.inner, e => e.alloc.history_config())
    }

    /// Records a `record_function` annotation while the history is on.
    pub fn record_annotation(&self, metadata: Vec<(String, String)>) {
        dispatch!(&self.inner, e => e.alloc.record_annotation(metadata))
    }

    /// The memory history, oldest entry first.
    pub fn memory_history(&self) -> Vec<TraceEntry> {
        dispatch!(&self.inner, e => e.alloc.memory_history())
    }

    /// Every segment and block, with the memory history.
    pub fn snapshot(&self) -> Snapshot {
        dispatch!(&self.inner, e => e.alloc.snapshot())
    }

    /// Largest cached free block.
    pub fn largest_free_block(&self) -> u64 {
        dispatch!(&self.inner, e => e.alloc.largest_free_block())
    }

    /// Live allocations as (address, block size), by address.
    pub fn live_allocations(&self) -> Vec<(u64, u64)> {
        dispatch!(&self.inner, e => e.alloc.live_allocations())
    }

    /// Checks the engine's bookkeeping invariants.
    pub fn check_invariants(&self) -> Result<(), String> {
        dispatch!(&self.inner, e => e.alloc.check_invariants())
    }

    /// The table of `torch.cuda.memory_summary()` for this device.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        summary::render(
            &self.memory_stats(),
            self.index,
            summary::SummaryLabels::for_backend(self.kind.as_str()),
            abbreviated,
        )
    }

    /// Replays `trace` `passes` times as PyTorch's `cca_replay` does (see
    /// [`cachalot_core::replay::replay`]), the trace's dense stream `i` on
    /// stream slot `i` (streams are created as needed, one per stream the
    /// trace uses). `progress` is called after each pass. A trace using more
    /// than [`MAX_REPLAY_STREAMS`] streams is an error; so is a failed
    /// operation, named by its index, line and text.
    pub fn replay(
        &self,
        trace: &Trace,
        passes: usize,
        mut progress: impl FnMut(usize),
    ) -> Result<ReplayReport, ReplayError> {
        let n = trace.num_streams.max(1);
        if n > MAX_REPLAY_STREAMS {
            return Err(ReplayError::whole(
                trace,
                Error::InvalidArgument(format!(
                    "the trace uses {n} streams, more than the {MAX_REPLAY_STREAMS} a replay creates"
                )),
            ));
        }
        let streams = self
            .streams(n as usize)
            .map_err(|e| ReplayError::whole(trace, e))?;
        let slots: Vec<u32> = streams.iter().map(|s| s.slot).collect();
        dispatch!(&self.inner, e => e.replay(trace, passes, &slots, &mut progress))
    }

    /// The multi-thread benchmark of `cca_threads.cpp` (see
    /// [`cachalot_core::replay::threads_bench`]): `threads` threads, each on
    /// its own new stream, `ops` timed operations each; `threads` must be
    /// in `1..=MAX_BENCH_THREADS`.
    pub fn threads_bench(&self, threads: usize, ops: u64) -> Result<ThreadsReport, Error> {
        if !(1..=MAX_BENCH_THREADS).contains(&threads) {
            return Err(Error::InvalidArgument(format!(
                "thread count {threads} is outside 1..={MAX_BENCH_THREADS}"
            )));
        }
        let slots = (0..threads)
            .map(|_| self.new_stream().map(|s| s.slot))
            .collect::<Result<Vec<u32>, _>>()?;
        dispatch!(&self.inner, e => e.threads_bench(&slots, ops))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_device_basics() {
        let dev = DeviceAllocator::with_mock(
            MockSettings::default().backend(0),
            Some(AllocatorConfig::default()),
        )
        .unwrap();
        let s1 = dev.new_stream().unwrap();
        assert_eq!(s1.slot(), 1);
        assert_eq!(dev.stream_handle(s1).unwrap(), 1);
        let p = dev.raw_alloc(1000, s1).unwrap();
        assert_eq!(dev.block_size(p), Some(1024));
        dev.record_stream(p, dev.default_stream()).unwrap();
        dev.raw_free(p).unwrap();
        assert!(dev.raw_alloc(10, Stream::default_for(7)).is_err());
        assert!(
            dev.raw_alloc(
                10,
                Stream {
                    device: 0,
                    slot: 99
                }
            )
            .is_err()
        );
        assert_eq!(dev.memory_stats().len(), 122);
        dev.check_invariants().unwrap();
    }

    #[test]
    fn replay_creates_one_stream_per_trace_stream() {
        let dev = DeviceAllocator::with_mock(
            MockSettings::default().backend(0),
            Some(AllocatorConfig::default()),
        )
        .unwrap();
        // 40 streams with far-apart numbers: 40 streams, none folded
        let text: String = (0..40u64)
            .map(|i| format!("a {i} 4096 {}\n", i * 100_000_000))
            .collect();
        let trace = Trace::parse("t", &text).unwrap();
        assert_eq!(trace.num_streams, 40);
        dev.replay(&trace, 1, |_| {}).unwrap();
        assert_eq!(dispatch!(&dev.inner, e => e.stream_count()), 40);
        // a hand-built trace above the limit is an error, not a fold
        let mut big = trace.clone();
        big.num_streams = MAX_REPLAY_STREAMS + 1;
        let e = dev.replay(&big, 1, |_| {}).unwrap_err();
        assert!(matches!(*e.source, Error::InvalidArgument(_)), "{e}");
        assert_eq!(dispatch!(&dev.inner, e => e.stream_count()), 40);
    }

    #[test]
    fn threads_bench_bounds_the_thread_count() {
        let dev = DeviceAllocator::with_mock(
            MockSettings::default().backend(0),
            Some(AllocatorConfig::default()),
        )
        .unwrap();
        for t in [0, MAX_BENCH_THREADS + 1, usize::MAX] {
            let e = dev.threads_bench(t, 10).unwrap_err();
            assert!(e.to_string().contains(&t.to_string()), "{e}");
        }
        assert_eq!(dev.threads_bench(2, 10).unwrap().threads, 2);
    }
}
