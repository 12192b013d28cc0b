//! A fake HIP driver for unit tests: [`api`] returns a [`HipApi`] whose
//! entries are the functions below, working on thread-local state
//! ([`with`]). No hardware, no library.
#![allow(non_snake_case, non_upper_case_globals)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
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

/// Physical memory from the fake `hipMemCreate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    pub size: usize,
    /// How many mappings use it.
    pub mappings: usize,
}

/// One mapping made by the fake `hipMemMap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub size: usize,
    pub handle: usize,
    /// Device -> access flags set by `hipMemSetAccess`.
    pub access: BTreeMap<c_int, hipMemAccessFlags>,
}

/// The fake runtime's virtual-memory state: reservations of a limited
/// address space, physical allocations counted against the device's
/// memory (with `hipMalloc`), mappings and access. Misuse answers as a
/// runtime would: `hipErrorInvalidValue` for bad sizes, ranges and handles
/// (mapping twice, unmapping what is not mapped), `hipErrorIllegalState` for
/// freeing a reservation with mappings in it or releasing mapped memory,
/// `hipErrorOutOfMemory` when memory or address space is exhausted.
#[derive(Debug)]
pub struct Vmm {
    /// What `hipRuntimeGetVersion` reports; below 5.3 `hipMemCreate` and
    /// `hipMemGetAllocationGranularity` read the ROCm 5.2 layout.
    pub runtime_version: c_int,
    /// `hipDeviceAttributeVirtualMemoryManagementSupported`; `None`: the
    /// runtime predates the attribute (`hipErrorInvalidValue`).
    pub attribute: Option<c_int>,
    /// The minimum granularity (the recommended one is twice it).
    pub granularity: usize,
    /// Error the next granularity query returns.
    pub granularity_error: Option<hipError_t>,
    /// Error the next `hipMemCreate` returns instead of allocating.
    pub create_error: Option<hipError_t>,
    /// Bytes of address space that may be reserved at once.
    pub va_limit: usize,
    pub va_used: usize,
    pub next_va: usize,
    /// Start -> size.
    pub reservations: BTreeMap<usize, usize>,
    pub physicals: HashMap<usize, Physical>,
    /// Start -> mapping.
    pub mappings: BTreeMap<usize, Mapping>,
    /// Every granularity option asked for.
    pub granularity_options: Vec<hipMemAllocationGranularity_flags>,
}

impl Default for Vmm {
    fn default() -> Self {
        Self {
            runtime_version: 60_200_000,
            attribute: Some(1),
            granularity: 2 << 20,
            granularity_error: None,
            create_error: None,
            va_limit: 1 << 34,
            va_used: 0,
            next_va: 0x1000_0000_0000,
            reservations: BTreeMap::new(),
            physicals: HashMap::new(),
            mappings: BTreeMap::new(),
            granularity_options: Vec::new(),
        }
    }
}

impl Vmm {
    /// Whether nothing is reserved, created or mapped.
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.physicals.is_empty() && self.mappings.is_empty()
    }

    fn aligned(&self, v: usize) -> bool {
        v != 0 && v.is_multiple_of(self.granularity)
    }

    /// The starts of the mappings that tile `[ptr, ptr + size)` exactly, or
    /// `None` when some byte is unmapped or a mapping crosses an end.
    fn tiling(&self, ptr: usize, size: usize) -> Option<Vec<usize>> {
        let end = ptr.checked_add(size)?;
        if let Some((&s, m)) = self.mappings.range(..ptr).next_back()
            && s + m.size > ptr
        {
            return None;
        }
        let mut at = ptr;
        let mut starts = Vec::new();
        for (&s, m) in self.mappings.range(ptr..end) {
            if s != at || s + m.size > end {
                return None;
            }
            starts.push(s);
            at = s + m.size;
        }
        (at == end && !starts.is_empty()).then_some(starts)
    }
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
    /// Streams with a record left pending (`hold_events`): busy for
    /// `hipStreamQuery` until `complete_all` or a synchronization.
    pub busy: HashSet<usize>,
    pub streams: HashSet<usize>,
    pub waits: Vec<(usize, usize)>,
    pub capture_mode: hipStreamCaptureMode,
    pub captures: HashMap<usize, Capture>,
    /// Node -> its dependencies.
    pub nodes: HashMap<usize, Vec<usize>>,
    pub set_device_calls: Vec<c_int>,
    pub device_syncs: usize,
    pub vm: Vmm,
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
            busy: HashSet::new(),
            streams: HashSet::new(),
            waits: Vec::new(),
            capture_mode: hipStreamCaptureModeGlobal,
            captures: HashMap::new(),
            nodes: HashMap::new(),
            set_device_calls: Vec::new(),
            device_syncs: 0,
            vm: Vmm::default(),
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
        self.busy.clear();
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
    t.hipStreamQuery = Some(hipStreamQuery);
    t.hipStreamGetCaptureInfo_v2 = Some(hipStreamGetCaptureInfo_v2);
    t.hipGraphNodeGetDependencies = Some(hipGraphNodeGetDependencies);
    t.hipGraphAddEmptyNode = Some(hipGraphAddEmptyNode);
    t.hipStreamUpdateCaptureDependencies = Some(hipStreamUpdateCaptureDependencies);
    t.hipThreadExchangeStreamCaptureMode = Some(hipThreadExchangeStreamCaptureMode);
    t.hipRuntimeGetVersion = Some(hipRuntimeGetVersion);
    t.hipDeviceGetAttribute = Some(hipDeviceGetAttribute);
    t.hipMemGetAllocationGranularity = Some(hipMemGetAllocationGranularity);
    t.hipMemAddressReserve = Some(hipMemAddressReserve);
    t.hipMemAddressFree = Some(hipMemAddressFree);
    t.hipMemCreate = Some(hipMemCreate);
    t.hipMemRelease = Some(hipMemRelease);
    t.hipMemMap = Some(hipMemMap);
    t.hipMemUnmap = Some(hipMemUnmap);
    t.hipMemSetAccess = Some(hipMemSetAccess);
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

unsafe extern "C" fn hipStreamSynchronize(st: hipStream_t) -> hipError_t {
    with(|s| {
        s.busy.remove(&(st as usize));
        hipSuccess
    })
}

unsafe extern "C" fn hipStreamQuery(st: hipStream_t) -> hipError_t {
    with(|s| {
        let st = st as usize;
        if st != 0 && !s.streams.contains(&st) {
            hipErrorInvalidHandle
        } else if s.busy.contains(&st) {
            hipErrorNotReady
        } else {
            hipSuccess
        }
    })
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

unsafe extern "C" fn hipEventRecord(ev: hipEvent_t, st: hipStream_t) -> hipError_t {
    with(|s| {
        let hold = s.hold_events;
        match s.events.get_mut(&(ev as usize)) {
            Some(p) => {
                *p = hold;
                if hold {
                    s.busy.insert(st as usize);
                }
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

unsafe extern "C" fn hipRuntimeGetVersion(v: *mut c_int) -> hipError_t {
    with(|s| put(v, s.vm.runtime_version));
    hipSuccess
}

unsafe extern "C" fn hipDeviceGetAttribute(
    v: *mut c_int,
    attr: hipDeviceAttribute_t,
    device: c_int,
) -> hipError_t {
    with(|s| {
        if device < 0 || device >= s.device_count {
            return hipErrorInvalidDevice;
        }
        match (attr, s.vm.attribute) {
            (hipDeviceAttributeVirtualMemoryManagementSupported, Some(a)) => {
                put(v, a);
                hipSuccess
            }
            _ => {
                s.sticky = hipErrorInvalidValue;
                hipErrorInvalidValue
            }
        }
    })
}

/// Reads and checks a `hipMemAllocationProp` in the layout of the fake
/// runtime's version: pinned memory on a present device, not exportable,
/// uncompressed. Any other field value is `hipErrorInvalidValue` (a bad
/// device `hipErrorInvalidDevice`), so a table passing the wrong layout fails.
fn check_prop(s: &State, prop: *const c_void) -> Result<c_int, hipError_t> {
    assert!(!prop.is_null(), "fake HIP: null hipMemAllocationProp");
    let (ty, handle, location, flags) =
        if s.vm.runtime_version >= HIP_VERSION_ALLOCATION_PROP_REORDERED {
            // SAFETY: the caller passes a live struct; this runtime's layout is the current one.
            let p = unsafe { *prop.cast::<hipMemAllocationProp>() };
            (
                p.r#type,
                p.requestedHandleType,
                p.location,
                (
                    p.allocFlags.compressionType,
                    p.allocFlags.usage,
                    p.win32HandleMetaData,
                ),
            )
        } else {
            // SAFETY: as above, in the ROCm 5.2 layout.
            let p = unsafe { *prop.cast::<hipMemAllocationProp_rocm52>() };
            (
                p.r#type,
                p.requestedHandleType,
                p.location,
                (p.compressionType, p.usage, p.win32HandleMetaData),
            )
        };
    if ty != hipMemAllocationTypePinned
        || handle != hipMemHandleTypeNone
        || location.r#type != hipMemLocationTypeDevice
        || flags != (0, 0, std::ptr::null_mut())
    {
        return Err(hipErrorInvalidValue);
    }
    if location.id < 0 || location.id >= s.device_count {
        return Err(hipErrorInvalidDevice);
    }
    Ok(location.id)
}

unsafe extern "C" fn hipMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const c_void,
    option: hipMemAllocationGranularity_flags,
) -> hipError_t {
    with(|s| {
        s.vm.granularity_options.push(option);
        if let Some(e) = s.vm.granularity_error.take() {
            s.sticky = e;
            return e;
        }
        if let Err(e) = check_prop(s, prop) {
            return e;
        }
        match option {
            hipMemAllocationGranularityMinimum => put(g, s.vm.granularity),
            hipMemAllocationGranularityRecommended => put(g, 2 * s.vm.granularity),
            _ => return hipErrorInvalidValue,
        }
        hipSuccess
    })
}

unsafe extern "C" fn hipMemAddressReserve(
    p: *mut *mut c_void,
    size: usize,
    alignment: usize,
    _addr: *mut c_void,
    flags: c_ulonglong,
) -> hipError_t {
    with(|s| {
        let vm = &mut s.vm;
        if flags != 0 || !vm.aligned(size) || (alignment != 0 && !alignment.is_power_of_two()) {
            return hipErrorInvalidValue;
        }
        if vm.va_used + size > vm.va_limit {
            s.sticky = hipErrorOutOfMemory;
            return hipErrorOutOfMemory;
        }
        let start = vm.next_va.next_multiple_of(vm.granularity.max(alignment));
        // A guard gap, so that ranges never touch.
        vm.next_va = start + size + vm.granularity;
        vm.va_used += size;
        vm.reservations.insert(start, size);
        put(p, start as *mut c_void);
        hipSuccess
    })
}

unsafe extern "C" fn hipMemAddressFree(p: *mut c_void, size: usize) -> hipError_t {
    with(|s| {
        let vm = &mut s.vm;
        let start = p as usize;
        if vm.reservations.get(&start) != Some(&size) {
            return hipErrorInvalidValue;
        }
        if vm.mappings.range(start..start + size).next().is_some() {
            return hipErrorIllegalState;
        }
        vm.reservations.remove(&start);
        vm.va_used -= size;
        hipSuccess
    })
}

unsafe extern "C" fn hipMemCreate(
    h: *mut hipMemGenericAllocationHandle_t,
    size: usize,
    prop: *const c_void,
    flags: c_ulonglong,
) -> hipError_t {
    with(|s| {
        if let Err(e) = check_prop(s, prop) {
            return e;
        }
        if flags != 0 || !s.vm.aligned(size) {
            return hipErrorInvalidValue;
        }
        if let Some(e) = s.vm.create_error.take() {
            s.sticky = e;
            return e;
        }
        if s.used + size > s.total {
            s.sticky = hipErrorOutOfMemory;
            return hipErrorOutOfMemory;
        }
        let handle = s.handle(16);
        s.used += size;
        s.vm.physicals
            .insert(handle, Physical { size, mappings: 0 });
        put(h, handle as hipMemGenericAllocationHandle_t);
        hipSuccess
    })
}

unsafe extern "C" fn hipMemRelease(h: hipMemGenericAllocationHandle_t) -> hipError_t {
    with(|s| match s.vm.physicals.get(&(h as usize)) {
        None => hipErrorInvalidValue,
        Some(p) if p.mappings > 0 => hipErrorIllegalState,
        Some(p) => {
            s.used -= p.size;
            s.vm.physicals.remove(&(h as usize));
            hipSuccess
        }
    })
}

unsafe extern "C" fn hipMemMap(
    p: *mut c_void,
    size: usize,
    offset: usize,
    h: hipMemGenericAllocationHandle_t,
    flags: c_ulonglong,
) -> hipError_t {
    with(|s| {
        let vm = &mut s.vm;
        let (start, handle) = (p as usize, h as usize);
        if flags != 0 || offset != 0 || !vm.aligned(size) || !start.is_multiple_of(vm.granularity) {
            return hipErrorInvalidValue;
        }
        let Some(phys) = vm.physicals.get(&handle) else {
            return hipErrorInvalidValue;
        };
        if size > phys.size {
            return hipErrorInvalidValue;
        }
        let end = start + size;
        let inside = vm
            .reservations
            .range(..=start)
            .next_back()
            .is_some_and(|(&r, &rs)| end <= r + rs);
        if !inside {
            return hipErrorInvalidValue;
        }
        let overlaps = vm
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&m, mp)| m + mp.size > start);
        if overlaps {
            return hipErrorInvalidValue;
        }
        vm.mappings.insert(
            start,
            Mapping {
                size,
                handle,
                access: BTreeMap::new(),
            },
        );
        if let Some(phys) = vm.physicals.get_mut(&handle) {
            phys.mappings += 1;
        }
        hipSuccess
    })
}

unsafe extern "C" fn hipMemUnmap(p: *mut c_void, size: usize) -> hipError_t {
    with(|s| {
        let vm = &mut s.vm;
        let Some(starts) = vm.tiling(p as usize, size) else {
            return hipErrorInvalidValue;
        };
        for start in starts {
            if let Some(m) = vm.mappings.remove(&start)
                && let Some(phys) = vm.physicals.get_mut(&m.handle)
            {
                phys.mappings -= 1;
            }
        }
        hipSuccess
    })
}

unsafe extern "C" fn hipMemSetAccess(
    p: *mut c_void,
    size: usize,
    desc: *const hipMemAccessDesc,
    count: usize,
) -> hipError_t {
    if count == 0 || desc.is_null() {
        return hipErrorInvalidValue;
    }
    // SAFETY: the caller passes `count` readable descriptors.
    let descs = unsafe { std::slice::from_raw_parts(desc, count) }.to_vec();
    with(|s| {
        for d in &descs {
            if d.location.r#type != hipMemLocationTypeDevice
                || ![
                    hipMemAccessFlagsProtNone,
                    hipMemAccessFlagsProtRead,
                    hipMemAccessFlagsProtReadWrite,
                ]
                .contains(&d.flags)
            {
                return hipErrorInvalidValue;
            }
            if d.location.id < 0 || d.location.id >= s.device_count {
                return hipErrorInvalidDevice;
            }
        }
        let Some(starts) = s.vm.tiling(p as usize, size) else {
            return hipErrorInvalidValue;
        };
        for start in starts {
            let m = s.vm.mappings.get_mut(&start).expect("tiled");
            for d in &descs {
                m.access.insert(d.location.id, d.flags);
            }
        }
        hipSuccess
    })
}
