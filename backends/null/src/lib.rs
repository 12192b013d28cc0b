//! # cachalot-null
//!
//! The least a port of cachalot must write: [`NullBackend`] implements
//! [`cachalot_core::Backend`] for a device that lives on the host. Its
//! "device memory" is a range of numbers (no byte is ever allocated): a
//! segment is a first-fit slot in `[BASE, BASE + capacity)`, its work
//! completes the moment it is queued (so every event is complete), and its
//! streams are plain `u32`s. It has neither graph capture ([`NoCapture`])
//! nor virtual memory ([`NoVirtualMemory`]).
//!
//! Read it next to `PORTING.md`: each method's documentation says what any
//! backend must guarantee there, and how this one does it.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use cachalot_core::{
    Backend, BackendError, DeviceAllocError, DeviceIndex, MemoryInfo, NoCapture, NoVirtualMemory,
};
use parking_lot::Mutex;

/// The name the backend reports, and puts in its errors.
pub const NAME: &str = "null";
/// The first address handed out. Never 0: the engine uses 0 as "null".
pub const BASE: u64 = 1 << 32;
/// The largest capacity [`NullBackend::new`] accepts (larger ones are clamped).
pub const MAX_CAPACITY: u64 = 1 << 60;
/// [`BackendError::code`] of a `malloc` size that is 0 or not a multiple of 512.
pub const ERR_INVALID_SIZE: i64 = 1;
/// [`BackendError::code`] of a `free` of an address `malloc` did not return.
pub const ERR_UNKNOWN_ADDRESS: i64 = 2;
/// [`BackendError::code`] of a `free` whose size differs from the `malloc`.
pub const ERR_WRONG_SIZE: i64 = 3;
/// [`BackendError::code`] of a stream this backend never created.
pub const ERR_UNKNOWN_STREAM: i64 = 4;

/// A stream: a plain number; 0 is the default stream.
pub type NullStream = u32;

/// An event. Work completes at once, so an event carries no state: it is
/// complete from the moment it is recorded (and before).
#[derive(Debug)]
pub struct NullEvent {
    _private: (),
}

/// The live segments, start address to size.
#[derive(Debug, Default)]
struct Segments {
    live: BTreeMap<u64, u64>,
    used: u64,
}

/// A host-side device of a fixed capacity. See the crate documentation.
#[derive(Debug)]
pub struct NullBackend {
    capacity: u64,
    segments: Mutex<Segments>,
    next_stream: AtomicU32,
    live_events: AtomicUsize,
}

fn error(call: &'static str, code: i64, message: String) -> BackendError {
    BackendError::new(NAME, call, code, message)
}

impl NullBackend {
    /// A device with `capacity` bytes (rounded down to a multiple of 512,
    /// at most [`MAX_CAPACITY`]) and only the default stream.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity: capacity.min(MAX_CAPACITY) / 512 * 512,
            segments: Mutex::new(Segments::default()),
            next_stream: AtomicU32::new(1),
            live_events: AtomicUsize::new(0),
        }
    }

    /// A new stream. Streams are never destroyed (they own nothing).
    pub fn create_stream(&self) -> NullStream {
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    /// Number of segments `malloc` handed out and `free` has not taken back.
    pub fn live_segments(&self) -> usize {
        self.segments.lock().live.len()
    }

    /// Number of events created and not yet destroyed.
    pub fn live_events(&self) -> usize {
        self.live_events.load(Ordering::Relaxed)
    }

    fn check_stream(&self, call: &'static str, stream: NullStream) -> Result<(), BackendError> {
        if stream < self.next_stream.load(Ordering::Relaxed) {
            Ok(())
        } else {
            let message = format!("stream {stream} was not created by this backend");
            Err(error(call, ERR_UNKNOWN_STREAM, message))
        }
    }
}

impl Backend for NullBackend {
    /// Copy, `Ord` and `Hash`: the free-block index is keyed by stream first.
    /// Wrap a raw driver handle in a newtype over `u64` (`Send + Sync`).
    type Stream = NullStream;
    /// Owned, moved back into [`Backend::destroy_event`] when the engine's
    /// event pool lets it go.
    type Event = NullEvent;
    /// Converts losslessly to and from the engine's `u64` addresses.
    type Ptr = u64;
    /// No graph capture: the engine rejects capture-id pool filters.
    type Capture = NoCapture;
    /// No virtual memory: the engine uses fixed segments on this backend.
    type VirtualMemory = NoVirtualMemory;

    /// Named in errors, OOM reports and statistics.
    fn name(&self) -> &'static str {
        NAME
    }

    /// The index the backend was opened on.
    fn device(&self) -> DeviceIndex {
        0
    }

    /// The stream of callers that name none (CUDA's stream 0); valid for
    /// the backend's whole life.
    fn default_stream(&self) -> NullStream {
        0
    }

    /// The engine asks only on a cache miss, for a multiple of 512 bytes.
    /// `OutOfMemory` means "no room now" and makes the engine free cached
    /// segments and retry, so it must be returned for that and nothing
    /// else; any other failure (here: a size that breaks the contract) is
    /// `Backend(..)` and is never retried. The address is never 0.
    fn malloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        if size == 0 || !size.is_multiple_of(512) {
            let message = format!("size {size} is not a positive multiple of 512");
            return Err(error("malloc", ERR_INVALID_SIZE, message).into());
        }
        let mut seg = self.segments.lock();
        if size > self.capacity - seg.used {
            return Err(DeviceAllocError::OutOfMemory);
        }
        // First fit: the lowest gap between live segments that is big enough.
        let mut start = BASE;
        for (&addr, &len) in &seg.live {
            if addr - start >= size {
                break;
            }
            start = addr + len;
        }
        if BASE + self.capacity - start < size {
            return Err(DeviceAllocError::OutOfMemory); // fragmented
        }
        seg.live.insert(start, size);
        seg.used += size;
        Ok(start)
    }

    /// Gets back exactly what `malloc` returned, with its size. A real
    /// backend must not release memory that queued work still uses (wait
    /// first if the driver does not, as `cudaFree` does); here no work is
    /// ever pending. A misuse is a typed error that changes nothing.
    fn free(&self, ptr: u64, size: u64) -> Result<(), BackendError> {
        let mut seg = self.segments.lock();
        match seg.live.get(&ptr) {
            None => {
                let message = format!("{ptr:#x} is not a live segment");
                Err(error("free", ERR_UNKNOWN_ADDRESS, message))
            }
            Some(&len) if len != size => {
                let message = format!("segment {ptr:#x} has {len} bytes, not {size}");
                Err(error("free", ERR_WRONG_SIZE, message))
            }
            Some(_) => {
                seg.live.remove(&ptr);
                seg.used -= size;
                Ok(())
            }
        }
    }

    /// Free and total bytes. A device that cannot report free memory
    /// reports, as this one does, the total minus what it handed out.
    fn memory_info(&self) -> Result<MemoryInfo, BackendError> {
        let used = self.segments.lock().used;
        Ok(MemoryInfo {
            free: self.capacity - used,
            total: self.capacity,
        })
    }

    /// The engine pools events, so this runs rarely; create without timing.
    fn create_event(&self) -> Result<NullEvent, BackendError> {
        self.live_events.fetch_add(1, Ordering::Relaxed);
        Ok(NullEvent { _private: () })
    }

    /// Called for every pooled event when the cache is emptied or dropped.
    fn destroy_event(&self, _event: NullEvent) -> Result<(), BackendError> {
        self.live_events.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Marks the current tail of `stream`. The engine re-records an event
    /// only once it has completed, so a backend may reset it here. All work
    /// has already completed, so there is nothing to mark.
    fn record_event(&self, _event: &NullEvent, stream: NullStream) -> Result<(), BackendError> {
        self.check_stream("record_event", stream)
    }

    /// `Ok(false)` means "not yet", never an error. Always `Ok(true)` here.
    fn query_event(&self, _event: &NullEvent) -> Result<bool, BackendError> {
        Ok(true)
    }

    /// Returns once the event's work has completed: at once here.
    fn synchronize_event(&self, _event: &NullEvent) -> Result<(), BackendError> {
        Ok(())
    }

    /// Orders later work on `stream` after the event; nothing to order here.
    fn stream_wait_event(
        &self,
        stream: NullStream,
        _event: &NullEvent,
    ) -> Result<(), BackendError> {
        self.check_stream("stream_wait_event", stream)
    }

    /// Returns once every stream is idle: they always are.
    fn synchronize_device(&self) -> Result<(), BackendError> {
        Ok(())
    }

    // `capture` and `virtual_memory` keep their defaults: `None`.
}
