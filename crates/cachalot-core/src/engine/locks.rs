//! The device path's locks: the device lock and the shard locks, taken
//! in one order ([`DeviceGuard`]: the shards' parts checked in while it
//! is held, out again when it drops), a shard lock alone for a fast
//! operation, spinning before parking, and the flushes of the shards'
//! stat logs (`stat_log/`) that take the locks for as long as a swap.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::shard::{SHARDS, Shard};
use super::state::Inner;
use super::sync::{self, Mutex, MutexGuard};
use super::{CachingAllocator, shard, stat_log};
use crate::backend::Backend;

/// A lock on its own cache lines (no false sharing between shards).
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

/// One shard's lock.
pub(super) type ShardLock<S> = Padded<Mutex<Shard<S>>>;

/// The shard locks the device path holds, by shard.
type ShardGuards<'a, S> = [Option<MutexGuard<'a, Shard<S>>>; SHARDS];

/// The device lock and every shard lock, with the shards' parts checked
/// in: derefs to the whole engine state. Dropping it checks the parts out
/// again.
pub(super) struct DeviceGuard<'a, B: Backend> {
    inner: MutexGuard<'a, Inner<B>>,
    /// The shards held: every shard that holds anything (`None` while the
    /// fast path is off: no part is out, no shard is held).
    shards: Option<ShardGuards<'a, B::Stream>>,
    all: &'a [ShardLock<B::Stream>],
    fast: &'a AtomicBool,
}

impl<B: Backend> std::ops::Deref for DeviceGuard<'_, B> {
    type Target = Inner<B>;
    #[inline]
    fn deref(&self) -> &Inner<B> {
        &self.inner
    }
}

impl<B: Backend> std::ops::DerefMut for DeviceGuard<'_, B> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Inner<B> {
        &mut self.inner
    }
}

impl<B: Backend> Drop for DeviceGuard<'_, B> {
    fn drop(&mut self) {
        if !self.inner.fast_on && !self.inner.fast_ok() {
            // the fast path was off and stays off: every part stays here
            return;
        }
        // shards that got something now are taken too (no order needed:
        // the device lock is held, and a fast path holding a shard lock
        // waits for nothing)
        let occupied = self.inner.occupied();
        let shards = self
            .shards
            .get_or_insert_with(|| std::array::from_fn(|_| None));
        take_shards(self.all, occupied, shards);
        self.inner.occupied = occupied;
        self.inner.check_out(&mut shards[..]);
        self.fast.store(occupied != 0, Ordering::Relaxed);
    }
}

/// Spins before parking on a contended lock. Critical sections are a few
/// hundred nanoseconds, far shorter than a futex sleep and wake-up, so
/// waiting threads spin (reading, not writing, the lock word) for a while
/// first; after about this many spins they park as usual.
const SPIN_LIMIT: u32 = 4000;

/// Takes `m`, spinning a while before parking.
#[inline]
fn spin_lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match sync::try_lock(m) {
        Some(g) => g,
        None => lock_contended(m),
    }
}

#[cold]
fn lock_contended<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    if sync::SPIN {
        for _ in 0..SPIN_LIMIT {
            std::hint::spin_loop();
            if !sync::is_locked(m)
                && let Some(g) = sync::try_lock(m)
            {
                return g;
            }
        }
    }
    sync::lock(m)
}

/// The shards in bit set `bits`, in index order.
#[inline]
fn shards_in(bits: u32) -> impl Iterator<Item = usize> {
    let mut bits = bits;
    std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            k
        })
    })
}

/// Takes the lock of every shard in `bits` that `held` does not hold yet,
/// in index order (the device lock is held: see [`CachingAllocator::lock`]).
#[inline]
fn take_shards<'a, S>(all: &'a [ShardLock<S>], bits: u32, held: &mut ShardGuards<'a, S>) {
    for k in shards_in(bits) {
        if held[k].is_none() {
            held[k] = Some(spin_lock(&all[k].0));
        }
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// The device path: the device lock, then every shard lock in index
    /// order (the fixed lock order; the fast path holds one shard lock and
    /// never waits for another lock while holding it), the parts checked in.
    #[inline]
    pub(super) fn lock(&self) -> DeviceGuard<'_, B> {
        let mut inner = spin_lock(&self.inner);
        // (while the fast path is off no part is out and no log holds
        // anything: no shard to take, nothing to check in)
        let shards = inner.fast_on.then(|| {
            let mut shards: ShardGuards<'_, B::Stream> = std::array::from_fn(|_| None);
            take_shards(&self.shards, inner.occupied, &mut shards);
            // the windows flushed before come first
            self.settle(&mut inner, true);
            inner.check_in(&mut shards[..]);
            // (what the shards summed in the shared mirror: no shard logged
            // meanwhile, `Logging`)
            let inner = &mut *inner;
            self.shared.0.fold_into(&mut inner.stats);
            shards
        });
        DeviceGuard {
            inner,
            shards,
            all: &self.shards,
            fast: &self.fast,
        }
    }

    /// `op` on shard `k` with its lock alone (the fast path); when it set a
    /// full log aside, the device is offered the logs after the shard lock
    /// is released.
    #[inline]
    pub(super) fn shard_op<T>(&self, k: usize, op: impl FnOnce(&mut Shard<B::Stream>) -> T) -> T {
        let mut sh = spin_lock(&self.shards[k].0);
        let r = op(&mut sh);
        let rotated = std::mem::take(&mut sh.rotated);
        drop(sh);
        if rotated {
            self.offer_logs();
        }
        r
    }

    /// Takes the shards' stat logs out (a shard's logs are both full): the
    /// device lock, then [`Self::flush_held`].
    #[cold]
    pub(super) fn flush_logs(&self) {
        shard::count_path(shard::FLUSH);
        self.flush_held(spin_lock(&self.inner));
    }

    /// A shard set a full log aside: the device takes the logs out now if
    /// its lock is free, else whoever holds it (or the next flush) will.
    #[cold]
    fn offer_logs(&self) {
        if let Some(inner) = sync::try_lock(&self.inner) {
            shard::count_path(shard::FLUSH);
            self.flush_held(inner);
        }
    }

    /// With the device lock held: every occupied shard's lock (index order,
    /// as [`Self::lock`]) for as long as it takes to swap its logs for
    /// empty ones, as the next window; then, with every lock let go, the
    /// window is summed and filed, by the stats thread when it takes it
    /// (`stat_log::flusher`), else here and folded with the others ready
    /// if the device lock is free (`stat_log/`).
    fn flush_held(&self, mut inner: MutexGuard<'_, Inner<B>>) {
        if !inner.fast_on {
            return;
        }
        // what other flushes filed meanwhile (so that the sums waiting stay
        // as few as the windows being summed)
        self.settle(&mut inner, false);
        // empty logs for the swap, taken before the shard locks
        let mut fresh: [Vec<stat_log::Entry>; 2 * SHARDS] = std::array::from_fn(|_| Vec::new());
        let n = 2 * inner.occupied.count_ones() as usize;
        {
            let mut f = sync::lock(&self.folds);
            for l in &mut fresh[..n] {
                *l = f.spare();
            }
        }
        let mut taken: stat_log::Taken = std::array::from_fn(|_| [Vec::new(), Vec::new()]);
        let mut any = false;
        {
            let mut held: ShardGuards<'_, B::Stream> = std::array::from_fn(|_| None);
            take_shards(&self.shards, inner.occupied, &mut held);
            let mut next = fresh.iter_mut();
            for (k, g) in held.iter_mut().enumerate() {
                let Some(g) = g else { continue };
                let sh = &mut **g;
                sh.rotated = false;
                for (log, t) in [&mut sh.full, &mut sh.log].into_iter().zip(&mut taken[k]) {
                    if !log.is_empty() {
                        // (two spares per shard held were taken: the
                        // allocation is never needed)
                        let empty = match next.next() {
                            Some(e) => std::mem::take(e),
                            None => Vec::with_capacity(stat_log::LOG_CAP),
                        };
                        *t = std::mem::replace(log, empty);
                        any = true;
                    }
                }
            }
        }
        if !any {
            sync::lock(&self.folds).give_back(&mut fresh);
            return;
        }
        let window = inner.windows_out;
        inner.windows_out += 1;
        drop(inner);
        // summed by the stats thread, else here (`stat_log::flusher`)
        let job = stat_log::Job {
            folds: Arc::clone(&self.folds),
            window,
            taken,
            fresh,
        };
        if let Some(job) = stat_log::offer(job) {
            job.run();
            if let Some(mut inner) = sync::try_lock(&self.inner) {
                self.settle(&mut inner, false);
            }
        }
    }

    /// Folds the flushed windows that are ready into the stats, in order;
    /// with `wait`, every window flushed so far (one still being summed is
    /// waited for: its flusher, or the stats thread, holds no lock and
    /// needs only `folds`).
    fn settle(&self, inner: &mut Inner<B>, wait: bool) {
        loop {
            if inner.windows_folded == inner.windows_out {
                // (every window flushed is folded: `folds` holds no sum)
                return;
            }
            {
                let inner = &mut *inner;
                sync::lock(&self.folds).fold_ready(&mut inner.windows_folded, &mut inner.stats);
            }
            if !wait {
                return;
            }
            sync::yield_now();
        }
    }
}
