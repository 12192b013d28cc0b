//! Checkpoints of a private pool in the private-pool harness: saved and
//! restored as cudagraph trees use them, outside capture, on pools no
//! default-pool allocation borrows from.

use cachalot_core::{CaptureError, Error};

use super::{MAX_CHECKPOINTS, STREAMS, World};

impl World {
    /// The live allocations made in pool `p`, by address.
    pub(super) fn live_in(&self, p: usize) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .live
            .iter()
            .filter(|l| l.pool == Some(p))
            .map(|l| l.addr)
            .collect();
        v.sort_unstable();
        v
    }

    /// Saves a checkpoint of held pool `pick` (no lender): it holds
    /// as allocated exactly the pool's live allocations.
    pub(super) fn checkpoint(&mut self, pick: u8) {
        let Some(p) = self.held_pool(pick).filter(|&p| !self.pools[p].lender) else {
            return;
        };
        let c = self
            .a
            .checkpoint_pool(self.pools[p].id)
            .expect("checkpoint_pool of a held pool");
        assert_eq!(c.pool(), self.pools[p].id);
        let saved: Vec<u64> = c.allocated().collect();
        assert_eq!(saved, self.live_in(p), "the checkpoint's allocated blocks");
        if self.checkpoints.len() >= MAX_CHECKPOINTS {
            self.checkpoints.remove(0);
        }
        self.checkpoints.push((p, c));
    }

    /// Restores checkpoint `pick`: the pool's live allocations are freed
    /// and the checkpoint's come back live, at their addresses and on
    /// their streams; a released pool's checkpoint is refused.
    pub(super) fn restore(&mut self, pick: u8) {
        if self.checkpoints.is_empty() {
            return;
        }
        let (p, c) = &self.checkpoints[pick as usize % self.checkpoints.len()];
        let (p, c) = (*p, c.clone());
        if self.pools[p].uses == 0 {
            let e = self
                .a
                .restore_pool(&c)
                .expect_err("restore of a released pool");
            assert!(
                matches!(e, Error::Capture(CaptureError::UnknownPool(_))),
                "{e}"
            );
            return;
        }
        // the blocks come back on their checkpoint's streams: the memory's
        // uses by the pool's other allocation streams must be over first
        let alloc_streams = self.pools[p].alloc_streams;
        if alloc_streams.count_ones() > 1 {
            for s in 0..STREAMS {
                if alloc_streams & (1 << s) != 0 {
                    self.m.complete(self.streams[s]).expect("complete");
                }
            }
        }
        let before = self.live_in(p);
        let d = match self.a.restore_pool(&c) {
            Ok(d) => d,
            // a segment of the checkpoint went, or pages unmapped since:
            // nothing changed
            Err(Error::Capture(CaptureError::Checkpoint(_))) => {
                for &addr in &before {
                    assert!(self.a.block_size(addr).is_some(), "{addr:#x} still live");
                }
                return;
            }
            Err(e) => panic!("restore_pool: {e}"),
        };
        let mut freed = d.freed.clone();
        freed.sort_unstable();
        assert_eq!(freed, before, "a restore frees the pool's live blocks");
        self.live.retain(|l| l.pool != Some(p));
        let mut made: Vec<u64> = d.allocated.iter().map(|x| x.0).collect();
        made.sort_unstable();
        assert_eq!(
            made,
            c.allocated().collect::<Vec<_>>(),
            "a restore allocates the checkpoint's blocks"
        );
        for &(addr, size) in &d.allocated {
            let b = c
                .segments()
                .iter()
                .flat_map(|s| s.blocks.iter())
                .find(|b| b.addr == addr)
                .expect("a block of the checkpoint");
            assert_eq!(b.size, size, "restored block {addr:#x}");
            let si = self
                .streams
                .iter()
                .position(|&s| s == b.stream)
                .expect("a stream of the program");
            assert_eq!(self.a.block_size(addr), Some(size));
            self.made(Ok(addr), size, si, Some(p));
        }
    }
}
