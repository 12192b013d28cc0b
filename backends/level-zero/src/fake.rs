//! A fake Level Zero driver for unit tests: [`api`] returns a [`ZeApi`]
//! whose entries are the functions below, working on thread-local state
//! ([`with`]). Every call is logged so tests can check call order.
#![allow(non_snake_case)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::c_void;
use std::sync::Arc;

use cachalot_level_zero_sys::*;

/// State of a fake event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// Not signaled, nothing pending.
    Reset,
    /// A barrier will signal it once `complete_all` runs.
    Pending,
    /// Signaled.
    Signaled,
}

/// Physical memory from the fake `zePhysicalMemCreate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    pub size: usize,
    /// How many mappings use it.
    pub mappings: usize,
}

/// One mapping made by the fake `zeVirtualMemMap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub size: usize,
    pub handle: usize,
    /// The access attribute, from the map or the last `zeVirtualMemSetAccessAttribute`.
    pub access: ze_memory_access_attribute_t,
}

/// The fake driver's virtual-memory state: reservations of a limited address
/// space, physical memory counted against the device's memory (with
/// `zeMemAllocDevice`), mappings and their access. Misuse answers as a driver
/// would: `ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT` for sizes and addresses
/// off the page size, `ZE_RESULT_ERROR_INVALID_ARGUMENT` for bad ranges
/// (mapping twice, unmapping what is not mapped),
/// `ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE` for freeing a reservation with
/// mappings in it or destroying mapped memory, and
/// `ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY` when memory or address space runs out.
#[derive(Debug)]
pub struct Vmm {
    /// The page size of allocations of 2 MiB and more, which every size and
    /// address must be a multiple of (smaller ones are told 64 KiB).
    pub page: usize,
    /// Error the next page-size query returns.
    pub query_error: Option<ze_result_t>,
    /// Sizes the page size was asked for.
    pub queries: Vec<usize>,
    /// Error the next `zePhysicalMemCreate` returns instead of allocating.
    pub create_error: Option<ze_result_t>,
    /// Bytes of address space that may be reserved at once.
    pub va_limit: usize,
    pub va_used: usize,
    pub next_va: usize,
    /// Start -> size.
    pub reservations: BTreeMap<usize, usize>,
    pub physicals: HashMap<usize, Physical>,
    /// Start -> mapping.
    pub mappings: BTreeMap<usize, Mapping>,
}

impl Default for Vmm {
    fn default() -> Self {
        Self {
            page: 2 << 20,
            query_error: None,
            queries: Vec::new(),
            create_error: None,
            va_limit: 1 << 34,
            va_used: 0,
            next_va: 0xff00_0000_0000,
            reservations: BTreeMap::new(),
            physicals: HashMap::new(),
            mappings: BTreeMap::new(),
        }
    }
}

impl Vmm {
    /// Whether nothing is reserved, created or mapped.
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.physicals.is_empty() && self.mappings.is_empty()
    }

    fn aligned(&self, v: usize) -> bool {
        v.is_multiple_of(self.page)
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

/// The fake driver's state.
#[derive(Debug)]
pub struct State {
    pub init_result: ze_result_t,
    pub gpus: u32,
    pub total: u64,
    pub used: u64,
    pub alloc_error: Option<ze_result_t>,
    pub next: usize,
    pub calls: Vec<&'static str>,
    pub contexts: HashSet<usize>,
    pub lists: HashSet<usize>,
    pub pools: HashMap<usize, u32>,
    pub events: HashMap<usize, Ev>,
    pub allocs: HashMap<usize, usize>,
    /// Barriers leave their event pending until `complete_all`.
    pub hold: bool,
    pub waits: Vec<(usize, usize)>,
    pub vm: Vmm,
}

impl Default for State {
    fn default() -> Self {
        Self {
            init_result: ZE_RESULT_SUCCESS,
            gpus: 1,
            total: 1 << 30,
            used: 0,
            alloc_error: None,
            next: 0x1000,
            calls: Vec::new(),
            contexts: HashSet::new(),
            lists: HashSet::new(),
            pools: HashMap::new(),
            events: HashMap::new(),
            allocs: HashMap::new(),
            hold: false,
            waits: Vec::new(),
            vm: Vmm::default(),
        }
    }
}

impl State {
    fn handle(&mut self) -> usize {
        self.next += 0x10;
        self.next
    }

    /// Signals every pending event.
    pub fn complete_all(&mut self) {
        for e in self.events.values_mut() {
            if *e == Ev::Pending {
                *e = Ev::Signaled;
            }
        }
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `f` on this thread's fake state.
pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

fn call<R>(name: &'static str, f: impl FnOnce(&mut State) -> R) -> R {
    with(|s| {
        s.calls.push(name);
        f(s)
    })
}

fn put<T>(p: *mut T, v: T) {
    assert!(!p.is_null(), "fake Level Zero: null out-pointer");
    // SAFETY: the backend passes valid, aligned out-pointers (checked non-null).
    unsafe { p.write(v) }
}

/// Resets this thread's fake driver and returns a table of fakes.
pub fn api() -> Arc<ZeApi> {
    with(|s| *s = State::default());
    let mut t = ZeApi::stub();
    t.zeInit = zeInit;
    t.zeDriverGet = zeDriverGet;
    t.zeDeviceGet = zeDeviceGet;
    t.zeDeviceGetCommandQueueGroupProperties = zeDeviceGetCommandQueueGroupProperties;
    t.zeDeviceGetMemoryProperties = zeDeviceGetMemoryProperties;
    t.zeContextCreate = zeContextCreate;
    t.zeContextDestroy = zeContextDestroy;
    t.zeCommandListCreateImmediate = zeCommandListCreateImmediate;
    t.zeCommandListDestroy = zeCommandListDestroy;
    t.zeCommandListAppendBarrier = zeCommandListAppendBarrier;
    t.zeCommandListAppendWaitOnEvents = zeCommandListAppendWaitOnEvents;
    t.zeEventPoolCreate = zeEventPoolCreate;
    t.zeEventPoolDestroy = zeEventPoolDestroy;
    t.zeEventCreate = zeEventCreate;
    t.zeEventDestroy = zeEventDestroy;
    t.zeEventHostSynchronize = zeEventHostSynchronize;
    t.zeEventQueryStatus = zeEventQueryStatus;
    t.zeEventHostReset = zeEventHostReset;
    t.zeMemAllocDevice = zeMemAllocDevice;
    t.zeMemFree = zeMemFree;
    t.zeVirtualMemReserve = Some(zeVirtualMemReserve);
    t.zeVirtualMemFree = Some(zeVirtualMemFree);
    t.zeVirtualMemQueryPageSize = Some(zeVirtualMemQueryPageSize);
    t.zePhysicalMemCreate = Some(zePhysicalMemCreate);
    t.zePhysicalMemDestroy = Some(zePhysicalMemDestroy);
    t.zeVirtualMemMap = Some(zeVirtualMemMap);
    t.zeVirtualMemUnmap = Some(zeVirtualMemUnmap);
    t.zeVirtualMemSetAccessAttribute = Some(zeVirtualMemSetAccessAttribute);
    Arc::new(t)
}

unsafe extern "C" fn zeInit(_flags: ze_init_flags_t) -> ze_result_t {
    call("zeInit", |s| s.init_result)
}

unsafe extern "C" fn zeDriverGet(n: *mut u32, out: *mut ze_driver_handle_t) -> ze_result_t {
    call("zeDriverGet", |_| {
        if !out.is_null() {
            put(out, 0xd0 as ze_driver_handle_t);
        }
        put(n, 1);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeDeviceGet(
    _d: ze_driver_handle_t,
    n: *mut u32,
    out: *mut ze_device_handle_t,
) -> ze_result_t {
    call("zeDeviceGet", |s| {
        if !out.is_null() {
            // SAFETY: the caller passes `*n` slots.
            let cap = unsafe { *n }.min(s.gpus);
            for i in 0..cap {
                // SAFETY: `i < cap`, within the caller's array.
                put(
                    unsafe { out.add(i as usize) },
                    (0xde0 + 0x10 * i as usize) as ze_device_handle_t,
                );
            }
            put(n, cap);
        } else {
            put(n, s.gpus);
        }
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeDeviceGetCommandQueueGroupProperties(
    _d: ze_device_handle_t,
    n: *mut u32,
    out: *mut ze_command_queue_group_properties_t,
) -> ze_result_t {
    call("zeDeviceGetCommandQueueGroupProperties", |_| {
        if out.is_null() {
            put(n, 2);
        } else {
            // Group 0 copies only; group 1 computes.
            // SAFETY: the caller passes 2 initialized structs.
            unsafe {
                (*out).flags = 0;
                (*out.add(1)).flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE;
            }
        }
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeDeviceGetMemoryProperties(
    _d: ze_device_handle_t,
    n: *mut u32,
    out: *mut ze_device_memory_properties_t,
) -> ze_result_t {
    call("zeDeviceGetMemoryProperties", |s| {
        if out.is_null() {
            put(n, 1);
        } else {
            // SAFETY: the caller passes 1 initialized struct.
            unsafe { (*out).totalSize = s.total };
        }
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeContextCreate(
    _d: ze_driver_handle_t,
    desc: *const ze_context_desc_t,
    out: *mut ze_context_handle_t,
) -> ze_result_t {
    // SAFETY: the caller passes a valid descriptor.
    let stype = unsafe { (*desc).stype };
    assert_eq!(stype, ZE_STRUCTURE_TYPE_CONTEXT_DESC);
    call("zeContextCreate", |s| {
        let h = s.handle();
        s.contexts.insert(h);
        put(out, h as ze_context_handle_t);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeContextDestroy(c: ze_context_handle_t) -> ze_result_t {
    call("zeContextDestroy", |s| {
        assert!(
            s.lists.is_empty() && s.pools.is_empty() && s.vm.physicals.is_empty(),
            "context destroyed before its objects"
        );
        s.contexts.remove(&(c as usize));
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeCommandListCreateImmediate(
    _c: ze_context_handle_t,
    _d: ze_device_handle_t,
    desc: *const ze_command_queue_desc_t,
    out: *mut ze_command_list_handle_t,
) -> ze_result_t {
    // SAFETY: the caller passes a valid descriptor.
    let desc = unsafe { *desc };
    assert_eq!(
        (desc.stype, desc.ordinal),
        (ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, 1),
        "compute group"
    );
    call("zeCommandListCreateImmediate", |s| {
        let h = s.handle();
        s.lists.insert(h);
        put(out, h as ze_command_list_handle_t);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeCommandListDestroy(l: ze_command_list_handle_t) -> ze_result_t {
    call("zeCommandListDestroy", |s| {
        s.lists.remove(&(l as usize));
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeCommandListAppendBarrier(
    l: ze_command_list_handle_t,
    ev: ze_event_handle_t,
    n: u32,
    _w: *mut ze_event_handle_t,
) -> ze_result_t {
    call("zeCommandListAppendBarrier", |s| {
        assert!(s.lists.contains(&(l as usize)) && n == 0);
        let hold = s.hold;
        match s.events.get_mut(&(ev as usize)) {
            Some(e) => {
                *e = if hold { Ev::Pending } else { Ev::Signaled };
                ZE_RESULT_SUCCESS
            }
            None => ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
        }
    })
}

unsafe extern "C" fn zeCommandListAppendWaitOnEvents(
    l: ze_command_list_handle_t,
    n: u32,
    evs: *mut ze_event_handle_t,
) -> ze_result_t {
    assert_eq!(n, 1);
    // SAFETY: the caller passes one handle.
    let ev = unsafe { *evs } as usize;
    call("zeCommandListAppendWaitOnEvents", |s| {
        s.waits.push((l as usize, ev));
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeEventPoolCreate(
    _c: ze_context_handle_t,
    desc: *const ze_event_pool_desc_t,
    nd: u32,
    _d: *mut ze_device_handle_t,
    out: *mut ze_event_pool_handle_t,
) -> ze_result_t {
    // SAFETY: the caller passes a valid descriptor.
    let desc = unsafe { *desc };
    assert_eq!((desc.flags, nd), (ZE_EVENT_POOL_FLAG_HOST_VISIBLE, 1));
    call("zeEventPoolCreate", |s| {
        let h = s.handle();
        s.pools.insert(h, desc.count);
        put(out, h as ze_event_pool_handle_t);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeEventPoolDestroy(p: ze_event_pool_handle_t) -> ze_result_t {
    call("zeEventPoolDestroy", |s| {
        assert!(s.events.is_empty(), "pool destroyed before its events");
        s.pools.remove(&(p as usize));
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeEventCreate(
    p: ze_event_pool_handle_t,
    desc: *const ze_event_desc_t,
    out: *mut ze_event_handle_t,
) -> ze_result_t {
    // SAFETY: the caller passes a valid descriptor.
    let desc = unsafe { *desc };
    call("zeEventCreate", |s| {
        let count = s.pools[&(p as usize)];
        assert!(desc.index < count);
        let h = s.handle();
        s.events.insert(h, Ev::Reset);
        put(out, h as ze_event_handle_t);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeEventDestroy(e: ze_event_handle_t) -> ze_result_t {
    call("zeEventDestroy", |s| match s.events.remove(&(e as usize)) {
        Some(_) => ZE_RESULT_SUCCESS,
        None => ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
    })
}

unsafe extern "C" fn zeEventHostSynchronize(e: ze_event_handle_t, _t: u64) -> ze_result_t {
    call("zeEventHostSynchronize", |s| {
        match s.events.get_mut(&(e as usize)) {
            Some(Ev::Reset) => ZE_RESULT_NOT_READY,
            Some(ev) => {
                *ev = Ev::Signaled;
                ZE_RESULT_SUCCESS
            }
            None => ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
        }
    })
}

unsafe extern "C" fn zeEventQueryStatus(e: ze_event_handle_t) -> ze_result_t {
    call("zeEventQueryStatus", |s| {
        match s.events.get(&(e as usize)) {
            Some(Ev::Signaled) => ZE_RESULT_SUCCESS,
            Some(_) => ZE_RESULT_NOT_READY,
            None => ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
        }
    })
}

unsafe extern "C" fn zeEventHostReset(e: ze_event_handle_t) -> ze_result_t {
    call("zeEventHostReset", |s| {
        match s.events.get_mut(&(e as usize)) {
            Some(ev) => {
                assert_ne!(*ev, Ev::Pending, "host reset of a pending event");
                *ev = Ev::Reset;
                ZE_RESULT_SUCCESS
            }
            None => ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
        }
    })
}

unsafe extern "C" fn zeMemAllocDevice(
    _c: ze_context_handle_t,
    desc: *const ze_device_mem_alloc_desc_t,
    size: usize,
    _align: usize,
    _d: ze_device_handle_t,
    out: *mut *mut c_void,
) -> ze_result_t {
    // SAFETY: the caller passes a valid descriptor.
    let stype = unsafe { (*desc).stype };
    assert_eq!(stype, ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC);
    call("zeMemAllocDevice", |s| {
        if let Some(e) = s.alloc_error.take() {
            return e;
        }
        if s.used + size as u64 > s.total {
            return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
        }
        let h = (s.next + 0x20_0000).next_multiple_of(0x20_0000);
        s.next = h + size;
        s.used += size as u64;
        s.allocs.insert(h, size);
        put(out, h as *mut c_void);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeMemFree(_c: ze_context_handle_t, p: *mut c_void) -> ze_result_t {
    call("zeMemFree", |s| match s.allocs.remove(&(p as usize)) {
        Some(size) => {
            s.used -= size as u64;
            ZE_RESULT_SUCCESS
        }
        None => ZE_RESULT_ERROR_INVALID_ARGUMENT,
    })
}

/// Checks the context handle of a virtual-memory call.
fn known_context(s: &State, c: ze_context_handle_t) -> Result<(), ze_result_t> {
    if s.contexts.contains(&(c as usize)) {
        Ok(())
    } else {
        Err(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)
    }
}

unsafe extern "C" fn zeVirtualMemQueryPageSize(
    c: ze_context_handle_t,
    _d: ze_device_handle_t,
    size: usize,
    out: *mut usize,
) -> ze_result_t {
    call("zeVirtualMemQueryPageSize", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        s.vm.queries.push(size);
        if let Some(e) = s.vm.query_error.take() {
            return e;
        }
        if size == 0 {
            return ZE_RESULT_ERROR_INVALID_SIZE;
        }
        put(out, if size >= 2 << 20 { s.vm.page } else { 64 << 10 });
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeVirtualMemReserve(
    c: ze_context_handle_t,
    _start: *const c_void,
    size: usize,
    out: *mut *mut c_void,
) -> ze_result_t {
    call("zeVirtualMemReserve", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        let vm = &mut s.vm;
        if size == 0 {
            return ZE_RESULT_ERROR_INVALID_SIZE;
        }
        if !vm.aligned(size) {
            return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
        }
        if vm.va_used + size > vm.va_limit {
            return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
        }
        let start = vm.next_va.next_multiple_of(vm.page);
        // A guard gap, so that ranges never touch.
        vm.next_va = start + size + vm.page;
        vm.va_used += size;
        vm.reservations.insert(start, size);
        put(out, start as *mut c_void);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeVirtualMemFree(
    c: ze_context_handle_t,
    p: *const c_void,
    size: usize,
) -> ze_result_t {
    call("zeVirtualMemFree", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        let vm = &mut s.vm;
        let start = p as usize;
        if vm.reservations.get(&start) != Some(&size) {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        }
        if vm.mappings.range(start..start + size).next().is_some() {
            return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
        }
        vm.reservations.remove(&start);
        vm.va_used -= size;
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zePhysicalMemCreate(
    c: ze_context_handle_t,
    _d: ze_device_handle_t,
    desc: *mut ze_physical_mem_desc_t,
    out: *mut ze_physical_mem_handle_t,
) -> ze_result_t {
    // SAFETY: the caller passes a valid descriptor.
    let desc = unsafe { *desc };
    assert_eq!(desc.stype, ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC);
    call("zePhysicalMemCreate", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        if desc.flags != 0 || !desc.pNext.is_null() {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        }
        if desc.size == 0 {
            return ZE_RESULT_ERROR_INVALID_SIZE;
        }
        if !s.vm.aligned(desc.size) {
            return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
        }
        if let Some(e) = s.vm.create_error.take() {
            return e;
        }
        if s.used + desc.size as u64 > s.total {
            return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
        }
        let h = s.handle();
        s.used += desc.size as u64;
        s.vm.physicals.insert(
            h,
            Physical {
                size: desc.size,
                mappings: 0,
            },
        );
        put(out, h as ze_physical_mem_handle_t);
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zePhysicalMemDestroy(
    c: ze_context_handle_t,
    h: ze_physical_mem_handle_t,
) -> ze_result_t {
    call("zePhysicalMemDestroy", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        match s.vm.physicals.get(&(h as usize)) {
            None => ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
            Some(p) if p.mappings > 0 => ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE,
            Some(p) => {
                s.used -= p.size as u64;
                s.vm.physicals.remove(&(h as usize));
                ZE_RESULT_SUCCESS
            }
        }
    })
}

unsafe extern "C" fn zeVirtualMemMap(
    c: ze_context_handle_t,
    p: *const c_void,
    size: usize,
    h: ze_physical_mem_handle_t,
    offset: usize,
    access: ze_memory_access_attribute_t,
) -> ze_result_t {
    call("zeVirtualMemMap", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        let vm = &mut s.vm;
        let (start, handle) = (p as usize, h as usize);
        if access > ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY || offset != 0 {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        }
        if size == 0 {
            return ZE_RESULT_ERROR_INVALID_SIZE;
        }
        if !vm.aligned(size) || !vm.aligned(start) {
            return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
        }
        let Some(phys) = vm.physicals.get(&handle) else {
            return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
        };
        if size > phys.size {
            return ZE_RESULT_ERROR_INVALID_SIZE;
        }
        let end = start + size;
        let inside = vm
            .reservations
            .range(..=start)
            .next_back()
            .is_some_and(|(&r, &rs)| end <= r + rs);
        let overlaps = vm
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&m, mp)| m + mp.size > start);
        if !inside || overlaps {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        }
        vm.mappings.insert(
            start,
            Mapping {
                size,
                handle,
                access,
            },
        );
        if let Some(phys) = vm.physicals.get_mut(&handle) {
            phys.mappings += 1;
        }
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeVirtualMemUnmap(
    c: ze_context_handle_t,
    p: *const c_void,
    size: usize,
) -> ze_result_t {
    call("zeVirtualMemUnmap", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        let vm = &mut s.vm;
        let Some(starts) = vm.tiling(p as usize, size) else {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        };
        for start in starts {
            if let Some(m) = vm.mappings.remove(&start)
                && let Some(phys) = vm.physicals.get_mut(&m.handle)
            {
                phys.mappings -= 1;
            }
        }
        ZE_RESULT_SUCCESS
    })
}

unsafe extern "C" fn zeVirtualMemSetAccessAttribute(
    c: ze_context_handle_t,
    p: *const c_void,
    size: usize,
    access: ze_memory_access_attribute_t,
) -> ze_result_t {
    call("zeVirtualMemSetAccessAttribute", |s| {
        if let Err(e) = known_context(s, c) {
            return e;
        }
        if access > ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        }
        let Some(starts) = s.vm.tiling(p as usize, size) else {
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        };
        for start in starts {
            s.vm.mappings.get_mut(&start).expect("tiled").access = access;
        }
        ZE_RESULT_SUCCESS
    })
}
