//! A fake HIP driver for unit tests: [`api`] returns a [`HipApi`] whose
//! entries are the functions below, working on thread-local state
//! ([`with`]). No hardware, no library.
#![allow(non_snake_case, non_upper_case_globals)]

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;

use cachalot_hip_sys::*;

/// One capture underway on a stream.
#[derive(Debug, Clone)]
pub struct Capture {
    pub id: u64,
    pub graph: usize,
    pub terminals: Vec<usize>,
}

/// The fake device's state.
#[derive(Debug)]
pub struct State {
    pub device_count: c_int,
    pub count_error: hipError_t,
    pub current: c_int,
    pub total: usize,
    pub used: usize,
    pub next_handle: usize,
    pub allocs: HashMap<usize, usize>,
    /// Error the next hipMalloc returns instead of allocating.
    pub malloc_error: Option<hipError_t>,
    pub sticky: hipError_t,
    pub free_error: Option<hipError_t>,
    /// Event handle -> still pending (recorded, not complete).
    pub events: HashMap<usize, bool>,
    pub events_created: usize,
    pub events_destroyed: usize,
    /// Records leave the event pending until `complete_all`.
    pub hold_events: bool,
    pub streams: HashSet<usize>,
    pub waits: Vec<(usize, usize)>,
    pub capture_mode: hipStreamCaptureMode,
    pub captures: HashMap<usize, Capture>,
    /// Node -> its dependencies.
    pub nodes: HashMap<usize, Vec<usize>>,
    pub set_device_calls: Vec<c_int>,
    pub device_syncs: usize,
}

impl Default for State {
    fn default() -> Self {
        Self {
            device_count: 2,
            count_error: hipSuccess,
            current: 0,
            total: 1 << 30,
            used: 0,
            next_handle: 0x7f00_0000_0000,
            allocs: HashMap::new(),
            malloc_error: None,
            sticky: hipSuccess,
            free_error: None,
            events: HashMap::new(),
            events_created: 0,
            events_destroyed: 0,
            hold_events: false,
            streams: HashSet::new(),
            waits: Vec::new(),
            capture_mode: hipStreamCaptureModeGlobal,
            captures: HashMap::new(),
            nodes: HashMap::new(),
            set_device_calls: Vec::new(),
            device_syncs: 0,
        }
    }
}

impl State {
    fn handle(&mut self, align: usize) -> usize {
        let h = self.next_handle.next_multiple_of(align);
        self.next_handle = h + align;
        h
    }

    /// Completes every pending event.
    pub fn complete_all(&mut self) {
        self.events.values_mut().for_each(|p| *p = false);
    }

    /// Starts a capture on `stream` with the given id.
    pub fn begin_capture(&mut self, stream: usize, id: u64) {
        let graph = self.handle(16);
        self.captures.insert(
            stream,
            Capture {
                id,
                graph,
                terminals: Vec::new(),
            },
        );
    }

    /// Captures one "kernel" on `stream`: a node depending on the stream's
    /// terminals, which becomes its sole terminal.
    pub fn kernel(&mut self, stream: usize) -> usize {
        let node = self.handle(16);
        let cap = self.captures.get_mut(&stream).expect("capturing");
        self.nodes.insert(node, std::mem::take(&mut cap.terminals));
        cap.terminals = vec![node];
        node
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `f` on this thread's fake state.
pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// Resets this thread's fake device and returns a table of fakes.
pub fn api() -> Arc<HipApi> {
    with(|s| *s = State::default());
    let mut t = HipApi::stub();
    t.hipInit = hipInit;
    t.hipGetDeviceCount = hipGetDeviceCount;
    t.hipGetDevice = hipGetDevice;
    t.hipSetDevice = hipSetDevice;
    t.hipGetLastError = hipGetLastError;
    t.hipMalloc = hipMalloc;
    t.hipFree = hipFree;
    t.hipMemGetInfo = hipMemGetInfo;
    t.hipDeviceSynchronize = hipDeviceSynchronize;
    t.hipStreamCreateWithFlags = hipStreamCreateWithFlags;
    t.hipStreamDestroy = hipStreamDestroy;
    t.hipStreamSynchronize = hipStreamSynchronize;
    t.hipStreamWaitEvent = hipStreamWaitEvent;
    t.hipEventCreateWithFlags = hipEventCreateWithFlags;
    t.hipEventDestroy = hipEventDestroy;
    t.hipEventRecord = hipEventRecord;
    t.hipEventQuery = hipEventQuery;
    t.hipEventSynchronize = hipEventSynchronize;
    t.hipStreamGetCaptureInfo_v2 = Some(hipStreamGetCaptureInfo_v2);
    t.hipGraphNodeGetDependencies = Some(hipGraphNodeGetDependencies);
    t.hipGraphAddEmptyNode = Some(hipGraphAddEmptyNode);
    t.hipStreamUpdateCaptureDependencies = Some(hipStreamUpdateCaptureDependencies);
    t.hipThreadExchangeStreamCaptureMode = Some(hipThreadExchangeStreamCaptureMode);
    Arc::new(t)
}

/// Writes `v` through an out-pointer handed to a fake.
fn put<T>(p: *mut T, v: T) {
    assert!(!p.is_null(), "fake HIP: null out-pointer");
    // SAFETY: the backend passes valid, aligned out-pointers (checked non-null).
    unsafe { p.write(v) }
}

unsafe extern "C" fn hipInit(_flags: c_uint) -> hipError_t {
    with(|s| {
        if s.device_count == 0 {
            hipErrorNoDevice
        } else {
            hipSuccess
        }
    })
}

unsafe extern "C" fn hipGetDeviceCount(n: *mut c_int) -> hipError_t {
    with(|s| {
        put(
            n,
            if s.count_error == hipSuccess {
                s.device_count
            } else {
                0
            },
        );
        if s.count_error != hipSuccess {
            s.count_error
        } else if s.device_count == 0 {
            hipErrorNoDevice
        } else {
            hipSuccess
        }
    })
}

unsafe extern "C" fn hipGetDevice(d: *mut c_int) -> hipError_t {
    with(|s| put(d, s.current));
    hipSuccess
}

unsafe extern "C" fn hipSetDevice(d: c_int) -> hipError_t {
    with(|s| {
        s.set_device_calls.push(d);
        if d < 0 || d >= s.device_count {
            return hipErrorInvalidDevice;
        }
        s.current = d;
        hipSuccess
    })
}

unsafe extern "C" fn hipGetLastError() -> hipError_t {
    with(|s| std::mem::replace(&mut s.sticky, hipSuccess))
}

unsafe extern "C" fn hipMalloc(p: *mut *mut c_void, size: usize) -> hipError_t {
    with(|s| {
        if !s.captures.is_empty() && s.capture_mode != hipStreamCaptureModeRelaxed {
            return hipErrorStreamCaptureUnsupported;
        }
        if let Some(e) = s.malloc_error.take() {
            s.sticky = e;
            return e;
        }
        if s.used + size > s.total {
            s.sticky = hipErrorOutOfMemory;
            return hipErrorOutOfMemory;
        }
        let h = s.handle(512.max(size.next_power_of_two().min(1 << 21)));
        s.next_handle += size;
        s.used += size;
        s.allocs.insert(h, size);
        put(p, h as *mut c_void);
        hipSuccess
    })
}

unsafe extern "C" fn hipFree(p: *mut c_void) -> hipError_t {
    with(|s| {
        if let Some(e) = s.free_error.take() {
            return e;
        }
        match s.allocs.remove(&(p as usize)) {
            Some(size) => {
                s.used -= size;
                hipSuccess
            }
            None => hipErrorInvalidValue,
        }
    })
}

unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError_t {
    with(|s| {
        put(free, s.total - s.used);
        put(total, s.total);
    });
    hipSuccess
}

unsafe extern "C" fn hipDeviceSynchronize() -> hipError_t {
    with(|s| {
        s.device_syncs += 1;
        s.complete_all();
    });
    hipSuccess
}

unsafe extern "C" fn hipStreamCreateWithFlags(p: *mut hipStream_t, _f: c_uint) -> hipError_t {
    with(|s| {
        let h = s.handle(16);
        s.streams.insert(h);
        put(p, h as hipStream_t);
    });
    hipSuccess
}

unsafe extern "C" fn hipStreamDestroy(st: hipStream_t) -> hipError_t {
    with(|s| {
        if s.streams.remove(&(st as usize)) {
            hipSuccess
        } else {
            hipErrorInvalidHandle
        }
    })
}

unsafe extern "C" fn hipStreamSynchronize(_st: hipStream_t) -> hipError_t {
    hipSuccess
}

unsafe extern "C" fn hipStreamWaitEvent(st: hipStream_t, ev: hipEvent_t, _f: c_uint) -> hipError_t {
    with(|s| {
        if !s.events.contains_key(&(ev as usize)) {
            return hipErrorInvalidHandle;
        }
        s.waits.push((st as usize, ev as usize));
        hipSuccess
    })
}

unsafe extern "C" fn hipEventCreateWithFlags(p: *mut hipEvent_t, flags: c_uint) -> hipError_t {
    with(|s| {
        assert_eq!(
            flags, hipEventDisableTiming,
            "events are created without timing"
        );
        let h = s.handle(16);
        s.events.insert(h, false);
        s.events_created += 1;
        put(p, h as hipEvent_t);
    });
    hipSuccess
}

unsafe extern "C" fn hipEventDestroy(ev: hipEvent_t) -> hipError_t {
    with(|s| {
        if s.events.remove(&(ev as usize)).is_some() {
            s.events_destroyed += 1;
            hipSuccess
        } else {
            hipErrorInvalidHandle
        }
    })
}

unsafe extern "C" fn hipEventRecord(ev: hipEvent_t, _st: hipStream_t) -> hipError_t {
    with(|s| {
        let hold = s.hold_events;
        match s.events.get_mut(&(ev as usize)) {
            Some(p) => {
                *p = hold;
                hipSuccess
            }
            None => hipErrorInvalidHandle,
        }
    })
}

unsafe extern "C" fn hipEventQuery(ev: hipEvent_t) -> hipError_t {
    with(|s| match s.events.get(&(ev as usize)) {
        Some(true) => hipErrorNotReady,
        Some(false) => hipSuccess,
        None => hipErrorInvalidHandle,
    })
}

unsafe extern "C" fn hipEventSynchronize(ev: hipEvent_t) -> hipError_t {
    with(|s| match s.events.get_mut(&(ev as usize)) {
        Some(p) => {
            *p = false;
            hipSuccess
        }
        None => hipErrorInvalidHandle,
    })
}

unsafe extern "C" fn hipStreamGetCaptureInfo_v2(
    st: hipStream_t,
    status: *mut hipStreamCaptureStatus,
    id: *mut c_ulonglong,
    graph: *mut hipGraph_t,
    deps: *mut *const hipGraphNode_t,
    n: *mut usize,
) -> hipError_t {
    // The terminal array must stay valid after the call: keep it per thread.
    thread_local! {
        static OUT: RefCell<Vec<hipGraphNode_t>> = const { RefCell::new(Vec::new()) };
    }
    with(|s| match s.captures.get(&(st as usize)) {
        None => {
            put(status, hipStreamCaptureStatusNone);
            put(id, 0);
            put(graph, std::ptr::null_mut());
            put(deps, std::ptr::null());
            put(n, 0);
        }
        Some(c) => {
            put(
                status,
                if c.id == u64::MAX {
                    hipStreamCaptureStatusInvalidated
                } else {
                    hipStreamCaptureStatusActive
                },
            );
            put(id, c.id);
            put(graph, c.graph as hipGraph_t);
            OUT.with(|o| {
                let mut o = o.borrow_mut();
                *o = c.terminals.iter().map(|&t| t as hipGraphNode_t).collect();
                put(deps, o.as_ptr());
                put(n, o.len());
            });
        }
    });
    hipSuccess
}

unsafe extern "C" fn hipGraphNodeGetDependencies(
    node: hipGraphNode_t,
    out: *mut hipGraphNode_t,
    n: *mut usize,
) -> hipError_t {
    with(|s| {
        let Some(deps) = s.nodes.get(&(node as usize)) else {
            return hipErrorInvalidValue;
        };
        if out.is_null() {
            put(n, deps.len());
            return hipSuccess;
        }
        // SAFETY: the caller passes `*n` writable slots (n is non-null here).
        let cap = unsafe { *n };
        for (i, &d) in deps.iter().take(cap).enumerate() {
            // SAFETY: `i < cap`, within the caller's array.
            put(unsafe { out.add(i) }, d as hipGraphNode_t);
        }
        put(n, deps.len().min(cap));
        hipSuccess
    })
}

unsafe extern "C" fn hipGraphAddEmptyNode(
    node: *mut hipGraphNode_t,
    graph: hipGraph_t,
    deps: *const hipGraphNode_t,
    n: usize,
) -> hipError_t {
    let deps: Vec<usize> = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `n` readable nodes.
        unsafe { std::slice::from_raw_parts(deps, n) }
            .iter()
            .map(|&p| p as usize)
            .collect()
    };
    with(|s| {
        if !s.captures.values().any(|c| c.graph == graph as usize) {
            return hipErrorInvalidValue;
        }
        if deps.iter().any(|d| !s.nodes.contains_key(d)) {
            return hipErrorInvalidValue;
        }
        let h = s.handle(16);
        s.nodes.insert(h, deps);
        put(node, h as hipGraphNode_t);
        hipSuccess
    })
}

unsafe extern "C" fn hipStreamUpdateCaptureDependencies(
    st: hipStream_t,
    deps: *mut hipGraphNode_t,
    n: usize,
    flags: c_uint,
) -> hipError_t {
    let deps: Vec<usize> = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `n` readable nodes.
        unsafe { std::slice::from_raw_parts(deps, n) }
            .iter()
            .map(|&p| p as usize)
            .collect()
    };
    with(|s| {
        let Some(c) = s.captures.get_mut(&(st as usize)) else {
            return hipErrorIllegalState;
        };
        match flags {
            hipStreamAddCaptureDependencies => {
                for d in deps {
                    if !c.terminals.contains(&d) {
                        c.terminals.push(d);
                    }
                }
            }
            hipStreamSetCaptureDependencies => c.terminals = deps,
            _ => return hipErrorInvalidValue,
        }
        hipSuccess
    })
}

unsafe extern "C" fn hipThreadExchangeStreamCaptureMode(
    mode: *mut hipStreamCaptureMode,
) -> hipError_t {
    // SAFETY: the caller passes a valid in/out pointer.
    let new = unsafe { *mode };
    with(|s| put(mode, std::mem::replace(&mut s.capture_mode, new)));
    hipSuccess
}
