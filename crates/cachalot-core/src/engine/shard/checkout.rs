//! Check-in and check-out: the device takes the shards' parts back
//! before it runs the engine's code, replaying their stat logs, and hands
//! them out again after, with what each may do alone.

use super::{Logging, SHARDS, Shard};
use crate::engine::block::{BlockId, part_of};
use crate::engine::free_set::FreeSet;
use crate::engine::pools::DEFAULT_POOL;
use crate::engine::stat_log::{replay, seqs_of};

impl<B: crate::backend::Backend> crate::engine::state::Inner<B> {
    /// Block `id` now belongs to stream `s`; a block that leaves the
    /// shard of its part turns the fast path off.
    pub(in crate::engine) fn rekey(&mut self, id: BlockId, s: B::Stream) {
        self.blocks[id].stream = s;
        if self.router.shard(s) != part_of(id) {
            self.foreign = true;
        }
    }

    /// Takes the parts of the shards held (those that hold any, see
    /// [`Self::occupied`]) back: the slab and live-map parts, the default
    /// pools' free sets, and the stat logs, replayed into the device's
    /// stats (every shard that can log is held: the stats are exact after
    /// it). A shard not held holds nothing (its fast path finds nothing).
    pub(crate) fn check_in<G>(&mut self, shards: &mut [Option<G>])
    where
        G: std::ops::DerefMut<Target = Shard<B::Stream>>,
    {
        debug_assert_eq!(shards.len(), SHARDS);
        let mut moved = false;
        for small in [false, true] {
            let mut from: [Option<&mut FreeSet<B::Stream>>; SHARDS] = std::array::from_fn(|_| None);
            for (f, sh) in from.iter_mut().zip(shards.iter_mut()) {
                *f = sh.as_deref_mut().map(|sh| &mut sh.free[small as usize]);
            }
            moved |= from.iter().any(Option::is_some);
            let free = &mut self.pools.pool_mut(DEFAULT_POOL, small).free;
            // (with no shard held, e.g. while the fast path is off, every
            // part is here already and the sets are in order)
            if moved {
                free.take_back(&mut from);
            }
        }
        for (k, sh) in shards.iter_mut().enumerate() {
            let Some(sh) = sh else { continue };
            let sh = &mut **sh;
            std::mem::swap(&mut self.blocks.parts[k], &mut sh.slab);
            std::mem::swap(&mut self.live.parts[k], &mut sh.live);
            self.events.observe_clock(sh.free_clock);
            // (the only shard out: nothing else changed these stats)
            sh.mirror.fold_into(&mut self.stats);
        }
        // (the windows flushed before are folded, `CachingAllocator::
        // settle`: every entry left is in a shard held)
        let seqs = seqs_of(
            shards
                .iter()
                .map(|sh| sh.as_ref().map(|sh| [&sh.full[..], &sh.log[..]])),
        );
        replay(&mut self.stats, &seqs);
        for sh in shards.iter_mut().flatten() {
            sh.full.clear();
            sh.log.clear();
        }
    }

    /// Whether the fast path is allowed: no capture, no pending events or
    /// deferred frees, no memory history, no garbage collection, no
    /// expandable segments turned off after use (the engine's best fit then
    /// skips their blocks; the shards' does not), no block outside its
    /// stream's shard. With expandable segments on, a hit in a mapped block
    /// and a plain free run on the shard as with fixed segments: the
    /// expandable best fit (`expandable_best_fit`), no `inactive_split`
    /// change, and the free stamp from the shard's clock
    /// (`Shard::free_clock`).
    pub(crate) fn fast_ok(&mut self) -> bool {
        let gc_on =
            self.limits.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0;
        self.ever_expandable |= self.config.expandable_segments;
        !self.capture.is_active()
            && self.capture.deferred.is_empty()
            && self.events.outstanding() == 0
            && self.history.is_none()
            && !gc_on
            && (self.config.expandable_segments || !self.ever_expandable)
            && !self.foreign
    }

    /// The shards that will hold anything once checked out (blocks, live
    /// blocks or default-pool free sets): the caller holds at least these.
    pub(crate) fn occupied(&mut self) -> u32 {
        if !self.fast_ok() {
            // nothing goes out while the fast path is off
            return 0;
        }
        let mut m = 0u32;
        for k in 0..SHARDS {
            // (a live block is a block of its part)
            if self.blocks.parts[k].has_blocks() {
                m |= 1 << k;
            }
        }
        for small in [false, true] {
            // (the streams in order: one walk along the router's)
            let mut at = 0;
            for s in self.pools.pool(DEFAULT_POOL, small).free.streams() {
                m |= 1 << self.router.shard_from(s, &mut at);
            }
        }
        m
    }

    /// Hands the parts out to the shards held again (the reverse of
    /// [`Self::check_in`]; the caller has set the `occupied` field from
    /// [`Self::occupied`] and holds every shard in it), with what each may
    /// now do alone: the fast-path flag, the configuration, and whether it
    /// is the only shard out (it then changes a copy of the stats, its
    /// `mirror`, instead of logging).
    pub(crate) fn check_out<G>(&mut self, shards: &mut [Option<G>])
    where
        G: std::ops::DerefMut<Target = Shard<B::Stream>>,
    {
        debug_assert_eq!(shards.len(), SHARDS);
        if !self.fast_ok() {
            // Every part stays here (the device path then takes no shard
            // lock at all): the shards held were checked in and hold
            // nothing; they refuse every fast operation.
            for sh in shards.iter_mut().flatten() {
                sh.view.ok = false;
            }
            self.fast_on = false;
            return;
        }
        self.fast_on = true;
        // one shard out alone: no other can log while it is (a shard held
        // but not occupied holds nothing, so it serves and logs nothing);
        // several, and no two threads have taken turns operation by
        // operation yet: the shared mirror
        let logging = if self.occupied.count_ones() <= 1 {
            Logging::Solo
        } else if self.multi_thread {
            Logging::Log
        } else {
            Logging::Shared
        };
        for small in [false, true] {
            let mut to: [Option<&mut FreeSet<B::Stream>>; SHARDS] = std::array::from_fn(|_| None);
            for (t, sh) in to.iter_mut().zip(shards.iter_mut()) {
                *t = sh.as_deref_mut().map(|sh| &mut sh.free[small as usize]);
            }
            // (the caller holds every occupied shard; the streams go in
            // order: one walk along the router's)
            let mut at = 0;
            let router = &mut self.router;
            self.pools
                .pool_mut(DEFAULT_POOL, small)
                .free
                .hand_out(&mut to, |s| router.shard_from(s, &mut at));
        }
        let gc_calls = [
            self.pools.pool(DEFAULT_POOL, false).gc_calls,
            self.pools.pool(DEFAULT_POOL, true).gc_calls,
        ];
        for (k, sh) in shards.iter_mut().enumerate() {
            let Some(sh) = sh else {
                debug_assert!(!self.blocks.parts[k].has_blocks() && self.live.parts[k].len() == 0);
                continue;
            };
            let sh = &mut **sh;
            sh.free[0].sort_streams();
            sh.free[1].sort_streams();
            std::mem::swap(&mut self.blocks.parts[k], &mut sh.slab);
            std::mem::swap(&mut self.live.parts[k], &mut sh.live);
            debug_assert!(sh.log.is_empty() && sh.full.is_empty());
            sh.view.ok = true;
            sh.view.gc_calls = gc_calls;
            if sh.view.config_gen != self.config_gen {
                sh.view.config = self.config.clone();
                sh.view.config_gen = self.config_gen;
            }
            sh.view.logging = logging;
            sh.free_clock = self.events.clock();
        }
    }

    /// The shard of `s` (assigned now if new).
    pub(crate) fn shard_of(&mut self, s: B::Stream) -> usize {
        self.router.shard(s)
    }
}
