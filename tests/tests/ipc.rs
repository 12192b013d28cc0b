//! Sharing allocations with another process on the mock (two mock devices
//! play two processes): what `CachingAllocator::share` hands over for a
//! fixed segment and for expandable pages, that the other side opens it,
//! that a segment open elsewhere is never given back to the device, and
//! bad pointers as typed errors.

use cachalot_conformance::mock::{Dev, FIXED, MIB, check};
use cachalot_core::engine::SharedMemory;
use cachalot_core::{Backend, CachingAllocator, Error, IPC_HANDLE_BYTES};
use cachalot_mock::MockBackend;

fn process(config: &str) -> (MockBackend, CachingAllocator<MockBackend>) {
    let Dev { m, a } = Dev::with_capacity(config, 8 << 30);
    (m, a)
}

/// Two processes of the same config: the producer and the other side.
fn processes(config: &str) -> [(MockBackend, CachingAllocator<MockBackend>); 2] {
    [process(config), process(config)]
}

/// What `a` shares of block `p` of a fixed segment: the segment's handle
/// and the block's offset in it.
fn segment(a: &CachingAllocator<MockBackend>, p: u64) -> ([u8; IPC_HANDLE_BYTES], u64) {
    let SharedMemory::Segment { handle, offset } = a.share(p).unwrap() else {
        panic!("a fixed segment is shared as a segment");
    };
    (handle, offset)
}

/// What `a` shares of block `p` of an expandable segment: the page size,
/// the pages' handles and the block's offset in the first.
fn pages(a: &CachingAllocator<MockBackend>, p: u64) -> (u64, Vec<i32>, u64) {
    let SharedMemory::Pages {
        page,
        handles,
        offset,
    } = a.share(p).unwrap()
    else {
        panic!("an expandable block is shared as pages");
    };
    (page, handles, offset)
}

#[test]
fn a_fixed_segment_is_shared_whole_with_the_offset_of_the_block() {
    let [(m, a), (other, _b)] = processes(FIXED);
    let s = m.default_stream();
    let x = a.allocate(512, s).unwrap();
    let y = a.allocate(4096, s).unwrap();
    let z = a.allocate(700_000, s).unwrap();
    let seg = a.snapshot().segments[0].address;
    for p in [x, y, z] {
        let (handle, offset) = segment(&a, p);
        assert_eq!(offset, p - seg);
        // the same segment: the same handle
        let (h2, _) = segment(&a, x);
        assert_eq!(handle, h2);
    }
    let (handle, _) = segment(&a, y);
    let ipc = other.ipc().unwrap();
    let at = ipc.open_segment(&handle).unwrap();
    // one open per process
    assert!(ipc.open_segment(&handle).is_err());
    // the producer's own process cannot open its handle
    assert!(m.ipc().unwrap().open_segment(&handle).is_err());
    // the producer frees everything while the consumer still maps the
    // segment: it stays cached (the device refuses), consistent
    for p in [x, y, z] {
        a.free(p).unwrap();
    }
    assert!(matches!(a.empty_cache(), Err(Error::ReleaseFailed { .. })));
    check(&a);
    assert_eq!(a.stats().reserved_bytes.all().current, 2 * MIB as i64);
    ipc.close_segment(at).unwrap();
    assert!(ipc.close_segment(at).is_err());
    a.empty_cache().unwrap();
    check(&a);
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    assert_eq!(other.ipc_open_count(), 0);
}

#[test]
fn bad_pointers_are_typed_errors() {
    let (m, a) = process(FIXED);
    let s = m.default_stream();
    let x = a.allocate(4096, s).unwrap();
    assert!(matches!(a.share(0x1234), Err(Error::UnknownPointer(_))));
    assert!(matches!(
        a.share(x + 512),
        Err(Error::InteriorPointer { .. })
    ));
    a.free(x).unwrap();
    assert!(matches!(a.share(x), Err(Error::NotLive(_))));
    assert!(
        Error::UnknownPointer(0x1234)
            .to_string()
            .contains("invalid device pointer")
    );
    // a forged handle
    let ipc = m.ipc().unwrap();
    assert!(ipc.open_segment(&[7u8; 64]).is_err());
    assert!(ipc.open_pages(1, 2 * MIB, &[12345]).is_err());
    assert!(ipc.close_pages(0xdead_0000).is_err());
}

/// PyTorch's expandable mode: one physical allocation per page of the
/// segment; a block is shared as the pages under it.
#[test]
fn expandable_pages_are_shared_one_handle_per_page() {
    let [(m, a), (other, _b)] = processes("expandable_segments:True,placement:pytorch");
    let s = m.default_stream();
    let x = a.allocate(4 * MIB, s).unwrap();
    let y = a.allocate(30 * MIB, s).unwrap();
    check(&a);
    let (page, handles, offset) = pages(&a, x);
    assert_eq!(page, 20 * MIB, "PyTorch's large page");
    assert_eq!((handles.len(), offset), (1, 0));
    let (p2, h2, o2) = pages(&a, y);
    // y starts 4 MiB into the first page and ends in the third
    assert_eq!((p2, o2), (20 * MIB, 4 * MIB));
    assert_eq!(h2.len(), 2);
    assert_eq!(h2[0], handles[0], "one handle per page, the same each time");
    let ipc = other.ipc().unwrap();
    let at = ipc.open_pages(4242, p2, &h2).unwrap();
    assert!(
        ipc.open_pages(4242, 2 * MIB, &h2).is_err(),
        "pages of the wrong size"
    );
    // the producer frees and releases while the consumer maps the pages:
    // the consumer's view stays valid (the device keeps the memory), the
    // producer's books are clean
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    check(&a);
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    ipc.close_pages(at).unwrap();
    assert_eq!(other.ipc_open_count(), 0);
}

/// cachalot's expandable mode maps runs of pages: a block within one run
/// is shared as that run, one over runs of one size as pages of that size
/// (PyTorch's format), one over runs of different sizes as those runs.
#[test]
fn cachalot_page_runs() {
    let [(m, a), (other, _b)] = processes("expandable_segments:True");
    let s = m.default_stream();
    let x = a.allocate(4 * MIB, s).unwrap();
    let (page, handles, offset) = pages(&a, x);
    assert_eq!(offset, 0);
    assert_eq!(page * handles.len() as u64 % (2 * MIB), 0);
    assert!(page * handles.len() as u64 >= 4 * MIB);
    let at = other.ipc().unwrap().open_pages(7, page, &handles).unwrap();
    other.ipc().unwrap().close_pages(at).unwrap();
    // a block over runs of 2 and 1 pages (6 MiB mapped at once): shared
    // as runs of their own sizes, which the other side maps in order
    let y = a.allocate(6 * MIB, s).unwrap();
    let SharedMemory::Runs { runs, offset } = a.share(y).unwrap() else {
        panic!("a block over runs of two sizes is shared as runs");
    };
    assert_eq!(offset, 0);
    assert_eq!(
        runs.iter().map(|r| r.1).collect::<Vec<_>>(),
        [4 * MIB, 2 * MIB]
    );
    let ipc = other.ipc().unwrap();
    let at = ipc.open_runs(7, &runs).unwrap();
    let swapped = [(runs[0].0, runs[1].1), (runs[1].0, runs[0].1)];
    assert!(
        ipc.open_runs(7, &swapped).is_err(),
        "runs of the wrong sizes"
    );
    assert!(ipc.open_runs(7, &[]).is_err());
    // the producer frees and releases while the other side maps them
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    check(&a);
    ipc.close_pages(at).unwrap();
    // 8 MiB: two runs of two pages, shared
    let z = a.allocate(8 * MIB, s).unwrap();
    let (page, handles, _) = pages(&a, z);
    assert_eq!((page, handles.len()), (4 * MIB, 2));
    a.free(z).unwrap();
    a.free(x).unwrap();
    a.empty_cache().unwrap();
    check(&a);
}
