//! Interprocess sharing in the private-pool harness: a live allocation
//! shared, the other process (a second mock device) opening it, and
//! closing it later.

use cachalot_core::engine::SharedMemory;
use cachalot_core::{Backend, IPC_HANDLE_BYTES};

use super::World;

/// What the other process opened.
pub(super) struct Window {
    /// Where it is mapped there.
    at: u64,
    /// The segment handle (a segment is open once per process: more
    /// shares of it count `refs`); `None`: pages.
    handle: Option<[u8; IPC_HANDLE_BYTES]>,
    refs: u32,
}

impl World {
    /// Whether the other process has a segment of this device open.
    pub(super) fn segments_open(&self) -> bool {
        self.windows.iter().any(|w| w.handle.is_some())
    }

    /// Shares live allocation `pick`; the other process opens it (a
    /// segment already open there counts one more reference).
    pub(super) fn share(&mut self, pick: u16) {
        let Some(i) = self.pick_live(pick) else {
            return;
        };
        let addr = self.live[i].addr;
        let ipc = self.other.ipc().expect("the mock shares memory");
        match self.a.share(addr) {
            Ok(SharedMemory::Segment { handle, offset }) => {
                let size = self.live[i].size;
                let seg = self
                    .m
                    .live_segments()
                    .into_iter()
                    .find(|&(b, n)| b <= addr && addr + size <= b + n)
                    .expect("a fixed block lies in a device segment");
                assert_eq!(offset, addr - seg.0, "offset of {addr:#x} in its segment");
                if let Some(w) = self.windows.iter_mut().find(|w| w.handle == Some(handle)) {
                    w.refs += 1;
                } else {
                    let at = ipc.open_segment(&handle).expect("open_segment");
                    self.windows.push(Window {
                        at,
                        handle: Some(handle),
                        refs: 1,
                    });
                }
                self.held_open = true;
            }
            Ok(SharedMemory::Pages {
                page,
                handles,
                offset,
            }) => {
                assert!(offset < page, "offset {offset} into pages of {page}");
                let at = ipc.open_pages(4242, page, &handles).expect("open_pages");
                self.windows.push(Window {
                    at,
                    handle: None,
                    refs: 1,
                });
            }
            Ok(SharedMemory::Runs { runs, offset }) => {
                // (only cachalot's page runs are of different sizes)
                assert!(self.runs, "runs of different sizes in PyTorch's mode");
                assert!(runs.windows(2).any(|w| w[0].1 != w[1].1), "{runs:?}");
                assert!(
                    offset < runs[0].1,
                    "offset {offset} into a run of {}",
                    runs[0].1
                );
                let at = ipc.open_runs(4242, &runs).expect("open_runs");
                self.windows.push(Window {
                    at,
                    handle: None,
                    refs: 1,
                });
            }
            Err(e) => panic!("share of live {addr:#x}: {e}"),
        }
    }

    /// The other process drops a reference to window `w`, and closes it
    /// at the last.
    pub(super) fn close(&mut self, w: usize) {
        self.windows[w].refs -= 1;
        if self.windows[w].refs > 0 {
            return;
        }
        let w = self.windows.swap_remove(w);
        let ipc = self.other.ipc().expect("the mock shares memory");
        match w.handle {
            Some(_) => ipc.close_segment(w.at).expect("close_segment"),
            None => ipc.close_pages(w.at).expect("close_pages"),
        }
    }
}
