//! `cudarc` interop: a caching allocator opened on the caller's
//! [`cudarc::driver::CudaContext`], the caller's
//! [`cudarc::driver::CudaStream`]s as its streams, and a typed buffer,
//! [`Slice<T>`] (with [`View`] / [`ViewMut`] sub-slices), that implements
//! cudarc's [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`], so that
//! `stream.memcpy_htod`, `memcpy_dtoh`, `memcpy_dtod`, `memset_zeros`,
//! cuBLAS calls and `launch_builder(..).arg(&buf)` take it unchanged.
//!
//! # Stream-safety rules
//!
//! A [`Slice`] belongs to the stream it was allocated on (its *own*
//! stream), as a PyTorch tensor does.
//!
//! 1. **A use on another stream is recorded.** When cudarc asks a buffer
//!    for its pointer on a stream ([`DevicePtr::device_ptr`] /
//!    [`DevicePtrMut::device_ptr_mut`]: every copy, memset and cuBLAS call),
//!    and that stream is not the buffer's own, the buffer calls the
//!    allocator's `record_stream` for it (once per stream; [`StreamUses`]
//!    keeps the set). The returned [`SyncOnDrop`] then has nothing left to
//!    do: the engine records the end-of-life event on each recorded stream
//!    when the buffer is dropped, which is after every use was queued.
//! 2. **Dropping is stream-ordered and never synchronizes.** The block goes
//!    back to the cache at once for later work on its own stream, and to
//!    other streams only once the events of rule 1 have completed.
//! 3. **Kernel launches:** cudarc does not tell a kernel argument which
//!    stream the launch is on, so `launch_builder(..).arg(&buf)` counts as
//!    a use on the buffer's own stream. Before launching with a buffer on
//!    another stream, call [`Slice::record_stream`] once (a copy or cuBLAS
//!    call on that stream does it for you).
//! 4. **Ordering is the program's, as in PyTorch:** cachalot does not add
//!    cudarc's per-buffer read/write events. A buffer written on one stream
//!    and read on another needs the reader to wait (`reader.join(&writer)`
//!    or an event), exactly as with `record_stream` in PyTorch.
//! 5. **Streams are kept alive.** The allocator holds an `Arc` of every
//!    stream it allocates on or records ([`CudaAllocator::register_stream`]),
//!    so none is destroyed while a cached block still refers to it. A use on
//!    a stream the allocator does not hold (cudarc hands the buffer a
//!    `&CudaStream`, not the `Arc`) cannot be recorded: the buffer falls back
//!    to `SyncOnDrop::Sync`, which synchronizes that stream once the use is
//!    queued (correct, but slow: register the stream to avoid it). A stream
//!    of another context falls back the same way and leaves a typed error
//!    for [`CudaAllocator::take_error`].
//!
//! Misuse never panics: bad ranges and sizes are typed errors, and failures
//! inside the cudarc traits (which return no `Result`) take the safe
//! fallback and are kept for [`CudaAllocator::take_error`].

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, DeviceStats, Error};
use cudarc::driver::{
    CudaContext, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, LaunchArgs, PushKernelArg,
    SyncOnDrop, ValidAsZeroBits,
};

use crate::{CudaBackend, CudaStream};

mod slice;

pub use slice::{Slice, View, ViewMut};
#[cfg(test)]
use slice::{offset, range};

type CudarcStream = cudarc::driver::CudaStream;

/// The streams a buffer was used on besides its own: the stream-safety rule
/// of this module, free of any driver so that it is tested on the mock.
///
/// [`StreamUses::record_use`] records a use on a stream other than the own
/// one with the allocator (`record_stream`), once per stream.
#[derive(Debug)]
pub struct StreamUses<S> {
    own: S,
    seen: Mutex<Vec<S>>,
}

impl<S: Copy + Eq> StreamUses<S> {
    /// No use yet besides the own stream `own`.
    pub fn new(own: S) -> Self {
        Self {
            own,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// The buffer's own stream.
    pub fn own(&self) -> S {
        self.own
    }

    /// Whether a use on `stream` needs recording: it is not the own stream
    /// and has not been recorded yet.
    pub fn needs_record(&self, stream: S) -> bool {
        stream != self.own
            && !self
                .seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&stream)
    }

    /// The streams recorded so far, in order.
    pub fn recorded(&self) -> Vec<S> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Notes a use of the block at `ptr` (the block's start address) on
    /// `stream`: on a stream other than the own one, not recorded before,
    /// calls `alloc.record_stream(ptr, stream)`. Returns whether it did.
    /// A failed `record_stream` is returned and leaves the stream
    /// unrecorded (a later use tries again).
    pub fn record_use<B: Backend<Stream = S>>(
        &self,
        alloc: &CachingAllocator<B>,
        ptr: u64,
        stream: S,
    ) -> Result<bool, Error> {
        self.record_with(stream, |s| alloc.record_stream(ptr, s))
    }

    /// [`Self::record_use`] with the recording call given.
    fn record_with(
        &self,
        stream: S,
        record: impl FnOnce(S) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        if stream == self.own {
            return Ok(false);
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(&stream) {
            return Ok(false);
        }
        record(stream)?;
        seen.push(stream);
        Ok(true)
    }
}

/// A caching allocator on a caller's `cudarc` context: the context is the
/// caller's (no second one is created), and the streams are the caller's
/// `Arc<CudaStream>`s. Buffers are [`Slice<T>`]s.
///
/// See the [module documentation](self) for the stream-safety rules.
pub struct CudaAllocator {
    // Declared first: dropped (releasing its memory) while the streams it
    // may still use are alive.
    engine: CachingAllocator<CudaBackend>,
    streams: RwLock<Vec<Arc<CudarcStream>>>,
    error: Mutex<Option<Error>>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for CudaAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaAllocator")
            .field("device", &self.ctx.ordinal())
            .field("streams", &self.read_streams().len())
            .finish_non_exhaustive()
    }
}

impl CudaAllocator {
    /// Opens a caching allocator on `ctx` with the configuration from the
    /// environment (`CACHALOT_ALLOC_CONF`, then PyTorch's variables).
    ///
    /// Errors: [`Error::NoDevice`] when the driver library cannot be loaded
    /// (checked first: never panics), a config error, or a driver error.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Arc<Self>, Error> {
        Self::with_config(ctx, AllocatorConfig::from_env()?)
    }

    /// [`CudaAllocator::new`] with an explicit configuration.
    pub fn with_config(
        ctx: &Arc<CudaContext>,
        config: AllocatorConfig,
    ) -> Result<Arc<Self>, Error> {
        let backend = CudaBackend::from_cudarc(ctx)?;
        Ok(Arc::new(Self {
            engine: CachingAllocator::with_config(backend, config)?,
            streams: RwLock::new(Vec::new()),
            error: Mutex::new(None),
            ctx: Arc::clone(ctx),
        }))
    }

    /// The context the allocator works in (the caller's).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The engine, for everything else: stats, snapshots, `empty_cache`,
    /// `set_config`, the memory history.
    pub fn engine(&self) -> &CachingAllocator<CudaBackend> {
        &self.engine
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        self.engine.stats()
    }

    /// Releases every unused cached segment to the device.
    pub fn empty_cache(&self) -> Result<(), Error> {
        self.engine.empty_cache()
    }

    /// The first error a cudarc trait call could not return (a use on a
    /// stream of another context, a failed `record_stream` or free), cleared.
    pub fn take_error(&self) -> Option<Error> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn keep_error(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn read_streams(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<CudarcStream>>> {
        self.streams.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The streams the allocator holds (allocated on or registered).
    pub fn streams(&self) -> Vec<Arc<CudarcStream>> {
        self.read_streams().clone()
    }

    /// Makes `stream` one of the allocator's streams (keeping it alive as
    /// long as the allocator) and returns its cachalot handle. Allocating on
    /// a stream registers it; register a stream that only *uses* buffers
    /// (a copy stream, say) so that those uses are recorded rather than
    /// synchronized (rule 5). Errors with [`Error::InvalidArgument`] for a
    /// stream of another context.
    pub fn register_stream(&self, stream: &Arc<CudarcStream>) -> Result<CudaStream, Error> {
        if stream.context() != &self.ctx {
            return Err(other_context(stream));
        }
        let handle = CudaStream::from_raw(stream.cu_stream());
        if self.holds(handle) {
            return Ok(handle);
        }
        let mut table = self.streams.write().unwrap_or_else(PoisonError::into_inner);
        if !table.iter().any(|s| s.cu_stream() == stream.cu_stream()) {
            table.push(Arc::clone(stream));
        }
        Ok(handle)
    }

    /// Whether the allocator holds the stream with this handle.
    fn holds(&self, handle: CudaStream) -> bool {
        self.read_streams()
            .iter()
            .any(|s| CudaStream::from_raw(s.cu_stream()) == handle)
    }

    /// Allocates `len` elements of `T` for use on `stream`, uninitialized.
    ///
    /// Errors: [`Error::InvalidArgument`] when `len * size_of::<T>()`
    /// overflows or `stream` is of another context; the engine's errors
    /// ([`Error::OutOfMemory`] with its report, ...).
    ///
    /// # Safety
    ///
    /// The memory is not initialized (as cudarc's `CudaStream::alloc`):
    /// write it before reading it as `T`.
    pub unsafe fn alloc<T: DeviceRepr>(
        self: &Arc<Self>,
        stream: &Arc<CudarcStream>,
        len: usize,
    ) -> Result<Slice<T>, Error> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .and_then(|b| u64::try_from(b).ok())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{len} elements of {} bytes overflow the address space",
                    size_of::<T>()
                ))
            })?;
        let own = self.register_stream(stream)?;
        let ptr = self.engine.allocate(bytes, own)?;
        Ok(Slice {
            core: Core {
                ptr,
                stream: Arc::clone(stream),
                uses: StreamUses::new(own),
                alloc: Arc::clone(self),
            },
            len,
            _t: PhantomData,
        })
    }

    /// Allocates `len` zeroed elements of `T` for use on `stream` (a
    /// memset queued on it).
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        self: &Arc<Self>,
        stream: &Arc<CudarcStream>,
        len: usize,
    ) -> Result<Slice<T>, Error> {
        // SAFETY: the memory is zeroed below before anything can read it
        // (the memset is queued on the slice's own stream), and all-zero
        // bits are a valid `T` (`ValidAsZeroBits`).
        let mut s = unsafe { self.alloc::<T>(stream, len) }?;
        stream
            .memset_zeros(&mut s)
            .map_err(crate::to_backend("cuMemsetD8Async"))?;
        Ok(s)
    }

    /// A new slice on `stream` holding a copy of `host`.
    pub fn clone_htod<T: DeviceRepr>(
        self: &Arc<Self>,
        stream: &Arc<CudarcStream>,
        host: &[T],
    ) -> Result<Slice<T>, Error> {
        // SAFETY: every element is written by the copy queued below on the
        // slice's own stream before anything can read it.
        let mut s = unsafe { self.alloc::<T>(stream, host.len()) }?;
        stream
            .memcpy_htod(host, &mut s)
            .map_err(crate::to_backend("cuMemcpyHtoDAsync"))?;
        Ok(s)
    }
}

fn other_context(stream: &CudarcStream) -> Error {
    Error::InvalidArgument(format!(
        "a stream of another CUDA context (device {}) used with this allocator",
        stream.context().ordinal()
    ))
}

/// What a slice and its views share: the block and its stream bookkeeping.
struct Core {
    /// The block's start address (what the engine knows it by).
    ptr: u64,
    stream: Arc<CudarcStream>,
    uses: StreamUses<CudaStream>,
    alloc: Arc<CudaAllocator>,
}

impl Core {
    /// Rule 1 of the module documentation, for a use on `stream`.
    fn on_use<'a>(&'a self, stream: &'a CudarcStream) -> SyncOnDrop<'a> {
        let handle = CudaStream::from_raw(stream.cu_stream());
        if self.ptr == 0 || !self.uses.needs_record(handle) {
            return SyncOnDrop::Record(None);
        }
        let alloc = &self.alloc;
        if stream.context() != &alloc.ctx {
            alloc.keep_error(other_context(stream));
            return SyncOnDrop::sync_stream(stream);
        }
        if !alloc.holds(handle) {
            // Not ours to keep alive (rule 5): make the use complete instead.
            return SyncOnDrop::sync_stream(stream);
        }
        match self.uses.record_use(&alloc.engine, self.ptr, handle) {
            Ok(_) => SyncOnDrop::Record(None),
            Err(e) => {
                alloc.keep_error(e);
                SyncOnDrop::sync_stream(stream)
            }
        }
    }

    fn record_stream(&self, stream: &Arc<CudarcStream>) -> Result<(), Error> {
        let handle = self.alloc.register_stream(stream)?;
        if self.ptr == 0 {
            return Ok(());
        }
        self.uses
            .record_use(&self.alloc.engine, self.ptr, handle)
            .map(drop)
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let p = std::mem::take(&mut self.ptr);
        if let Err(e) = self.alloc.engine.free(p) {
            self.alloc.keep_error(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_send_and_sync_like_cudarcs() {
        fn both<T: Send + Sync>() {}
        both::<Slice<f32>>();
        both::<View<'static, f32>>();
        both::<ViewMut<'static, u8>>();
        both::<CudaAllocator>();
        both::<cudarc::driver::CudaSlice<f32>>();
    }

    #[test]
    fn ranges_are_checked() {
        assert_eq!(range(.., 10).unwrap(), (0, 10));
        assert_eq!(range(2..5, 10).unwrap(), (2, 5));
        assert_eq!(range(2..=5, 10).unwrap(), (2, 6));
        assert_eq!(range(10.., 10).unwrap(), (10, 10));
        for bad in [
            range((Bound::Included(5), Bound::Excluded(2)), 10),
            range(0..11, 10),
            range(11.., 10),
        ] {
            assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
        }
        assert!(range(..=usize::MAX, 10).is_err());
        assert!(range((Bound::Excluded(usize::MAX), Bound::Unbounded), 10).is_err());
        assert_eq!(offset::<f32>(0x1000, 3), 0x100c);
    }

    #[test]
    fn uses_record_other_streams_once() {
        let uses = StreamUses::new(1u32);
        let mut calls = Vec::new();
        assert!(!uses.needs_record(1));
        assert!(uses.needs_record(2));
        let mut record = |s: u32| {
            uses.record_with(s, |s| {
                calls.push(s);
                Ok(())
            })
            .unwrap()
        };
        assert!(!record(1), "the buffer's own stream is not recorded");
        assert!(record(2));
        assert!(!record(2), "a stream is recorded once");
        assert!(record(3));
        assert_eq!(calls, [2, 3]);
        assert_eq!(uses.recorded(), [2, 3]);
        assert!(!uses.needs_record(3));
        // a failed record leaves the stream unrecorded
        let e = uses
            .record_with(4, |_| Err(Error::UnknownPointer(7)))
            .unwrap_err();
        assert!(matches!(e, Error::UnknownPointer(7)));
        assert!(uses.needs_record(4));
        assert_eq!(uses.recorded(), [2, 3]);
    }
}
