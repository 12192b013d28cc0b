//! Memory history: a bounded ring buffer of trace entries (PyTorch's
//! `_record_memory_history`), off by default and costing one branch when off.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

/// What happened (PyTorch's trace-entry actions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block was handed out.
    Alloc,
    /// The caller freed a block (it may still wait for other streams).
    FreeRequested,
    /// A block actually returned to its pool.
    FreeCompleted,
    /// A device segment was allocated.
    SegmentAlloc,
    /// A device segment was released.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// An allocation failed with out-of-memory (addr = device free bytes).
    Oom,
    /// A snapshot was taken.
    Snapshot,
}

impl TraceAction {
    /// PyTorch's string for the action.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
        }
    }
}

/// One entry of the memory history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Device address (device free bytes for `Oom`).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream (rendered with `Debug`).
    pub stream: String,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// Captured backtrace, when enabled.
    pub frames: Option<String>,
}

/// Settings of the memory history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Ring-buffer capacity (oldest entries are overwritten).
    pub max_entries: usize,
    /// Capture a backtrace for each entry (slow).
    pub backtraces: bool,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            backtraces: false,
        }
    }
}

pub(crate) struct History {
    pub config: HistoryConfig,
    pub ring: VecDeque<TraceEntry>,
}

impl History {
    pub fn new(config: HistoryConfig) -> Self {
        Self {
            config,
            ring: VecDeque::with_capacity(config.max_entries.min(1 << 16)),
        }
    }

    #[cold]
    pub fn push(&mut self, action: TraceAction, addr: u64, size: u64, stream: String) {
        if self.config.max_entries == 0 {
            return;
        }
        if self.ring.len() >= self.config.max_entries {
            self.ring.pop_front();
        }
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let frames = self
            .config
            .backtraces
            .then(|| std::backtrace::Backtrace::force_capture().to_string());
        self.ring.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
        });
    }
}
