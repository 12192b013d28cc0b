//! Two behaviours of the drop-in through the C ABI on the mock: the cache
//! turned off and on again (`torch.cuda.caching_allocator_enable`), and the
//! out-of-memory message (PyTorch's text first, cachalot's report after).

use std::ptr::null_mut;
use std::sync::MutexGuard;

use cachalot_capi::drop_in::*;
use cachalot_capi::*;

mod common;
use common::*;

fn setup() -> MutexGuard<'static, ()> {
    let g = lock_mock();
    assert_eq!(cachalot_caching_enable(1), CACHALOT_OK);
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
    g
}

fn enabled() -> bool {
    let mut on = -1;
    // SAFETY: valid out-pointer.
    ok(unsafe { cachalot_caching_enabled(&mut on) });
    on == 1
}

fn free_bytes() -> usize {
    let mut free = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { cachalot_mem_get_info(0, &mut free, null_mut()) });
    free
}

#[test]
fn caching_off_gives_each_request_its_own_device_memory() {
    let _g = setup();
    assert!(enabled());
    let cached = try_alloc(1 << 20).unwrap();
    let before = stats();
    let free0 = free_bytes();
    ok(cachalot_caching_enable(0));
    assert!(!enabled());
    // outside the statistics; device memory taken and given back at once
    let p = try_alloc(1 << 20).unwrap();
    assert!(!p.is_null());
    let s = stats();
    assert_eq!(
        s.requested_bytes[0].allocated,
        before.requested_bytes[0].allocated
    );
    assert_eq!(
        s.reserved_bytes[0].current,
        before.reserved_bytes[0].current
    );
    assert_eq!(s.num_device_alloc, before.num_device_alloc);
    assert!(free_bytes() <= free0 - (1 << 20), "no device memory taken");
    // pool allocations too
    let pool = (0, 0xcafe);
    ok(cachalot_pool_create_or_incref(0, pool.0, pool.1));
    let mut q = null_mut();
    // SAFETY: valid out-pointer.
    ok(unsafe { cachalot_alloc_in_pool(4096, 0, null_mut(), pool.0, pool.1, &mut q) });
    assert_eq!(stats().allocation[0].current, before.allocation[0].current);
    // record_stream ignores them (their memory is freed at once)
    ok(cachalot_record_stream(p, 0, null_mut()));
    ok(cachalot_raw_delete(p, 0));
    ok(cachalot_raw_delete(q, -1));
    assert_eq!(free_bytes(), free0, "uncached memory not given back");
    assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_ERR_INVALID_POINTER);
    // what was allocated while caching was on is freed into the cache
    ok(cachalot_raw_delete(cached, 0));
    assert_eq!(
        stats().allocated_bytes[0].current,
        before.allocated_bytes[0].current - (1 << 20)
    );
    // on again: cached, counted
    ok(cachalot_caching_enable(1));
    assert!(enabled());
    let r = try_alloc(1 << 20).unwrap();
    let s = stats();
    assert_eq!(
        s.requested_bytes[0].allocated,
        before.requested_bytes[0].allocated + (1 << 20)
    );
    // freed while off: still the cache's
    ok(cachalot_caching_enable(0));
    ok(cachalot_raw_delete(r, 0));
    ok(cachalot_caching_enable(1));
    assert_eq!(
        stats().allocated_bytes[0].current,
        before.allocated_bytes[0].current - (1 << 20)
    );
    ok(cachalot_pool_release(0, pool.0, pool.1));
    // SAFETY: NULL is refused.
    let rc = unsafe { cachalot_caching_enabled(null_mut()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
}

#[test]
fn out_of_memory_says_it_as_pytorch_then_cachalot() {
    let _g = setup();
    let held = try_alloc(3 << 20).unwrap();
    let (rc, msg) = try_alloc(1 << 50).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_NEVER_FITS);
    let text = msg.strip_prefix("cachalot_alloc: ").expect(&msg);
    // PyTorch's sentence, its sizes as PyTorch formats them
    assert!(
        text.starts_with(
            "CUDA out of memory. Tried to allocate 1048576.00 GiB. GPU 0 has a total capacity of "
        ),
        "{text}"
    );
    let first = text.lines().next().unwrap();
    assert!(
        first.contains("Of the allocated memory 3.00 MiB is allocated by PyTorch, and "),
        "{first}"
    );
    assert!(
        first.ends_with(
            "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large \
             try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  \
             See documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
        ),
        "{first}"
    );
    // then cachalot's report, on its own line
    let second = text.lines().nth(1).expect("cachalot's report");
    assert!(second.starts_with("cachalot: "), "{second}");
    assert!(second.contains("Largest free block"), "{second}");
    // a memory fraction: "allowed" as PyTorch says it
    ok(cachalot_set_memory_fraction(0, 0.5));
    let (_, msg) = try_alloc(120 << 30).unwrap_err();
    assert!(
        msg.contains(" is free. ") && msg.contains(" allowed; Of the allocated"),
        "{msg}"
    );
    ok(cachalot_set_memory_fraction(0, 1.0));
    // 2^60 bytes and more: PyTorch's own short message
    let (rc, msg) = try_alloc(1 << 60).unwrap_err();
    assert_eq!(rc, CACHALOT_ERR_NEVER_FITS);
    assert_eq!(msg, format!("cachalot_alloc: {OVER_1EB}"));
    assert_eq!(
        OVER_1EB,
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    ok(cachalot_raw_delete(held, 0));
}
