//! Virtual memory (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`) on a
//! real device. Every test prints "skipped: ..." and passes on a machine
//! without CUDA or on a device without virtual memory management. The
//! tests of this file run one at a time (one of them measures free memory).

mod common;

use std::sync::{Mutex, MutexGuard};

use cachalot_core::{Backend, DeviceAllocError, VirtualMemory};
use cachalot_cuda::{CudaBackend, CudaStream};
use common::{backend_or_skip, read_back};

const MIB: u64 = 1 << 20;

/// Serializes the tests of this file.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The backend and its granularity, or `None` (having printed why) when
/// the machine has no device or the device no virtual memory.
fn vmm_or_skip(test: &str) -> Option<(CudaBackend, u64)> {
    let b = backend_or_skip(test)?;
    if b.virtual_memory().is_none() {
        common::skip(format_args!(
            "{test}: the device does not support virtual memory management"
        ));
        return None;
    }
    let g = b.granularity().expect("granularity");
    Some((b, g))
}

/// Runs a kernel-free workload once (memset, copies, a cuMemAlloc) so that
/// the driver's lazy per-context allocations happen before free memory is
/// measured.
fn warm_up(b: &CudaBackend) {
    let p = b.malloc(2 * MIB).expect("malloc");
    b.memset_d8_async(p, 0, 2 * MIB, CudaStream::LEGACY)
        .expect("memset");
    b.memcpy_htod(p, &[1, 2, 3]).expect("memcpy_htod");
    let _ = read_back(b, p, 3);
    b.free(p, 2 * MIB).expect("free");
    b.synchronize_device().expect("synchronize");
}

#[test]
fn granularity_and_capability() {
    let _serial = serial();
    let Some((b, g)) = vmm_or_skip("granularity_and_capability") else {
        return;
    };
    println!("device 0: {}, VMM granularity {g} B", b.device_name());
    assert!(g.is_power_of_two(), "{g}");
    assert!(g >= 4096, "{g}");
    assert_eq!(b.vmm_granularity(), Some(g));
    assert!(b.virtual_memory().is_some());
}

#[test]
fn map_write_move_and_release() {
    let _serial = serial();
    let Some((b, g)) = vmm_or_skip("map_write_move_and_release") else {
        return;
    };
    warm_up(&b);
    let start = b.memory_info().expect("memory_info");
    let s = CudaStream::LEGACY;

    // Reserve four pages of address space and back the first two.
    let a = b.reserve(4 * g).expect("reserve");
    assert_ne!(a, 0);
    assert_eq!(a % g, 0, "reservation {a:#x} not aligned to {g}");
    let p = b.create_physical(g).expect("create_physical p");
    let q = b.create_physical(g).expect("create_physical q");
    assert_eq!((p.size(), q.size()), (g, g));
    assert_ne!(p.as_raw(), q.as_raw());
    let during = b.memory_info().expect("memory_info");
    assert!(
        during.free + 2 * g <= start.free + 64 * MIB,
        "free memory did not drop by two pages: {start:?} -> {during:?}"
    );
    b.map(a, g, &p).expect("map p");
    b.map(a + g, g, &q).expect("map q");
    // One cuMemSetAccess over both adjacent mappings.
    b.set_access(a, 2 * g, b.device()).expect("set_access");

    // Write: a memset per page, then a small pattern copied from the host.
    let len = g as usize;
    b.memset_d8_async(a, 0xAB, g, s).expect("memset p");
    b.memset_d8_async(a + g, 0xCD, g, s).expect("memset q");
    b.stream_synchronize(s).expect("sync");
    let pattern: Vec<u8> = (0u8..64).collect();
    b.memcpy_htod(a + 256, &pattern).expect("memcpy_htod");
    // A copy across the page boundary, device to device.
    b.memcpy_dtod_async(a + g - 32, a + 256, 64, s)
        .expect("memcpy_dtod");
    b.stream_synchronize(s).expect("sync");

    let first = read_back(&b, a, len);
    assert!(first[..256].iter().all(|&x| x == 0xAB));
    assert_eq!(&first[256..256 + 64], &pattern[..]);
    assert!(first[256 + 64..len - 32].iter().all(|&x| x == 0xAB));
    assert_eq!(&first[len - 32..], &pattern[..32]);
    let second = read_back(&b, a + g, len);
    assert_eq!(&second[..32], &pattern[32..]);
    assert!(second[32..].iter().all(|&x| x == 0xCD));

    // Unmap both (one mapping per cuMemUnmap) and map them back swapped,
    // at other offsets: page p at slot 3, page q at slot 0.
    b.synchronize_device().expect("synchronize");
    b.unmap(a, g).expect("unmap p");
    b.unmap(a + g, g).expect("unmap q");
    b.map(a + 3 * g, g, &p).expect("remap p");
    b.map(a, g, &q).expect("remap q");
    b.set_access(a + 3 * g, g, b.device())
        .expect("set_access p");
    b.set_access(a, g, b.device()).expect("set_access q");
    assert_eq!(read_back(&b, a + 3 * g, len), first, "page p kept its data");
    assert_eq!(read_back(&b, a, len), second, "page q kept its data");

    // Release everything.
    b.synchronize_device().expect("synchronize");
    b.unmap(a + 3 * g, g).expect("unmap p");
    b.unmap(a, g).expect("unmap q");
    b.release_physical(p).expect("release p");
    b.release_physical(q).expect("release q");
    b.unreserve(a, 4 * g).expect("unreserve");
    let end = b.memory_info().expect("memory_info");
    assert!(
        end.free.abs_diff(start.free) < g,
        "free memory is not back to its start: {start:?} -> {end:?}"
    );
}

#[test]
fn physical_memory_beyond_the_device_is_out_of_memory() {
    let _serial = serial();
    let Some((b, g)) = vmm_or_skip("physical_memory_beyond_the_device_is_out_of_memory") else {
        return;
    };
    let total = b.memory_info().expect("memory_info").total;
    let size = (total + (1 << 30)).div_ceil(g) * g;
    match b.create_physical(size) {
        Err(DeviceAllocError::OutOfMemory) => {}
        Ok(p) => {
            let raw = p.as_raw();
            b.release_physical(p).expect("release");
            panic!("cuMemCreate of {size} bytes succeeded (handle {raw:#x})");
        }
        Err(e) => panic!("cuMemCreate of {size} bytes: expected OutOfMemory, got {e}"),
    }
    // The failure is not sticky.
    let p = b.create_physical(g).expect("create_physical after OOM");
    b.release_physical(p).expect("release");
}

#[test]
fn misuse_is_a_typed_error() {
    let _serial = serial();
    let Some((b, g)) = vmm_or_skip("misuse_is_a_typed_error") else {
        return;
    };
    let a = b.reserve(2 * g).expect("reserve");
    let p = b.create_physical(g).expect("create_physical");
    // A size other than the allocation's is refused before the driver.
    let e = b.map(a, 2 * g, &p).expect_err("map with the wrong size");
    assert_eq!((e.backend, e.call, e.code), ("cuda", "cuMemMap", 1));
    // Unmapping what is not mapped: the driver (580, H200) accepts it, so
    // only that it does not fail the state is checked (the mock refuses it).
    match b.unmap(a, g) {
        Ok(()) => println!("cuMemUnmap of an unmapped range: accepted by the driver"),
        Err(e) => println!("cuMemUnmap of an unmapped range: {e}"),
    }
    b.map(a, g, &p).expect("map");
    // Mapping over a mapped page.
    let q = b.create_physical(g).expect("create_physical");
    let e = b.map(a, g, &q).expect_err("map over a mapped page");
    println!("cuMemMap over a mapped page: {e}");
    b.unmap(a, g).expect("unmap");
    b.release_physical(q).expect("release q");
    b.release_physical(p).expect("release p");
    b.unreserve(a, 2 * g).expect("unreserve");
}

/// Not a check: reports whether the driver accepts one `cuMemUnmap` over two
/// adjacent mappings (the driver documents one mapping per call; the mock
/// refuses it), then cleans up either way.
#[test]
fn probe_unmap_spanning_two_mappings() {
    let _serial = serial();
    let Some((b, g)) = vmm_or_skip("probe_unmap_spanning_two_mappings") else {
        return;
    };
    let a = b.reserve(2 * g).expect("reserve");
    let p = b.create_physical(g).expect("create_physical");
    let q = b.create_physical(g).expect("create_physical");
    b.map(a, g, &p).expect("map p");
    b.map(a + g, g, &q).expect("map q");
    match b.unmap(a, 2 * g) {
        Ok(()) => println!("probe: cuMemUnmap over two mappings is accepted"),
        Err(e) => {
            println!("probe: cuMemUnmap over two mappings is refused: {e}");
            // Whatever the failed call left mapped.
            for at in [a, a + g] {
                if let Err(e) = b.unmap(at, g) {
                    println!("probe: then cuMemUnmap of one page at {at:#x}: {e}");
                }
            }
        }
    }
    b.release_physical(p).expect("release p");
    b.release_physical(q).expect("release q");
    b.unreserve(a, 2 * g).expect("unreserve");
}

/// A block of cachalot's expandable mode over physical runs of two sizes
/// (three pages mapped at once: a run of two and a run of one) is shared
/// as those runs (`SharedMemory::Runs`, which PyTorch's one-page-size
/// format cannot carry) and opened again here (`open_runs`, taking this
/// process's own descriptors, as another process on cachalot takes the
/// sender's): both mappings are the same memory, either way.
#[test]
fn runs_of_two_sizes_open_as_one_range() {
    use cachalot_core::engine::SharedMemory;
    use cachalot_core::{AllocatorConfig, CachingAllocator};

    let _serial = serial();
    let test = "runs_of_two_sizes_open_as_one_range";
    let Some((b, g)) = vmm_or_skip(test) else {
        return;
    };
    if b.ipc().is_none() {
        common::skip(format_args!("{test}: the driver cannot share memory"));
        return;
    }
    let s = CudaStream::LEGACY;
    let a = CachingAllocator::with_config(
        b,
        AllocatorConfig::parse("expandable_segments:True").expect("config"),
    )
    .expect("allocator");
    let p = a.allocate(3 * g, s).expect("allocate");
    let runs = match a.share(p) {
        Ok(SharedMemory::Runs { runs, offset }) => {
            assert_eq!(offset, 0);
            runs
        }
        Ok(other) => panic!("three fresh pages: runs of two sizes, got {other:?}"),
        Err(e) if e.to_string().contains("cannot share these pages") => {
            common::skip(format_args!(
                "{test}: the device's memory is not exportable ({e})"
            ));
            a.free(p).expect("free");
            return;
        }
        Err(e) => panic!("share: {e}"),
    };
    assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 3 * g);
    assert!(runs.iter().any(|r| r.1 != runs[0].1), "{runs:?}");
    let b = a.backend();
    let ipc = b.ipc().expect("ipc");
    let q = ipc
        .open_runs(std::process::id() as i32, &runs)
        .expect("open_runs");
    assert_ne!(q, p);
    let n = (3 * g) as usize;
    b.memset_d8_async(p, 0x5a, 3 * g, s).expect("memset");
    b.synchronize_device().expect("synchronize");
    assert!(
        read_back(b, q, n).iter().all(|&x| x == 0x5a),
        "the other view"
    );
    // the last byte of the first run and the first of the second, through
    // the opened view
    b.memset_d8_async(q + runs[0].1 - 1, 0x33, 2, s)
        .expect("memset");
    b.synchronize_device().expect("synchronize");
    let back = read_back(b, p, n);
    let at = runs[0].1 as usize;
    assert_eq!(&back[at - 2..at + 2], &[0x5a, 0x33, 0x33, 0x5a]);
    ipc.close_pages(q).expect("close");
    a.free(p).expect("free");
    a.empty_cache().expect("empty_cache");
}
