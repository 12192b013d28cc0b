//! No thread's allocation lands in a private pool it did not ask for: one
//! thread allocates into a `use_mem_pool`-style pool
//! (`cachalot_alloc_in_pool`) on the default stream while seven others make
//! plain allocations (`cachalot_alloc`) on the same stream, on the mock
//! through the C ABI. Every allocation of the pool thread is freed, so at
//! the end the pool must hold no allocated block, and every block of the
//! other threads must be in the default pools.
//!
//! (When the pool allocation registered a stream filter for the length of
//! the call, the other threads' allocations on that stream that took the
//! device path inside that window went to the pool: an audit counted 1,942
//! of 3.8 M in 10 s with 8 threads.)

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use cachalot_capi::drop_in::*;
use cachalot_capi::*;

mod common;
use common::*;

/// A pointer as an integer, to send between threads.
fn addr(p: *mut c_void) -> u64 {
    p.addr() as u64
}

fn ptr(a: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(a as usize)
}

const POOL: (u64, u64) = (0, 0x5eed);
const OTHERS: usize = 7;
const PER_THREAD: usize = 2000;

#[test]
fn other_threads_never_land_in_a_threads_pool() {
    // SAFETY: a NUL-terminated literal.
    assert_eq!(unsafe { cachalot_init(c"mock".as_ptr()) }, CACHALOT_OK);
    cachalot_set_error_logging(0);
    assert_eq!(
        cachalot_pool_create_or_incref(0, POOL.0, POOL.1),
        CACHALOT_OK,
        "{}",
        last_error()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(OTHERS + 1));
    let in_pool = Arc::new(AtomicU64::new(0));
    let pool_thread = {
        let (stop, start, in_pool) = (stop.clone(), start.clone(), in_pool.clone());
        std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let mut p = null_mut();
                // SAFETY: `p` is a valid out-pointer.
                let rc =
                    unsafe { cachalot_alloc_in_pool(512, 0, null_mut(), POOL.0, POOL.1, &mut p) };
                assert_eq!(rc, CACHALOT_OK, "{}", last_error());
                assert_eq!(cachalot_raw_delete(p, 0), CACHALOT_OK, "{}", last_error());
                in_pool.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // the others keep what they allocate (a cache miss every other call:
    // the device path, where routing happens), to look at it afterwards
    let others: Vec<_> = (0..OTHERS)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut mine = Vec::with_capacity(PER_THREAD);
                for _ in 0..PER_THREAD {
                    let mut p = null_mut();
                    // SAFETY: `p` is a valid out-pointer.
                    let rc = unsafe { cachalot_alloc(512 << 10, 0, null_mut(), &mut p) };
                    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
                    mine.push(addr(p));
                }
                mine
            })
        })
        .collect();
    let kept: Vec<u64> = others
        .into_iter()
        .flat_map(|t| t.join().expect("an allocating thread"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    pool_thread.join().expect("the pool thread");
    assert!(
        in_pool.load(Ordering::Relaxed) > 0,
        "the pool thread never ran"
    );

    // what the pool holds: its segments' allocated blocks
    let mut snap = null_mut();
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_snapshot(0, POOL.0, POOL.1, 0, &mut snap) };
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
    // SAFETY: a live snapshot from cachalot_snapshot.
    let s = unsafe { &*snap };
    // SAFETY: cachalot's arrays, valid while the snapshot lives.
    let blocks = unsafe { std::slice::from_raw_parts(s.blocks, s.num_blocks) };
    let kept_set: HashSet<u64> = kept.iter().copied().collect();
    let foreign: Vec<&CachalotBlock> = blocks.iter().filter(|b| b.state == 0).collect();
    let theirs = foreign
        .iter()
        .filter(|b| kept_set.contains(&b.address))
        .count();
    // SAFETY: from cachalot_snapshot, released once.
    unsafe { cachalot_snapshot_free(snap) };
    assert!(
        foreign.is_empty(),
        "{} allocated block(s) in the pool after its thread freed everything it allocated \
         there ({theirs} of them allocated by the other threads, of {} plain allocations, \
         while the pool thread made {} pool allocations)",
        foreign.len(),
        kept.len(),
        in_pool.load(Ordering::Relaxed)
    );
    for a in kept {
        assert_eq!(
            cachalot_raw_delete(ptr(a), 0),
            CACHALOT_OK,
            "{}",
            last_error()
        );
    }
    assert_eq!(
        cachalot_pool_release(0, POOL.0, POOL.1),
        CACHALOT_OK,
        "{}",
        last_error()
    );
    let mut n: c_int = -1;
    // SAFETY: valid out-pointer.
    let rc = unsafe { cachalot_pool_use_count(0, POOL.0, POOL.1, &mut n) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!(n, 0);
}
