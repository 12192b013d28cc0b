//! The process-wide, per-device allocators, created lazily.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use cachalot_core::engine::OomObserver;
use cachalot_core::{DeviceIndex, Error, OomReport};
use parking_lot::{Mutex, RwLock};

use crate::backend::BackendKind;
use crate::device::DeviceAllocator;

struct Runtime {
    kind: BackendKind,
    devices: Vec<OnceLock<Arc<DeviceAllocator>>>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());
static OBSERVERS: RwLock<Vec<OomObserver>> = RwLock::new(Vec::new());

thread_local! {
    static CURRENT: Cell<DeviceIndex> = const { Cell::new(0) };
}

fn build(kind: BackendKind) -> Result<Runtime, Error> {
    let count = kind.device_count()?;
    Ok(Runtime {
        kind,
        devices: (0..count).map(|_| OnceLock::new()).collect(),
    })
}

fn runtime() -> Result<&'static Runtime, Error> {
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let _g = INIT.lock();
    if let Some(r) = RUNTIME.get() {
        return Ok(r);
    }
    let r = build(BackendKind::detect()?)?;
    Ok(RUNTIME.get_or_init(|| r))
}

/// Chooses the backend of the global allocators. Call it before any other
/// function of this crate; without it the backend is
/// [`BackendKind::detect`]'s. Calling it again with the same kind is a no-op;
/// with another kind once the backend is chosen, an error.
pub fn init(kind: BackendKind) -> Result<(), Error> {
    let _g = INIT.lock();
    if let Some(r) = RUNTIME.get() {
        return if r.kind == kind {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "the backend is already '{}', cannot switch to '{kind}'",
                r.kind
            )))
        };
    }
    let r = build(kind)?;
    let _ = RUNTIME.set(r);
    Ok(())
}

/// The backend of the global allocators (choosing it if not yet chosen).
pub fn backend_kind() -> Result<BackendKind, Error> {
    Ok(runtime()?.kind)
}

/// Number of devices of the backend.
pub(crate) fn device_count() -> Result<u32, Error> {
    Ok(runtime()?.devices.len() as u32)
}

pub(crate) fn current_device() -> DeviceIndex {
    CURRENT.with(Cell::get)
}

pub(crate) fn set_current_device(device: DeviceIndex) -> Result<(), Error> {
    check_index(runtime()?, device)?;
    CURRENT.with(|c| c.set(device));
    Ok(())
}

fn check_index(r: &Runtime, device: DeviceIndex) -> Result<(), Error> {
    if (device as usize) < r.devices.len() {
        Ok(())
    } else if r.devices.is_empty() {
        Err(Error::NoDevice(format!(
            "the {} backend has no device",
            r.kind
        )))
    } else {
        Err(Error::InvalidArgument(format!(
            "device index {device} out of range ({} {} device(s))",
            r.devices.len(),
            r.kind
        )))
    }
}

fn resolve(device: Option<DeviceIndex>) -> DeviceIndex {
    device.unwrap_or_else(current_device)
}

/// The global allocator of `device` (`None` = the current device),
/// initializing it on first use.
pub fn allocator(device: Option<DeviceIndex>) -> Result<Arc<DeviceAllocator>, Error> {
    let r = runtime()?;
    let d = resolve(device);
    check_index(r, d)?;
    let slot = &r.devices[d as usize];
    if let Some(a) = slot.get() {
        return Ok(a.clone());
    }
    let _g = INIT.lock();
    if let Some(a) = slot.get() {
        return Ok(a.clone());
    }
    let a = DeviceAllocator::open(r.kind, d, None)?;
    a.add_oom_observer(|report: &OomReport| {
        let list = OBSERVERS.read().clone();
        for o in list {
            o(report);
        }
    });
    Ok(slot.get_or_init(|| a).clone())
}

/// The global allocator of `device` (`None` = the current device) if it is
/// initialized; never initializes anything. An out-of-range index is an error.
pub fn try_allocator(device: Option<DeviceIndex>) -> Result<Option<Arc<DeviceAllocator>>, Error> {
    let r = runtime()?;
    let d = resolve(device);
    check_index(r, d)?;
    Ok(r.devices[d as usize].get().cloned())
}

/// The global allocators initialized so far, by device index.
pub fn initialized_allocators() -> Vec<Arc<DeviceAllocator>> {
    RUNTIME.get().map_or_else(Vec::new, |r| {
        r.devices.iter().filter_map(|d| d.get().cloned()).collect()
    })
}

/// Registers a callback run on every out-of-memory error of every global
/// allocator (also those created later), before the error returns to the
/// caller.
pub fn add_oom_observer(observer: impl Fn(&OomReport) + Send + Sync + 'static) {
    OBSERVERS.write().push(Arc::new(observer));
}
