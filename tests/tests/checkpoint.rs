//! Checkpoints of a private pool on the mock (PyTorch's
//! `getCheckpointState` / `setCheckpointPoolState`, as cudagraph trees use
//! them): the layout saved, more allocated and freed, the layout restored
//! with the same addresses, every invariant holding after each step.

use cachalot_conformance::mock::{Dev, FIXED, MIB, check};
use cachalot_core::engine::{BlockState, CheckpointState, PoolCheckpoint};
use cachalot_core::{CachingAllocator, CaptureError, Error, PoolFilter, PoolId, graph_pool_handle};
use cachalot_mock::{MockBackend, MockStream};

fn setup(config: &str) -> (MockBackend, CachingAllocator<MockBackend>, MockStream) {
    let Dev { m, a } = Dev::with_capacity(config, 8 << 30);
    let s = m.create_stream();
    (m, a, s)
}

/// A pool's blocks, segment by segment.
type Layout = Vec<Vec<(u64, u64, bool)>>;

/// The pool's blocks as (address, size, allocated), segment by segment
/// (mapped ranges, as the snapshot reports them).
fn layout(a: &CachingAllocator<MockBackend>, pool: PoolId) -> Layout {
    a.snapshot()
        .segments
        .iter()
        .filter(|s| s.pool_id == pool)
        .map(|s| {
            s.blocks
                .iter()
                .map(|b| (b.address, b.size, b.state == BlockState::ActiveAllocated))
                .collect()
        })
        .collect()
}

/// The checkpoint's mapped blocks in the same form.
fn saved(c: &PoolCheckpoint<MockStream>) -> Vec<(u64, u64, bool)> {
    c.segments()
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state != CheckpointState::Unmapped)
        .map(|b| (b.addr, b.size, b.state == CheckpointState::Allocated))
        .collect()
}

/// A new private pool with one use (a graph holding it).
fn new_pool(a: &CachingAllocator<MockBackend>) -> PoolId {
    let pool = graph_pool_handle();
    a.begin_allocate_to_pool(pool, PoolFilter::Streams(Vec::new()))
        .unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    pool
}

/// Allocates `sizes` on `s` into `pool` (as a `use_mem_pool` context:
/// a use taken for the allocations and dropped after).
fn alloc_in(
    a: &CachingAllocator<MockBackend>,
    pool: PoolId,
    s: MockStream,
    sizes: &[u64],
) -> Vec<u64> {
    a.begin_allocate_to_pool(pool, PoolFilter::Streams(vec![s]))
        .unwrap();
    let v = sizes.iter().map(|&n| a.allocate(n, s).unwrap()).collect();
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    check(a);
    v
}

#[test]
fn restore_right_after_save_keeps_the_layout_and_the_addresses() {
    let (_m, a, s) = setup(FIXED);
    let pool = new_pool(&a);
    // test_simple's shape: a large block, small ones, some freed
    let p = alloc_in(&a, pool, s, &[8 * MIB, MIB, MIB, MIB, 512, 512, 512, 3000]);
    a.free(p[1]).unwrap();
    a.free(p[4]).unwrap();
    a.free(p[6]).unwrap();
    check(&a);
    let before = layout(&a, pool);
    let c = a.checkpoint_pool(pool).unwrap();
    let live: Vec<u64> = [0, 2, 3, 5, 7].iter().map(|&i| p[i]).collect();
    let mut sorted = live.clone();
    sorted.sort_unstable();
    assert_eq!(c.allocated().collect::<Vec<_>>(), sorted);
    let stats_before = a.stats();
    let d = a.restore_pool(&c).unwrap();
    check(&a);
    assert_eq!(layout(&a, pool), before);
    let mut freed = d.freed.clone();
    freed.sort_unstable();
    assert_eq!(freed, sorted, "every allocated block was freed");
    let mut made: Vec<u64> = d.allocated.iter().map(|x| x.0).collect();
    made.sort_unstable();
    assert_eq!(made, sorted, "and allocated again at its address");
    let st = a.stats();
    assert_eq!(
        st.allocated_bytes.all().current,
        stats_before.allocated_bytes.all().current
    );
    assert_eq!(
        st.allocation.all().current,
        stats_before.allocation.all().current
    );
    assert_eq!(
        st.inactive_split.all().current,
        stats_before.inactive_split.all().current
    );
    assert_eq!(
        st.inactive_split_bytes.all().current,
        stats_before.inactive_split_bytes.all().current
    );
    for x in live {
        a.free(x).unwrap();
    }
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    check(&a);
    assert!(layout(&a, pool).is_empty(), "the pool's segments went");
}

#[test]
fn restore_frees_what_came_after_and_brings_back_what_died() {
    let (_m, a, s) = setup(FIXED);
    let pool = new_pool(&a);
    let p = alloc_in(&a, pool, s, &[512, 512, 512, 4 * MIB, 12 * MIB]);
    a.free(p[1]).unwrap();
    let c = a.checkpoint_pool(pool).unwrap();
    let saved_layout = saved(&c);
    // the checkpoint's tensors die; another graph allocates in the pool
    for &x in &[p[0], p[3]] {
        a.free(x).unwrap();
    }
    let q = alloc_in(&a, pool, s, &[2048, 512, 30 * MIB, 4 * MIB]);
    check(&a);
    let d = a.restore_pool(&c).unwrap();
    check(&a);
    let mut freed = d.freed.clone();
    freed.sort_unstable();
    let mut want_freed = vec![p[2], p[4]];
    want_freed.extend(&q);
    want_freed.sort_unstable();
    assert_eq!(freed, want_freed);
    let mut made: Vec<u64> = d.allocated.iter().map(|x| x.0).collect();
    made.sort_unstable();
    let mut want = vec![p[0], p[2], p[3], p[4]];
    want.sort_unstable();
    assert_eq!(
        made, want,
        "the blocks of the checkpoint, at their addresses"
    );
    // every segment of the checkpoint has its layout; the segment the
    // second graph added stays, free
    let now: Vec<(u64, u64, bool)> = layout(&a, pool).into_iter().flatten().collect();
    for b in &saved_layout {
        assert!(now.contains(b), "{b:?} restored");
    }
    let extra: Vec<_> = now.iter().filter(|b| !saved_layout.contains(b)).collect();
    assert!(
        extra.iter().all(|b| !b.2),
        "only free blocks besides: {extra:?}"
    );
    // a second restore of the same checkpoint frees and re-makes the same
    let d2 = a.restore_pool(&c).unwrap();
    check(&a);
    let mut f2 = d2.freed.clone();
    f2.sort_unstable();
    assert_eq!(f2, want);
    for (x, _) in d2.allocated {
        a.free(x).unwrap();
    }
    check(&a);
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert!(layout(&a, pool).is_empty());
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
    check(&a);
}

#[test]
fn blocks_of_two_streams_and_a_free_waiting_for_an_event() {
    let (m, a, s) = setup(FIXED);
    let s2 = m.create_stream();
    let pool = new_pool(&a);
    let p = alloc_in(&a, pool, s, &[512, 512, 512]);
    let q = alloc_in(&a, pool, s2, &[512]);
    let c = a.checkpoint_pool(pool).unwrap();
    let before = layout(&a, pool);
    for x in p.iter().chain(&q) {
        a.free(*x).unwrap();
    }
    // a used on another stream: its free waits for an event
    let r = alloc_in(&a, pool, s, &[1024]);
    a.record_stream(r[0], s2).unwrap();
    let d = a.restore_pool(&c).unwrap();
    check(&a);
    assert_eq!(d.freed, r);
    assert_eq!(layout(&a, pool), before);
    for (x, _) in d.allocated {
        a.free(x).unwrap();
    }
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    check(&a);
    assert!(layout(&a, pool).is_empty());
}

#[test]
fn expandable_pool_restores_a_smaller_checkpoint_after_growing() {
    let (_m, a, s) = setup("expandable_segments:True,placement:pytorch");
    let pool = new_pool(&a);
    let p = alloc_in(&a, pool, s, &[2 * MIB]);
    let c = a.checkpoint_pool(pool).unwrap();
    assert!(c.segments().iter().all(|g| g.expandable));
    let small = saved(&c);
    a.free(p[0]).unwrap();
    let q = alloc_in(&a, pool, s, &[32 * MIB]);
    check(&a);
    let d = a.restore_pool(&c).unwrap();
    check(&a);
    assert_eq!(d.freed, q);
    assert_eq!(d.allocated, vec![(p[0], 2 * MIB)]);
    // the pages mapped since stay mapped, free
    let now = layout(&a, pool);
    assert_eq!(now.len(), 1);
    assert_eq!(now[0][0], small[0]);
    assert!(now[0][1..].iter().all(|b| !b.2));
    assert!(now[0].iter().map(|b| b.1).sum::<u64>() >= 32 * MIB);
    a.free(p[0]).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    check(&a);
    assert!(layout(&a, pool).is_empty());
}

#[test]
fn bad_checkpoints_are_typed_errors_and_change_nothing() {
    let (_m, a, s) = setup(FIXED);
    assert!(matches!(
        a.checkpoint_pool((0, 0)),
        Err(Error::Capture(CaptureError::ReservedPool(_)))
    ));
    assert!(matches!(
        a.checkpoint_pool(graph_pool_handle()),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    let pool = new_pool(&a);
    let p = alloc_in(&a, pool, s, &[512]);
    let c = a.checkpoint_pool(pool).unwrap();
    // another allocator's checkpoint, even of a pool of the same id
    let (_m2, b, s2) = setup(FIXED);
    b.begin_allocate_to_pool(pool, PoolFilter::Streams(vec![s2]))
        .unwrap();
    let other = b.allocate(512, s2).unwrap();
    b.end_allocate_to_pool(pool).unwrap();
    let before = layout(&b, pool);
    assert!(matches!(
        b.restore_pool(&c),
        Err(Error::Capture(CaptureError::Checkpoint(_)))
    ));
    assert_eq!(layout(&b, pool), before, "nothing changed");
    b.free(other).unwrap();
    // a pool whose uses all ended
    a.free(p[0]).unwrap();
    a.release_pool(pool).unwrap();
    assert!(matches!(
        a.restore_pool(&c),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    assert!(matches!(
        a.checkpoint_pool(pool),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    check(&a);
    // the default pool's blocks are never touched by a restore
    let pool2 = new_pool(&a);
    let q = alloc_in(&a, pool2, s, &[512]);
    let plain = a.allocate(512, s).unwrap();
    let c2 = a.checkpoint_pool(pool2).unwrap();
    let d = a.restore_pool(&c2).unwrap();
    assert_eq!(d.freed, q);
    assert!(a.block_size(plain).is_some());
    a.free(plain).unwrap();
    a.free(q[0]).unwrap();
    check(&a);
}

/// A deterministic random walk: allocations and frees in a pool, a
/// checkpoint now and then, restored later; after each restore the pool's
/// layout is the checkpoint's and every invariant holds.
#[test]
fn random_walk_restores_exactly() {
    for seed in 1..=12u64 {
        let (m, a, s) = setup(if seed % 3 == 0 {
            "expandable_segments:True,placement:pytorch"
        } else {
            FIXED
        });
        let s2 = m.create_stream();
        let pool = new_pool(&a);
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live: Vec<u64> = alloc_in(&a, pool, s, &[512]);
        let mut restores = 0;
        let mut saved_at: Option<(PoolCheckpoint<MockStream>, Layout)> = None;
        for step in 0..200 {
            match next() % 10 {
                0..=3 => {
                    let size = match next() % 4 {
                        0 => 512 * (1 + next() % 8),
                        1 => 1 + next() % MIB,
                        2 => MIB + next() % (8 * MIB),
                        _ => 10 * MIB + next() % (30 * MIB),
                    };
                    let st = if next() % 4 == 0 { s2 } else { s };
                    live.extend(alloc_in(&a, pool, st, &[size]));
                }
                4..=6 if !live.is_empty() => {
                    let i = (next() % live.len() as u64) as usize;
                    a.free(live.swap_remove(i)).unwrap();
                }
                7 => {
                    let c = a.checkpoint_pool(pool).unwrap();
                    saved_at = Some((c, layout(&a, pool)));
                }
                8 | 9 => {
                    if let Some((c, l)) = &saved_at {
                        let d = a.restore_pool(c).unwrap();
                        restores += 1;
                        a.check_invariants()
                            .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
                        let now: Vec<(u64, u64, bool)> =
                            layout(&a, pool).into_iter().flatten().collect();
                        // every allocated block of the checkpoint is back,
                        // nothing else is allocated
                        let want: Vec<(u64, u64, bool)> =
                            l.iter().flatten().copied().filter(|b| b.2).collect();
                        let got: Vec<(u64, u64, bool)> =
                            now.iter().copied().filter(|b| b.2).collect();
                        assert_eq!(got, want, "seed {seed} step {step}");
                        // fixed segments: the checkpoint's blocks exactly
                        if !c.segments().iter().any(|g| g.expandable) {
                            for b in l.iter().flatten() {
                                assert!(now.contains(b), "seed {seed} step {step}: {b:?}");
                            }
                        }
                        live = d.allocated.iter().map(|x| x.0).collect();
                    }
                }
                _ => {}
            }
            a.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        }
        assert!(restores > 5, "seed {seed}: {restores} restores");
        for x in live {
            a.free(x).unwrap();
        }
        a.release_pool(pool).unwrap();
        a.empty_cache().unwrap();
        check(&a);
        assert!(layout(&a, pool).is_empty(), "seed {seed}");
        assert_eq!(a.stats().reserved_bytes.all().current, 0, "seed {seed}");
    }
}
