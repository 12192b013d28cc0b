//! # cachalot-hip-sys
//!
//! Hand-written FFI for the part of the HIP runtime that cachalot uses, loaded
//! at run time with `libloading` into a table of function pointers
//! ([`HipApi`]). Nothing links against `libamdhip64` at build time: a missing
//! library is the typed error [`LoadError`], never a link failure.
//!
//! The library is looked up under the names in [`LIBRARY_NAMES`] (newest ROCm
//! first), or under the single name in the environment variable
//! [`LIBRARY_ENV`] when it is set.
//!
//! Every field of [`HipApi`] is public so that tests can substitute fake
//! functions: start from [`HipApi::stub`] (every entry fails with
//! [`hipErrorNotSupported`], optional entries absent) and overwrite the entries
//! a test needs. This crate has no logic beyond loading; the Result-returning
//! calls and the safe RAII types live in `cachalot-hip`.
//!
//! Names follow the vendor headers (`hip/hip_runtime_api.h`), so the
//! `tests/layout.rs` test can compare them with the headers directly.
//!
//! The optional entries (`Option` fields) are those older runtimes may lack:
//! the graph-capture calls, `hipRuntimeGetVersion`, `hipDeviceGetAttribute`
//! and the eight virtual-memory calls ([`HipApi::has_virtual_memory`]).
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::fmt;
use std::sync::Arc;

/// `hipError_t`: a C enum, `int`-sized.
pub type hipError_t = c_int;
/// `hipStream_t`: an opaque stream handle (null is the legacy default stream).
pub type hipStream_t = *mut c_void;
/// `hipEvent_t`: an opaque event handle.
pub type hipEvent_t = *mut c_void;
/// `hipGraph_t`: an opaque graph handle.
pub type hipGraph_t = *mut c_void;
/// `hipGraphNode_t`: an opaque graph node handle.
pub type hipGraphNode_t = *mut c_void;
/// `hipStreamCaptureStatus`: a C enum, `int`-sized.
pub type hipStreamCaptureStatus = c_int;

/// Successful completion.
pub const hipSuccess: hipError_t = 0;
/// One or more of the parameters passed to the API call is invalid.
pub const hipErrorInvalidValue: hipError_t = 1;
/// The device has no room for the allocation (alias `hipErrorMemoryAllocation`).
pub const hipErrorOutOfMemory: hipError_t = 2;
/// The runtime is not initialized (alias `hipErrorInitializationError`).
pub const hipErrorNotInitialized: hipError_t = 3;
/// The runtime has been deinitialized.
pub const hipErrorDeinitialized: hipError_t = 4;
/// The installed driver is older than the runtime.
pub const hipErrorInsufficientDriver: hipError_t = 35;
/// No HIP-capable device is present.
pub const hipErrorNoDevice: hipError_t = 100;
/// The device ordinal is out of range.
pub const hipErrorInvalidDevice: hipError_t = 101;
/// An invalid stream or event handle (alias `hipErrorInvalidResourceHandle`).
pub const hipErrorInvalidHandle: hipError_t = 400;
/// The resource is not in a valid state for the operation.
pub const hipErrorIllegalState: hipError_t = 401;
/// Asynchronous work has not completed yet (an event query).
pub const hipErrorNotReady: hipError_t = 600;
/// The API is not supported or implemented.
pub const hipErrorNotSupported: hipError_t = 801;
/// The operation is not permitted while the stream is capturing.
pub const hipErrorStreamCaptureUnsupported: hipError_t = 900;
/// The capture sequence was invalidated by an earlier error.
pub const hipErrorStreamCaptureInvalidated: hipError_t = 901;
/// An unknown error.
pub const hipErrorUnknown: hipError_t = 999;

/// `hipStreamCaptureMode`: a C enum, `int`-sized.
pub type hipStreamCaptureMode = c_int;
/// `hipStreamCaptureModeGlobal`: unsafe calls are prohibited in every thread.
pub const hipStreamCaptureModeGlobal: hipStreamCaptureMode = 0;
/// `hipStreamCaptureModeThreadLocal`: unsafe calls are prohibited in this thread.
pub const hipStreamCaptureModeThreadLocal: hipStreamCaptureMode = 1;
/// `hipStreamCaptureModeRelaxed`: unsafe calls (e.g. `hipMalloc`) are allowed.
pub const hipStreamCaptureModeRelaxed: hipStreamCaptureMode = 2;

/// `hipStreamCaptureStatusNone`: the stream is not capturing.
pub const hipStreamCaptureStatusNone: hipStreamCaptureStatus = 0;
/// `hipStreamCaptureStatusActive`: the stream is capturing.
pub const hipStreamCaptureStatusActive: hipStreamCaptureStatus = 1;
/// `hipStreamCaptureStatusInvalidated`: the capture was invalidated.
pub const hipStreamCaptureStatusInvalidated: hipStreamCaptureStatus = 2;

/// `hipStreamAddCaptureDependencies`: add nodes to the dependency set.
pub const hipStreamAddCaptureDependencies: c_uint = 0;
/// `hipStreamSetCaptureDependencies`: replace the dependency set.
pub const hipStreamSetCaptureDependencies: c_uint = 1;

/// `hipStreamDefault` stream creation flag.
pub const hipStreamDefault: c_uint = 0x00;
/// `hipStreamNonBlocking`: no implicit synchronization with the null stream.
pub const hipStreamNonBlocking: c_uint = 0x01;
/// `hipEventDefault` event creation flag.
pub const hipEventDefault: c_uint = 0x0;
/// `hipEventDisableTiming`: the event records no timestamp (cheaper).
pub const hipEventDisableTiming: c_uint = 0x2;

/// `hipDeviceAttribute_t`: a C enum, `int`-sized.
pub type hipDeviceAttribute_t = c_int;
/// `hipDeviceAttributeMemoryPoolsSupported`: the device supports stream-ordered
/// memory pools (the last CUDA-compatible attribute of ROCm 5.2).
pub const hipDeviceAttributeMemoryPoolsSupported: hipDeviceAttribute_t = 88;
/// `hipDeviceAttributeVirtualMemoryManagementSupported`: the device supports
/// the virtual-memory calls (`hipMemAddressReserve` and the rest). Runtimes
/// that predate the attribute (ROCm 5.2 among them) reject it with
/// [`hipErrorInvalidValue`].
pub const hipDeviceAttributeVirtualMemoryManagementSupported: hipDeviceAttribute_t = 89;

/// `hipMemGenericAllocationHandle_t`: an opaque handle to physical memory
/// created by `hipMemCreate`.
pub type hipMemGenericAllocationHandle_t = *mut c_void;
/// `hipMemLocationType`: a C enum, `int`-sized.
pub type hipMemLocationType = c_int;
/// `hipMemLocationTypeInvalid`.
pub const hipMemLocationTypeInvalid: hipMemLocationType = 0;
/// `hipMemLocationTypeDevice`: the location's id is a HIP device ordinal.
pub const hipMemLocationTypeDevice: hipMemLocationType = 1;
/// `hipMemAccessFlags`: a C enum, `int`-sized.
pub type hipMemAccessFlags = c_int;
/// `hipMemAccessFlagsProtNone`: the range is not accessible.
pub const hipMemAccessFlagsProtNone: hipMemAccessFlags = 0;
/// `hipMemAccessFlagsProtRead`: the range is readable.
pub const hipMemAccessFlagsProtRead: hipMemAccessFlags = 1;
/// `hipMemAccessFlagsProtReadWrite`: the range is readable and writable.
pub const hipMemAccessFlagsProtReadWrite: hipMemAccessFlags = 3;
/// `hipMemAllocationType`: a C enum, `int`-sized.
pub type hipMemAllocationType = c_int;
/// `hipMemAllocationTypeInvalid`.
pub const hipMemAllocationTypeInvalid: hipMemAllocationType = 0;
/// `hipMemAllocationTypePinned`: memory that does not migrate (the only type).
pub const hipMemAllocationTypePinned: hipMemAllocationType = 1;
/// `hipMemAllocationHandleType`: a C enum, `int`-sized.
pub type hipMemAllocationHandleType = c_int;
/// `hipMemHandleTypeNone`: the allocation cannot be exported.
pub const hipMemHandleTypeNone: hipMemAllocationHandleType = 0;
/// `hipMemAllocationGranularity_flags`: a C enum, `int`-sized.
pub type hipMemAllocationGranularity_flags = c_int;
/// `hipMemAllocationGranularityMinimum`: the granularity sizes and addresses must have.
pub const hipMemAllocationGranularityMinimum: hipMemAllocationGranularity_flags = 0;
/// `hipMemAllocationGranularityRecommended`: the granularity best for performance.
pub const hipMemAllocationGranularityRecommended: hipMemAllocationGranularity_flags = 1;

/// `hipMemLocation`: where memory resides or who accesses it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct hipMemLocation {
    /// What `id` names ([`hipMemLocationTypeDevice`]).
    pub r#type: hipMemLocationType,
    /// The device ordinal.
    pub id: c_int,
}

/// `hipMemAccessDesc`: one entry of `hipMemSetAccess`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct hipMemAccessDesc {
    /// The accessing device.
    pub location: hipMemLocation,
    /// The access it gets ([`hipMemAccessFlagsProtReadWrite`]).
    pub flags: hipMemAccessFlags,
}

/// The `allocFlags` member of [`hipMemAllocationProp`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct hipMemAllocationPropFlags {
    /// Compression type (0: none).
    pub compressionType: u8,
    /// Whether the memory may be used for GPUDirect RDMA.
    pub gpuDirectRDMACapable: u8,
    /// Usage flags.
    pub usage: u16,
}

/// `hipMemAllocationProp` as ROCm 5.3 and later declare it (the layout of
/// CUDA's `CUmemAllocationProp` without its trailing reserved bytes).
///
/// ROCm 5.2 and earlier declare the same fields in another order: that is
/// [`hipMemAllocationProp_rocm52`]. Both are 32 bytes, so a runtime of one
/// kind misreads the other's silently; pick by the runtime's version
/// (`hipRuntimeGetVersion`) against [`HIP_VERSION_ALLOCATION_PROP_REORDERED`].
/// `tests/layout.rs` checks whichever layout the installed header has.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct hipMemAllocationProp {
    /// Allocation type ([`hipMemAllocationTypePinned`]).
    pub r#type: hipMemAllocationType,
    /// Handle type the allocation may be exported as ([`hipMemHandleTypeNone`]).
    pub requestedHandleType: hipMemAllocationHandleType,
    /// Where the memory resides.
    pub location: hipMemLocation,
    /// Windows security attributes for exported handles (null).
    pub win32HandleMetaData: *mut c_void,
    /// Compression, RDMA and usage flags (all zero).
    pub allocFlags: hipMemAllocationPropFlags,
}

/// `hipMemAllocationProp` as ROCm 5.2 and earlier declare it (the Debian 12
/// `libamdhip64-dev` header): the fields of [`hipMemAllocationProp`] in
/// another order, with `compressionType` and `usage` at top level.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct hipMemAllocationProp_rocm52 {
    /// Compression type (0: none).
    pub compressionType: u8,
    /// Where the memory resides.
    pub location: hipMemLocation,
    /// Handle type the allocation may be exported as ([`hipMemHandleTypeNone`]).
    pub requestedHandleType: hipMemAllocationHandleType,
    /// Allocation type ([`hipMemAllocationTypePinned`]).
    pub r#type: hipMemAllocationType,
    /// Usage flags.
    pub usage: u16,
    /// Windows security attributes for exported handles (null).
    pub win32HandleMetaData: *mut c_void,
}

/// The first `hipRuntimeGetVersion` value (`HIP_VERSION` of ROCm 5.3) whose
/// runtime takes [`hipMemAllocationProp`]; older runtimes take
/// [`hipMemAllocationProp_rocm52`].
pub const HIP_VERSION_ALLOCATION_PROP_REORDERED: c_int = 50_300_000;

/// Names of the HIP runtime library, tried in order.
#[cfg(not(windows))]
pub const LIBRARY_NAMES: &[&str] = &[
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];
/// Names of the HIP runtime library, tried in order.
#[cfg(windows)]
pub const LIBRARY_NAMES: &[&str] = &["amdhip64_7.dll", "amdhip64_6.dll", "amdhip64.dll"];

/// Environment variable naming the HIP runtime library to load instead of
/// [`LIBRARY_NAMES`] (a file name or a path).
pub const LIBRARY_ENV: &str = "CACHALOT_HIP_LIBRARY";

/// Why the HIP runtime could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// None of the candidate names could be opened; each with the loader's message.
    LibraryNotFound {
        /// `(name, why)` for each name tried.
        tried: Vec<(String, String)>,
    },
    /// The library opened but lacks a symbol cachalot requires.
    MissingSymbol {
        /// The library that was opened.
        library: String,
        /// The missing symbol.
        symbol: &'static str,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::LibraryNotFound { tried } => {
                write!(f, "HIP runtime library not found (tried")?;
                for (i, (name, why)) in tried.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    write!(f, "{sep}{name}: {why}")?;
                }
                write!(f, ")")
            }
            LoadError::MissingSymbol { library, symbol } => {
                write!(f, "HIP runtime library {library} lacks symbol {symbol}")
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// Value a stub entry returns; private helper of [`HipApi::stub`].
trait StubReturn {
    fn stub() -> Self;
}

impl StubReturn for hipError_t {
    fn stub() -> Self {
        hipErrorNotSupported
    }
}

impl StubReturn for *const c_char {
    fn stub() -> Self {
        std::ptr::null()
    }
}

macro_rules! hip_api {
    (
        required { $( $(#[$rm:meta])* fn $rname:ident ( $($rarg:ident : $rty:ty),* ) -> $rret:ty; )* }
        optional { $( $(#[$om:meta])* fn $oname:ident ( $($oarg:ident : $oty:ty),* ) -> $oret:ty; )* }
    ) => {
        /// The table of HIP runtime entry points cachalot uses.
        ///
        /// Required entries are plain function pointers; the graph-capture,
        /// version, attribute and virtual-memory entries are `Option`s because
        /// older runtimes may lack them. Fields are public so tests can
        /// substitute fakes (see [`HipApi::stub`]).
        pub struct HipApi {
            /// The library the entries were resolved from (`None` for a stub
            /// or faked table). Keeps the entries valid while the table lives.
            library: Option<(String, libloading::Library)>,
            $( $(#[$rm])* pub $rname: unsafe extern "C" fn($($rty),*) -> $rret, )*
            $( $(#[$om])* pub $oname: Option<unsafe extern "C" fn($($oty),*) -> $oret>, )*
        }

        impl HipApi {
            /// A table with no library behind it: every required entry returns
            /// [`hipErrorNotSupported`] (`hipGetErrorName` returns null) and
            /// every optional (capture, version, attribute, virtual-memory)
            /// entry is `None`. Tests overwrite the
            /// entries they need with fake functions.
            pub fn stub() -> Self {
                Self {
                    library: None,
                    $( $rname: {
                        unsafe extern "C" fn stub($(_: $rty),*) -> $rret { StubReturn::stub() }
                        stub
                    }, )*
                    $( $oname: None, )*
                }
            }

            fn from_library(name: String, lib: libloading::Library) -> Result<Self, LoadError> {
                $(
                    // SAFETY: the symbol is declared in hip_runtime_api.h with
                    // exactly this C signature (checked by tests/layout.rs),
                    // and the library stays loaded as long as the table.
                    let $rname = unsafe {
                        lib.get::<unsafe extern "C" fn($($rty),*) -> $rret>(
                            concat!(stringify!($rname), "\0").as_bytes(),
                        )
                    }
                    .map(|s| *s)
                    .map_err(|_| LoadError::MissingSymbol {
                        library: name.clone(),
                        symbol: stringify!($rname),
                    })?;
                )*
                $(
                    // SAFETY: as above; a missing optional symbol is `None`.
                    let $oname = unsafe {
                        lib.get::<unsafe extern "C" fn($($oty),*) -> $oret>(
                            concat!(stringify!($oname), "\0").as_bytes(),
                        )
                    }
                    .ok()
                    .map(|s| *s);
                )*
                Ok(Self { library: Some((name, lib)), $($rname,)* $($oname,)* })
            }
        }
    };
}

hip_api! {
    required {
        /// `hipError_t hipInit(unsigned int flags)`
        fn hipInit(flags: c_uint) -> hipError_t;
        /// `hipError_t hipDriverGetVersion(int* driverVersion)`
        fn hipDriverGetVersion(version: *mut c_int) -> hipError_t;
        /// `hipError_t hipGetDeviceCount(int* count)`
        fn hipGetDeviceCount(count: *mut c_int) -> hipError_t;
        /// `hipError_t hipGetDevice(int* deviceId)`
        fn hipGetDevice(device: *mut c_int) -> hipError_t;
        /// `hipError_t hipSetDevice(int deviceId)`
        fn hipSetDevice(device: c_int) -> hipError_t;
        /// `const char* hipGetErrorName(hipError_t hip_error)`
        fn hipGetErrorName(error: hipError_t) -> *const c_char;
        /// `hipError_t hipGetLastError(void)` (also clears the sticky error)
        fn hipGetLastError() -> hipError_t;
        /// `hipError_t hipMalloc(void** ptr, size_t size)`
        fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> hipError_t;
        /// `hipError_t hipFree(void* ptr)`
        fn hipFree(ptr: *mut c_void) -> hipError_t;
        /// `hipError_t hipMemGetInfo(size_t* free, size_t* total)`
        fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError_t;
        /// `hipError_t hipDeviceSynchronize(void)`
        fn hipDeviceSynchronize() -> hipError_t;
        /// `hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags)`
        fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> hipError_t;
        /// `hipError_t hipStreamDestroy(hipStream_t stream)`
        fn hipStreamDestroy(stream: hipStream_t) -> hipError_t;
        /// `hipError_t hipStreamSynchronize(hipStream_t stream)`
        fn hipStreamSynchronize(stream: hipStream_t) -> hipError_t;
        /// `hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags)`
        fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> hipError_t;
        /// `hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags)`
        fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> hipError_t;
        /// `hipError_t hipEventDestroy(hipEvent_t event)`
        fn hipEventDestroy(event: hipEvent_t) -> hipError_t;
        /// `hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)`
        fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> hipError_t;
        /// `hipError_t hipEventQuery(hipEvent_t event)`
        fn hipEventQuery(event: hipEvent_t) -> hipError_t;
        /// `hipError_t hipEventSynchronize(hipEvent_t event)`
        fn hipEventSynchronize(event: hipEvent_t) -> hipError_t;
    }
    optional {
        /// `hipError_t hipStreamQuery(hipStream_t stream)`
        fn hipStreamQuery(stream: hipStream_t) -> hipError_t;
        /// `hipError_t hipStreamGetCaptureInfo_v2(hipStream_t, hipStreamCaptureStatus*,
        /// unsigned long long* id, hipGraph_t* graph, const hipGraphNode_t** deps, size_t* n)`
        fn hipStreamGetCaptureInfo_v2(
            stream: hipStream_t,
            status: *mut hipStreamCaptureStatus,
            id: *mut c_ulonglong,
            graph: *mut hipGraph_t,
            deps: *mut *const hipGraphNode_t,
            n: *mut usize
        ) -> hipError_t;
        /// `hipError_t hipGraphNodeGetDependencies(hipGraphNode_t node,
        /// hipGraphNode_t* pDependencies, size_t* pNumDependencies)`
        fn hipGraphNodeGetDependencies(node: hipGraphNode_t, deps: *mut hipGraphNode_t, n: *mut usize) -> hipError_t;
        /// `hipError_t hipGraphAddEmptyNode(hipGraphNode_t* pGraphNode, hipGraph_t graph,
        /// const hipGraphNode_t* pDependencies, size_t numDependencies)`
        fn hipGraphAddEmptyNode(node: *mut hipGraphNode_t, graph: hipGraph_t, deps: *const hipGraphNode_t, n: usize) -> hipError_t;
        /// `hipError_t hipStreamUpdateCaptureDependencies(hipStream_t stream,
        /// hipGraphNode_t* dependencies, size_t numDependencies, unsigned int flags)`
        fn hipStreamUpdateCaptureDependencies(stream: hipStream_t, deps: *mut hipGraphNode_t, n: usize, flags: c_uint) -> hipError_t;
        /// `hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* mode)`
        fn hipThreadExchangeStreamCaptureMode(mode: *mut hipStreamCaptureMode) -> hipError_t;
        /// `hipError_t hipRuntimeGetVersion(int* runtimeVersion)` (`HIP_VERSION`)
        fn hipRuntimeGetVersion(version: *mut c_int) -> hipError_t;
        /// `hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int deviceId)`
        fn hipDeviceGetAttribute(value: *mut c_int, attr: hipDeviceAttribute_t, device: c_int) -> hipError_t;
        /// `hipError_t hipMemGetAllocationGranularity(size_t* granularity,
        /// const hipMemAllocationProp* prop, hipMemAllocationGranularity_flags option)`;
        /// `prop` points at the layout the runtime takes (see [`hipMemAllocationProp`]).
        fn hipMemGetAllocationGranularity(
            granularity: *mut usize,
            prop: *const c_void,
            option: hipMemAllocationGranularity_flags
        ) -> hipError_t;
        /// `hipError_t hipMemAddressReserve(void** ptr, size_t size, size_t alignment,
        /// void* addr, unsigned long long flags)`
        fn hipMemAddressReserve(
            ptr: *mut *mut c_void,
            size: usize,
            alignment: usize,
            addr: *mut c_void,
            flags: c_ulonglong
        ) -> hipError_t;
        /// `hipError_t hipMemAddressFree(void* devPtr, size_t size)`
        fn hipMemAddressFree(ptr: *mut c_void, size: usize) -> hipError_t;
        /// `hipError_t hipMemCreate(hipMemGenericAllocationHandle_t* handle, size_t size,
        /// const hipMemAllocationProp* prop, unsigned long long flags)`; `prop` points
        /// at the layout the runtime takes (see [`hipMemAllocationProp`]).
        fn hipMemCreate(
            handle: *mut hipMemGenericAllocationHandle_t,
            size: usize,
            prop: *const c_void,
            flags: c_ulonglong
        ) -> hipError_t;
        /// `hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle)`
        fn hipMemRelease(handle: hipMemGenericAllocationHandle_t) -> hipError_t;
        /// `hipError_t hipMemMap(void* ptr, size_t size, size_t offset,
        /// hipMemGenericAllocationHandle_t handle, unsigned long long flags)`
        fn hipMemMap(
            ptr: *mut c_void,
            size: usize,
            offset: usize,
            handle: hipMemGenericAllocationHandle_t,
            flags: c_ulonglong
        ) -> hipError_t;
        /// `hipError_t hipMemUnmap(void* ptr, size_t size)`
        fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError_t;
        /// `hipError_t hipMemSetAccess(void* ptr, size_t size, const hipMemAccessDesc* desc,
        /// size_t count)`
        fn hipMemSetAccess(ptr: *mut c_void, size: usize, desc: *const hipMemAccessDesc, count: usize) -> hipError_t;
    }
}

impl HipApi {
    /// Loads the HIP runtime: the library named by [`LIBRARY_ENV`] when set,
    /// otherwise the first of [`LIBRARY_NAMES`] that opens.
    pub fn load() -> Result<Arc<Self>, LoadError> {
        match std::env::var(LIBRARY_ENV) {
            Ok(name) if !name.is_empty() => Self::load_from(&[name.as_str()]),
            _ => Self::load_from(LIBRARY_NAMES),
        }
    }

    /// Loads the HIP runtime from the first of `names` that opens. Calls no
    /// HIP function (initialization is the caller's business).
    pub fn load_from(names: &[&str]) -> Result<Arc<Self>, LoadError> {
        let mut tried = Vec::with_capacity(names.len());
        for &name in names {
            // SAFETY: opening the HIP runtime runs its initializers, which is
            // the documented way to use it; we pass only a library name.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Self::from_library(name.to_owned(), lib).map(Arc::new),
                Err(e) => tried.push((name.to_owned(), e.to_string())),
            }
        }
        Err(LoadError::LibraryNotFound { tried })
    }

    /// Name of the library the table was loaded from (`None` for a stub or fake).
    pub fn library_name(&self) -> Option<&str> {
        self.library.as_ref().map(|(n, _)| n.as_str())
    }

    /// Whether all four stream-capture entries are present.
    pub fn has_capture(&self) -> bool {
        self.hipStreamGetCaptureInfo_v2.is_some()
            && self.hipGraphNodeGetDependencies.is_some()
            && self.hipGraphAddEmptyNode.is_some()
            && self.hipStreamUpdateCaptureDependencies.is_some()
    }

    /// Whether all eight virtual-memory entries are present
    /// (`hipMemGetAllocationGranularity`, `hipMemAddressReserve`,
    /// `hipMemAddressFree`, `hipMemCreate`, `hipMemRelease`, `hipMemMap`,
    /// `hipMemUnmap`, `hipMemSetAccess`). Whether the device supports them
    /// is a further question (`hipDeviceAttributeVirtualMemoryManagementSupported`).
    pub fn has_virtual_memory(&self) -> bool {
        self.hipMemGetAllocationGranularity.is_some()
            && self.hipMemAddressReserve.is_some()
            && self.hipMemAddressFree.is_some()
            && self.hipMemCreate.is_some()
            && self.hipMemRelease.is_some()
            && self.hipMemMap.is_some()
            && self.hipMemUnmap.is_some()
            && self.hipMemSetAccess.is_some()
    }
}

impl fmt::Debug for HipApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipApi")
            .field("library", &self.library_name())
            .field("capture", &self.has_capture())
            .field("virtual_memory", &self.has_virtual_memory())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(miri, ignore = "dlopen: a foreign call Miri cannot run")]
    #[test]
    fn absent_library_is_a_typed_error() {
        let err = HipApi::load_from(&["libcachalot-no-such-hip.so.0"]).unwrap_err();
        match &err {
            LoadError::LibraryNotFound { tried } => {
                assert_eq!(tried.len(), 1);
                assert_eq!(tried[0].0, "libcachalot-no-such-hip.so.0");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("libcachalot-no-such-hip.so.0"));
    }

    #[test]
    fn stub_fails_every_call_and_lacks_capture() {
        let api = HipApi::stub();
        assert!(!api.has_capture());
        assert!(!api.has_virtual_memory());
        assert_eq!(api.library_name(), None);
        let mut n = 0;
        // SAFETY: the stub ignores its argument; `n` is a valid out-pointer anyway.
        let rc = unsafe { (api.hipGetDeviceCount)(&mut n) };
        assert_eq!(rc, hipErrorNotSupported);
        // SAFETY: the stub ignores its argument.
        assert!(unsafe { (api.hipGetErrorName)(hipSuccess) }.is_null());
    }

    /// The installed runtime loads with every required symbol; the only
    /// acceptable failure is its absence (then the test skips, or fails
    /// under `CACHALOT_REQUIRE_GPU`). A library that opens but lacks a
    /// required symbol ([`LoadError::MissingSymbol`]) fails the test.
    #[cfg_attr(miri, ignore = "dlopen: a foreign call Miri cannot run")]
    #[test]
    fn installed_library_loads_or_is_reported_absent() {
        match HipApi::load() {
            Ok(api) => {
                println!(
                    "loaded {:?} (virtual memory entries: {})",
                    api.library_name(),
                    api.has_virtual_memory()
                );
                assert!(api.library_name().is_some());
            }
            Err(e @ LoadError::LibraryNotFound { .. }) => {
                if std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
                    panic!("CACHALOT_REQUIRE_GPU is set, and this test would skip: {e}");
                }
                // a direct write: libtest captures println! of a passing test
                use std::io::Write;
                let _ = std::io::stderr().write_all(format!("skipped: {e}\n").as_bytes());
            }
            Err(e) => panic!("the HIP runtime is installed but does not load: {e}"),
        }
    }
}
