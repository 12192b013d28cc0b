//! cachalot's expandable mode (`expandable_segments:True` with any
//! placement but `placement:pytorch`): 2 MiB pages in both pools, and page
//! recycling — a segment about to grow past the peak of reserved memory
//! first unmaps whole free pages of any stream's segments, so their memory
//! serves the new mapping. PyTorch's mode (`placement:pytorch`) keeps
//! growing instead; each test shows both.

use cachalot_conformance::mock::{Dev, MIB, replay_on_mock};
use cachalot_core::PathCounts;
use cachalot_core::replay::Trace;
use cachalot_mock::{MockCall, MockStream};

const CACHALOT: &str = "expandable_segments:True";
const PYTORCH: &str = "placement:pytorch,expandable_segments:True";

/// Two 50 MiB blocks on the default stream, kept apart by a live 2 MiB
/// block so that they cannot merge: (first, separator, second).
fn two_apart(d: &Dev) -> (u64, u64, u64) {
    let a = d.alloc(50 * MIB);
    let sep = d.alloc(2 * MIB);
    let c = d.alloc(50 * MIB);
    (a, sep, c)
}

/// Frees `p`, checking that the free ran on its stream's shard (the fast
/// path), not on the device.
fn free_on_shard(d: &Dev, p: u64) {
    let before = PathCounts::this_thread();
    d.free(p);
    let paths = PathCounts::this_thread().since(&before);
    assert_eq!(
        (paths.fast, paths.device),
        (1, 0),
        "{p:#x} freed on its shard"
    );
}

fn reserved(d: &Dev) -> i64 {
    d.a.stats().reserved_bytes.all().current
}

/// Memory freed on one stream serves the next request of another stream
/// through a fresh mapping, once that stream's work is done; PyTorch's
/// mode reserves a second segment's worth. Two free blocks hold the
/// request's bytes but neither holds it whole, so no block is lent and
/// their pages move. The data written through the new mapping is there,
/// and nothing leaks.
#[test]
fn free_pages_of_one_stream_serve_another() {
    for config in [CACHALOT, PYTORCH] {
        let d = Dev::new(config);
        let s1 = d.stream();
        let (a, sep, c) = two_apart(&d);
        d.m.use_memory(d.s0(), a, 50 * MIB, 1).unwrap();
        d.free(a);
        d.free(c);
        let held = reserved(&d);
        let unmaps = d.m.call_count(MockCall::Unmap);
        let (creates, releases) = (
            d.m.call_count(MockCall::CreatePhysical),
            d.m.call_count(MockCall::ReleasePhysical),
        );
        let b = d.alloc_on(100 * MIB, s1);
        d.m.use_memory(s1, b, 100 * MIB, 2).unwrap();
        assert_eq!(d.m.tag_at(b + 100 * MIB - 1), Some(2), "{config}");
        let unmapped = d.m.call_count(MockCall::Unmap) - unmaps;
        if config == CACHALOT {
            assert_eq!(held, 102 * MIB as i64);
            assert_eq!(reserved(&d), held, "{config}");
            assert_eq!(d.a.stats().reserved_bytes.all().peak, held, "{config}");
            // fifty 2 MiB pages: each 50 MiB block a large mapping, in
            // runs of 12, 12 and 1 pages; their old mappings stay as
            // ghosts (no unmap), and their physical memory moves to the new
            // mapping as it is
            assert_eq!(unmapped, 0, "{config}: {unmapped} unmaps");
            assert_eq!(d.a.ghost_mappings(), 6, "{config}");
            assert_eq!(d.m.call_count(MockCall::CreatePhysical), creates);
            assert_eq!(d.m.call_count(MockCall::ReleasePhysical), releases);
            assert_eq!(d.a.lent_blocks(), (0, 0), "no block lent");
        } else {
            assert_eq!(reserved(&d), held + 100 * MIB as i64, "{config}");
            assert_eq!(unmapped, 0, "{config}");
        }
        d.free(b);
        d.free(sep);
        d.drop_without_vmm_leaks();
    }
}

/// Ghost mappings (`docs/design-expandable.md`): memory that page
/// recycling moved to another stream stays mapped at its old place, so
/// when it moves back (the second allocation below) no driver call is
/// made: no creation, no mapping, no unmap, no access set; the data
/// written through the returned memory is there. The three runs that come
/// back lie one below the other in s1's free block (they were mapped there
/// last first), so they leave it in one move (one `segment_unmap` of the
/// memory history, of all 50 MiB; "Cheaper moves").
/// `empty_cache` then unmaps every ghost with the pages, and nothing is
/// left on the device.
#[test]
fn ghost_mappings_bring_memory_back_without_a_driver_call() {
    let d = Dev::new(CACHALOT);
    let s1 = d.stream();
    let (a, sep, c) = two_apart(&d);
    d.free(a);
    d.free(c);
    let b = d.alloc_on(100 * MIB, s1); // a's and c's memory moves to s1
    assert_eq!(d.a.ghost_mappings(), 6);
    d.m.use_memory(s1, b, 100 * MIB, 1).unwrap();
    d.free(b);
    // past the peak: s1's pages move back
    let (a2, moves) = alloc_moving_without_calls(&d, 50 * MIB);
    assert_eq!(a2, a, "the lowest chain");
    assert!(
        matches!(moves[..], [(at, len)] if len == 50 * MIB && b <= at && at + len <= b + 100 * MIB),
        "the three runs in one move out of b: {moves:?}"
    );
    assert_eq!(
        d.a.ghost_mappings(),
        6,
        "three ghosts at a traded for three in b"
    );
    assert_eq!(reserved(&d), 102 * MIB as i64, "the peak did not move");
    d.m.use_memory(d.s0(), a2, 50 * MIB, 2).unwrap();
    assert_eq!(d.m.tag_at(a2 + 50 * MIB - 1), Some(2));
    assert_eq!(d.m.invalid_access_count(), 0);
    assert_eq!(d.m.race_count(), 0);
    d.free(a2);
    d.free(sep);
    d.a.empty_cache().unwrap();
    assert_eq!(d.a.ghost_mappings(), 0);
    assert!(d.m.vmm_usage().is_empty(), "{:?}", d.m.vmm_usage());
    d.drop_without_vmm_leaks();
}

/// Allocates `size` bytes on the default stream with the memory history
/// on, checking that no driver call is made: the address, and the
/// (address, bytes) of each `segment_unmap` meanwhile (each move of page
/// recycling).
fn alloc_moving_without_calls(d: &Dev, size: u64) -> (u64, Vec<(u64, u64)>) {
    use cachalot_core::engine::history::{HistoryConfig, TraceAction};
    let calls = vmm_calls(&d.m);
    d.a.record_memory_history(Some(HistoryConfig::default()));
    let p = d.alloc(size);
    let moves =
        d.a.memory_history()
            .iter()
            .filter(|e| e.action == TraceAction::SegmentUnmap)
            .map(|e| (e.addr, e.size))
            .collect();
    d.a.record_memory_history(None);
    assert_eq!(vmm_calls(&d.m), calls, "no driver call");
    (p, moves)
}

/// Memory of `runs` single-page runs on the default stream moves to s1
/// (their ghosts stay) and back, over a request that takes all of them:
/// returns the number of moves on the way back, after checking that the
/// memory came back with no driver call, that the data written through it
/// is there, and that nothing leaks.
fn ghost_homes_moved_back(runs: u64) -> usize {
    let d = Dev::new(CACHALOT);
    let s1 = d.stream();
    // one page mapped per allocation: `runs` runs side by side, one free
    // block once freed; a live separator, then a second free block, so
    // that neither block holds s1's request and no block is lent
    let pages: Vec<u64> = (0..runs).map(|_| d.alloc(2 * MIB)).collect();
    let a = pages[0];
    assert_eq!(
        pages[runs as usize - 1],
        a + (runs - 1) * 2 * MIB,
        "side by side"
    );
    let sep = d.alloc(2 * MIB);
    let c = d.alloc(runs * 2 * MIB);
    for p in pages {
        d.free(p);
    }
    d.free(c);
    let b = d.alloc_on(runs * 4 * MIB, s1); // a's and c's memory moves to s1
    assert_eq!(d.a.lent_blocks(), (0, 0), "no block lent");
    d.free(b);
    // past the peak: a's memory moves back
    let (a2, moves) = alloc_moving_without_calls(&d, runs * 2 * MIB);
    assert_eq!(a2, a, "the lowest chain");
    d.m.use_memory(d.s0(), a2, runs * 2 * MIB, 3).unwrap();
    assert_eq!(d.m.tag_at(a2 + runs * 2 * MIB - 1), Some(3));
    assert_eq!((d.m.invalid_access_count(), d.m.race_count()), (0, 0));
    d.free(a2);
    d.free(sep);
    d.a.empty_cache().unwrap();
    d.drop_without_vmm_leaks();
    moves.len()
}

/// Moving memory back through its ghosts groups the home runs that tile
/// one stretch into one move while a request has at most 64 homes; past
/// that (the search is quadratic) they move run by run, with the same
/// outcome.
#[test]
fn ghost_homes_group_up_to_a_bound() {
    let grouped = ghost_homes_moved_back(64);
    assert!(grouped < 8, "64 homes: {grouped} moves");
    assert_eq!(ghost_homes_moved_back(65), 65, "65 homes: run by run");
}

/// On a full device, recycled memory that the new mapping cannot use
/// (a 24 MiB run, where 4 MiB are to be mapped) is released before the
/// mapping's own memory is created, not after it fails: the request is
/// served at once, with no out-of-memory retry of the ladder.
#[test]
fn recycled_memory_the_mapping_cannot_use_makes_room_first() {
    let d = Dev::with_capacity(CACHALOT, 52 * MIB);
    let s1 = d.stream();
    let a = d.alloc(48 * MIB); // a large mapping: two runs of 24 MiB
    let sep = d.alloc(2 * MIB);
    d.free(a);
    let creates = d.m.call_count(MockCall::CreatePhysical);
    let b = d.alloc_on(4 * MIB, s1); // past the peak: a's runs recycle
    assert_eq!(d.a.stats().num_alloc_retries, 0, "no ladder retry");
    assert_eq!(
        d.m.call_count(MockCall::CreatePhysical) - creates,
        2,
        "one refused, then one made after the release"
    );
    assert_eq!(reserved(&d), 6 * MIB as i64);
    for p in [b, sep] {
        d.free(p);
    }
    d.drop_without_vmm_leaks();
}

/// A driver that refuses to map physical memory that is still mapped
/// elsewhere (a ghost) does not fail the allocation: the memory's ghost is
/// unmapped, the mapping is made again, and no ghost is made from then on.
#[test]
fn a_refused_second_mapping_turns_ghosts_off() {
    let d = Dev::new(CACHALOT);
    let s1 = d.stream();
    let (a, sep, c) = two_apart(&d);
    d.free(a);
    d.free(c);
    let unmaps = d.m.call_count(MockCall::Unmap);
    d.m.fail_call_at(MockCall::Map, 1); // the next one
    let b = d.alloc_on(100 * MIB, s1);
    assert_eq!(
        d.m.call_count(MockCall::Unmap),
        unmaps + 1,
        "one ghost went"
    );
    assert_eq!(d.a.ghost_mappings(), 5);
    d.free(b);
    let x = d.alloc(60 * MIB); // moves memory again: no new ghost
    assert!(d.a.ghost_mappings() <= 5);
    for p in [x, sep] {
        d.free(p);
    }
    d.drop_without_vmm_leaks();
}

/// Cross-stream lending: a free block of another stream whose work is
/// done serves a request whole (the request fits it, within the leftover
/// bound): no page moves, no mapping, no wait. The block stays its
/// stream's: freed by the borrower, it waits for the borrower's work and
/// then serves its own stream again. A block much larger than the
/// request is not taken apart (the segment grows instead). PyTorch's mode
/// never lends.
/// Once several threads allocate at once (the shards log), memory stays
/// with its stream: no block is lent and no page moves, the stream that
/// misses grows its own segment (moves would take the device lock and
/// stop every thread's fast path), and `empty_cache` still returns every
/// page. Before that, the same miss borrows the other stream's free block.
#[test]
fn several_threads_at_once_keep_each_streams_memory() {
    for threads in [false, true] {
        let d = Dev::new("");
        let s1 = d.stream();
        let big = d.alloc(100 * MIB);
        let sep = d.alloc(2 * MIB);
        let a = d.alloc(40 * MIB);
        d.free(a);
        d.free(big);
        if threads {
            d.a.force_shard_logs();
        }
        let held = reserved(&d);
        let unmaps = d.m.call_count(MockCall::Unmap);
        let b = d.alloc_on(39 * MIB, s1);
        if threads {
            assert_ne!(b, a, "not lent");
            assert_eq!(d.a.lent_blocks(), (0, 0));
            assert_eq!(d.m.call_count(MockCall::Unmap), unmaps, "no page moved");
            assert!(reserved(&d) > held, "s1's segment grew");
        } else {
            assert_eq!(b, a, "lent while one thread drives the streams");
            assert_eq!(reserved(&d), held);
        }
        d.free(b);
        d.free(sep);
        d.a.empty_cache().unwrap();
        assert_eq!(reserved(&d), 0);
        d.check();
    }
}

#[test]
fn a_done_block_of_another_stream_is_lent() {
    for config in [CACHALOT, PYTORCH] {
        let d = Dev::manual(config);
        let s1 = d.stream();
        let big = d.alloc(100 * MIB);
        let sep = d.alloc(2 * MIB);
        let a = d.alloc(40 * MIB);
        d.m.use_memory(d.s0(), a, 40 * MIB, 1).unwrap();
        d.m.complete(d.s0()).unwrap();
        d.free(a);
        d.free(big);
        let calls = [
            MockCall::Map,
            MockCall::Unmap,
            MockCall::StreamWaitEvent,
            MockCall::SynchronizeEvent,
        ];
        let before = calls.map(|c| d.m.call_count(c));
        let held = reserved(&d);
        let b = d.alloc_on(39 * MIB, s1);
        if config == PYTORCH {
            assert!(b != a && reserved(&d) > held, "{config}: the segment grew");
            assert_eq!(d.a.lent_blocks(), (0, 0));
            d.free(b);
            d.free(sep);
            d.m.complete_all();
            d.drop_without_vmm_leaks();
            continue;
        }
        assert_eq!(b, a, "the done block of s0 is lent to s1");
        assert_eq!(calls.map(|c| d.m.call_count(c)), before, "no device call");
        assert_eq!(reserved(&d), held);
        assert_eq!(d.a.lent_blocks(), (1, 0));
        d.m.use_memory(s1, b, 39 * MIB, 2).unwrap();
        d.free(b); // s1's use pending: an end-of-life event there
        let c = d.alloc(40 * MIB);
        assert!(
            c + 40 * MIB <= a || c >= a + 40 * MIB,
            "{c:#x} overlaps the pending block"
        );
        d.m.complete(s1).unwrap();
        d.free(c);
        // back with s0 once s1's work is done, and done: lent again
        let again = d.alloc_on(39 * MIB, s1);
        assert_eq!(again, a);
        assert_eq!(d.a.lent_blocks(), (2, 0));
        // a small request does not take the 100 MiB block apart
        let small = d.alloc_on(8 * MIB, s1);
        assert!(
            small + 8 * MIB <= big || small >= big + 100 * MIB,
            "{small:#x} in the big block"
        );
        assert_eq!(d.a.lent_blocks(), (2, 0));
        assert_eq!(d.m.invalid_access_count(), 0);
        assert_eq!(d.m.race_count(), 0);
        for p in [again, small, sep] {
            d.free(p);
        }
        d.m.complete_all();
        d.drop_without_vmm_leaks();
    }
}

/// Cross-stream lending of a block whose stream is still busy: the block
/// is lent at once and the borrowing stream waits for the oldest fence of
/// the lender recorded after the block's free (one inserted wait, no
/// host synchronization); the mock's race detector sees no access race,
/// and the borrower's write is the one that stays.
#[test]
fn a_busy_block_is_lent_behind_its_fence() {
    let d = Dev::manual(CACHALOT);
    let s1 = d.stream();
    let a = d.alloc(40 * MIB);
    d.m.use_memory(d.s0(), a, 40 * MIB, 1).unwrap(); // queued, not complete
    d.free(a);
    let waits = d.m.call_count(MockCall::StreamWaitEvent);
    let syncs = d.m.call_count(MockCall::SynchronizeEvent);
    let maps = d.m.call_count(MockCall::Map);
    let b = d.alloc_on(40 * MIB, s1);
    assert_eq!(b, a, "lent while s0 is busy");
    assert_eq!(d.a.lent_blocks(), (1, 1));
    assert_eq!(
        d.m.call_count(MockCall::StreamWaitEvent),
        waits + 1,
        "one inserted wait"
    );
    assert_eq!(
        d.m.call_count(MockCall::SynchronizeEvent),
        syncs,
        "no host wait"
    );
    assert_eq!(d.m.call_count(MockCall::Map), maps, "no mapping");
    d.m.use_memory(s1, b, 40 * MIB, 2).unwrap();
    assert_eq!(d.m.race_count(), 0, "s1's use ordered after s0's");
    assert_eq!(d.m.invalid_access_count(), 0);
    d.m.complete_all();
    assert_eq!(d.m.tag_at(a), Some(2));
    d.free(b);
    d.m.complete_all();
    d.drop_without_vmm_leaks();
}

/// Recycling waits for the freeing stream's work: with work still queued
/// on it, the stream is synchronized once before its pages are unmapped
/// (the mock refuses to unmap a page with pending work).
#[test]
fn recycling_waits_for_the_freeing_streams_work() {
    let d = Dev::manual(CACHALOT);
    let s1 = d.stream();
    let a = d.alloc(40 * MIB);
    d.m.use_memory(d.s0(), a, 40 * MIB, 1).unwrap(); // queued, not complete
    d.free(a);
    let syncs = d.m.call_count(MockCall::SynchronizeEvent);
    // (larger than a, so a is not lent: its pages move)
    let b = d.alloc_on(42 * MIB, s1);
    assert_eq!(d.m.call_count(MockCall::SynchronizeEvent), syncs + 1);
    assert_eq!(reserved(&d), 42 * MIB as i64);
    d.m.use_memory(s1, b, 42 * MIB, 2).unwrap();
    d.m.complete_all();
    assert_eq!(d.m.tag_at(b), Some(2));
    d.free(b);
    d.drop_without_vmm_leaks();
}

/// A busy stream's pages whose uses are over are taken without waiting:
/// recycling records a completion fence on each stream it looks at, and a
/// block freed before a fence that has completed has no work pending,
/// however much later work the stream has queued. A block freed after it
/// keeps its pages (the mock refuses to unmap a page with pending work),
/// and the stream is not synchronized.
#[test]
fn recycling_takes_a_busy_streams_pages_whose_uses_are_over() {
    let d = Dev::manual(CACHALOT);
    let s1 = d.stream();
    let c = d.alloc(40 * MIB); // lowest address: recycling looks at it first
    let sep = d.alloc(4 * MIB); // keeps a and c from merging
    let a = d.alloc(40 * MIB);
    d.m.use_memory(d.s0(), a, 40 * MIB, 1).unwrap();
    d.free(a);
    // past the recycling cap, within the hard cap: s0 is probed (a fence
    // recorded after a's free, pending) and the segment grows
    let r = d.alloc_on(8 * MIB, s1);
    assert_eq!(reserved(&d), 92 * MIB as i64);
    d.m.use_memory(d.s0(), c, 40 * MIB, 2).unwrap();
    // (on the stream's shard: stamped by the shard's clock, which starts
    // at the device's, so above the fence just recorded)
    free_on_shard(&d, c);
    d.m.complete_n(d.s0(), 1).unwrap(); // a's use and the fence done; c's pending
    let syncs = d.m.call_count(MockCall::SynchronizeEvent);
    let moved = moved_runs(&d.m);
    // (larger than a and c, so neither is lent: pages move)
    let b = d.alloc_on(42 * MIB, s1);
    assert_eq!(
        d.m.call_count(MockCall::SynchronizeEvent),
        syncs,
        "no stream waited for"
    );
    assert!(moved_runs(&d.m) > moved, "a's pages moved");
    assert_eq!(d.m.pending(d.s0()).unwrap(), 1, "c's use still pending");
    assert_eq!(reserved(&d), 94 * MIB as i64, "c's pages stayed, a's moved");
    assert_eq!(d.m.invalid_access_count(), 0);
    d.m.use_memory(s1, b, 42 * MIB, 3).unwrap();
    d.m.complete_all();
    assert_eq!(d.m.tag_at(c), Some(2), "c's data intact");
    assert_eq!(d.m.tag_at(b), Some(3));
    for p in [b, r, sep] {
        d.free(p);
    }
    d.drop_without_vmm_leaks();
}

/// A fast free (on its stream's shard) is stamped from the shard's clock,
/// which starts at the device's at every check-out: so a block freed after
/// a completion fence counts as freed after it even when the other shards
/// have freed far more (and moved the device's clock past this shard's own
/// count). Its pages then stay while its use is pending; the older block's
/// move, and the mock refuses no unmap.
#[test]
fn shard_free_stamps_follow_the_devices_clock() {
    let d = Dev::manual(CACHALOT);
    let s1 = d.stream();
    let s2 = d.stream();
    let c = d.alloc(40 * MIB);
    let sep = d.alloc(4 * MIB);
    let a = d.alloc(40 * MIB);
    d.m.use_memory(d.s0(), a, 40 * MIB, 1).unwrap();
    d.free(a);
    // another shard frees many times
    let small: Vec<u64> = (0..16).map(|_| d.alloc_on(64 << 10, s2)).collect();
    for p in small {
        free_on_shard(&d, p);
    }
    // past the recycling cap: s0 is probed (a fence after a's free and
    // every free so far) and the segment grows
    let r = d.alloc_on(8 * MIB, s1);
    d.m.use_memory(d.s0(), c, 40 * MIB, 2).unwrap();
    free_on_shard(&d, c);
    d.m.complete_n(d.s0(), 1).unwrap(); // a's use and the fence done; c's pending
    let b = d.alloc_on(40 * MIB, s1);
    assert_eq!(d.m.counters().unmap_refused, 0, "c's pages were not taken");
    assert_eq!(d.m.pending(d.s0()).unwrap(), 1, "c's use still pending");
    d.m.use_memory(s1, b, 40 * MIB, 3).unwrap();
    d.m.complete_all();
    assert_eq!(d.m.tag_at(c), Some(2), "c's data intact");
    assert_eq!(d.m.tag_at(b), Some(3));
    assert_eq!(d.m.invalid_access_count(), 0);
    for p in [b, r, sep] {
        d.free(p);
    }
    d.drop_without_vmm_leaks();
}

/// On a busy device, recycling grows rather than waits while reserved
/// memory stays within the hard cap (the allocated peak plus 1/8, at most
/// 64 MiB): a synchronization stalls the pipeline. Past the hard cap it
/// waits for the stream, once. Cases (MiB): the block freed on the busy
/// stream, a request that grows, a request after it that waits, the most
/// reserved after the wait. With 1 GiB, the second request (1,124 MiB)
/// is within 1/8 but past 1 GiB + 64 MiB: for a large workload a
/// gigabyte is worth more than a stall.
#[test]
fn recycling_grows_rather_than_waits_below_the_hard_cap() {
    for (freed, grows, waits, most) in [(80, 8, 40, 90), (1024, 40, 60, 1066)] {
        let d = Dev::manual(CACHALOT);
        let s1 = d.stream();
        let a = d.alloc(freed * MIB);
        d.m.use_memory(d.s0(), a, freed * MIB, 1).unwrap();
        d.free(a); // its use pending
        let syncs = d.m.call_count(MockCall::SynchronizeEvent);
        let unmaps = d.m.call_count(MockCall::Unmap);
        let b = d.alloc_on(grows * MIB, s1);
        assert_eq!(
            d.m.call_count(MockCall::SynchronizeEvent),
            syncs,
            "{freed}: not waited"
        );
        assert_eq!(
            d.m.call_count(MockCall::Unmap),
            unmaps,
            "{freed}: no page moved"
        );
        assert_eq!(reserved(&d), ((freed + grows) * MIB) as i64);
        let c = d.alloc_on(waits * MIB, s1);
        assert_eq!(
            d.m.call_count(MockCall::SynchronizeEvent),
            syncs + 1,
            "{freed}: s0 waited for once"
        );
        assert!(
            reserved(&d) <= (most * MIB) as i64,
            "{freed}: {}",
            reserved(&d)
        );
        assert_eq!(d.m.counters().unmap_refused, 0);
        d.m.complete_all();
        d.free(b);
        d.free(c);
        d.drop_without_vmm_leaks();
    }
}

/// Completion fences stay bounded when streams come and go: a fence is
/// kept for at most 64 streams, so blocks freed with work pending on 150
/// streams (a stream per request) leave no more than that many fence
/// events, and every event is destroyed with the allocator.
#[test]
fn completion_fences_are_bounded_over_many_streams() {
    let d = Dev::manual(CACHALOT);
    let streams: Vec<MockStream> = (0..150).map(|_| d.stream()).collect();
    for (i, &s) in streams.iter().enumerate() {
        // each larger than the blocks before it, so none is lent
        let n = (i as u64 + 1) * 2 * MIB;
        let p = d.alloc_on(n, s);
        d.m.use_memory(s, p, n, i as u64).unwrap();
        d.free(p); // its use pending
    }
    // each allocation on a new stream went past the recycling cap, so
    // recycling probed the streams before it (one fence each)
    let setup = d.m.live_events();
    assert!((1..=64).contains(&setup), "{setup} fence events");
    // and once more for all of them: none done, it waits past the hard cap
    let big = d.alloc(400 * MIB);
    assert!(
        d.m.live_events() <= 64,
        "{} fence events",
        d.m.live_events()
    );
    assert_eq!(d.m.counters().unmap_refused, 0);
    d.m.complete_all();
    d.free(big);
    let m = d.m.clone();
    d.drop_without_vmm_leaks();
    assert_eq!(m.live_events(), 0, "no event left after the drop");
}

/// The cudarc example's training loop (`examples/mlp-train`: five layers,
/// batch sizes cycling through eight values, inputs uploaded on a second
/// stream and used on the first) on a device that lags the host: once it
/// has settled, no page moves and no stream is waited for, reserved memory
/// stays within the hard cap, and the completion fences stay bounded.
#[test]
fn a_lagging_device_settles_without_waiting() {
    let d = Dev::manual(CACHALOT);
    let (s0, s1) = (d.s0(), d.stream());
    let widths = [1024u64, 4096, 2048, 2048, 1024, 512];
    let batches = [512u64, 768, 256, 1024, 640, 384, 896, 320];
    let layers = widths.len() - 1;
    let mut tag = 0u64;
    // a kernel writes every new buffer; the device stays 50 kernels behind
    let alloc = |n: u64, s: MockStream, tag: &mut u64| {
        let p = d.alloc_on(n * 4, s);
        *tag += 1;
        d.m.use_memory(s, p, n * 4, *tag).unwrap();
        let pending = d.m.pending(s).unwrap();
        if pending > 50 {
            d.m.complete_n(s, pending - 50).unwrap();
        }
        p
    };
    let params: Vec<u64> = (0..layers)
        .flat_map(|l| [widths[l] * widths[l + 1], widths[l + 1]])
        .map(|n| alloc(n, s0, &mut tag))
        .collect();
    let upload = |step: usize, tag: &mut u64| {
        let rows = batches[step % 8];
        let x = alloc(rows * widths[0], s1, tag);
        let y = alloc(rows, s1, tag);
        d.m.complete(s1).unwrap();
        (x, y)
    };
    let calls = [MockCall::Unmap, MockCall::Map, MockCall::SynchronizeEvent];
    let mut settled = [0; 3];
    let mut next = upload(0, &mut tag);
    let mut live_peak = 0;
    for step in 0..96 {
        if step == 64 {
            settled = calls.map(|c| d.m.call_count(c));
        }
        let rows = batches[step % 8];
        let (x, y) = next;
        d.a.record_stream(x, s0).unwrap();
        d.a.record_stream(y, s0).unwrap();
        let mut acts: Vec<u64> = (0..layers)
            .map(|l| alloc(rows * widths[l + 1], s0, &mut tag))
            .collect();
        let mut grad = alloc(rows * widths[layers], s0, &mut tag);
        d.free(alloc(rows, s0, &mut tag));
        for l in (0..layers).rev() {
            d.free(acts.pop().unwrap());
            let dw = alloc(widths[l] * widths[l + 1], s0, &mut tag);
            let db = alloc(widths[l + 1], s0, &mut tag);
            let dx = (l > 0).then(|| alloc(rows * widths[l], s0, &mut tag));
            live_peak = live_peak.max(d.a.stats().allocated_bytes.all().current);
            d.free(dw);
            d.free(db);
            let Some(dx) = dx else { break };
            d.free(grad);
            grad = dx;
        }
        d.free(grad);
        next = upload(step + 1, &mut tag);
        d.free(x);
        d.free(y);
        d.m.complete(s0).unwrap(); // the step's synchronization
    }
    let after = calls.map(|c| d.m.call_count(c));
    assert_eq!(after, settled, "unmaps, maps, waits in the last 32 steps");
    let st = d.a.stats();
    let peak = st.reserved_bytes.all().peak;
    let live = st.allocated_bytes.all().peak;
    assert!(live >= live_peak);
    assert!(
        peak <= live + live / 8 + 2 * MIB as i64,
        "{peak} reserved, {live} live"
    );
    assert!(d.m.live_events() <= 40, "{} events", d.m.live_events());
    d.m.complete_all();
    for p in params.into_iter().chain([next.0, next.1]) {
        d.free(p);
    }
    d.drop_without_vmm_leaks();
}

/// Pages of a stream whose work has completed are taken first, with no
/// wait; a stream with queued work keeps its pages (and is not
/// synchronized) while the idle one covers the request.
#[test]
fn recycling_takes_idle_streams_pages_first() {
    let d = Dev::manual(CACHALOT);
    let (s1, s2) = (d.stream(), d.stream());
    let a = d.alloc(40 * MIB);
    let c = d.alloc_on(40 * MIB, s2);
    d.m.use_memory(d.s0(), a, 40 * MIB, 1).unwrap(); // queued, not complete
    d.m.use_memory(s2, c, 40 * MIB, 3).unwrap();
    d.m.complete(s2).unwrap(); // s2 is idle
    d.free(a);
    d.free(c);
    let syncs = d.m.call_count(MockCall::SynchronizeEvent);
    let (asked, fenced) = (
        d.m.call_count(MockCall::QueryStream),
        d.m.call_count(MockCall::RecordEvent),
    );
    let b = d.alloc_on(40 * MIB, s1);
    assert_eq!(
        d.m.call_count(MockCall::SynchronizeEvent),
        syncs,
        "no stream waited for"
    );
    // both streams asked; the busy one (s0) answered "busy" and got a
    // completion fence, the idle one none
    assert_eq!(d.m.call_count(MockCall::QueryStream) - asked, 2);
    assert_eq!(d.m.call_count(MockCall::RecordEvent) - fenced, 1);
    assert_eq!(
        reserved(&d),
        80 * MIB as i64,
        "s2's pages moved, s0's stayed"
    );
    d.m.use_memory(s1, b, 40 * MIB, 2).unwrap();
    d.m.complete_all();
    assert_eq!(d.m.tag_at(a), Some(1), "s0's block kept its pages and data");
    assert_eq!(d.m.tag_at(b), Some(2));
    d.free(b);
    d.drop_without_vmm_leaks();
}

/// A block freed while another stream still uses it (`record_stream`) is
/// not free yet, so its pages are not taken: the new request grows instead.
#[test]
fn pages_with_pending_stream_uses_are_not_recycled() {
    let d = Dev::manual(CACHALOT);
    let s1 = d.stream();
    let a = d.alloc(40 * MIB);
    d.a.record_stream(a, s1).unwrap();
    d.m.use_memory(s1, a, 40 * MIB, 1).unwrap();
    d.free(a); // pending on s1's event
    let b = d.alloc_on(40 * MIB, s1);
    assert_eq!(reserved(&d), 80 * MIB as i64, "a's pages stay mapped");
    d.m.complete_all();
    assert_eq!(
        d.m.tag_at(a),
        Some(1),
        "a's data intact until its use ended"
    );
    d.free(b);
    d.drop_without_vmm_leaks();
}

/// Below the peak, nothing is recycled: growth up to the earlier peak maps
/// new pages without unmapping any (fewer calls); past it, free pages are
/// recycled so the peak does not move.
#[test]
fn recycling_only_past_the_peak() {
    let d = Dev::new(CACHALOT);
    let s1 = d.stream();
    let a = d.alloc(60 * MIB);
    d.free(a);
    d.a.empty_cache().unwrap();
    assert_eq!(reserved(&d), 0);
    let moved = moved_runs(&d.m);
    let b = d.alloc_on(20 * MIB, s1); // 20 MiB ≤ the 60 MiB peak
    d.free(b);
    assert_eq!(moved_runs(&d.m), moved, "below the peak");
    let c = d.alloc(60 * MIB); // 20 + 60 > 60: s1's free pages recycled
    assert!(moved_runs(&d.m) > moved);
    assert_eq!(d.a.stats().reserved_bytes.all().peak, 60 * MIB as i64);
    d.free(c);
}

/// Graph pools' pages are never recycled, and nothing is unmapped during a
/// capture (unmapping needs a synchronization, which a capture forbids).
#[test]
fn private_pool_pages_are_not_recycled() {
    use cachalot_core::{PoolFilter, graph_pool_handle};
    let d = Dev::new(CACHALOT);
    let s1 = d.stream();
    let pool = graph_pool_handle();
    d.a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s1))
        .unwrap();
    d.m.begin_capture(s1).unwrap();
    let g = d.alloc_on(30 * MIB, s1);
    d.free(g);
    d.m.end_capture(s1).unwrap();
    d.a.end_allocate_to_pool(pool).unwrap();
    let unmaps = d.m.call_count(MockCall::Unmap);
    let x = d.alloc(30 * MIB);
    assert_eq!(
        d.m.call_count(MockCall::Unmap),
        unmaps,
        "the pool's pages stay"
    );
    assert_eq!(reserved(&d), 60 * MIB as i64);
    d.free(x);
    d.a.release_pool(pool).unwrap();
}

fn trace(name: &str) -> Trace {
    Trace::load(cachalot_conformance::traces_dir().join(format!("{name}.trace"))).expect("trace")
}

/// On every recorded trace, cachalot's mode reserves no more at its peak
/// than PyTorch's expandable mode, and beats it where streams or
/// fragmentation leave free pages (side_stream_pipeline by over 20%: 1.1996
/// of its live peak against 1.5687, where it settles with no device call
/// after its first pass; 1.1073 while its pages crept up the reservation,
/// moved by about 350 driver calls a pass, before the lowest chain and
/// ghost mappings).
#[test]
fn recorded_traces_reserve_no_more_than_pytorch_expandable() {
    for name in ["gpt2_train", "resnet50_train", "side_stream_pipeline"] {
        let t = trace(name);
        let ours = replay_on_mock(&t, 2, CACHALOT);
        let theirs = replay_on_mock(&t, 2, PYTORCH);
        assert!(
            ours.peak_reserved <= theirs.peak_reserved,
            "{name}: {} > {}",
            ours.peak_reserved,
            theirs.peak_reserved
        );
        if name == "side_stream_pipeline" {
            assert!(
                (ours.peak_reserved as f64) < 0.80 * theirs.peak_reserved as f64,
                "{name}: {} vs {}",
                ours.peak_reserved,
                theirs.peak_reserved
            );
        }
    }
}

/// Issue 15, item 3, on the mock (whose peaks equal the H200's): the
/// default configuration (cachalot's expandable mode on a backend with
/// virtual memory) reserves at its peak no more than the lowest of
/// PyTorch's three modes (default, expandable, cudaMallocAsync) and than
/// RMM's smallest pool and arena, on every trace, as a ratio to the
/// trace's live peak; and at most 1.10x the live peak on every trace with
/// at least 400 MB live.
#[test]
fn the_default_reserves_less_than_every_pytorch_mode_and_rmm() {
    let json = |name: &str| -> serde_json::Value {
        let path = cachalot_conformance::traces_dir().join(name);
        serde_json::from_str(&std::fs::read_to_string(&path).expect("anchor")).expect("json")
    };
    let (modes, rmm) = (json("pytorch-modes-h200.json"), json("rmm-fit-h200.json"));
    for name in [
        "gpt2_train",
        "resnet50_train",
        "side_stream_pipeline",
        "churn_1stream",
        "churn_4streams",
        "hit_1mib",
    ] {
        let t = Trace::synthetic(name).unwrap_or_else(|| trace(name));
        let m = &modes["traces"][name];
        let live = m["live_peak"].as_f64().unwrap();
        let mut bound = f64::INFINITY;
        for k in [
            "default_reserved_over_live",
            "expandable_reserved_over_live",
            "async_reserved_over_live",
        ] {
            bound = bound.min(m[k].as_f64().unwrap());
        }
        for k in ["pool_over_live", "arena_over_live"] {
            if let Some(v) = rmm["traces"][name][k].as_f64() {
                bound = bound.min(v);
            }
        }
        if live >= 400e6 {
            bound = bound.min(1.10);
        }
        let r = replay_on_mock(&t, 2, "");
        let ours = r.peak_reserved as f64 / live;
        println!("{name}: {ours:.4} of the live peak, bound {bound:.4}");
        assert!(ours <= bound, "{name}: {ours:.4} > {bound:.4}");
    }
}

/// The serving traces with random shapes (`traces/serving_traces.py`,
/// `Trace::bert_serving` and `Trace::gpt2_generate`: BERT-base inference of
/// random batch × length, GPT-2 generation with a key/value cache that
/// grows): the default reserves less at its first pass's peak than
/// PyTorch's default and expandable modes (reproduced exactly by
/// `placement:pytorch`, with and without `expandable_segments:True`).
/// Over five passes its peak rises where the allowance above the
/// allocated peak lets reserved memory grow rather than move pages
/// (bert_serving: 1.0021 of its live peak after the first pass, 1.0281
/// after five, where PyTorch's expandable mode stays at 1.0258;
/// gpt2_generate 1.0164 against 1.1264).
#[test]
fn serving_traces_reserve_less_than_pytorch_at_their_first_peak() {
    for (name, five_passes) in [("bert_serving", 1.0285), ("gpt2_generate", 1.0170)] {
        let t = Trace::synthetic(name).expect("synthetic trace");
        let ours = replay_on_mock(&t, 1, "").peak_reserved;
        for config in ["placement:pytorch", PYTORCH] {
            let theirs = replay_on_mock(&t, 1, config).peak_reserved;
            println!("{name}: {ours} B against {theirs} B ({config})");
            assert!(
                ours < theirs,
                "{name}: {ours} B against {theirs} B ({config})"
            );
        }
        let (d, per_pass, ratio) = calls_per_pass(&t, 5);
        println!("{name}: calls per pass {per_pass:?}, peak reserved / live peak {ratio:.4}");
        assert!(ratio <= five_passes, "{name}: {ratio}");
        d.a.check_invariants().expect("invariants");
    }
}

/// A device with less address space left than its segments ask for: in
/// PyTorch's mode an expandable segment's reservation (1.125x the device)
/// is halved until it fits (down to the request); in cachalot's the second
/// of two segments asks for half of 1.125x the device and the third, when
/// its third is refused, for what the request needs, so the address space
/// left serves as many streams as it can. A 4 TiB mock keeps 8 TiB for
/// reservations.
#[test]
fn reservations_share_the_address_space() {
    let t = 1u64 << 40;
    // PyTorch's pages are 20 MiB in the large pool
    let up = |x: u64| x.div_ceil(20 * MIB) * 20 * MIB;
    let (p1, p2) = (up(4 * t + t / 2), up(up(4 * t + t / 2) / 2));
    for (config, calls, want) in [
        // 4.5 TiB; 4.5 refused, 2.25; 4.5 and 2.25 refused, 1.125
        (PYTORCH, 6, [up(p2 / 2), p2, p1]),
        // 4.5 TiB; 2.25; 1.5 refused, 1
        (CACHALOT, 4, [t, 2 * t + t / 4, 4 * t + t / 2]),
    ] {
        let d = Dev::with_capacity(config, 4 << 40);
        let streams = [d.s0(), d.stream(), d.stream()];
        let ptrs: Vec<u64> = streams.iter().map(|&s| d.alloc_on(t, s)).collect();
        assert_eq!(d.m.call_count(MockCall::Reserve), calls, "{config}");
        let mut sizes: Vec<u64> = d.m.live_reservations().iter().map(|r| r.1).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, want, "{config}");
        for p in ptrs {
            d.free(p);
        }
        d.a.empty_cache().unwrap();
        d.check();
        assert_eq!(
            d.m.reservation_count(),
            0,
            "{config}: every reservation freed"
        );
    }
}

/// One 82 MiB block on each of `n` streams of an H200-sized mock with
/// `config`, the invariants checked every 100 streams: the streams served
/// before the first failure, and the failure.
fn blocks_on_streams(
    d: &Dev,
    n: usize,
    config: &str,
) -> (Vec<(MockStream, u64)>, Option<cachalot_core::Error>) {
    let mut held = Vec::new();
    for i in 0..n {
        let s = if i == 0 { d.s0() } else { d.stream() };
        match d.a.allocate(82 * MIB, s) {
            Ok(p) => held.push((s, p)),
            Err(e) => return (held, Some(e)),
        }
        if i % 100 == 99 {
            d.check();
        }
    }
    eprintln!(
        "{config}: {n} streams, {} reservations, {} GiB of address space",
        d.m.reservation_count(),
        d.m.reserved_bytes() >> 30
    );
    (held, None)
}

/// Many streams in cachalot's default: 1,000 streams each holding one
/// 82 MiB block (80 GiB live) fit on an H200-sized mock, as with fixed
/// segments (200 of them here), and take a bounded share of the address space: a segment
/// gets 1.125x the device divided among the live segments, about 8.5x the
/// device for 1,000 (1.125x per stream ran out of the mock's 15 TiB at the
/// 98th, and the 104th allocation failed). Everything is released after,
/// and the streams serve their blocks again. In PyTorch's mode (1.125x per
/// stream, as PyTorch 2.11) address space runs out first, and the report
/// says so instead of advising `empty_cache`: nothing is releasable.
#[test]
fn a_thousand_streams_each_hold_a_block() {
    use cachalot_conformance::mock::{FIXED, H200_BYTES};
    const N: usize = 1000;
    for (config, n) in [("", N), (FIXED, 200)] {
        let d = Dev::with_capacity(config, H200_BYTES);
        let (held, err) = blocks_on_streams(&d, n, config);
        assert!(err.is_none(), "{config}: stream {}: {err:?}", held.len());
        let s = d.a.memory_stats();
        assert_eq!(
            s["allocated_bytes.all.current"],
            (n as u64 * 82 * MIB) as i64
        );
        if config != FIXED {
            // 1.125 x the device x H(1000) (7.49), rounded up
            let bound = H200_BYTES / 8 * 9 * 15 / 2;
            assert!(
                d.m.reserved_bytes() <= bound,
                "{config}: {} B of address space",
                d.m.reserved_bytes()
            );
            assert_eq!(d.m.reservation_count(), N);
        }
        d.check();
        for &(_, p) in &held {
            d.a.free(p).unwrap();
        }
        d.a.empty_cache().unwrap();
        assert_eq!(
            d.m.reservation_count(),
            0,
            "{config}: every reservation freed"
        );
        // the same streams again
        for &(s, _) in &held {
            d.a.allocate(82 * MIB, s)
                .expect("allocation after empty_cache");
        }
        d.check();
        d.drop_without_vmm_leaks();
    }
    let d = Dev::with_capacity(PYTORCH, H200_BYTES);
    let (held, err) = blocks_on_streams(&d, N, PYTORCH);
    match err {
        Some(cachalot_core::Error::OutOfMemory(r)) => {
            assert!(held.len() > 90 && held.len() < 200, "{}", held.len());
            assert!(!r.fits_after_empty_cache, "{r}");
            let text = r.to_string();
            assert!(text.contains("would not make this request fit"), "{text}");
            assert!(text.contains("what ran out is not its memory"), "{text}");
        }
        other => panic!("PyTorch's mode: expected an out-of-memory error, got {other:?}"),
    }
    d.check();
}

/// A stream that outgrows its segment in cachalot's mode reserves another
/// at least as large as those it holds, so its segments double: ten 64
/// MiB blocks on the last of 16 streams of a 1 GiB device (a share of 72
/// MiB) take five segments (72, 72, 144, 288 and 576 MiB), not ten.
#[test]
fn a_stream_that_outgrows_its_share_doubles_its_segments() {
    let d = Dev::with_capacity(CACHALOT, 1 << 30);
    let streams: Vec<MockStream> = std::iter::once(d.s0())
        .chain((1..16).map(|_| d.stream()))
        .collect();
    for &s in &streams {
        d.alloc_on(2 * MIB, s);
    }
    let before: Vec<(u64, u64)> = d.m.live_reservations();
    assert_eq!(before.len(), 16);
    let last = *streams.last().unwrap();
    for _ in 0..10 {
        d.alloc_on(64 * MIB, last);
    }
    let mut grown: Vec<u64> =
        d.m.live_reservations()
            .into_iter()
            .filter(|r| !before.contains(r))
            .map(|r| r.1 >> 20)
            .collect();
    grown.sort_unstable();
    assert_eq!(grown, [72, 144, 288, 576]);
    // the last stream's first segment was 1.125 GiB / 16
    assert!(before.iter().any(|r| r.1 == 72 * MIB));
    d.check();
}

/// Replays `trace` for `passes` passes on a manual mock that lags the host
/// by `lag` uses per stream: every allocation is followed by a use of it on
/// its stream (as a kernel writing the new tensor), and each stream
/// completes only what is older than its last `lag` uses. Returns the peak
/// reserved bytes and the synchronizations made; panics on a refused
/// unmap, a race, a broken invariant or a leak.
fn replay_lagging(t: &Trace, passes: usize, config: &str, lag: u64) -> (i64, u64) {
    use cachalot_core::replay::Op;
    let d = Dev::manual_with_capacity(config, 150 << 30);
    let streams: Vec<MockStream> = (0..t.num_streams)
        .map(|i| if i == 0 { d.s0() } else { d.stream() })
        .collect();
    let mut addrs = vec![0u64; t.num_ids];
    let mut tag = 0;
    for _ in 0..passes {
        for op in &t.ops {
            match *op {
                Op::Alloc { id, size, stream } => {
                    let s = streams[stream as usize];
                    let p = d.a.allocate(size, s).expect("allocation");
                    addrs[id as usize] = p;
                    tag += 1;
                    d.m.use_memory(s, p, size, tag).unwrap();
                    let pending = d.m.pending(s).unwrap();
                    if pending > lag {
                        d.m.complete_n(s, pending - lag).unwrap();
                    }
                }
                Op::Free { id } => d.a.free(addrs[id as usize]).expect("free"),
            }
        }
    }
    d.check();
    assert_eq!(d.m.counters().unmap_refused, 0, "{config}");
    assert_eq!(d.m.race_count(), 0, "{config}");
    let peak = d.a.stats().reserved_bytes.all().peak;
    let syncs = d.m.call_count(MockCall::SynchronizeEvent);
    d.m.complete_all();
    d.drop_without_vmm_leaks();
    (peak, syncs)
}

/// The recorded traces on a device that lags the host (the replays above
/// run on an idle device, where every free page is done by the time
/// recycling looks): cachalot's mode still reserves no more than PyTorch's
/// expandable mode on the same device, with a bounded number of waits, and
/// no unmap is ever refused, nor any race found (by address or, for ghost
/// mappings, by physical memory). Figures (lag 20, two passes, mock):
/// gpt2_train 7,554 MiB with 9 waits (7,566 before the ghost mappings and
/// the lowest chain, 7,482 before large mappings took large runs),
/// resnet50_train 3,022 with none, side_stream_pipeline 76 with 55 (72
/// with 66 before the ghost mappings), against PyTorch's mode's 7,948 /
/// 3,036 / 102 (a page move without a wait, tried before the large runs
/// and not kept, made them 7,524 / 3,022 / 86 MiB: design-expandable.md).
#[test]
fn recorded_traces_on_a_lagging_device() {
    for (name, max_syncs) in [
        ("gpt2_train", 20),
        ("resnet50_train", 0),
        ("side_stream_pipeline", 100),
    ] {
        let t = trace(name);
        let (ours, syncs) = replay_lagging(&t, 2, CACHALOT, 20);
        let (theirs, their_syncs) = replay_lagging(&t, 2, PYTORCH, 20);
        eprintln!(
            "{name}: {} MiB, {syncs} waits; PyTorch's mode {} MiB, {their_syncs} waits",
            ours >> 20,
            theirs >> 20
        );
        assert!(ours <= theirs, "{name}: {ours} > {theirs}");
        assert!(syncs <= max_syncs, "{name}: {syncs} waits");
        assert_eq!(their_syncs, 0, "{name}: PyTorch's mode never recycles");
    }
}

/// An out-of-memory during a capture (where the ladder cannot unmap)
/// reports that `empty_cache` would help when the default pool's free
/// expandable pages would make room: their whole pages count as
/// releasable, as whole free fixed segments do.
#[test]
fn oom_report_counts_free_expandable_pages_as_releasable() {
    use cachalot_core::{Error, PoolFilter, graph_pool_handle};
    for config in [PYTORCH, CACHALOT] {
        let d = cachalot_conformance::mock::Dev::with_capacity(config, 64 * MIB);
        let s1 = d.stream();
        let a = d.alloc(40 * MIB);
        d.free(a); // 40 MiB of free, mapped pages in the default pool
        let pool = graph_pool_handle();
        d.a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s1))
            .unwrap();
        d.m.begin_capture(s1).unwrap();
        match d.a.allocate(40 * MIB, s1) {
            Err(Error::OutOfMemory(r)) => {
                assert!(r.fits_after_empty_cache, "{config}: {r}");
            }
            other => panic!("{config}: expected an out-of-memory error, got {other:?}"),
        }
        d.m.end_capture(s1).unwrap();
        d.a.end_allocate_to_pool(pool).unwrap();
        d.a.release_pool(pool).unwrap();
        d.check();
    }
}

/// Runs mapped again from memory that existed before (page recycling
/// moving memory with a driver call) so far: mappings less creations.
fn moved_runs(m: &cachalot_mock::MockBackend) -> u64 {
    m.call_count(MockCall::Map) - m.call_count(MockCall::CreatePhysical)
}

/// Device calls of the virtual-memory kinds (and plain segments) so far.
fn vmm_calls(m: &cachalot_mock::MockBackend) -> u64 {
    [
        MockCall::Map,
        MockCall::Unmap,
        MockCall::CreatePhysical,
        MockCall::ReleasePhysical,
        MockCall::SetAccess,
        MockCall::Malloc,
        MockCall::Free,
    ]
    .iter()
    .map(|c| m.call_count(*c))
    .sum()
}

/// Replays `trace` `passes` times on the default stream of a fresh
/// allocator in cachalot's mode; returns it and the device calls of each
/// pass, and the peak reserved over the live peak.
fn calls_per_pass(trace: &Trace, passes: usize) -> (Dev, Vec<u64>, f64) {
    use cachalot_core::Backend;
    use cachalot_core::replay::replay_pass;
    let d = Dev::new(CACHALOT);
    let mut streams = vec![d.m.default_stream()];
    for _ in 1..trace.num_streams {
        streams.push(d.stream());
    }
    let mut ptr = vec![0u64; trace.num_ids];
    let mut per_pass = Vec::new();
    for _ in 0..passes {
        let c0 = vmm_calls(&d.m);
        replay_pass(&d.a, &streams, trace, &mut ptr).expect("replay");
        per_pass.push(vmm_calls(&d.m) - c0);
    }
    let s = d.a.stats();
    let ratio = s.reserved_bytes.all().peak as f64 / s.requested_bytes.all().peak as f64;
    (d, per_pass, ratio)
}

/// A repeating workload settles: in cachalot's expandable mode the
/// request's chain is chosen before pages recycle (the lowest that fits)
/// and reserved memory may pass the allocated peak by 2% (more, up to
/// 1/11, only while page moves cost more than their budget) without moving
/// pages, so the real training traces make no device call from their
/// second pass (gpt2_train from its fourth before the budget; recycling
/// whenever a segment would grow past the reserved peak, with no chain
/// chosen first and no allowance, made about 1,600 calls per pass on gpt2
/// and 400 on resnet50), at a peak within 2.5% of the live peak.
/// side_stream_pipeline (two streams taking turns) still moves pages in
/// every pass, but between the same places, through ghost mappings: no
/// device call from its second pass (without ghost mappings and the lowest
/// chain: about 350 a pass, the mapped range creeping up the reservation),
/// at 1.1996 of its live peak, below RMM's smallest pool (1.249).
#[test]
fn recycling_settles_on_repeating_traces() {
    for (name, settled, bound) in [
        ("gpt2_train", 1, 1.025),
        ("resnet50_train", 1, 1.025),
        ("side_stream_pipeline", 1, 1.249),
    ] {
        let (d, per_pass, ratio) = calls_per_pass(&trace(name), 5);
        assert!(per_pass[0] > 100, "{name}: {per_pass:?}");
        assert!(
            per_pass[settled..].iter().all(|&c| c == 0),
            "{name}: calls per pass {per_pass:?}"
        );
        assert!(ratio < bound, "{name}: peak reserved / live peak {ratio}");
        d.a.check_invariants().expect("invariants");
    }
}

/// side_stream_pipeline moves pages between its two streams' segments in
/// every pass (ghost mappings, no driver mapping call from its second
/// pass), and each move needs the work on the pages done. The replay
/// launches no work, so its streams are idle: the allocator asks the
/// backend ([`Backend::query_stream`], one call) instead of recording a
/// completion fence and querying it (two calls, an event). From the
/// second pass on: no event recorded or queried, one stream query per
/// move at most (28 a pass; a fence recorded and queried per move instead
/// would be 56 event calls a pass).
/// A busy stream still gets a fence (`recycling_takes_idle_streams_pages_first`).
///
/// [`Backend::query_stream`]: cachalot_core::Backend::query_stream
#[test]
fn idle_streams_are_asked_not_fenced() {
    use cachalot_core::Backend;
    use cachalot_core::replay::replay_pass;
    let trace = trace("side_stream_pipeline");
    let d = Dev::new(CACHALOT);
    let streams = vec![d.m.default_stream(), d.stream()];
    let mut ptr = vec![0u64; trace.num_ids];
    let count = |c| d.m.call_count(c);
    for pass in 0..3 {
        let (r0, q0, s0) = (
            count(MockCall::RecordEvent),
            count(MockCall::QueryEvent),
            count(MockCall::QueryStream),
        );
        replay_pass(&d.a, &streams, &trace, &mut ptr).expect("replay");
        let (r, q, s) = (
            count(MockCall::RecordEvent) - r0,
            count(MockCall::QueryEvent) - q0,
            count(MockCall::QueryStream) - s0,
        );
        println!("pass {pass}: {r} fences recorded, {q} event queries, {s} stream queries");
        if pass > 0 {
            assert_eq!((r, q), (0, 0), "pass {pass}: {s} stream queries");
            assert!(s > 0 && s <= 28, "pass {pass}: {s} stream queries");
        }
    }
    assert!(d.a.stats().num_device_alloc > 0);
    d.a.check_invariants().expect("invariants");
}

/// The move budget (`docs/design-expandable.md`, "A move budget"): the
/// allowance above the allocated peak doubles while page moves cost more
/// than 50 ns of driver time per operation, up to 1/11 of the allocated
/// peak, and there recycling takes the fewest, largest free blocks. A
/// workload that cannot settle (random sizes and lifetimes) reaches the
/// largest allowance and moves far fewer pages in its later passes; its
/// peak stays within 1.10x of its live peak. A training step whose pages
/// settle keeps the first allowance (resnet50_train: no page moves after
/// its first mappings) or one doubling (gpt2_train: its first pass moves
/// pages all through).
#[test]
fn the_move_budget_raises_the_allowance_only_where_moves_cost() {
    for (name, calls_before) in [("churn_1stream", 6_300), ("churn_4streams", 9_400)] {
        let trace = Trace::synthetic(name).expect("synthetic trace");
        let (d, per_pass, ratio) = calls_per_pass(&trace, 4);
        let peak = d.a.stats().allocated_bytes.all().peak as u64;
        println!("{name}: calls per pass {per_pass:?}, peak reserved / live peak {ratio:.4}");
        assert_eq!(d.a.recycling_allowance(), peak / 11, "{name}");
        // before the budget the later passes made 6,301-8,794 and
        // 9,429-11,256 calls (smallest blocks first, at most 1/16); now
        // 933-1,120 and 1,749-2,157
        for &c in &per_pass[1..] {
            assert!(c * 4 < calls_before, "{name}: calls per pass {per_pass:?}");
        }
        assert!(ratio <= 1.10, "{name}: peak reserved / live peak {ratio}");
        d.a.check_invariants().expect("invariants");
    }
    for (name, raised) in [("resnet50_train", false), ("gpt2_train", true)] {
        let (d, per_pass, _) = calls_per_pass(&trace(name), 3);
        let peak = d.a.stats().allocated_bytes.all().peak as u64;
        let allowance = d.a.recycling_allowance();
        println!("{name}: calls per pass {per_pass:?}, allowance {allowance} B");
        assert_eq!(allowance > peak / 50, raised, "{name}: {allowance} B");
        assert!(allowance < peak / 11, "{name}: {allowance} B");
    }
}

/// cachalot's mode maps new pages in runs of two (one physical allocation
/// and one mapping for 4 MiB: half the driver calls), PyTorch's mode one
/// page at a time. A run is unmapped whole: a free page whose run partner
/// is live stays mapped through `empty_cache`, and goes once its partner
/// is freed; nothing leaks.
#[test]
fn pages_map_in_runs_and_unmap_whole() {
    for (config, page) in [(CACHALOT, 2 * MIB), (PYTORCH, 20 * MIB)] {
        let d = Dev::new(config);
        let (c0, m0) = (
            d.m.call_count(MockCall::CreatePhysical),
            d.m.call_count(MockCall::Map),
        );
        let a = d.alloc(2 * page);
        let runs = d.m.call_count(MockCall::Map) - m0;
        assert_eq!(
            d.m.call_count(MockCall::CreatePhysical) - c0,
            runs,
            "{config}"
        );
        if config == CACHALOT {
            assert_eq!(runs, 1, "{config}: two pages, one run");
        } else {
            assert_eq!(runs, 2, "{config}: one mapping per page");
        }
        d.free(a);
        let x = d.alloc(page); // the first page of the run, live
        assert_eq!(x, a);
        d.a.empty_cache().unwrap();
        let left = if config == CACHALOT { 2 * page } else { page };
        assert_eq!(reserved(&d), left as i64, "{config}: the run stays whole");
        d.a.check_invariants().expect("invariants");
        d.free(x);
        d.a.empty_cache().unwrap();
        assert_eq!(reserved(&d), 0, "{config}");
        assert_eq!(d.m.counters().unmap_refused, 0);
        d.drop_without_vmm_leaks();
    }
}

/// A large mapping (32 MiB or more) is made of runs of up to twelve pages
/// in cachalot's mode: a 100 MiB request is five physical allocations and
/// mappings (12, 12, 12, 12 and 2 pages) and one access call, where runs
/// of two would be 25; a 32 MiB request is two (12 and 4 pages); a 20 or
/// 30 MiB request keeps runs of two (five, eight). Freed and recycled, the
/// large runs move whole; nothing leaks. PyTorch's mode maps its 20 MiB
/// pages one at a time.
#[test]
fn large_mappings_map_in_large_runs() {
    for config in [CACHALOT, PYTORCH] {
        let d = Dev::new(config);
        let calls = [MockCall::CreatePhysical, MockCall::Map, MockCall::SetAccess];
        let before = calls.map(|c| d.m.call_count(c));
        let big = d.alloc(100 * MIB);
        let after = calls.map(|c| d.m.call_count(c));
        let made: Vec<u64> = (0..3).map(|k| after[k] - before[k]).collect();
        assert_eq!(made, [5, 5, 1], "{config}: 100 MiB");
        let small = d.alloc_on(20 * MIB, d.stream());
        let again = calls.map(|c| d.m.call_count(c));
        let made: Vec<u64> = (0..3).map(|k| again[k] - after[k]).collect();
        let want = if config == CACHALOT {
            [5, 5, 1]
        } else {
            [1, 1, 1]
        };
        assert_eq!(made, want, "{config}: 20 MiB");
        // freed, the large runs serve a large request of another stream
        d.free(big);
        let other = d.alloc_on(96 * MIB, d.stream());
        if config == CACHALOT {
            assert_eq!(
                d.m.call_count(MockCall::CreatePhysical),
                again[0],
                "{config}: the runs moved, no new memory"
            );
            assert_eq!(reserved(&d), 120 * MIB as i64, "{config}");
        }
        d.free(small);
        d.free(other);
        d.a.empty_cache().unwrap();
        assert_eq!(reserved(&d), 0, "{config}");
        d.drop_without_vmm_leaks();
        // the threshold: 16 pages
        let d = Dev::new(config);
        for (mib, runs) in [(30, 8), (32, 2)] {
            let before = calls.map(|c| d.m.call_count(c));
            d.alloc_on(mib * MIB, d.stream());
            let after = calls.map(|c| d.m.call_count(c));
            let made: Vec<u64> = (0..3).map(|k| after[k] - before[k]).collect();
            let runs = if config == CACHALOT { runs } else { 2 };
            assert_eq!(made, [runs, runs, 1], "{config}: {mib} MiB");
        }
        d.drop_without_vmm_leaks();
    }
}

/// Lending on a device with many busy streams probes few of them: one
/// miss records completion fences on at most four streams (best fit
/// first), not one on every stream holding a candidate, and the best fit
/// is lent behind its fence.
#[test]
fn lending_probes_few_streams() {
    let d = Dev::manual(CACHALOT);
    let streams: Vec<MockStream> = (0..40).map(|_| d.stream()).collect();
    let ps: Vec<u64> = streams.iter().map(|&s| d.alloc_on(10 * MIB, s)).collect();
    for (i, (&s, &p)) in streams.iter().zip(&ps).enumerate() {
        d.m.use_memory(s, p, 10 * MIB, i as u64 + 1).unwrap(); // pending
        d.free(p);
    }
    let s = d.stream();
    let recorded = d.m.call_count(MockCall::RecordEvent);
    let b = d.alloc_on(10 * MIB, s);
    let recorded = d.m.call_count(MockCall::RecordEvent) - recorded;
    assert!(ps.contains(&b), "a busy stream's block is lent");
    assert_eq!(d.a.lent_blocks(), (1, 1));
    assert!(recorded <= 4, "{recorded} fences recorded for one miss");
    d.m.use_memory(s, b, 10 * MIB, 99).unwrap();
    assert_eq!(d.m.race_count(), 0);
    d.free(b);
    d.m.complete_all();
    d.drop_without_vmm_leaks();
}
