//! The virtual-memory capability over the faked HIP table: the lifecycle
//! (reserve, create, map, set access and back), the granularity, every
//! misuse a typed error, out of memory, and when `virtual_memory()` is
//! `None`.

use std::sync::Arc;

use cachalot_core::{Backend, BackendError, DeviceAllocError, VirtualMemory};
use cachalot_hip_sys::*;

use crate::fake::{self, with};
use crate::result::PropLayout;
use crate::{HipBackend, HipVirtualMemory};

const G: u64 = 2 << 20;

fn backend() -> HipBackend {
    HipBackend::with_api(fake::api(), 0).expect("fake device opens")
}

fn vm(b: &HipBackend) -> &HipVirtualMemory {
    b.virtual_memory()
        .expect("the fake runtime has virtual memory")
}

fn assert_code(e: &BackendError, call: &str, code: hipError_t) {
    assert_eq!(
        (e.backend, e.call, e.code),
        ("hip", call, i64::from(code)),
        "{e}"
    );
}

#[test]
fn full_lifecycle_reserve_create_map_access_and_back() {
    let b = backend();
    let vm = vm(&b);
    assert_eq!(vm.prop_layout(), PropLayout::Current);
    let total = b.memory_info().unwrap().total;

    let base = vm.reserve(4 * G).unwrap();
    assert_eq!(base % G, 0);
    assert_eq!(
        with(|s| s.vm.reservations.get(&(base as usize)).copied()),
        Some(4 << 21)
    );

    let p1 = vm.create_physical(2 * G).unwrap();
    let p2 = vm.create_physical(2 * G).unwrap();
    assert_eq!((p1.size(), p2.size()), (2 * G, 2 * G));
    assert_eq!(
        b.memory_info().unwrap().free,
        total - 4 * G,
        "physical memory is device memory"
    );

    vm.map(base, 2 * G, &p1).unwrap();
    vm.map(base + 2 * G, 2 * G, &p2).unwrap();
    vm.set_access(base, 4 * G, 0).unwrap();
    vm.set_access(base + 2 * G, 2 * G, 1).unwrap();
    with(|s| {
        let m = &s.vm.mappings;
        assert_eq!(m.len(), 2);
        assert_eq!(m[&(base as usize)].handle, p1.as_raw() as usize);
        let a1: Vec<_> = m[&(base as usize)].access.clone().into_iter().collect();
        assert_eq!(a1, vec![(0, hipMemAccessFlagsProtReadWrite)]);
        let a2: Vec<_> = m[&((base + 2 * G) as usize)]
            .access
            .clone()
            .into_iter()
            .collect();
        assert_eq!(
            a2,
            vec![
                (0, hipMemAccessFlagsProtReadWrite),
                (1, hipMemAccessFlagsProtReadWrite)
            ]
        );
    });

    vm.unmap(base, 2 * G).unwrap();
    vm.release_physical(p1).unwrap();
    vm.unmap(base + 2 * G, 2 * G).unwrap();
    vm.release_physical(p2).unwrap();
    vm.unreserve(base, 4 * G).unwrap();
    assert!(with(|s| s.vm.is_empty()));
    assert_eq!(b.memory_info().unwrap().free, total);
}

#[test]
fn one_unmap_may_cover_several_mappings_and_a_physical_may_be_remapped() {
    let b = backend();
    let vm = vm(&b);
    let base = vm.reserve(4 * G).unwrap();
    let p1 = vm.create_physical(G).unwrap();
    let p2 = vm.create_physical(G).unwrap();
    vm.map(base, G, &p1).unwrap();
    vm.map(base + G, G, &p2).unwrap();
    vm.set_access(base, 2 * G, 0).unwrap();
    vm.unmap(base, 2 * G).unwrap();
    // Remapped elsewhere in the range after the unmap.
    vm.map(base + 3 * G, G, &p1).unwrap();
    vm.unmap(base + 3 * G, G).unwrap();
    vm.release_physical(p1).unwrap();
    vm.release_physical(p2).unwrap();
    vm.unreserve(base, 4 * G).unwrap();
    assert!(with(|s| s.vm.is_empty()));
}

#[test]
fn granularity_is_the_minimum_one_and_sizes_must_be_multiples() {
    let b = backend();
    let vm = vm(&b);
    assert_eq!(vm.granularity().unwrap(), G);
    assert_eq!(
        with(|s| s.vm.granularity_options.clone()),
        vec![hipMemAllocationGranularityMinimum],
        "asked once, at open, for the minimum"
    );
    vm.granularity().unwrap();
    assert_eq!(with(|s| s.vm.granularity_options.len()), 1, "cached");

    match vm.reserve(G / 2).unwrap_err() {
        DeviceAllocError::Backend(e) => {
            assert_code(&e, "hipMemAddressReserve", hipErrorInvalidValue)
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    match vm.create_physical(G + 4096).unwrap_err() {
        DeviceAllocError::Backend(e) => assert_code(&e, "hipMemCreate", hipErrorInvalidValue),
        other => panic!("expected a backend error, got {other:?}"),
    }

    with(|s| s.vm.granularity = 64 << 10);
    let b = HipBackend::with_api(b.api().clone(), 0).unwrap();
    assert_eq!(b.virtual_memory().unwrap().granularity().unwrap(), 64 << 10);
}

#[test]
fn each_misuse_is_a_typed_error() {
    let b = backend();
    let vm = vm(&b);
    let base = vm.reserve(4 * G).unwrap();
    let p = vm.create_physical(G).unwrap();
    let q = vm.create_physical(G).unwrap();

    // Map twice (the same range, or overlapping it).
    vm.map(base, G, &p).unwrap();
    assert_code(
        &vm.map(base, G, &q).unwrap_err(),
        "hipMemMap",
        hipErrorInvalidValue,
    );
    // Map outside any reservation.
    assert_code(
        &vm.map(base + 8 * G, G, &q).unwrap_err(),
        "hipMemMap",
        hipErrorInvalidValue,
    );
    // Map a size other than the physical allocation's (checked before the driver).
    let e = vm.map(base + G, 2 * G, &q).unwrap_err();
    assert_code(&e, "hipMemMap", hipErrorInvalidValue);
    assert!(e.message.contains("all of it"), "{e}");

    // Unmap what is not mapped, or part of a mapping.
    assert_code(
        &vm.unmap(base + G, G).unwrap_err(),
        "hipMemUnmap",
        hipErrorInvalidValue,
    );
    assert_code(
        &vm.unmap(base, 2 * G).unwrap_err(),
        "hipMemUnmap",
        hipErrorInvalidValue,
    );
    // Set access on an unmapped range; for a device that does not exist.
    assert_code(
        &vm.set_access(base + G, G, 0).unwrap_err(),
        "hipMemSetAccess",
        hipErrorInvalidValue,
    );
    assert_code(
        &vm.set_access(base, G, 7).unwrap_err(),
        "hipMemSetAccess",
        hipErrorInvalidDevice,
    );

    // Free a reservation with a mapping in it; free a range not reserved.
    assert_code(
        &vm.unreserve(base, 4 * G).unwrap_err(),
        "hipMemAddressFree",
        hipErrorIllegalState,
    );
    assert_code(
        &vm.unreserve(base, 2 * G).unwrap_err(),
        "hipMemAddressFree",
        hipErrorInvalidValue,
    );

    // Release mapped physical memory: an error, and the handle is consumed
    // (not released a second time on drop).
    assert_code(
        &vm.release_physical(p).unwrap_err(),
        "hipMemRelease",
        hipErrorIllegalState,
    );
    assert_eq!(
        with(|s| s.vm.physicals.len()),
        2,
        "still there, still mapped"
    );

    // Every error names the runtime's call and keeps the HipError as source.
    let e = vm.unmap(base + 3 * G, G).unwrap_err();
    assert!(e.source.is_some());

    vm.unmap(base, G).unwrap();
    vm.release_physical(q).unwrap();
    vm.unreserve(base, 4 * G).unwrap();
}

#[test]
fn exhausting_memory_or_address_space_is_out_of_memory() {
    let b = backend();
    let vm = vm(&b);
    // The fake device has 1 GiB.
    let held: Vec<_> = (0..512).map(|_| vm.create_physical(G).unwrap()).collect();
    assert!(matches!(
        vm.create_physical(G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    assert_eq!(
        with(|s| s.sticky),
        hipSuccess,
        "the sticky error is cleared"
    );
    assert!(
        matches!(b.malloc(512), Err(DeviceAllocError::OutOfMemory)),
        "shared with hipMalloc"
    );
    drop(held);
    assert!(
        with(|s| s.vm.physicals.is_empty()),
        "HipPhysical releases on drop"
    );
    vm.create_physical(G).map(drop).unwrap();

    with(|s| s.vm.va_limit = 8 * G as usize);
    let r = vm.reserve(6 * G).unwrap();
    assert!(matches!(
        vm.reserve(4 * G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    assert_eq!(with(|s| s.sticky), hipSuccess);
    vm.unreserve(r, 6 * G).unwrap();
    vm.unreserve(vm.reserve(8 * G).unwrap(), 8 * G).unwrap();

    // Any other failure of hipMemCreate stays a backend error.
    with(|s| s.vm.create_error = Some(hipErrorUnknown));
    match vm.create_physical(G).unwrap_err() {
        DeviceAllocError::Backend(e) => assert_code(&e, "hipMemCreate", hipErrorUnknown),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn calls_run_on_the_backends_device_and_restore_the_current_one() {
    let b = HipBackend::with_api(fake::api(), 1).unwrap();
    let vm = vm(&b);
    with(|s| {
        s.current = 0;
        s.set_device_calls.clear();
    });
    let r = vm.reserve(G).unwrap();
    let p = vm.create_physical(G).unwrap();
    vm.map(r, G, &p).unwrap();
    vm.set_access(r, G, 1).unwrap();
    assert_eq!(with(|s| s.current), 0);
    assert_eq!(
        with(|s| s.set_device_calls.len()),
        8,
        "set and restored per call"
    );
    assert!(with(|s| s.vm.mappings[&(r as usize)]
        .access
        .contains_key(&1)));
    vm.unmap(r, G).unwrap();
    vm.release_physical(p).unwrap();
    vm.unreserve(r, G).unwrap();
}

/// A table of the fake's entries without the ones `remove` takes out.
fn api_without(remove: impl FnOnce(&mut HipApi)) -> Arc<HipApi> {
    let full = fake::api();
    let mut t = HipApi::stub();
    t.hipGetDeviceCount = full.hipGetDeviceCount;
    t.hipGetDevice = full.hipGetDevice;
    t.hipSetDevice = full.hipSetDevice;
    t.hipGetLastError = full.hipGetLastError;
    t.hipMalloc = full.hipMalloc;
    t.hipRuntimeGetVersion = full.hipRuntimeGetVersion;
    t.hipDeviceGetAttribute = full.hipDeviceGetAttribute;
    t.hipMemGetAllocationGranularity = full.hipMemGetAllocationGranularity;
    t.hipMemAddressReserve = full.hipMemAddressReserve;
    t.hipMemAddressFree = full.hipMemAddressFree;
    t.hipMemCreate = full.hipMemCreate;
    t.hipMemRelease = full.hipMemRelease;
    t.hipMemMap = full.hipMemMap;
    t.hipMemUnmap = full.hipMemUnmap;
    t.hipMemSetAccess = full.hipMemSetAccess;
    remove(&mut t);
    Arc::new(t)
}

#[test]
fn missing_vmm_symbols_mean_no_virtual_memory() {
    let b = HipBackend::with_api(api_without(|_| {}), 0).unwrap();
    assert!(
        b.virtual_memory().is_some(),
        "all present: the capability is there"
    );
    type Remove = fn(&mut HipApi);
    let removals: [(&str, Remove); 8] = [
        ("hipMemGetAllocationGranularity", |t| {
            t.hipMemGetAllocationGranularity = None
        }),
        ("hipMemAddressReserve", |t| t.hipMemAddressReserve = None),
        ("hipMemAddressFree", |t| t.hipMemAddressFree = None),
        ("hipMemCreate", |t| t.hipMemCreate = None),
        ("hipMemRelease", |t| t.hipMemRelease = None),
        ("hipMemMap", |t| t.hipMemMap = None),
        ("hipMemUnmap", |t| t.hipMemUnmap = None),
        ("hipMemSetAccess", |t| t.hipMemSetAccess = None),
    ];
    for (name, remove) in removals {
        let api = api_without(remove);
        assert!(!api.has_virtual_memory(), "{name}");
        let b = HipBackend::with_api(api, 0).unwrap();
        assert!(b.virtual_memory().is_none(), "without {name}");
        // Nothing else changes: the backend still allocates.
        assert!(b.malloc(512).is_ok());
    }
}

#[test]
fn the_device_attribute_and_the_runtime_version_gate_the_capability() {
    // The device says no.
    let api = fake::api();
    with(|s| s.vm.attribute = Some(0));
    let b = HipBackend::with_api(api.clone(), 0).unwrap();
    assert!(b.virtual_memory().is_none());
    assert!(
        with(|s| s.vm.granularity_options.is_empty()),
        "not even probed"
    );

    // A runtime that predates the attribute: the granularity query decides,
    // and the attribute's error does not stay sticky.
    with(|s| s.vm.attribute = None);
    let b = HipBackend::with_api(api.clone(), 0).unwrap();
    assert!(b.virtual_memory().is_some());
    assert_eq!(with(|s| s.sticky), hipSuccess);
    with(|s| s.vm.granularity_error = Some(hipErrorNotSupported));
    let b = HipBackend::with_api(api.clone(), 0).unwrap();
    assert!(b.virtual_memory().is_none());
    assert_eq!(with(|s| s.sticky), hipSuccess);

    // A granularity that is not a power of two is not trusted.
    with(|s| s.vm.granularity = 3 << 20);
    assert!(
        HipBackend::with_api(api.clone(), 0)
            .unwrap()
            .virtual_memory()
            .is_none()
    );

    // Without hipRuntimeGetVersion the struct layout is unknown: none.
    let b = HipBackend::with_api(api_without(|t| t.hipRuntimeGetVersion = None), 0).unwrap();
    assert!(b.virtual_memory().is_none());
    // Without hipDeviceGetAttribute the granularity query decides.
    let b = HipBackend::with_api(api_without(|t| t.hipDeviceGetAttribute = None), 0).unwrap();
    assert!(b.virtual_memory().is_some());
}

#[test]
fn a_rocm_5_2_runtime_gets_its_own_struct_layout() {
    let api = fake::api();
    // ROCm 5.2.3 as Debian 12 ships it: no attribute, the old layout (which
    // the fake reads; the current layout would fail its checks).
    with(|s| {
        s.vm.runtime_version = 50_221_153;
        s.vm.attribute = None;
    });
    let b = HipBackend::with_api(api, 0).unwrap();
    let vm = vm(&b);
    assert_eq!(vm.prop_layout(), PropLayout::Rocm52);
    let r = vm.reserve(G).unwrap();
    let p = vm.create_physical(G).unwrap();
    vm.map(r, G, &p).unwrap();
    vm.set_access(r, G, 0).unwrap();
    vm.unmap(r, G).unwrap();
    vm.release_physical(p).unwrap();
    vm.unreserve(r, G).unwrap();

    // The layout boundary is ROCm 5.3.
    assert_eq!(PropLayout::for_runtime(50_299_999), PropLayout::Rocm52);
    assert_eq!(PropLayout::for_runtime(50_300_000), PropLayout::Current);
    assert_eq!(PropLayout::for_runtime(70_000_000), PropLayout::Current);
}

#[test]
fn the_wrong_layout_is_rejected_by_the_fake() {
    // Guards the test above: the fake really checks the layout.
    use crate::result::{AllocationProp, mem_create};
    let api = fake::api();
    with(|s| s.vm.runtime_version = 50_221_153);
    let wrong = AllocationProp::pinned_on(0, PropLayout::Current);
    assert_eq!(
        mem_create(&api, G as usize, &wrong).unwrap_err().code,
        hipErrorInvalidValue
    );
    let right = AllocationProp::pinned_on(0, PropLayout::Rocm52);
    assert!(mem_create(&api, G as usize, &right).is_ok());
}
