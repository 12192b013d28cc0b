//! Bad-pointer classification: why an address passed to `free` or
//! `record_stream` is not a live allocation's start.

use crate::backend::Backend;
use crate::engine::block::{BState, BlockId, NIL};
use crate::engine::state::Inner;
use crate::error::Error;

impl<B: Backend> Inner<B> {
    /// (`is_free`) or `record_stream`: not in any segment (unknown
    /// pointer); inside a live allocation but not its start (interior
    /// pointer); in a block that is not live, a cached free block or one
    /// waiting for its streams (double free for `free`, not live for
    /// `record_stream`).
    pub(in crate::engine) fn classify_bad_pointer(&self, addr: u64, is_free: bool) -> Error {
        match self.block_containing(addr) {
            None => Error::UnknownPointer(addr),
            Some(id) => {
                let b = &self.blocks[id];
                if b.state == BState::Allocated && b.addr != addr {
                    Error::InteriorPointer {
                        addr,
                        block: b.addr,
                        size: b.size,
                    }
                } else if is_free {
                    Error::DoubleFree(addr)
                } else {
                    Error::NotLive(addr)
                }
            }
        }
    }

    /// The block of a segment whose bytes contain `addr` (a walk of its
    /// segment's block list: for the error path only).
    pub(in crate::engine) fn block_containing(&self, addr: u64) -> Option<BlockId> {
        if !self.segments.contains(addr) {
            return None;
        }
        let (_, seg) = self.segments.map.range(..=addr).next_back()?;
        let mut id = seg.head;
        while id != NIL {
            let b = &self.blocks[id];
            if addr >= b.addr && addr - b.addr < b.size {
                return Some(id);
            }
            id = b.next;
        }
        None
    }
}
