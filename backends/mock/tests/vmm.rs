//! The mock's virtual memory (`cachalot_core::VirtualMemory`): placement,
//! counting, typed misuse errors, data following physical pages, OOM,
//! injected failures and the "nothing leaked" check.

use cachalot_core::{Backend, BackendError, DeviceAllocError, VirtualMemory};
use cachalot_mock::{
    DEFAULT_BASE_ADDRESS, DEFAULT_GRANULARITY, DEVICE_ADDRESS_STRIDE, Failure, InvalidAccessKind,
    MockBackend, MockCall, MockConfig, MockMapping, MockPhysical, Placement, VmmUsage, codes,
};

const M: u64 = 1 << 20;
const G: u64 = DEFAULT_GRANULARITY;

fn dev() -> MockBackend {
    MockBackend::new(1 << 30)
}

fn code(r: Result<(), BackendError>) -> i64 {
    r.expect_err("expected an error").code
}

fn alloc_code<T: std::fmt::Debug>(r: Result<T, DeviceAllocError>) -> i64 {
    match r.expect_err("expected an error") {
        DeviceAllocError::OutOfMemory => -1,
        DeviceAllocError::Backend(e) => e.code,
    }
}

/// A reservation of `pages` pages with every page backed, mapped and
/// accessible; returns the reservation and the physical pages.
fn mapped(d: &MockBackend, pages: u64) -> (u64, Vec<MockPhysical>) {
    let a = d.reserve(pages * G).unwrap();
    let mut ps = Vec::new();
    for i in 0..pages {
        let p = d.create_physical(G).unwrap();
        d.map(a + i * G, G, &p).unwrap();
        ps.push(p);
    }
    d.set_access(a, pages * G, d.device()).unwrap();
    (a, ps)
}

/// Unmaps, releases and unreserves everything [`mapped`] made.
fn teardown(d: &MockBackend, a: u64, ps: Vec<MockPhysical>) {
    let n = ps.len() as u64;
    for i in 0..n {
        d.unmap(a + i * G, G).unwrap();
    }
    for p in ps {
        d.release_physical(p).unwrap();
    }
    d.unreserve(a, n * G).unwrap();
}

#[test]
fn capability_and_granularity() {
    let d = dev();
    assert!(d.virtual_memory().is_some(), "on by default");
    assert_eq!(d.granularity().unwrap(), 2 * M);
    let d = MockConfig::new(1 << 30).granularity(64 << 10).build();
    assert_eq!(d.granularity().unwrap(), 64 << 10);
    let a = d.reserve(64 << 10).unwrap();
    assert_eq!(a % (64 << 10), 0);
    d.unreserve(a, 64 << 10).unwrap();
    // Not a power of two: rounded up; tiny: at least 512.
    let d = MockConfig::new(1 << 30).granularity(3000).build();
    assert_eq!(d.granularity().unwrap(), 4096);
    let d = MockConfig::new(1 << 30).granularity(1).build();
    assert_eq!(d.granularity().unwrap(), 512);
    // Off: no capability, and every call is a typed error.
    let d = MockConfig::new(1 << 30).virtual_memory(false).build();
    assert!(d.virtual_memory().is_none());
    assert_eq!(d.granularity().unwrap_err().code, codes::NOT_SUPPORTED);
    assert_eq!(alloc_code(d.reserve(G)), codes::NOT_SUPPORTED);
    assert_eq!(alloc_code(d.create_physical(G)), codes::NOT_SUPPORTED);
    assert_eq!(code(d.unmap(DEFAULT_BASE_ADDRESS, G)), codes::NOT_SUPPORTED);
    assert_eq!(d.counters().errors, 4);
}

#[test]
fn reservations_are_disjoint_from_segments_and_each_other() {
    // The segment range of device 0 is unchanged: 1 TiB from the default
    // base, and reservations lie right above it, inside the device's span.
    let d = dev();
    let (base, size) = d.address_range();
    assert_eq!((base, size), (DEFAULT_BASE_ADDRESS, 1 << 40));
    let (rs, re) = d.reservation_range();
    assert_eq!(rs, base + size);
    assert_eq!(re, DEFAULT_BASE_ADDRESS + DEVICE_ADDRESS_STRIDE);
    let mut ranges = Vec::new();
    for i in 1..=8 {
        let p = d.malloc(i * G).unwrap();
        ranges.push((p, i * G));
        let a = d.reserve(i * G).unwrap();
        assert!(a >= rs && a + i * G <= re, "{a:#x}");
        assert_eq!(a % G, 0);
        ranges.push((a, i * G));
    }
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:x?}");
    }
    // Lowest first: an unreserved hole is reused.
    let res = d.live_reservations();
    assert_eq!(res[0].0, rs);
    d.unreserve(res[0].0, res[0].1).unwrap();
    assert_eq!(d.reserve(G).unwrap(), rs);
    // Another device's reservations are in its own span.
    let d1 = MockConfig::new(1 << 30).device(1).build();
    let a1 = d1.reserve(G).unwrap();
    assert!(a1 >= DEFAULT_BASE_ADDRESS + DEVICE_ADDRESS_STRIDE);
    assert!(a1 < DEFAULT_BASE_ADDRESS + 2 * DEVICE_ADDRESS_STRIDE);
    assert!(d.unreserve(a1, G).is_err(), "unknown to device 0");
}

#[test]
fn segment_placement_is_unchanged_by_virtual_memory() {
    for placement in [Placement::Cuda13, Placement::Increasing] {
        let plain = MockConfig::new(1 << 30)
            .placement(placement)
            .virtual_memory(false)
            .build();
        let vmm = MockConfig::new(1 << 30).placement(placement).build();
        for size in [2 * M, 512, 20 * M, 4096, 64 * M] {
            let a = vmm.reserve(G).unwrap();
            let p = vmm.create_physical(G).unwrap();
            vmm.map(a, G, &p).unwrap();
            assert_eq!(plain.malloc(size).unwrap(), vmm.malloc(size).unwrap());
        }
    }
    // The first 2 MiB segment of device 0 (Cuda13): the low end of the top
    // 32 MiB chunk of the 1 TiB range.
    let d = dev();
    d.reserve(G).unwrap();
    assert_eq!(
        d.malloc(2 * M).unwrap(),
        DEFAULT_BASE_ADDRESS + (1 << 40) - (32 << 20)
    );
}

#[test]
fn every_call_is_counted() {
    let d = dev();
    let c0 = d.counters();
    let g = d.granularity().unwrap();
    let a = d.reserve(2 * g).unwrap();
    let p = d.create_physical(g).unwrap();
    let q = d.create_physical(g).unwrap();
    d.map(a, g, &p).unwrap();
    d.map(a + g, g, &q).unwrap();
    d.set_access(a, 2 * g, 0).unwrap();
    d.unmap(a, g).unwrap();
    d.unmap(a + g, g).unwrap();
    d.release_physical(p).unwrap();
    d.release_physical(q).unwrap();
    d.unreserve(a, 2 * g).unwrap();
    // A failed call counts too.
    assert!(d.unreserve(a, 2 * g).is_err());
    assert!(d.reserve(3).is_err());
    let c = d.counters();
    assert_eq!(
        (c.granularity, c.reserve, c.unreserve, c.create_physical),
        (1, 2, 2, 2)
    );
    assert_eq!(
        (c.release_physical, c.map, c.unmap, c.set_access),
        (2, 2, 2, 1)
    );
    assert_eq!(
        (c.errors, c.reserve_failed, c.create_physical_failed),
        (2, 1, 0)
    );
    assert_eq!(c0.reserve, 0);
    for (call, n) in [
        (MockCall::Granularity, 1),
        (MockCall::Reserve, 2),
        (MockCall::Unreserve, 2),
        (MockCall::CreatePhysical, 2),
        (MockCall::ReleasePhysical, 2),
        (MockCall::Map, 2),
        (MockCall::Unmap, 2),
        (MockCall::SetAccess, 1),
    ] {
        assert_eq!(d.call_count(call), n, "{call}");
    }
    assert_eq!(MockCall::VIRTUAL_MEMORY.len(), 8);
    assert!(
        MockCall::VIRTUAL_MEMORY
            .iter()
            .all(|c| MockCall::ALL.contains(c))
    );
    // VMM calls advance the operation clock like any backend call.
    let t = d.op_clock();
    d.granularity().unwrap();
    assert_eq!(d.op_clock(), t + 1);
    d.assert_no_vmm_leaks();
}

#[test]
fn accessors_and_memory_info() {
    let d = dev();
    let a = d.reserve(4 * G).unwrap();
    let p = d.create_physical(2 * G).unwrap();
    let seg = d.malloc(G).unwrap();
    d.map(a + 2 * G, 2 * G, &p).unwrap();
    assert_eq!(d.live_reservations(), vec![(a, 4 * G)]);
    assert_eq!((d.reservation_count(), d.reserved_bytes()), (1, 4 * G));
    assert_eq!((d.physical_count(), d.live_physical_bytes()), (1, 2 * G));
    assert_eq!(d.live_physical(), vec![(p.id(), 2 * G)]);
    assert_eq!(p.size(), 2 * G);
    assert_eq!(
        d.mappings(),
        vec![MockMapping {
            addr: a + 2 * G,
            size: 2 * G,
            physical: p.id(),
            accessible: false,
        }]
    );
    d.set_access(a + 2 * G, 2 * G, 0).unwrap();
    assert!(d.mappings()[0].accessible);
    assert_eq!((d.mapping_count(), d.mapped_bytes()), (1, 2 * G));
    // Segments and physical memory are counted apart, and both are used.
    assert_eq!((d.live_bytes(), d.segment_count()), (G, 1));
    assert_eq!(d.live_segments(), vec![(seg, G)]);
    let info = d.memory_info().unwrap();
    assert_eq!(info.free, (1 << 30) - 3 * G);
    assert_eq!(
        d.vmm_usage(),
        VmmUsage {
            reservations: 1,
            reserved_bytes: 4 * G,
            physical: 1,
            physical_bytes: 2 * G,
            mappings: 1,
            mapped_bytes: 2 * G,
        }
    );
    assert!(!d.vmm_usage().is_empty());
    assert!(d.vmm_usage().to_string().contains("1 mapping(s)"));
    d.unmap(a + 2 * G, 2 * G).unwrap();
    d.release_physical(p).unwrap();
    d.unreserve(a, 4 * G).unwrap();
    d.free(seg, G).unwrap();
    assert_eq!(d.memory_info().unwrap().free, 1 << 30);
    assert!(d.vmm_usage().is_empty());
    d.assert_no_vmm_leaks();
}

#[test]
fn misuse_is_a_typed_error_and_changes_nothing() {
    let d = dev();
    let a = d.reserve(4 * G).unwrap();
    let p = d.create_physical(G).unwrap();
    let big = d.create_physical(2 * G).unwrap();
    // Sizes and alignment.
    assert_eq!(alloc_code(d.reserve(0)), codes::INVALID_VALUE);
    assert_eq!(alloc_code(d.reserve(G + 512)), codes::INVALID_VALUE);
    assert_eq!(alloc_code(d.create_physical(M)), codes::INVALID_VALUE);
    assert_eq!(code(d.map(a + M, G, &p)), codes::INVALID_VALUE, "unaligned");
    assert_eq!(code(d.map(a, 2 * G, &p)), codes::INVALID_VALUE, "size");
    // Outside a reservation.
    assert_eq!(
        code(d.map(a + 4 * G, G, &p)),
        codes::INVALID_DEVICE_POINTER,
        "past the end"
    );
    assert_eq!(
        code(d.map(a + 3 * G, 2 * G, &big)),
        codes::INVALID_DEVICE_POINTER,
        "straddles the end"
    );
    let seg = d.malloc(G).unwrap();
    assert_eq!(code(d.map(seg, G, &p)), codes::INVALID_DEVICE_POINTER);
    // Mapping twice over mapped pages.
    d.map(a, G, &p).unwrap();
    let q = d.create_physical(G).unwrap();
    assert_eq!(code(d.map(a, G, &q)), codes::ALREADY_MAPPED);
    d.map(a + 2 * G, 2 * G, &big).unwrap();
    assert_eq!(code(d.map(a + 3 * G, G, &q)), codes::ALREADY_MAPPED);
    // Unmapping what is not mapped, part of a mapping, or two at once.
    assert_eq!(code(d.unmap(a + G, G)), codes::NOT_MAPPED);
    assert_eq!(code(d.unmap(a, 2 * G)), codes::NOT_MAPPED, "hole");
    assert_eq!(code(d.unmap(a + 2 * G, G)), codes::INVALID_VALUE, "part");
    assert_eq!(code(d.unmap(a + 3 * G, G)), codes::INVALID_VALUE, "part");
    assert_eq!(code(d.unmap(seg, G)), codes::INVALID_DEVICE_POINTER);
    let r = d.create_physical(G).unwrap();
    d.map(a + G, G, &r).unwrap();
    assert_eq!(code(d.unmap(a, 2 * G)), codes::INVALID_VALUE, "two");
    d.unmap(a + G, G).unwrap();
    d.release_physical(r).unwrap();
    // set_access: the same rules, and the own device only.
    assert_eq!(code(d.set_access(a + G, G, 0)), codes::NOT_MAPPED);
    assert_eq!(code(d.set_access(a + 2 * G, G, 0)), codes::INVALID_VALUE);
    assert_eq!(code(d.set_access(a, G, 1)), codes::INVALID_DEVICE);
    // Unreserving with pages mapped; unknown range; wrong size.
    assert_eq!(code(d.unreserve(a, 4 * G)), codes::ILLEGAL_STATE);
    assert_eq!(
        code(d.unreserve(a + G, 3 * G)),
        codes::INVALID_DEVICE_POINTER
    );
    assert_eq!(code(d.unreserve(a, 2 * G)), codes::INVALID_VALUE);
    // Releasing physical memory still mapped.
    assert_eq!(code(d.release_physical(p.clone())), codes::ILLEGAL_STATE);
    // Nothing changed.
    assert_eq!(d.reservation_count(), 1);
    assert_eq!(d.mapping_count(), 2);
    assert_eq!(d.physical_count(), 3);
    assert!(d.mappings().iter().all(|m| !m.accessible));
    // Released or foreign handles.
    d.release_physical(q.clone()).unwrap();
    assert_eq!(
        code(d.release_physical(q.clone())),
        codes::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(code(d.map(a + G, G, &q)), codes::INVALID_RESOURCE_HANDLE);
    let other = dev();
    let foreign = other.create_physical(G).unwrap();
    assert_eq!(
        code(d.map(a + G, G, &foreign)),
        codes::INVALID_RESOURCE_HANDLE
    );
    assert_eq!(
        code(d.release_physical(foreign)),
        codes::INVALID_RESOURCE_HANDLE
    );
    // Every error names its call.
    assert_eq!(d.unmap(a + G, G).unwrap_err().call, "unmap");
    // Clean up in the right order.
    d.unmap(a, G).unwrap();
    d.unmap(a + 2 * G, 2 * G).unwrap();
    d.release_physical(p).unwrap();
    d.release_physical(big).unwrap();
    d.unreserve(a, 4 * G).unwrap();
    d.free(seg, G).unwrap();
    d.assert_no_vmm_leaks();
}

#[test]
fn unmap_with_pending_work_fails_until_it_completes() {
    let d = dev();
    let s1 = d.create_stream();
    let s2 = d.create_stream();
    let (a, ps) = mapped(&d, 2);
    // Work on s1 touches the first page only.
    d.use_memory(s1, a + 100, 4096, 1).unwrap();
    assert_eq!(code(d.unmap(a, G)), codes::NOT_READY);
    assert_eq!(d.mapping_count(), 2, "nothing unmapped");
    // The second page is free to go.
    d.unmap(a + G, G).unwrap();
    // A later use on s2 keeps it pending after s1 completes.
    d.use_memory(s2, a, 8, 1).unwrap();
    d.complete(s1).unwrap();
    let e = d.unmap(a, G).unwrap_err();
    assert_eq!(e.code, codes::NOT_READY);
    assert!(e.message.contains("stream2"), "{}", e.message);
    d.synchronize_device().unwrap();
    d.unmap(a, G).unwrap();
    for p in ps {
        d.release_physical(p).unwrap();
    }
    d.unreserve(a, 2 * G).unwrap();
    // Auto-completed work is never pending.
    let d = MockConfig::new(1 << 30).auto_complete(true).build();
    let (a, ps) = mapped(&d, 1);
    d.use_memory(d.create_stream(), a, G, 1).unwrap();
    teardown(&d, a, ps);
    d.assert_no_vmm_leaks();
}

#[test]
fn data_follows_physical_pages() {
    let d = MockConfig::new(1 << 30).auto_complete(true).build();
    let s = d.create_stream();
    let a = d.reserve(4 * G).unwrap();
    let p = d.create_physical(G).unwrap();
    let q = d.create_physical(G).unwrap();
    d.map(a, G, &p).unwrap();
    d.map(a + G, G, &q).unwrap();
    d.set_access(a, 2 * G, 0).unwrap();
    // One use spanning both pages, then another over part of the first.
    d.use_memory(s, a + G - 512, 1024, 7).unwrap();
    d.use_memory(s, a, 256, 8).unwrap();
    assert_eq!(
        d.read_tags(a, G + 1024).unwrap(),
        vec![
            (a, a + 256, Some(8)),
            (a + 256, a + G - 512, None),
            (a + G - 512, a + G + 512, Some(7)),
            (a + G + 512, a + G + 1024, None),
        ]
    );
    // Unmapped bytes have no readable contents.
    assert!(d.tag_at(a + 2 * G).is_none());
    assert_eq!(
        d.read_tags(a + G, 2 * G).unwrap_err().code,
        codes::NOT_MAPPED
    );
    // Move the first page to the fourth slot and the second to the first:
    // each keeps its data.
    d.unmap(a, G).unwrap();
    d.unmap(a + G, G).unwrap();
    d.map(a + 3 * G, G, &p).unwrap();
    d.map(a, G, &q).unwrap();
    d.set_access(a + 3 * G, G, 0).unwrap();
    d.set_access(a, G, 0).unwrap();
    assert_eq!(d.tag_at(a + 3 * G), Some(8));
    assert_eq!(d.tag_at(a + 3 * G + G - 1), Some(7));
    assert_eq!(d.tag_at(a + 3 * G + 256), None);
    assert_eq!(d.tag_at(a), Some(7));
    assert_eq!(d.tag_at(a + 511), Some(7));
    assert_eq!(d.tag_at(a + 512), None);
    // A page mapped twice shows the same data at both addresses.
    d.map(a + 2 * G, G, &p).unwrap();
    d.set_access(a + 2 * G, G, 0).unwrap();
    d.use_memory(s, a + 2 * G + 4096, 1, 9).unwrap();
    assert_eq!(d.tag_at(a + 3 * G + 4096), Some(9));
    // Unmapping the whole reservation at once fails over the hole at page
    // 1; each mapping goes in its own call.
    assert_eq!(d.unmap(a, 4 * G).unwrap_err().code, codes::NOT_MAPPED);
    for i in [0, 2, 3] {
        d.unmap(a + i * G, G).unwrap();
    }
    // Releasing forgets: a new allocation starts empty.
    d.release_physical(p).unwrap();
    d.release_physical(q).unwrap();
    let r = d.create_physical(G).unwrap();
    d.map(a, G, &r).unwrap();
    assert_eq!(d.read_tags(a, G).unwrap(), vec![(a, a + G, None)]);
    d.unmap(a, G).unwrap();
    d.release_physical(r).unwrap();
    d.unreserve(a, 4 * G).unwrap();
    d.assert_no_vmm_leaks();
}

#[test]
fn access_to_unmapped_or_inaccessible_pages_is_reported() {
    let d = dev();
    let s = d.create_stream();
    let a = d.reserve(3 * G).unwrap();
    let p = d.create_physical(G).unwrap();
    let q = d.create_physical(G).unwrap();
    d.map(a, G, &p).unwrap();
    d.set_access(a, G, 0).unwrap();
    d.map(a + 2 * G, G, &q).unwrap();
    // Page 0 accessible, page 1 unmapped, page 2 mapped without access.
    d.use_memory(s, a + G - 8, G + 16, 5).unwrap();
    let bad = d.invalid_accesses();
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert_eq!(bad[0].kind, InvalidAccessKind::Unmapped);
    assert_eq!(bad[0].range, (a + G, a + 2 * G));
    assert_eq!(bad[1].kind, InvalidAccessKind::NoAccess);
    assert_eq!(bad[1].range, (a + 2 * G, a + 2 * G + 8));
    assert_eq!(bad[0].site.tag, 5);
    assert_eq!((bad[0].site.addr, bad[0].site.len), (a + G - 8, G + 16));
    assert!(bad[0].to_string().contains("not mapped"));
    assert_eq!(d.counters().invalid_accesses, 2);
    // The accessible bytes were written; the others were not.
    assert_eq!(d.tag_at(a + G - 1), Some(5));
    assert_eq!(d.tag_at(a + 2 * G), None);
    // A use of an accessible page is fine; one outside every reservation
    // and segment is an error, as before.
    d.use_memory(s, a, 64, 6).unwrap();
    assert_eq!(d.invalid_access_count(), 2);
    assert_eq!(
        d.use_memory(s, a + 3 * G, 64, 6).unwrap_err().code,
        codes::INVALID_DEVICE_POINTER
    );
    // After an unmap, the page's old address is invalid again.
    d.complete_all();
    d.unmap(a, G).unwrap();
    d.use_memory(s, a, 64, 6).unwrap();
    assert_eq!(d.invalid_access_count(), 3);
    d.clear_invalid_accesses();
    assert_eq!(d.invalid_access_count(), 0);
    // Uses inside a capture do not run: nothing is reported until the
    // graph is launched.
    let s2 = d.create_stream();
    d.begin_capture(s2).unwrap();
    d.use_memory(s2, a, 64, 10).unwrap();
    let graph = d.end_capture(s2).unwrap();
    assert_eq!(d.invalid_access_count(), 0);
    d.launch_graph(&graph, s).unwrap();
    assert_eq!(d.invalid_access_count(), 1);
    d.complete_all();
    d.unmap(a + 2 * G, G).unwrap();
    d.release_physical(p).unwrap();
    d.release_physical(q).unwrap();
    d.unreserve(a, 3 * G).unwrap();
    d.assert_no_vmm_leaks();
}

#[test]
fn races_on_mapped_pages_are_found() {
    let d = dev();
    let (s1, s2) = (d.create_stream(), d.create_stream());
    let (a, ps) = mapped(&d, 2);
    d.use_memory(s1, a + G - 512, 1024, 1).unwrap();
    d.use_memory(s2, a + G, 512, 2).unwrap();
    assert_eq!(d.race_count(), 1);
    assert_eq!(d.races()[0].overlap, (a + G, a + G + 512));
    d.synchronize_device().unwrap();
    teardown(&d, a, ps);
    d.assert_no_vmm_leaks();
}

#[test]
fn create_physical_counts_against_capacity() {
    let d = MockBackend::new(16 * M);
    let p = d.create_physical(8 * M).unwrap();
    let seg = d.malloc(4 * M).unwrap();
    assert_eq!(d.memory_info().unwrap().free, 4 * M);
    assert!(matches!(
        d.create_physical(6 * M),
        Err(DeviceAllocError::OutOfMemory)
    ));
    assert!(matches!(
        d.malloc(6 * M),
        Err(DeviceAllocError::OutOfMemory)
    ));
    let q = d.create_physical(4 * M).unwrap();
    assert_eq!(d.memory_info().unwrap().free, 0);
    assert!(matches!(
        d.create_physical(G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    let c = d.counters();
    assert_eq!((c.create_physical, c.create_physical_failed), (4, 2));
    assert_eq!(d.physical_count(), 2, "a failed create allocates nothing");
    // External usage counts too.
    d.release_physical(q).unwrap();
    d.set_external_usage(4 * M);
    assert!(matches!(
        d.create_physical(G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    d.set_external_usage(0);
    let r = d.create_physical(4 * M).unwrap();
    d.release_physical(r).unwrap();
    d.release_physical(p).unwrap();
    d.free(seg, 4 * M).unwrap();
    assert_eq!(d.memory_info().unwrap().free, 16 * M);
    // Reserving costs no memory; address space runs out, as OOM.
    let a = d.reserve(1 << 40).unwrap();
    assert_eq!(d.memory_info().unwrap().free, 16 * M);
    assert!(matches!(
        d.reserve(DEVICE_ADDRESS_STRIDE),
        Err(DeviceAllocError::OutOfMemory)
    ));
    d.unreserve(a, 1 << 40).unwrap();
    d.assert_no_vmm_leaks();
}

#[test]
fn injected_failures_are_typed_counted_and_change_nothing() {
    let d = dev();
    // reserve / create_physical: OOM or a backend error, nothing allocated.
    d.fail_call_at_with(MockCall::Reserve, 1, Failure::OutOfMemory);
    d.fail_call_at(MockCall::Reserve, 2);
    assert!(matches!(d.reserve(G), Err(DeviceAllocError::OutOfMemory)));
    assert_eq!(alloc_code(d.reserve(G)), codes::INJECTED);
    assert_eq!(d.reservation_count(), 0);
    d.fail_call_at_with(MockCall::CreatePhysical, 1, Failure::OutOfMemory);
    d.fail_call_at_with(MockCall::CreatePhysical, 2, Failure::Backend(719));
    assert!(matches!(
        d.create_physical(G),
        Err(DeviceAllocError::OutOfMemory)
    ));
    match d.create_physical(G) {
        Err(DeviceAllocError::Backend(e)) => {
            assert_eq!((e.code, e.call), (719, "create_physical"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((d.physical_count(), d.live_physical_bytes()), (0, 0));
    // The rest: a BackendError naming the call, no state change.
    let a = d.reserve(2 * G).unwrap();
    let p = d.create_physical(G).unwrap();
    d.fail_call_at(MockCall::Map, 1);
    let e = d.map(a, G, &p).unwrap_err();
    assert_eq!((e.code, e.call), (codes::INJECTED, "map"));
    assert_eq!(d.mapping_count(), 0);
    d.map(a, G, &p).unwrap();
    d.fail_call_at(MockCall::SetAccess, 1);
    assert_eq!(code(d.set_access(a, G, 0)), codes::INJECTED);
    assert!(!d.mappings()[0].accessible);
    d.set_access(a, G, 0).unwrap();
    d.fail_call_at_with(MockCall::Unmap, 1, Failure::OutOfMemory);
    assert_eq!(code(d.unmap(a, G)), codes::MEMORY_ALLOCATION);
    assert_eq!(d.mapping_count(), 1);
    d.unmap(a, G).unwrap();
    d.fail_call_at(MockCall::ReleasePhysical, 1);
    assert_eq!(code(d.release_physical(p.clone())), codes::INJECTED);
    assert_eq!(d.physical_count(), 1, "the memory stays allocated");
    d.release_physical(p).unwrap();
    d.fail_call_always(MockCall::Unreserve);
    assert_eq!(code(d.unreserve(a, 2 * G)), codes::INJECTED);
    assert_eq!(code(d.unreserve(a, 2 * G)), codes::INJECTED);
    assert_eq!(d.reservation_count(), 1);
    d.fail_call_at(MockCall::Granularity, 1);
    assert_eq!(d.granularity().unwrap_err().code, codes::INJECTED);
    assert_eq!(d.granularity().unwrap(), G);
    d.clear_failures();
    d.unreserve(a, 2 * G).unwrap();
    let c = d.counters();
    assert_eq!(c.injected, 11);
    assert_eq!((c.reserve_failed, c.create_physical_failed), (2, 2));
    assert_eq!(c.errors, 11);
    d.assert_no_vmm_leaks();
}

#[test]
fn nothing_leaked_after_cleanup() {
    let d = MockConfig::new(1 << 30).auto_complete(true).build();
    let s = d.create_stream();
    // Grow a reservation page by page, use it, shrink it back.
    let a = d.reserve(8 * G).unwrap();
    let mut pages = Vec::new();
    for i in 0..8 {
        let p = d.create_physical(G).unwrap();
        d.map(a + i * G, G, &p).unwrap();
        d.set_access(a + i * G, G, 0).unwrap();
        d.use_memory(s, a, (i + 1) * G, i + 1).unwrap();
        pages.push(p);
    }
    assert_eq!(d.live_physical_bytes(), 8 * G);
    assert_eq!(d.invalid_access_count(), 0);
    while let Some(p) = pages.pop() {
        let at = a + pages.len() as u64 * G;
        d.unmap(at, G).unwrap();
        d.release_physical(p).unwrap();
    }
    d.unreserve(a, 8 * G).unwrap();
    assert!(d.vmm_usage().is_empty());
    assert_eq!(d.memory_info().unwrap().free, 1 << 30);
    d.assert_no_vmm_leaks();
}

#[test]
#[should_panic(expected = "virtual memory leaked: 1 reservation(s)")]
fn the_leak_check_sees_a_leak() {
    let d = dev();
    let a = d.reserve(G).unwrap();
    let p = d.create_physical(G).unwrap();
    d.map(a, G, &p).unwrap();
    d.assert_no_vmm_leaks();
}
