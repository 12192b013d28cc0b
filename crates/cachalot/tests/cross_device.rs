//! Two mock devices built the way the facade builds them
//! (`MockSettings::backend`): each has its own address range, so a pointer
//! of device 0 freed (or recorded) on device 1 is a typed error that changes
//! nothing on either device.

use cachalot::core::AllocatorConfig;
use cachalot::{DeviceAllocator, Error, MockSettings};

const MIB: u64 = 1 << 20;

#[test]
fn a_pointer_freed_on_the_wrong_device_is_unknown_and_changes_nothing() {
    let settings = MockSettings {
        devices: 2,
        total_memory: 8 << 30,
    };
    let open = |i| {
        DeviceAllocator::with_mock(settings.backend(i), Some(AllocatorConfig::default())).unwrap()
    };
    let (d0, d1) = (open(0), open(1));
    assert_eq!((d0.index(), d1.index()), (0, 1));
    // The same requests on both: the same placement, but disjoint addresses.
    let mut p0 = Vec::new();
    let mut p1 = Vec::new();
    for size in [3 * MIB, 1000, 40 * MIB] {
        p0.push(d0.raw_alloc(size, d0.default_stream()).unwrap());
        p1.push(d1.raw_alloc(size, d1.default_stream()).unwrap());
    }
    for p in &p0 {
        assert!(!p1.contains(p), "device 1 handed out device 0's {p:#x}");
    }
    let before = (d0.stats(), d1.stats());
    let live = (d0.live_allocations(), d1.live_allocations());
    let segments = |d: &DeviceAllocator| d.as_mock().unwrap().backend().live_segments();
    let segs = (segments(&d0), segments(&d1));

    for &p in &p0 {
        match d1.raw_free(p) {
            Err(Error::UnknownPointer(q)) => assert_eq!(q, p),
            other => panic!("free of device 0's {p:#x} on device 1: {other:?}"),
        }
        assert!(
            matches!(
                d1.record_stream(p, d1.default_stream()),
                Err(Error::UnknownPointer(_))
            ),
            "record_stream of device 0's pointer on device 1"
        );
        assert_eq!(d1.block_size(p), None);
    }

    assert_eq!((d0.stats(), d1.stats()), before, "stats unchanged");
    assert_eq!(
        (d0.live_allocations(), d1.live_allocations()),
        live,
        "every block still live where it was"
    );
    assert_eq!((segments(&d0), segments(&d1)), segs, "no segment freed");
    d0.check_invariants().unwrap();
    d1.check_invariants().unwrap();

    // Each pointer still frees on its own device.
    for (&a, &b) in p0.iter().zip(&p1) {
        assert!(d0.block_size(a).is_some());
        d0.raw_free(a).unwrap();
        d1.raw_free(b).unwrap();
    }
    for d in [&d0, &d1] {
        assert_eq!(d.stats().allocation.all().current, 0);
        d.check_invariants().unwrap();
    }
}
