//! Configuration of a simulated device.

use cachalot_core::DeviceIndex;

use crate::MockBackend;
use crate::space::{CHUNK, Placement};
use crate::types::CaptureMode;

/// Default lowest address of the simulated address range.
pub const DEFAULT_BASE_ADDRESS: u64 = 0x7f00_0000_0000;

/// Smallest default address range (1 TiB).
const MIN_ADDRESS_SPACE: u64 = 1 << 40;

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
    /// Whether submitted work completes immediately (trace replays).
    pub auto_complete: bool,
    /// How strictly host calls are policed during capture.
    pub capture_mode: CaptureMode,
    /// Whether memory uses are checked for races.
    pub race_checking: bool,
    /// Lowest address of the range (rounded up to 32 MiB).
    pub base_address: u64,
    /// Size of the address range; `None` = `max(1 TiB, 4 × capacity)`
    /// (rounded up to 32 MiB). Placement fails with OOM when the range, not
    /// the capacity, is exhausted.
    pub address_space: Option<u64>,
    /// Whether `Backend::node_index` numbers graph nodes (their creation
    /// index). Off, the mock answers like a backend without numbers (CUDA):
    /// the engine numbers nodes itself and walks the graph node by node
    /// through `Backend::extend_node_dependencies`.
    pub node_numbers: bool,
}

impl MockConfig {
    /// Defaults: device 0, [`Placement::Cuda13`], manual completion,
    /// [`CaptureMode::Global`], race checking on, base `0x7f00_0000_0000`,
    /// graph nodes numbered.
    pub fn new(total_memory: u64) -> Self {
        Self {
            device: 0,
            total_memory,
            placement: Placement::default(),
            auto_complete: false,
            capture_mode: CaptureMode::default(),
            race_checking: true,
            base_address: DEFAULT_BASE_ADDRESS,
            address_space: None,
            node_numbers: true,
        }
    }

    /// Sets whether graph nodes are numbered for the engine (see
    /// [`MockConfig::node_numbers`]).
    pub fn node_numbers(mut self, on: bool) -> Self {
        self.node_numbers = on;
        self
    }

    /// Sets the device index.
    pub fn device(mut self, device: DeviceIndex) -> Self {
        self.device = device;
        self
    }

    /// Sets the placement policy.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Sets auto-completion of submitted work.
    pub fn auto_complete(mut self, on: bool) -> Self {
        self.auto_complete = on;
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
        self.base_address = base;
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
        let base = round(self.base_address).min(u64::MAX / 2 / CHUNK * CHUNK);
        let want = match self.address_space {
            Some(s) => round(s),
            None => round(self.total_memory)
                .saturating_mul(4)
                .max(MIN_ADDRESS_SPACE),
        };
        let room = (u64::MAX - base) / CHUNK * CHUNK;
        (base, want.min(room))
    }
}
