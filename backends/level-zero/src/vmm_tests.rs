//! The virtual-memory capability over the faked Level Zero table: the
//! lifecycle (reserve, create, map, set access and back), the granularity,
//! every misuse a typed error, out of memory, and when `virtual_memory()` is
//! `None`.

use std::sync::Arc;

use cachalot_core::{Backend, BackendError, DeviceAllocError, VirtualMemory};
use cachalot_level_zero_sys::*;

use crate::fake::{self, with};
use crate::{LevelZeroBackend, OpenError, ZeVirtualMemory};

const G: u64 = 2 << 20;

fn backend() -> LevelZeroBackend {
    LevelZeroBackend::with_api(fake::api(), 0).expect("fake GPU opens")
}

fn vm(b: &LevelZeroBackend) -> &ZeVirtualMemory {
    b.virtual_memory()
        .expect("the fake driver has virtual memory")
}

fn assert_code(e: &BackendError, call: &str, code: ze_result_t) {
    assert_eq!(
        (e.backend, e.call, e.code),
        ("level-zero", call, i64::from(code)),
        "{e}"
    );
}

fn backend_err(e: DeviceAllocError) -> BackendError {
    match e {
        DeviceAllocError::Backend(e) => e,
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn full_lifecycle_reserve_create_map_access_and_back() {
    let b = backend();
    let vm = vm(&b);
    let total = b.memory_info().unwrap().total;

    let base = vm.reserve(4 * G).unwrap();
    assert_eq!(base % G, 0);
    let p1 = vm.create_physical(2 * G).unwrap();
    let p2 = vm.create_physical(2 * G).unwrap();
    assert_eq!((p1.size(), p2.size()), (2 * G, 2 * G));
    assert_eq!(
        b.memory_info().unwrap().free,
        total - 4 * G,
        "physical memory counts as allocated"
    );

    vm.map(base, 2 * G, &p1).unwrap();
    vm.map(base + 2 * G, 2 * G, &p2).unwrap();
    vm.set_access(base, 4 * G, 0).unwrap();
    with(|s| {
        let m = &s.vm.mappings;
        assert_eq!(m.len(), 2);
        assert_eq!(m[&(base as usize)].handle, p1.as_raw() as usize);
        assert!(
            m.values()
                .all(|m| m.access == ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE)
        );
    });

    // Unmapping waits for every stream of the backend first (a barrier and
    // a host wait per list), as zeVirtualMemUnmap does not wait itself.
    let _s1 = b.create_stream().unwrap();
    with(|s| s.calls.clear());
    vm.unmap(base, 2 * G).unwrap();
    let calls = with(|s| s.calls.clone());
    let unmap_at = calls
        .iter()
        .position(|c| *c == "zeVirtualMemUnmap")
        .unwrap();
    let waits = |name| calls[..unmap_at].iter().filter(|c| **c == name).count();
    assert_eq!(
        (
            waits("zeCommandListAppendBarrier"),
            waits("zeEventHostSynchronize")
        ),
        (2, 2),
        "{calls:?}"
    );

    vm.release_physical(p1).unwrap();
    vm.unmap(base + 2 * G, 2 * G).unwrap();
    vm.release_physical(p2).unwrap();
    vm.unreserve(base, 4 * G).unwrap();
    assert!(with(|s| s.vm.is_empty()));
    assert_eq!(b.memory_info().unwrap().free, total);
}

#[test]
fn granularity_is_the_large_page_size_and_sizes_must_be_multiples() {
    let b = backend();
    let vm = vm(&b);
    assert_eq!(vm.granularity().unwrap(), G);
    assert_eq!(
        with(|s| s.vm.queries.clone()),
        vec![2 << 20],
        "asked once, at open, for a 2 MiB allocation"
    );
    vm.granularity().unwrap();
    assert_eq!(with(|s| s.vm.queries.len()), 1, "cached");

    let e = backend_err(vm.reserve(G / 2).unwrap_err());
    assert_code(
        &e,
        "zeVirtualMemReserve",
        ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT,
    );
    let e = backend_err(vm.create_physical(G + 4096).unwrap_err());
    assert_code(
        &e,
        "zePhysicalMemCreate",
        ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT,
    );
    assert_eq!(e.message, "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT");

    // (The fake drives one backend at a time.)
    let api = b.api().clone();
    drop(b);
    with(|s| s.vm.page = 64 << 10);
    let b = LevelZeroBackend::with_api(api, 0).unwrap();
    assert_eq!(b.virtual_memory().unwrap().granularity().unwrap(), 64 << 10);
}

#[test]
fn each_misuse_is_a_typed_error() {
    let b = backend();
    let vm = vm(&b);
    let base = vm.reserve(4 * G).unwrap();
    let p = vm.create_physical(G).unwrap();
    let q = vm.create_physical(G).unwrap();

    // Map twice; outside any reservation; a size other than the physical's.
    vm.map(base, G, &p).unwrap();
    assert_code(
        &vm.map(base, G, &q).unwrap_err(),
        "zeVirtualMemMap",
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
    );
    assert_code(
        &vm.map(base + 8 * G, G, &q).unwrap_err(),
        "zeVirtualMemMap",
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
    );
    let e = vm.map(base + G, 2 * G, &q).unwrap_err();
    assert_code(&e, "zeVirtualMemMap", ZE_RESULT_ERROR_INVALID_SIZE);
    assert!(e.message.contains("all of it"), "{e}");

    // Unmap what is not mapped, or more than a mapping.
    assert_code(
        &vm.unmap(base + G, G).unwrap_err(),
        "zeVirtualMemUnmap",
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
    );
    assert_code(
        &vm.unmap(base, 2 * G).unwrap_err(),
        "zeVirtualMemUnmap",
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
    );
    // Access on an unmapped range; from another device.
    assert_code(
        &vm.set_access(base + G, G, 0).unwrap_err(),
        "zeVirtualMemSetAccessAttribute",
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
    );
    let e = vm.set_access(base, G, 1).unwrap_err();
    assert_code(
        &e,
        "zeVirtualMemSetAccessAttribute",
        ZE_RESULT_ERROR_UNSUPPORTED_FEATURE,
    );
    assert!(e.message.contains("per context"), "{e}");

    // Free a reservation with a mapping in it; free a range not reserved.
    assert_code(
        &vm.unreserve(base, 4 * G).unwrap_err(),
        "zeVirtualMemFree",
        ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE,
    );
    assert_code(
        &vm.unreserve(base, 2 * G).unwrap_err(),
        "zeVirtualMemFree",
        ZE_RESULT_ERROR_INVALID_ARGUMENT,
    );

    // Destroy mapped physical memory: an error, the handle consumed, and
    // the memory still counted as allocated.
    let before = b.memory_info().unwrap().free;
    assert_code(
        &vm.release_physical(p).unwrap_err(),
        "zePhysicalMemDestroy",
        ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE,
    );
    assert_eq!(with(|s| s.vm.physicals.len()), 2);
    assert_eq!(b.memory_info().unwrap().free, before);
    assert!(vm.unmap(base + 3 * G, G).unwrap_err().source.is_some());

    // Clean up what can be: the consumed physical memory is the driver's
    // (the fake's) to keep; forget it so the context destroy check passes.
    vm.unmap(base, G).unwrap();
    vm.release_physical(q).unwrap();
    vm.unreserve(base, 4 * G).unwrap();
    with(|s| s.vm.physicals.clear());
}

#[test]
fn exhausting_memory_or_address_space_is_out_of_memory() {
    let b = backend();
    let vm = vm(&b);
    // The fake GPU has 1 GiB.
    let held: Vec<_> = (0..512).map(|_| vm.create_physical(G).unwrap()).collect();
    assert!(matches!(
        vm.create_physical(G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    assert!(
        matches!(b.malloc(512), Err(DeviceAllocError::OutOfMemory)),
        "shared with zeMemAllocDevice"
    );
    assert_eq!(b.memory_info().unwrap().free, 0);
    drop(held);
    assert!(
        with(|s| s.vm.physicals.is_empty()),
        "ZePhysical destroys on drop"
    );
    assert_eq!(b.memory_info().unwrap().free, 1 << 30);

    with(|s| s.vm.va_limit = 8 * G as usize);
    let r = vm.reserve(6 * G).unwrap();
    assert!(matches!(
        vm.reserve(4 * G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    vm.unreserve(r, 6 * G).unwrap();
    vm.unreserve(vm.reserve(8 * G).unwrap(), 8 * G).unwrap();

    // Any other failure of zePhysicalMemCreate stays a backend error.
    with(|s| s.vm.create_error = Some(ZE_RESULT_ERROR_DEVICE_LOST));
    let e = backend_err(vm.create_physical(G).unwrap_err());
    assert_code(&e, "zePhysicalMemCreate", ZE_RESULT_ERROR_DEVICE_LOST);
    assert_eq!(b.memory_info().unwrap().free, 1 << 30, "nothing counted");
}

#[test]
fn physical_memory_is_destroyed_before_the_context() {
    let p = {
        let b = backend();
        let vm = vm(&b);
        vm.create_physical(G).unwrap()
        // The backend drops here; the physical memory keeps the context.
    };
    assert_eq!(with(|s| s.contexts.len()), 1);
    drop(p);
    // The fake asserts on destroy order (no physical memory left).
    assert!(with(|s| s.contexts.is_empty() && s.vm.physicals.is_empty()));
}

/// A table of the fake's entries without the ones `remove` takes out.
fn api_without(remove: impl FnOnce(&mut ZeApi)) -> Arc<ZeApi> {
    let full = fake::api();
    let mut t = ZeApi::stub();
    t.zeInit = full.zeInit;
    t.zeDriverGet = full.zeDriverGet;
    t.zeDeviceGet = full.zeDeviceGet;
    t.zeDeviceGetCommandQueueGroupProperties = full.zeDeviceGetCommandQueueGroupProperties;
    t.zeDeviceGetMemoryProperties = full.zeDeviceGetMemoryProperties;
    t.zeContextCreate = full.zeContextCreate;
    t.zeContextDestroy = full.zeContextDestroy;
    t.zeCommandListCreateImmediate = full.zeCommandListCreateImmediate;
    t.zeCommandListDestroy = full.zeCommandListDestroy;
    t.zeMemAllocDevice = full.zeMemAllocDevice;
    t.zeVirtualMemReserve = full.zeVirtualMemReserve;
    t.zeVirtualMemFree = full.zeVirtualMemFree;
    t.zeVirtualMemQueryPageSize = full.zeVirtualMemQueryPageSize;
    t.zePhysicalMemCreate = full.zePhysicalMemCreate;
    t.zePhysicalMemDestroy = full.zePhysicalMemDestroy;
    t.zeVirtualMemMap = full.zeVirtualMemMap;
    t.zeVirtualMemUnmap = full.zeVirtualMemUnmap;
    t.zeVirtualMemSetAccessAttribute = full.zeVirtualMemSetAccessAttribute;
    remove(&mut t);
    Arc::new(t)
}

#[test]
fn missing_vmm_symbols_mean_no_virtual_memory() {
    let b = LevelZeroBackend::with_api(api_without(|_| {}), 0).unwrap();
    assert!(
        b.virtual_memory().is_some(),
        "all present: the capability is there"
    );
    type Remove = fn(&mut ZeApi);
    let removals: [(&str, Remove); 8] = [
        ("zeVirtualMemReserve", |t| t.zeVirtualMemReserve = None),
        ("zeVirtualMemFree", |t| t.zeVirtualMemFree = None),
        ("zeVirtualMemQueryPageSize", |t| {
            t.zeVirtualMemQueryPageSize = None
        }),
        ("zePhysicalMemCreate", |t| t.zePhysicalMemCreate = None),
        ("zePhysicalMemDestroy", |t| t.zePhysicalMemDestroy = None),
        ("zeVirtualMemMap", |t| t.zeVirtualMemMap = None),
        ("zeVirtualMemUnmap", |t| t.zeVirtualMemUnmap = None),
        ("zeVirtualMemSetAccessAttribute", |t| {
            t.zeVirtualMemSetAccessAttribute = None
        }),
    ];
    for (name, remove) in removals {
        let api = api_without(remove);
        assert!(!api.has_virtual_memory(), "{name}");
        let b = LevelZeroBackend::with_api(api, 0).unwrap();
        assert!(b.virtual_memory().is_none(), "without {name}");
        assert!(
            !with(|s| s.calls.contains(&"zeVirtualMemQueryPageSize")),
            "not probed without {name}"
        );
        assert!(b.malloc(512).is_ok(), "the backend still allocates");
    }
}

#[test]
fn a_driver_that_refuses_the_page_size_query_has_no_virtual_memory() {
    let api = fake::api();
    with(|s| s.vm.query_error = Some(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE));
    let b = LevelZeroBackend::with_api(api.clone(), 0).unwrap();
    assert!(b.virtual_memory().is_none());
    drop(b);
    // A page size that is not a power of two is not trusted.
    with(|s| s.vm.page = 3 << 20);
    assert!(
        LevelZeroBackend::with_api(api, 0)
            .unwrap()
            .virtual_memory()
            .is_none()
    );
}

#[test]
fn failed_zeinit_probes_nothing() {
    let api = fake::api();
    with(|s| s.init_result = ZE_RESULT_ERROR_UNINITIALIZED);
    let e = LevelZeroBackend::with_api(api, 0).unwrap_err();
    assert!(matches!(e, OpenError::NoDevice { .. }), "{e:?}");
    assert_eq!(with(|s| s.calls.clone()), vec!["zeInit"]);
}
