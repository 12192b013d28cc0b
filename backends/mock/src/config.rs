//! Configuration of a simulated device.

use cachalot_core::DeviceIndex;

use crate::MockBackend;
use crate::space::{CHUNK, Placement};
use crate::types::{CaptureMode, Completion};

/// Default lowest address of the simulated address range of device 0.
pub const DEFAULT_BASE_ADDRESS: u64 = 0x7f00_0000_0000;

/// Distance between the default ranges of consecutive device indices
/// (16 TiB): device `i` starts at `DEFAULT_BASE_ADDRESS + i ×
/// DEVICE_ADDRESS_STRIDE`, and a default-sized range never exceeds the
/// stride, so the default ranges of different devices are disjoint (for
/// device indices below 500 000) and a pointer of one device is unknown to
/// every other.
pub const DEVICE_ADDRESS_STRIDE: u64 = 1 << 44;

/// Smallest default address range (1 TiB).
const MIN_ADDRESS_SPACE: u64 = 1 << 40;

/// Default virtual-memory granularity (2 MiB, CUDA's minimum on current GPUs).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Settings of a [`MockBackend`]; build one with [`MockConfig::build`].
///
/// ```
/// use cachalot_mock::{MockConfig, Placement};
/// let dev = MockConfig::new(8 << 30)
///     .device(1)
///     .placement(Placement::Increasing)
///     .auto_complete(true)
///     .build();
/// assert_eq!(dev.capacity(), 8 << 30);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockConfig {
    /// Device index reported by `Backend::device`.
    pub device: DeviceIndex,
    /// Device capacity in bytes (`memory_info().total`).
    pub total_memory: u64,
    /// Where new segments are placed.
    pub placement: Placement,
    /// When submitted work completes.
    pub completion: Completion,
    /// How strictly host calls are policed during capture.
    pub capture_mode: CaptureMode,
    /// Whether memory uses are checked for races.
    pub race_checking: bool,
    /// Lowest address of the range (rounded up to 32 MiB); `None` = the
    /// device's own default, `DEFAULT_BASE_ADDRESS + device ×`
    /// [`DEVICE_ADDRESS_STRIDE`].
    pub base_address: Option<u64>,
    /// Size of the address range; `None` = `max(1 TiB, 4 × capacity)`
    /// (rounded up to 32 MiB), at most half of [`DEVICE_ADDRESS_STRIDE`]
    /// when the base is the default one (the rest of the span holds
    /// virtual-memory reservations). Placement fails with OOM when the range, not
    /// the capacity, is exhausted.
    pub address_space: Option<u64>,
    /// Whether `Backend::node_index` numbers graph nodes (their creation
    /// index). Off, the mock answers like a backend without numbers (CUDA):
    /// the engine numbers nodes itself and walks the graph node by node
    /// through `Backend::extend_node_dependencies`.
    pub node_numbers: bool,
    /// Whether the device has virtual memory: `Backend::virtual_memory`
    /// answers `Some` and the `VirtualMemory` calls work (off, they fail
    /// with [`crate::codes::NOT_SUPPORTED`]).
    pub virtual_memory: bool,
    /// The virtual-memory granularity in bytes: a power of two of at least
    /// 512 (other values are rounded up to one).
    pub granularity: u64,
}

impl MockConfig {
    /// Defaults: device 0, [`Placement::Cuda13`], [`Completion::Manual`],
    /// [`CaptureMode::Global`], race checking on, the device's default base
    /// (`0x7f00_0000_0000` for device 0), graph nodes numbered, virtual
    /// memory on with a granularity of [`DEFAULT_GRANULARITY`] (2 MiB).
    pub fn new(total_memory: u64) -> Self {
        Self {
            device: 0,
            total_memory,
            placement: Placement::default(),
            completion: Completion::Manual,
            capture_mode: CaptureMode::default(),
            race_checking: true,
            base_address: None,
            address_space: None,
            node_numbers: true,
            virtual_memory: true,
            granularity: DEFAULT_GRANULARITY,
        }
    }

    /// Turns virtual memory on or off (see [`MockConfig::virtual_memory`]).
    pub fn virtual_memory(mut self, on: bool) -> Self {
        self.virtual_memory = on;
        self
    }

    /// Sets the virtual-memory granularity (see [`MockConfig::granularity`]).
    pub fn granularity(mut self, bytes: u64) -> Self {
        self.granularity = bytes;
        self
    }

    /// Sets whether graph nodes are numbered for the engine (see
    /// [`MockConfig::node_numbers`]).
    pub fn node_numbers(mut self, on: bool) -> Self {
        self.node_numbers = on;
        self
    }

    /// Sets the device index (which also chooses the default address range,
    /// see [`DEVICE_ADDRESS_STRIDE`]).
    pub fn device(mut self, device: DeviceIndex) -> Self {
        self.device = device;
        self
    }

    /// Sets the placement policy.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Sets auto-completion of submitted work: on is
    /// [`Completion::Immediate`], off [`Completion::Manual`].
    pub fn auto_complete(mut self, on: bool) -> Self {
        self.completion = if on {
            Completion::Immediate
        } else {
            Completion::Manual
        };
        self
    }

    /// Sets when submitted work completes (e.g. late, [`Completion::Random`]).
    pub fn completion(mut self, completion: Completion) -> Self {
        self.completion = completion;
        self
    }

    /// Sets the capture mode.
    pub fn capture_mode(mut self, mode: CaptureMode) -> Self {
        self.capture_mode = mode;
        self
    }

    /// Turns race checking on or off.
    pub fn race_checking(mut self, on: bool) -> Self {
        self.race_checking = on;
        self
    }

    /// Sets the lowest address of the range.
    pub fn base_address(mut self, base: u64) -> Self {
        self.base_address = Some(base);
        self
    }

    /// Sets the size of the address range.
    pub fn address_space(mut self, size: u64) -> Self {
        self.address_space = Some(size);
        self
    }

    /// Builds the device.
    pub fn build(self) -> MockBackend {
        MockBackend::with_config(self)
    }

    /// The effective `(base, size)` of the address range: both multiples of
    /// 32 MiB, the end not overflowing.
    pub(crate) fn range(&self) -> (u64, u64) {
        let round = |x: u64| x.div_ceil(CHUNK).saturating_mul(CHUNK);
        let default_base = self.base_address.is_none();
        let base = self.base_address.unwrap_or_else(|| {
            DEFAULT_BASE_ADDRESS
                .saturating_add(u64::from(self.device).saturating_mul(DEVICE_ADDRESS_STRIDE))
        });
        let base = round(base).min(u64::MAX / 2 / CHUNK * CHUNK);
        let want = match self.address_space {
            Some(s) => round(s),
            None => {
                let w = round(self.total_memory)
                    .saturating_mul(4)
                    .max(MIN_ADDRESS_SPACE);
                if default_base {
                    // half the span at most: the other half stays for
                    // virtual-memory reservations (a 4 TiB device keeps 8
                    // TiB of address space for them)
                    w.min(DEVICE_ADDRESS_STRIDE / 2)
                } else {
                    w
                }
            }
        };
        let room = (u64::MAX - base) / CHUNK * CHUNK;
        (base, want.min(room))
    }

    /// The effective granularity: a power of two, at least 512.
    pub(crate) fn effective_granularity(&self) -> u64 {
        self.granularity
            .max(512)
            .checked_next_power_of_two()
            .unwrap_or(1 << 63)
    }

    /// The effective `[start, end)` of the range reservations are placed
    /// in, both multiples of the granularity: right above the segment range.
    /// With the default base it is the rest of the device's
    /// [`DEVICE_ADDRESS_STRIDE`] span (15 TiB for capacities up to 256 GiB,
    /// at least 8 TiB at any capacity); with a base of the caller's, `max(1
    /// TiB, 4 × capacity)`. Never overlaps the segment range.
    pub(crate) fn reservation_range(&self) -> (u64, u64) {
        let g = self.effective_granularity();
        let (base, size) = self.range();
        let seg_end = base + size;
        let span_end = DEFAULT_BASE_ADDRESS
            .saturating_add(u64::from(self.device).saturating_mul(DEVICE_ADDRESS_STRIDE))
            .saturating_add(DEVICE_ADDRESS_STRIDE);
        let end = if self.base_address.is_none() && seg_end <= span_end {
            span_end
        } else {
            let want = self.total_memory.saturating_mul(4).max(MIN_ADDRESS_SPACE);
            seg_end.saturating_add(want)
        };
        let start = seg_end.div_ceil(g).saturating_mul(g);
        let end = end / g * g;
        (start, end.max(start))
    }
}
