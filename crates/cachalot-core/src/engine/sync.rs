//! The engine's lock: parking_lot's mutex, or under the `shuttle` feature
//! shuttle's, so that the model check (`tests/shuttle_locks.rs`) schedules
//! every lock acquisition of the shard/device protocol.

#[cfg(not(feature = "shuttle"))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::{Mutex, MutexGuard};

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
/// The atomics of the shared mirror (`shard::SharedMirror`): std's, or
/// under the `shuttle` feature shuttle's, so that the model check can
/// switch threads between any two of its loads and stores.
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};

/// Takes `m` if free.
#[inline]
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    #[cfg(not(feature = "shuttle"))]
    return m.try_lock();
    #[cfg(feature = "shuttle")]
    return m.try_lock().ok();
}

/// Takes `m`, waiting.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(feature = "shuttle"))]
    return m.lock();
    #[cfg(feature = "shuttle")]
    return m.lock().unwrap_or_else(|e| e.into_inner());
}

/// Whether `m` is held (a hint for spinning; never under the model check,
/// which does not spin).
#[inline]
pub(crate) fn is_locked<T>(m: &Mutex<T>) -> bool {
    #[cfg(not(feature = "shuttle"))]
    return m.is_locked();
    #[cfg(feature = "shuttle")]
    {
        let _ = m;
        false
    }
}

/// The value, through a unique reference.
#[inline]
pub(crate) fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
    #[cfg(not(feature = "shuttle"))]
    return m.get_mut();
    #[cfg(feature = "shuttle")]
    return m.get_mut().unwrap_or_else(|e| e.into_inner());
}

/// Whether to spin before parking on a contended lock (not under the model
/// check: every try is a scheduling point there).
pub(crate) const SPIN: bool = cfg!(not(feature = "shuttle"));

/// Lets other threads run (while waiting for one to finish a step).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(feature = "shuttle"))]
    std::thread::yield_now();
    #[cfg(feature = "shuttle")]
    shuttle::thread::yield_now();
}
