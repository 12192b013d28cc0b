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
/// The backend [`select`] chose, for the first use to set up.
static SELECTED: Mutex<Option<BackendKind>> = Mutex::new(None);
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
    let selected = *SELECTED.lock();
    let r = build(match selected {
        Some(kind) => kind,
        None => BackendKind::detect()?,
    })?;
    Ok(RUNTIME.get_or_init(|| r))
}

/// Choosing `to` once `from` is set up: a no-op when they are the same.
fn same_backend(from: BackendKind, to: BackendKind) -> Result<(), Error> {
    if from == to {
        Ok(())
    } else {
        Err(switch_error(from, to))
    }
}

fn switch_error(from: BackendKind, to: BackendKind) -> Error {
    Error::InvalidArgument(format!(
        "the backend is already '{from}', cannot switch to '{to}'"
    ))
}

/// Chooses the backend of the global allocators. Call it before any other
/// function of this crate; without it the backend is
/// [`BackendKind::detect`]'s. Calling it again with the same kind is a no-op;
/// with another kind once the backend is chosen, an error.
pub fn init(kind: BackendKind) -> Result<(), Error> {
    let _g = INIT.lock();
    if let Some(r) = RUNTIME.get() {
        return same_backend(r.kind, kind);
    }
    if let Some(s) = *SELECTED.lock() {
        same_backend(s, kind)?;
    }
    let r = build(kind)?;
    let _ = RUNTIME.set(r);
    Ok(())
}

/// Chooses the backend of the global allocators as [`init`] does, but
/// without touching its driver: the devices are counted (CUDA's `cuInit`)
/// at the first use of the global allocators, as PyTorch initializes CUDA
/// at its first use, so that a process may fork or run without a device
/// until then. A backend not compiled in is an error now; one without a
/// device, at that first use. Choosing again the same backend is a no-op;
/// another one, once chosen, is an error.
pub fn select(kind: BackendKind) -> Result<(), Error> {
    let _g = INIT.lock();
    if let Some(r) = RUNTIME.get() {
        return same_backend(r.kind, kind);
    }
    let mut selected = SELECTED.lock();
    match *selected {
        Some(s) if s != kind => Err(switch_error(s, kind)),
        _ if !kind.is_compiled() => Err(kind.not_compiled()),
        _ => {
            *selected = Some(kind);
            Ok(())
        }
    }
}

/// The backend of the global allocators (choosing it if not yet chosen;
/// one [`select`]ed is not set up by this).
pub fn backend_kind() -> Result<BackendKind, Error> {
    if RUNTIME.get().is_none()
        && let Some(kind) = *SELECTED.lock()
    {
        return Ok(kind);
    }
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
