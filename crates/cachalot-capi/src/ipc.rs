//! CUDA tensors between processes (`torch.multiprocessing`): PyTorch's
//! `shareIpcHandle` ([`cachalot_ipc_share`]) and `getIpcDevPtr`
//! ([`cachalot_ipc_open`], [`cachalot_ipc_close`]) in PyTorch 2.11's wire
//! format, so that either side may run native PyTorch
//! (PyTorch's `DeviceCachingAllocator::shareIpcHandle` and `getIpcDevPtr`):
//!
//! * byte 0: the format version, 2;
//! * byte 1 `'c'`: the 64-byte `cudaIpcMemHandle_t` of the segment
//!   (`cudaMalloc` memory) follows; the offset is the allocation's offset
//!   in the segment;
//! * byte 1 `'e'`: expandable-segment pages: a header `{ int32 pid; 4 zero
//!   bytes; uint64 page_size; uint64 num_handles }` then one `int32` file
//!   descriptor (of process `pid`) per page; the offset is the
//!   allocation's offset in the first page;
//! * byte 1 `'r'` (cachalot's; PyTorch refuses it): expandable-segment
//!   pages in physical allocations of different sizes (cachalot's page
//!   runs, which PyTorch's `'e'` cannot describe): a header `{ int32 pid;
//!   4 zero bytes; uint64 num_runs }`, then per run `{ int32 fd; 4 zero
//!   bytes; uint64 bytes }`; the offset is the allocation's offset in the
//!   first run. Sent only for such an allocation: a process on cachalot
//!   opens it, a process on native PyTorch refuses it ("unexpected or
//!   illformed shareable handle type");
//! * a bare 64-byte string (no version byte) is a legacy `'c'` handle.
//!
//! The receiving side opens each handle once per process (CUDA allows no
//! more) and counts its users: [`cachalot_ipc_open`] of a handle already
//! open returns the same address, and the last [`cachalot_ipc_close`]
//! unmaps it.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use cachalot::core::engine::SharedMemory;
use cachalot::core::{Backend, IPC_HANDLE_BYTES, IpcMemory};
use cachalot::{DeviceAllocator, Error};
use parking_lot::Mutex;

use crate::{Failure, device_alloc, existing_alloc, status};

/// The wire format's version byte (PyTorch's `SHAREABLE_HANDLE_VERSION`).
pub const IPC_VERSION: u8 = 2;
/// Most page handles one `'e'` handle may carry (a bound on untrusted
/// input: 2^20 pages of 2 MiB are 2 TiB).
pub const MAX_IPC_PAGES: u64 = 1 << 20;
/// Bytes of the `'e'` header after the two leading bytes.
const HEADER: usize = 24;
/// Bytes of the `'r'` header after the two leading bytes.
const RUNS_HEADER: usize = 16;
/// Bytes of one run of an `'r'` handle.
const RUN: usize = 16;
/// The longest handle [`decode`] reads.
const MAX_HANDLE: usize = 2 + RUNS_HEADER + RUN * MAX_IPC_PAGES as usize;

/// What is open in this process, by (device, handle bytes): the address
/// and the number of users.
struct Open {
    addr: u64,
    pages: bool,
    users: u64,
}

/// The open handles by (device, handle bytes).
type Table = HashMap<(u32, Vec<u8>), Open>;

static OPEN: Mutex<Option<Table>> = Mutex::new(None);

fn ipc_of(dev: &DeviceAllocator) -> Result<&dyn IpcMemory, Failure> {
    let ipc = if let Some(a) = dev.as_mock() {
        a.backend().ipc()
    } else if let Some(a) = dev.as_cuda() {
        a.backend().ipc()
    } else {
        None
    };
    ipc.ok_or_else(|| {
        Failure::invalid(format!(
            "the {} backend cannot share memory with another process",
            dev.backend_kind()
        ))
    })
}

fn share_on(dev: &DeviceAllocator, addr: u64) -> Result<SharedMemory, Error> {
    if let Some(a) = dev.as_mock() {
        a.share(addr)
    } else if let Some(a) = dev.as_cuda() {
        a.share(addr)
    } else {
        Err(Error::InvalidArgument(format!(
            "the {} backend cannot share memory with another process",
            dev.backend_kind()
        )))
    }
}

/// PyTorch's bytes for `s` (see the module documentation).
pub fn encode(s: &SharedMemory, pid: i32) -> (Vec<u8>, u64) {
    match s {
        SharedMemory::Segment { handle, offset } => {
            let mut v = vec![IPC_VERSION, b'c'];
            v.extend_from_slice(handle);
            (v, *offset)
        }
        SharedMemory::Pages {
            page,
            handles,
            offset,
        } => {
            let mut v = vec![IPC_VERSION, b'e'];
            v.extend_from_slice(&pid.to_ne_bytes());
            v.extend_from_slice(&[0; 4]);
            v.extend_from_slice(&page.to_ne_bytes());
            v.extend_from_slice(&(handles.len() as u64).to_ne_bytes());
            for fd in handles {
                v.extend_from_slice(&fd.to_ne_bytes());
            }
            (v, *offset)
        }
        SharedMemory::Runs { runs, offset } => {
            let mut v = vec![IPC_VERSION, b'r'];
            v.extend_from_slice(&pid.to_ne_bytes());
            v.extend_from_slice(&[0; 4]);
            v.extend_from_slice(&(runs.len() as u64).to_ne_bytes());
            for &(fd, bytes) in runs {
                v.extend_from_slice(&fd.to_ne_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&bytes.to_ne_bytes());
            }
            (v, *offset)
        }
    }
}

/// A handle as this process must open it.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A segment's 64-byte handle.
    Segment([u8; IPC_HANDLE_BYTES]),
    /// Pages of process `pid`, `page` bytes each, by file descriptor.
    Pages {
        /// The exporting process.
        pid: i32,
        /// Bytes per page.
        page: u64,
        /// Its file descriptors, one per page.
        fds: Vec<i32>,
    },
    /// Physical allocations of process `pid` of different sizes.
    Runs {
        /// The exporting process.
        pid: i32,
        /// Each one's file descriptor and bytes, in address order.
        runs: Vec<(i32, u64)>,
    },
}

/// Parses PyTorch's bytes (untrusted: every length and count is checked);
/// the error says what is wrong.
pub fn decode(b: &[u8]) -> Result<Decoded, String> {
    if b.len() == IPC_HANDLE_BYTES {
        // a legacy handle: the raw cudaIpcMemHandle_t
        return Ok(Decoded::Segment(b.try_into().expect("64 bytes")));
    }
    if b.len() < 2 {
        return Err(format!(
            "a shareable handle of {} bytes is too short",
            b.len()
        ));
    }
    if b[0] > IPC_VERSION {
        return Err(format!(
            "received sharable handle from a future version of torch (format {}, this one reads up to {IPC_VERSION})",
            b[0]
        ));
    }
    match b[1] {
        b'c' if b.len() == 2 + IPC_HANDLE_BYTES => {
            Ok(Decoded::Segment(b[2..].try_into().expect("64 bytes")))
        }
        b'e' if b.len() >= 2 + HEADER => {
            let h = &b[2..2 + HEADER];
            let pid = i32::from_ne_bytes(h[0..4].try_into().expect("4 bytes"));
            let page = u64::from_ne_bytes(h[8..16].try_into().expect("8 bytes"));
            let n = u64::from_ne_bytes(h[16..24].try_into().expect("8 bytes"));
            let rest = &b[2 + HEADER..];
            if n == 0 || n > MAX_IPC_PAGES || rest.len() as u64 != n * 4 || page == 0 {
                return Err(format!(
                    "ill-formed expandable-segment handle: {n} page(s) of {page} bytes in {} bytes",
                    rest.len()
                ));
            }
            let fds = rest
                .chunks_exact(4)
                .map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes")))
                .collect();
            Ok(Decoded::Pages { pid, page, fds })
        }
        b'r' if b.len() >= 2 + RUNS_HEADER => {
            let h = &b[2..2 + RUNS_HEADER];
            let pid = i32::from_ne_bytes(h[0..4].try_into().expect("4 bytes"));
            let n = u64::from_ne_bytes(h[8..16].try_into().expect("8 bytes"));
            let rest = &b[2 + RUNS_HEADER..];
            if n == 0 || n > MAX_IPC_PAGES || rest.len() as u64 != n * RUN as u64 {
                return Err(format!(
                    "ill-formed page-runs handle: {n} run(s) in {} bytes",
                    rest.len()
                ));
            }
            let runs: Vec<(i32, u64)> = rest
                .chunks_exact(RUN)
                .map(|c| {
                    (
                        i32::from_ne_bytes(c[0..4].try_into().expect("4 bytes")),
                        u64::from_ne_bytes(c[8..16].try_into().expect("8 bytes")),
                    )
                })
                .collect();
            if runs.iter().any(|r| r.1 == 0)
                || runs
                    .iter()
                    .try_fold(0u64, |t, r| t.checked_add(r.1))
                    .is_none()
            {
                return Err("ill-formed page-runs handle: a run of 0 bytes, or too many".into());
            }
            Ok(Decoded::Runs { pid, runs })
        }
        t => Err(format!(
            "unexpected or ill-formed shareable handle (type {t:#04x}, {} bytes)",
            b.len()
        )),
    }
}

/// Writes PyTorch's shareable handle of the live allocation at `ptr` (on
/// `device_hint` first, then on every other device in use) to `buf` (its
/// length to `*len`, the allocation's offset in what the handle maps to
/// `*offset`). `buf` too short (or NULL with `buf_len` 0) is
/// [`crate::CACHALOT_ERR_INVALID_ARGUMENT`] with the length needed in
/// `*len`. A pointer no device handed out is
/// [`crate::CACHALOT_ERR_INVALID_POINTER`] ("invalid device pointer").
///
/// # Safety
/// `buf` is valid for `buf_len` bytes of writes (NULL when 0); `len` and
/// `offset` are valid for one write each (NULL: an error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_ipc_share(
    ptr: *const c_void,
    device_hint: c_int,
    buf: *mut u8,
    buf_len: usize,
    len: *mut usize,
    offset: *mut u64,
) -> c_int {
    status("cachalot_ipc_share", || {
        if len.is_null() || offset.is_null() || (buf.is_null() && buf_len > 0) {
            return Err(Failure::invalid("len, offset or buf is NULL"));
        }
        let addr = ptr.addr() as u64;
        let n = crate::device_table()?.len();
        let hint = usize::try_from(device_hint).ok().filter(|&h| h < n);
        let order = hint.into_iter().chain((0..n).filter(|&d| Some(d) != hint));
        let mut shared = None;
        for d in order {
            let Some(dev) = existing_alloc(d as c_int)? else {
                continue;
            };
            match share_on(dev, addr) {
                Err(Error::UnknownPointer(_)) => {}
                r => {
                    shared = Some(r?);
                    break;
                }
            }
        }
        let shared = shared.ok_or(Failure::from(Error::UnknownPointer(addr)))?;
        let (bytes, off) = encode(&shared, std::process::id() as i32);
        // SAFETY: `len` is non-NULL and valid for a write.
        unsafe { len.write(bytes.len()) };
        if bytes.len() > buf_len {
            return Err(Failure::invalid(format!(
                "the handle needs {} bytes, the buffer has {buf_len}",
                bytes.len()
            )));
        }
        // SAFETY: `buf` is valid for `buf_len` >= `bytes.len()` bytes and
        // does not overlap the local vector; `offset` is valid for a write.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len());
            offset.write(off);
        }
        Ok(())
    })
}

/// Opens another process's shareable handle (`handle_len` bytes of
/// PyTorch's format, from either allocator) on `device` and writes the
/// address of what it maps (the segment, or the first page) to `*out`. A
/// handle already open in this process gives the same address again (one
/// more user). Malformed input is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`];
/// a driver refusal [`crate::CACHALOT_ERR_BACKEND`].
///
/// # Safety
/// `handle` is valid for `handle_len` bytes of reads; `out` is valid for
/// one pointer write (NULL: an error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_ipc_open(
    device: c_int,
    handle: *const u8,
    handle_len: usize,
    out: *mut *mut c_void,
) -> c_int {
    status("cachalot_ipc_open", || {
        if out.is_null() || handle.is_null() {
            return Err(Failure::invalid("handle or out is NULL"));
        }
        if handle_len > MAX_HANDLE {
            return Err(Failure::invalid(format!(
                "a shareable handle of {handle_len} bytes"
            )));
        }
        // SAFETY: valid for `handle_len` reads by the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(handle, handle_len) }.to_vec();
        let decoded = decode(&bytes).map_err(Failure::invalid)?;
        let dev = device_alloc(device)?;
        let key = (dev.index(), bytes);
        let mut open = OPEN.lock();
        let table = open.get_or_insert_with(HashMap::new);
        let addr = if let Some(o) = table.get_mut(&key) {
            o.users += 1;
            o.addr
        } else {
            let ipc = ipc_of(dev)?;
            let (addr, pages) = match &decoded {
                Decoded::Segment(h) => (ipc.open_segment(h).map_err(Error::from)?, false),
                Decoded::Pages { pid, page, fds } => {
                    (ipc.open_pages(*pid, *page, fds).map_err(Error::from)?, true)
                }
                Decoded::Runs { pid, runs } => {
                    (ipc.open_runs(*pid, runs).map_err(Error::from)?, true)
                }
            };
            table.insert(
                key,
                Open {
                    addr,
                    pages,
                    users: 1,
                },
            );
            addr
        };
        // SAFETY: non-NULL and valid for a write by the caller's contract.
        unsafe { out.write(std::ptr::with_exposed_provenance_mut(addr as usize)) };
        Ok(())
    })
}

/// Drops one user of what [`cachalot_ipc_open`] opened at `ptr` on
/// `device`; the last unmaps it. An address not opened so is
/// [`crate::CACHALOT_ERR_INVALID_ARGUMENT`].
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_ipc_close(device: c_int, ptr: *const c_void) -> c_int {
    status("cachalot_ipc_close", || {
        let addr = ptr.addr() as u64;
        let dev = device_alloc(device)?;
        let mut open = OPEN.lock();
        let table = open.get_or_insert_with(HashMap::new);
        let key = table
            .iter()
            .find(|((d, _), o)| *d == dev.index() && o.addr == addr)
            .map(|(k, _)| k.clone())
            .ok_or_else(|| Failure::invalid(format!("nothing shared is open at {addr:#x}")))?;
        let o = table.get_mut(&key).expect("found");
        o.users -= 1;
        if o.users > 0 {
            return Ok(());
        }
        let pages = o.pages;
        table.remove(&key);
        let ipc = ipc_of(dev)?;
        if pages {
            ipc.close_pages(addr).map_err(Error::from)?;
        } else {
            ipc.close_segment(addr).map_err(Error::from)?;
        }
        Ok(())
    })
}

/// How many handles are open in this process (a testing hook).
pub fn open_handles() -> usize {
    OPEN.lock().as_ref().map_or(0, HashMap::len)
}
