//! `release_lock_on_device_malloc` (PyTorch's `release_lock_on_cudamalloc`):
//! the device call that creates a fixed segment, made with every lock of
//! the engine released, so that the other threads' operations on the
//! device (cache hits and frees on the shards, and the device path:
//! `empty_cache`, statistics, other allocations) go on while it runs.
//!
//! The ladder (`state.rs`, `Inner::malloc_slow`) stops where it would call
//! the device for a fixed segment (`Inner::alloc_segment` answers
//! `NewSegment::Call`) and hands the call out ([`Inner::suspend`],
//! `AllocOutcome::Call`) with nothing changed but the call's bookkeeping
//! ([`InFlight`], the pool's count of calls in flight). The caller lets the
//! device guard go (the shards' parts are checked out, as after any
//! operation), makes the call ([`CachingAllocator::device_call`]), takes
//! the locks again and goes on ([`Inner::resume_malloc`]): the memory is
//! checked and registered as a new segment (`Inner::new_fixed_segment`),
//! then the ladder goes on from the rung that made the call
//! (`Inner::ladder_after`), with the state read again as PyTorch reads it
//! after it takes its lock again. What holds across the call:
//!
//! * nothing refers to the memory before it is registered, so the other
//!   threads' `empty_cache` and release paths cannot meet it, and the
//!   statistics count it only from its registration, as one change;
//! * the memory fraction's cap counts the bytes in flight
//!   ([`InFlight::bytes`]), so that two calls cannot both pass it (PyTorch
//!   checks its cap before the call and lets them: a fix);
//! * the pool of the call is not deleted while the call is in flight (a
//!   private pool whose last use ended meanwhile stays until the
//!   allocation ended, then goes as it would have gone: `PoolPair::calls`);
//! * what the ladder decided from the capture state before the call (the
//!   pool it routed the request to) stands, as in PyTorch; what it decides
//!   after it (whether the last rung, which no capture may run, runs) is
//!   read again;
//! * a release failure of the ladder's rungs before the call is dropped
//!   at the call, as at the ladder's end (the outcome never depends on it).
//!
//! The pages of an expandable segment are mapped with the lock held, as
//! in PyTorch (whose expandable path never drops its lock): they grow a
//! segment whose records (its runs, its unmapped blocks, page recycling's
//! choices) the other operations read and edit.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::backend::Backend;
use crate::engine::CachingAllocator;
use crate::engine::pool_ops::device_memory;
use crate::engine::pools::{DEFAULT_POOL, PoolIdx, SegmentSource};
use crate::engine::state::{AllocOutcome, Inner, Params};
use crate::error::{DeviceAllocError, Error};

/// The rungs of the out-of-memory ladder that ask the device for a new
/// segment (`Inner::malloc_slow`), in order: where an allocation goes on
/// after such a call made with the lock released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rung {
    /// The first request, after garbage collection, idle-stream reuse and
    /// lending.
    First,
    /// After `release_available_cached_blocks`.
    Available,
    /// After the whole cache was released (the last).
    All,
}

/// The device calls of new segments in flight with the lock released.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InFlight {
    /// Their bytes (counted against the memory fraction's cap).
    pub bytes: u64,
    /// Their number (the pools' counts sum to it).
    pub calls: u32,
    /// Calls made so far.
    pub made: u64,
}

/// An allocation stopped for the device call of a new fixed segment.
pub(crate) struct DeviceCall<S> {
    p: Params<S>,
    /// The rung that makes the call.
    rung: Rung,
    /// The segment's bytes.
    size: u64,
    /// The pool's segment source, if it has one.
    source: Option<Arc<dyn SegmentSource>>,
}

impl<S> DeviceCall<S> {
    /// The call itself, with no lock held.
    fn run<B: Backend<Stream = S>>(&self, backend: &B) -> Result<u64, DeviceAllocError> {
        device_memory(backend, self.source.as_deref(), self.size)
    }
}

impl<B: Backend> Inner<B> {
    /// Stops the allocation `p` at `rung` for the device call of a fixed
    /// segment of `size` bytes, to be made with the lock released.
    pub(super) fn suspend(
        &mut self,
        p: &Params<B::Stream>,
        rung: Rung,
        size: u64,
    ) -> AllocOutcome<B::Stream> {
        // (as at the ladder's end: another operation must not report it)
        let _ = self.release_failures.take();
        self.in_flight.bytes += size;
        self.in_flight.calls += 1;
        self.in_flight.made += 1;
        self.pools.start_call(p.pool);
        AllocOutcome::Call(Box::new(DeviceCall {
            p: *p,
            rung,
            size,
            source: self.source(p.pool).cloned(),
        }))
    }

    /// The allocation `call` stopped for goes on, the lock held again,
    /// with what the call got.
    pub(super) fn resume_malloc(
        &mut self,
        backend: &B,
        call: DeviceCall<B::Stream>,
        got: Result<u64, DeviceAllocError>,
    ) -> Result<AllocOutcome<B::Stream>, Error> {
        self.in_flight.bytes -= call.size;
        self.in_flight.calls -= 1;
        let got = self.accept_memory(call.p.pool, call.size, call.source.as_deref(), got);
        let r = match self.new_fixed_segment(&call.p, call.size, got) {
            Ok(found) => self.ladder_after(backend, &call.p, call.rung, found),
            Err(e) => Err(e),
        };
        let r = self.drop_release_failures_on_err(r);
        // (the pool was kept until now: the ladder may have released it)
        self.end_pool_call(call.p.pool);
        r
    }

    /// A call for a segment of `pool` ended: the pool goes if its last
    /// use ended meanwhile and it owns nothing.
    fn end_pool_call(&mut self, pool: PoolIdx) {
        self.pools.end_call(pool);
        if pool != DEFAULT_POOL && self.pools.is_freeable(pool) {
            self.pools.delete_if_empty(pool);
        }
    }
}

/// A call in flight whose caller unwinds (a backend that panicked): its
/// bookkeeping ends all the same.
struct Unwinding<'a, B: Backend> {
    a: &'a CachingAllocator<B>,
    size: u64,
    pool: PoolIdx,
}

impl<B: Backend> Drop for Unwinding<'_, B> {
    fn drop(&mut self) {
        let mut g = self.a.lock();
        g.in_flight.bytes -= self.size;
        g.in_flight.calls -= 1;
        g.end_pool_call(self.pool);
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// Makes `call` with no lock of the engine held, then takes the locks
    /// again and goes on with the allocation ([`Inner::resume_malloc`]).
    pub(super) fn device_call(
        &self,
        call: DeviceCall<B::Stream>,
    ) -> Result<AllocOutcome<B::Stream>, Error> {
        let unwinding = Unwinding {
            a: self,
            size: call.size,
            pool: call.p.pool,
        };
        let got = call.run(&self.backend);
        // (it holds nothing to free)
        std::mem::forget(unwinding);
        self.lock().resume_malloc(&self.backend, call, got)
    }

    /// Device calls of new segments made with the lock released so far
    /// (`release_lock_on_device_malloc`). A testing hook.
    #[doc(hidden)]
    pub fn unlocked_device_calls(&self) -> u64 {
        self.lock().in_flight.made
    }
}
