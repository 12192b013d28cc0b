//! Simulated interprocess sharing ([`cachalot_core::IpcMemory`]): every mock
//! device of this process plays a process of its own. A segment's handle
//! (`segment_handle`) and a physical allocation's exported handle
//! (`export_physical`) are tokens in a registry shared by every mock
//! device; another mock device opens them (`open_segment`, `open_runs`)
//! at addresses of its own foreign window, counted per token. Misuse is a
//! typed error: an unknown or forged handle, a handle opened twice by the
//! same device (CUDA opens a handle once per process), pages of the wrong
//! size, closing what was not opened. A segment open in another device
//! cannot be freed (`free` fails with [`codes::ILLEGAL_STATE`]): an
//! allocator that hands memory another process still maps back to the
//! device is caught. Released physical memory stays valid where it is open
//! (as CUDA keeps imported memory alive), and its handle stops working
//! for new opens.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};

use cachalot_core::{BackendError, IPC_HANDLE_BYTES, IpcMemory};
use parking_lot::Mutex;

use crate::MockBackend;
use crate::types::codes;

/// The first bytes of a mock segment handle.
const MAGIC: &[u8; 8] = b"MOCKIPC1";
/// Where the foreign windows of a mock device start (above every segment
/// and reservation range).
const WINDOW_BASE: u64 = 0xE000_0000_0000_0000;
/// Address space of one opened token.
const WINDOW: u64 = 1 << 40;

fn err(call: &'static str, code: i64, message: impl Into<String>) -> BackendError {
    BackendError::new("mock", call, code, message)
}

/// What a token names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum What {
    /// A segment from `malloc`: (base, size).
    Segment(u64, u64),
    /// A physical allocation: (id, size).
    Physical(u64, u64),
}

struct Export {
    instance: u64,
    what: What,
    /// Opens by other devices.
    opens: u64,
}

#[derive(Default)]
struct Registry {
    next: u64,
    exports: HashMap<u64, Export>,
    /// (instance, what) -> token, so that one memory has one token.
    tokens: HashMap<(u64, What), u64>,
    /// (importer instance, window address) -> the tokens mapped there.
    opened: BTreeMap<(u64, u64), Vec<u64>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// Whether any memory was ever exported: until then `free` and
/// `release_physical` skip the registry (the mock's hot paths).
static ANY: AtomicBool = AtomicBool::new(false);

fn registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    f(REGISTRY.lock().get_or_insert_with(Registry::default))
}

impl Registry {
    fn token(&mut self, instance: u64, what: What) -> u64 {
        if let Some(&t) = self.tokens.get(&(instance, what)) {
            return t;
        }
        self.next += 1;
        ANY.store(true, Ordering::Relaxed);
        let t = self.next;
        self.exports.insert(
            t,
            Export {
                instance,
                what,
                opens: 0,
            },
        );
        self.tokens.insert((instance, what), t);
        t
    }

    fn window(&self, importer: u64) -> u64 {
        let used: Vec<u64> = self
            .opened
            .range((importer, 0)..=(importer, u64::MAX))
            .map(|(&(_, a), _)| a)
            .collect();
        (0..)
            .map(|k| WINDOW_BASE + k * WINDOW)
            .find(|a| !used.contains(a))
            .expect("a free window")
    }
}

/// Called by the device's `free` / `release_physical`: an error when the
/// memory is open in another device; else its token (if any) is dropped.
pub(crate) fn forget(
    call: &'static str,
    instance: u64,
    memory: (bool, u64),
) -> Result<(), BackendError> {
    if !ANY.load(Ordering::Relaxed) {
        return Ok(());
    }
    registry(|r| {
        let key = r
            .tokens
            .iter()
            .find(|((i, w), _)| {
                *i == instance
                    && match (*w, memory) {
                        (What::Segment(b, _), (false, a)) => b == a,
                        (What::Physical(id, _), (true, a)) => id == a,
                        _ => false,
                    }
            })
            .map(|(k, &t)| (*k, t));
        let Some((k, t)) = key else { return Ok(()) };
        let opens = r.exports.get(&t).map_or(0, |e| e.opens);
        if opens > 0 && !memory.0 {
            return Err(err(
                call,
                codes::ILLEGAL_STATE,
                format!("this memory is still open in {opens} other process(es) (IPC)"),
            ));
        }
        r.tokens.remove(&k);
        if opens == 0 {
            r.exports.remove(&t);
        }
        Ok(())
    })
}

/// The token of physical allocation `id` of `size` bytes of device
/// `instance` (`VirtualMemory::export_physical`).
pub(crate) fn export_physical(instance: u64, id: u64, size: u64) -> Result<i32, BackendError> {
    registry(|r| {
        let t = r.token(instance, What::Physical(id, size));
        i32::try_from(t)
            .map_err(|_| err("export_physical", codes::INVALID_VALUE, "too many handles"))
    })
}

impl IpcMemory for MockBackend {
    fn segment_handle(&self, base: u64) -> Result<[u8; IPC_HANDLE_BYTES], BackendError> {
        let size = self.segment_size(base).ok_or_else(|| {
            err(
                "segment_handle",
                codes::INVALID_DEVICE_POINTER,
                format!("{base:#x} is not the start of a segment of this mock device"),
            )
        })?;
        let t = registry(|r| r.token(self.instance(), What::Segment(base, size)));
        let mut h = [0u8; IPC_HANDLE_BYTES];
        h[..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&t.to_le_bytes());
        Ok(h)
    }

    fn open_segment(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64, BackendError> {
        const CALL: &str = "open_segment";
        if &handle[..8] != MAGIC || handle[16..].iter().any(|&b| b != 0) {
            return Err(err(CALL, codes::INVALID_VALUE, "not a mock segment handle"));
        }
        let t = u64::from_le_bytes(handle[8..16].try_into().expect("8 bytes"));
        let me = self.instance();
        registry(|r| {
            let e = r
                .exports
                .get(&t)
                .filter(|e| matches!(e.what, What::Segment(..)))
                .ok_or_else(|| {
                    err(
                        CALL,
                        codes::INVALID_VALUE,
                        "unknown or freed segment handle",
                    )
                })?;
            if e.instance == me {
                return Err(err(
                    CALL,
                    codes::INVALID_CONTEXT,
                    "a handle of this very process",
                ));
            }
            if r.opened.iter().any(|(&(i, _), ts)| i == me && ts == &[t]) {
                return Err(err(
                    CALL,
                    codes::ALREADY_MAPPED,
                    "the handle is already open here",
                ));
            }
            let a = r.window(me);
            r.exports.get_mut(&t).expect("found").opens += 1;
            r.opened.insert((me, a), vec![t]);
            Ok(a)
        })
    }

    fn close_segment(&self, addr: u64) -> Result<(), BackendError> {
        close(self.instance(), "close_segment", addr, true)
    }

    fn open_runs(&self, pid: i32, runs: &[(i32, u64)]) -> Result<u64, BackendError> {
        const CALL: &str = "open_runs";
        if pid <= 0 || runs.is_empty() || runs.iter().any(|r| r.1 == 0) {
            return Err(err(CALL, codes::INVALID_VALUE, "no pid, handle or size"));
        }
        let me = self.instance();
        registry(|r| {
            let mut ts = Vec::with_capacity(runs.len());
            for &(h, bytes) in runs {
                let t = u64::try_from(h).unwrap_or(0);
                match r.exports.get(&t) {
                    Some(e) if e.instance != me && e.what == What::Physical(phys_id(e), bytes) => {
                        ts.push(t)
                    }
                    Some(e) if e.instance != me => {
                        return Err(err(
                            CALL,
                            codes::INVALID_VALUE,
                            format!(
                                "handle {h} is not a physical allocation of {bytes} bytes ({:?})",
                                e.what
                            ),
                        ));
                    }
                    _ => {
                        return Err(err(
                            CALL,
                            codes::INVALID_VALUE,
                            format!("unknown handle {h}"),
                        ));
                    }
                }
            }
            let a = r.window(me);
            for t in &ts {
                r.exports.get_mut(t).expect("found").opens += 1;
            }
            r.opened.insert((me, a), ts);
            Ok(a)
        })
    }

    fn close_pages(&self, addr: u64) -> Result<(), BackendError> {
        close(self.instance(), "close_pages", addr, false)
    }
}

fn phys_id(e: &Export) -> u64 {
    match e.what {
        What::Physical(id, _) => id,
        What::Segment(..) => u64::MAX,
    }
}

fn close(me: u64, call: &'static str, addr: u64, segment: bool) -> Result<(), BackendError> {
    registry(|r| {
        let Some(ts) = r.opened.get(&(me, addr)) else {
            return Err(err(
                call,
                codes::INVALID_VALUE,
                format!("nothing is open at {addr:#x}"),
            ));
        };
        let is_segment = ts.len() == 1
            && r.exports
                .get(&ts[0])
                .is_some_and(|e| matches!(e.what, What::Segment(..)));
        if is_segment != segment {
            return Err(err(
                call,
                codes::INVALID_VALUE,
                format!("{addr:#x} was opened by the other call"),
            ));
        }
        let ts = r.opened.remove(&(me, addr)).expect("found");
        for t in ts {
            if let Some(e) = r.exports.get_mut(&t) {
                e.opens -= 1;
                // memory released while open goes with its last close
                if e.opens == 0 && !r.tokens.values().any(|&v| v == t) {
                    r.exports.remove(&t);
                }
            }
        }
        Ok(())
    })
}

impl MockBackend {
    /// What this device holds open of other devices' memory (IPC): the
    /// windows it opened.
    pub fn ipc_open_count(&self) -> usize {
        let me = self.instance();
        registry(|r| r.opened.range((me, 0)..=(me, u64::MAX)).count())
    }
}
