//! Checks the hand-written declarations against the vendor header
//! `hip/hip_runtime_api.h` (Debian: `libamdhip64-dev`): constant values and
//! type sizes by compiling and running a small C program, and every entry's
//! signature by assigning the header's function to a pointer of the Rust
//! signature (spelled in C) under `-Werror`. Skips, printing why, when no C
//! compiler or no header is installed (fails instead under
//! `CACHALOT_REQUIRE_GPU=1`).

use std::ffi::{c_int, c_uint};
use std::mem::offset_of;
use std::path::{Path, PathBuf};
use std::process::Command;

use cachalot_hip_sys::*;

/// Reports a test that cannot run here: writes `skipped: <reason>` to
/// stderr and returns, or panics when `CACHALOT_REQUIRE_GPU` is set (to
/// anything but `0`): the packed `run.sh` sets it on the machine with the
/// hardware, where a skip would hide a test that never ran. The note is a
/// direct write to stderr, which libtest does not capture (it captures
/// `println!`), so `cargo test` shows it.
fn skip(reason: impl std::fmt::Display) {
    if std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("CACHALOT_REQUIRE_GPU is set, and this test would skip: {reason}");
    }
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("skipped: {reason}\n").as_bytes());
}

const INCLUDE_DIRS: &[&str] = &["/opt/rocm/include", "/usr/include"];
const HEADER: &str = "hip/hip_runtime_api.h";

fn header_dir() -> Option<&'static str> {
    if let Ok(dir) = std::env::var("CACHALOT_HIP_INCLUDE") {
        return Some(Box::leak(dir.into_boxed_str()));
    }
    INCLUDE_DIRS
        .iter()
        .copied()
        .find(|d| Path::new(d).join(HEADER).exists())
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_owned())
}

fn workdir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("cachalot-hip-layout-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Compiles `src`; `run` also links and runs it, returning its stdout.
fn compile(name: &str, include: &str, src: &str, run: bool) -> Option<String> {
    let dir = workdir(name);
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).expect("write C source");
    let exe = dir.join(name);
    let mut cmd = Command::new(cc());
    cmd.args([
        "-D__HIP_PLATFORM_AMD__",
        "-Werror",
        "-Wall",
        "-Wno-unused-variable",
    ])
    .arg(format!("-I{include}"))
    .arg(&c);
    if run {
        cmd.arg("-o").arg(&exe);
    } else {
        cmd.args(["-fsyntax-only"]);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            skip(format_args!("no C compiler ({}): {e}", cc()));
            return None;
        }
    };
    assert!(
        out.status.success(),
        "C check against {HEADER} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !run {
        return Some(String::new());
    }
    let out = Command::new(&exe).output().expect("run layout probe");
    assert!(out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    Some(String::from_utf8(out.stdout).expect("utf-8"))
}

#[cfg_attr(miri, ignore = "runs a C compiler: process spawning Miri cannot run")]
#[test]
fn constants_and_sizes_match_header() {
    let Some(include) = header_dir() else {
        skip(format_args!("{HEADER} not found (install libamdhip64-dev)"));
        return;
    };
    let ints: &[(&str, i64)] = &[
        ("hipSuccess", hipSuccess as i64),
        ("hipErrorInvalidValue", hipErrorInvalidValue as i64),
        ("hipErrorOutOfMemory", hipErrorOutOfMemory as i64),
        ("hipErrorMemoryAllocation", hipErrorOutOfMemory as i64),
        ("hipErrorNotInitialized", hipErrorNotInitialized as i64),
        ("hipErrorDeinitialized", hipErrorDeinitialized as i64),
        (
            "hipErrorInsufficientDriver",
            hipErrorInsufficientDriver as i64,
        ),
        ("hipErrorNoDevice", hipErrorNoDevice as i64),
        ("hipErrorInvalidDevice", hipErrorInvalidDevice as i64),
        ("hipErrorInvalidHandle", hipErrorInvalidHandle as i64),
        (
            "hipErrorInvalidResourceHandle",
            hipErrorInvalidHandle as i64,
        ),
        ("hipErrorIllegalState", hipErrorIllegalState as i64),
        ("hipErrorNotReady", hipErrorNotReady as i64),
        ("hipErrorNotSupported", hipErrorNotSupported as i64),
        (
            "hipErrorStreamCaptureUnsupported",
            hipErrorStreamCaptureUnsupported as i64,
        ),
        (
            "hipErrorStreamCaptureInvalidated",
            hipErrorStreamCaptureInvalidated as i64,
        ),
        ("hipErrorUnknown", hipErrorUnknown as i64),
        (
            "hipStreamCaptureStatusNone",
            hipStreamCaptureStatusNone as i64,
        ),
        (
            "hipStreamCaptureStatusActive",
            hipStreamCaptureStatusActive as i64,
        ),
        (
            "hipStreamCaptureStatusInvalidated",
            hipStreamCaptureStatusInvalidated as i64,
        ),
        (
            "hipStreamAddCaptureDependencies",
            hipStreamAddCaptureDependencies as i64,
        ),
        (
            "hipStreamSetCaptureDependencies",
            hipStreamSetCaptureDependencies as i64,
        ),
        (
            "hipStreamCaptureModeGlobal",
            hipStreamCaptureModeGlobal as i64,
        ),
        (
            "hipStreamCaptureModeThreadLocal",
            hipStreamCaptureModeThreadLocal as i64,
        ),
        (
            "hipStreamCaptureModeRelaxed",
            hipStreamCaptureModeRelaxed as i64,
        ),
        ("hipStreamDefault", hipStreamDefault as i64),
        ("hipStreamNonBlocking", hipStreamNonBlocking as i64),
        ("hipEventDefault", hipEventDefault as i64),
        ("hipEventDisableTiming", hipEventDisableTiming as i64),
        (
            "hipDeviceAttributeMemoryPoolsSupported",
            hipDeviceAttributeMemoryPoolsSupported as i64,
        ),
        (
            "hipMemLocationTypeInvalid",
            hipMemLocationTypeInvalid as i64,
        ),
        ("hipMemLocationTypeDevice", hipMemLocationTypeDevice as i64),
        (
            "hipMemAccessFlagsProtNone",
            hipMemAccessFlagsProtNone as i64,
        ),
        (
            "hipMemAccessFlagsProtRead",
            hipMemAccessFlagsProtRead as i64,
        ),
        (
            "hipMemAccessFlagsProtReadWrite",
            hipMemAccessFlagsProtReadWrite as i64,
        ),
        (
            "hipMemAllocationTypeInvalid",
            hipMemAllocationTypeInvalid as i64,
        ),
        (
            "hipMemAllocationTypePinned",
            hipMemAllocationTypePinned as i64,
        ),
        ("hipMemHandleTypeNone", hipMemHandleTypeNone as i64),
        (
            "hipMemAllocationGranularityMinimum",
            hipMemAllocationGranularityMinimum as i64,
        ),
        (
            "hipMemAllocationGranularityRecommended",
            hipMemAllocationGranularityRecommended as i64,
        ),
    ];
    let sizes: &[(&str, usize)] = &[
        ("hipError_t", size_of::<hipError_t>()),
        ("hipStream_t", size_of::<hipStream_t>()),
        ("hipEvent_t", size_of::<hipEvent_t>()),
        ("hipGraph_t", size_of::<hipGraph_t>()),
        ("hipGraphNode_t", size_of::<hipGraphNode_t>()),
        (
            "hipStreamCaptureStatus",
            size_of::<hipStreamCaptureStatus>(),
        ),
        (
            "hipStreamUpdateCaptureDependenciesFlags",
            size_of::<c_uint>(),
        ),
        ("int", size_of::<c_int>()),
        ("hipDeviceAttribute_t", size_of::<hipDeviceAttribute_t>()),
        (
            "hipMemGenericAllocationHandle_t",
            size_of::<hipMemGenericAllocationHandle_t>(),
        ),
        ("hipMemLocationType", size_of::<hipMemLocationType>()),
        ("hipMemAccessFlags", size_of::<hipMemAccessFlags>()),
        ("hipMemAllocationType", size_of::<hipMemAllocationType>()),
        (
            "hipMemAllocationHandleType",
            size_of::<hipMemAllocationHandleType>(),
        ),
        (
            "hipMemAllocationGranularity_flags",
            size_of::<hipMemAllocationGranularity_flags>(),
        ),
    ];
    let mut src =
        String::from("#include <hip/hip_runtime_api.h>\n#include <stdio.h>\nint main(void) {\n");
    for (name, _) in ints {
        src.push_str(&format!(
            "  printf(\"{name} %lld\\n\", (long long)({name}));\n"
        ));
    }
    for (name, _) in sizes {
        src.push_str(&format!(
            "  printf(\"sizeof({name}) %lld\\n\", (long long)sizeof({name}));\n"
        ));
    }
    src.push_str("  return 0;\n}\n");
    let Some(out) = compile("consts", include, &src, true) else {
        return;
    };
    let mut checked = 0;
    for line in out.lines() {
        let (name, value) = line.rsplit_once(' ').expect("name value");
        let value: i64 = value.parse().expect("number");
        let expected = if let Some(ty) = name
            .strip_prefix("sizeof(")
            .and_then(|s| s.strip_suffix(')'))
        {
            sizes.iter().find(|(n, _)| *n == ty).map(|(_, s)| *s as i64)
        } else {
            ints.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        };
        assert_eq!(expected, Some(value), "{name} differs from {HEADER}");
        checked += 1;
    }
    assert_eq!(checked, ints.len() + sizes.len());
}

#[cfg_attr(miri, ignore = "runs a C compiler: process spawning Miri cannot run")]
#[test]
fn signatures_match_header() {
    let Some(include) = header_dir() else {
        skip(format_args!("{HEADER} not found (install libamdhip64-dev)"));
        return;
    };
    // Each line mirrors one HipApi entry's Rust signature in C; the compiler
    // rejects the assignment (-Werror) if the header's prototype differs.
    let protos = [
        "hipError_t (*f_hipInit)(unsigned int) = hipInit;",
        "hipError_t (*f_hipDriverGetVersion)(int*) = hipDriverGetVersion;",
        "hipError_t (*f_hipGetDeviceCount)(int*) = hipGetDeviceCount;",
        "hipError_t (*f_hipGetDevice)(int*) = hipGetDevice;",
        "hipError_t (*f_hipSetDevice)(int) = hipSetDevice;",
        "const char* (*f_hipGetErrorName)(hipError_t) = hipGetErrorName;",
        "hipError_t (*f_hipGetLastError)(void) = hipGetLastError;",
        "hipError_t (*f_hipMalloc)(void**, size_t) = hipMalloc;",
        "hipError_t (*f_hipFree)(void*) = hipFree;",
        "hipError_t (*f_hipMemGetInfo)(size_t*, size_t*) = hipMemGetInfo;",
        "hipError_t (*f_hipDeviceSynchronize)(void) = hipDeviceSynchronize;",
        "hipError_t (*f_hipStreamCreateWithFlags)(hipStream_t*, unsigned int) = hipStreamCreateWithFlags;",
        "hipError_t (*f_hipStreamDestroy)(hipStream_t) = hipStreamDestroy;",
        "hipError_t (*f_hipStreamSynchronize)(hipStream_t) = hipStreamSynchronize;",
        "hipError_t (*f_hipStreamWaitEvent)(hipStream_t, hipEvent_t, unsigned int) = hipStreamWaitEvent;",
        "hipError_t (*f_hipEventCreateWithFlags)(hipEvent_t*, unsigned int) = hipEventCreateWithFlags;",
        "hipError_t (*f_hipEventDestroy)(hipEvent_t) = hipEventDestroy;",
        "hipError_t (*f_hipEventRecord)(hipEvent_t, hipStream_t) = hipEventRecord;",
        "hipError_t (*f_hipEventQuery)(hipEvent_t) = hipEventQuery;",
        "hipError_t (*f_hipEventSynchronize)(hipEvent_t) = hipEventSynchronize;",
        "hipError_t (*f_hipStreamGetCaptureInfo_v2)(hipStream_t, hipStreamCaptureStatus*, unsigned long long*, hipGraph_t*, const hipGraphNode_t**, size_t*) = hipStreamGetCaptureInfo_v2;",
        "hipError_t (*f_hipGraphNodeGetDependencies)(hipGraphNode_t, hipGraphNode_t*, size_t*) = hipGraphNodeGetDependencies;",
        "hipError_t (*f_hipGraphAddEmptyNode)(hipGraphNode_t*, hipGraph_t, const hipGraphNode_t*, size_t) = hipGraphAddEmptyNode;",
        "hipError_t (*f_hipStreamUpdateCaptureDependencies)(hipStream_t, hipGraphNode_t*, size_t, unsigned int) = hipStreamUpdateCaptureDependencies;",
        "hipError_t (*f_hipThreadExchangeStreamCaptureMode)(hipStreamCaptureMode*) = hipThreadExchangeStreamCaptureMode;",
        "hipError_t (*f_hipRuntimeGetVersion)(int*) = hipRuntimeGetVersion;",
        "hipError_t (*f_hipDeviceGetAttribute)(int*, hipDeviceAttribute_t, int) = hipDeviceGetAttribute;",
        // `prop` is `*const c_void` in Rust: the struct's layout depends on
        // the runtime's version (see `hipMemAllocationProp`).
        "hipError_t (*f_hipMemGetAllocationGranularity)(size_t*, const hipMemAllocationProp*, hipMemAllocationGranularity_flags) = hipMemGetAllocationGranularity;",
        "hipError_t (*f_hipMemAddressReserve)(void**, size_t, size_t, void*, unsigned long long) = hipMemAddressReserve;",
        "hipError_t (*f_hipMemAddressFree)(void*, size_t) = hipMemAddressFree;",
        "hipError_t (*f_hipMemCreate)(hipMemGenericAllocationHandle_t*, size_t, const hipMemAllocationProp*, unsigned long long) = hipMemCreate;",
        "hipError_t (*f_hipMemRelease)(hipMemGenericAllocationHandle_t) = hipMemRelease;",
        "hipError_t (*f_hipMemMap)(void*, size_t, size_t, hipMemGenericAllocationHandle_t, unsigned long long) = hipMemMap;",
        "hipError_t (*f_hipMemUnmap)(void*, size_t) = hipMemUnmap;",
        "hipError_t (*f_hipMemSetAccess)(void*, size_t, const hipMemAccessDesc*, size_t) = hipMemSetAccess;",
    ];
    let mut src = String::from("#include <hip/hip_runtime_api.h>\n");
    for p in protos {
        src.push_str(p);
        src.push('\n');
    }
    compile("sigs", include, &src, false);
}

/// `(C expression, Rust value)` pairs for the size, alignment and field
/// offsets of a struct.
fn struct_layout(
    ty: &str,
    size: usize,
    align: usize,
    fields: &[(&str, usize)],
) -> Vec<(String, i64)> {
    let mut v = vec![
        (format!("sizeof({ty})"), size as i64),
        (format!("_Alignof({ty})"), align as i64),
    ];
    for (field, off) in fields {
        v.push((format!("offsetof({ty}, {field})"), *off as i64));
    }
    v
}

fn location_and_access_layouts() -> Vec<(String, i64)> {
    let mut v = struct_layout(
        "hipMemLocation",
        size_of::<hipMemLocation>(),
        align_of::<hipMemLocation>(),
        &[
            ("type", offset_of!(hipMemLocation, r#type)),
            ("id", offset_of!(hipMemLocation, id)),
        ],
    );
    v.extend(struct_layout(
        "hipMemAccessDesc",
        size_of::<hipMemAccessDesc>(),
        align_of::<hipMemAccessDesc>(),
        &[
            ("location", offset_of!(hipMemAccessDesc, location)),
            ("flags", offset_of!(hipMemAccessDesc, flags)),
        ],
    ));
    v
}

/// `hipMemAllocationProp` of ROCm 5.3 and later, as the header spells its fields.
fn current_prop_layout() -> Vec<(String, i64)> {
    let flags = offset_of!(hipMemAllocationProp, allocFlags);
    struct_layout(
        "hipMemAllocationProp",
        size_of::<hipMemAllocationProp>(),
        align_of::<hipMemAllocationProp>(),
        &[
            ("type", offset_of!(hipMemAllocationProp, r#type)),
            (
                "requestedHandleType",
                offset_of!(hipMemAllocationProp, requestedHandleType),
            ),
            ("location", offset_of!(hipMemAllocationProp, location)),
            (
                "win32HandleMetaData",
                offset_of!(hipMemAllocationProp, win32HandleMetaData),
            ),
            ("allocFlags", flags),
            (
                "allocFlags.compressionType",
                flags + offset_of!(hipMemAllocationPropFlags, compressionType),
            ),
            (
                "allocFlags.gpuDirectRDMACapable",
                flags + offset_of!(hipMemAllocationPropFlags, gpuDirectRDMACapable),
            ),
            (
                "allocFlags.usage",
                flags + offset_of!(hipMemAllocationPropFlags, usage),
            ),
        ],
    )
}

/// `hipMemAllocationProp` of ROCm 5.2 and earlier ([`hipMemAllocationProp_rocm52`]).
fn rocm52_prop_layout() -> Vec<(String, i64)> {
    struct_layout(
        "hipMemAllocationProp",
        size_of::<hipMemAllocationProp_rocm52>(),
        align_of::<hipMemAllocationProp_rocm52>(),
        &[
            (
                "compressionType",
                offset_of!(hipMemAllocationProp_rocm52, compressionType),
            ),
            (
                "location",
                offset_of!(hipMemAllocationProp_rocm52, location),
            ),
            (
                "requestedHandleType",
                offset_of!(hipMemAllocationProp_rocm52, requestedHandleType),
            ),
            ("type", offset_of!(hipMemAllocationProp_rocm52, r#type)),
            ("usage", offset_of!(hipMemAllocationProp_rocm52, usage)),
            (
                "win32HandleMetaData",
                offset_of!(hipMemAllocationProp_rocm52, win32HandleMetaData),
            ),
        ],
    )
}

fn printf_lines(exprs: &[(String, i64)]) -> String {
    exprs
        .iter()
        .map(|(e, _)| format!("  printf(\"%s %lld\\n\", \"{e}\", (long long)({e}));\n"))
        .collect()
}

/// The virtual-memory structs against the installed header: `hipMemLocation`
/// and `hipMemAccessDesc` always; `hipMemAllocationProp` against
/// [`hipMemAllocationProp`] when the header is ROCm 5.3 or later and against
/// [`hipMemAllocationProp_rocm52`] before (Debian 12 ships ROCm 5.2); and the
/// virtual-memory device attribute where the header has it.
#[test]
fn virtual_memory_structs_match_header() {
    let Some(include) = header_dir() else {
        skip(format_args!("{HEADER} not found (install libamdhip64-dev)"));
        return;
    };
    let common = location_and_access_layouts();
    let current = current_prop_layout();
    let rocm52 = rocm52_prop_layout();
    let attr = (
        "hipDeviceAttributeVirtualMemoryManagementSupported".to_owned(),
        i64::from(hipDeviceAttributeVirtualMemoryManagementSupported),
    );
    let mut src = String::from(
        "#include <hip/hip_runtime_api.h>\n#include <stdio.h>\n#include <stddef.h>\nint main(void) {\n",
    );
    src.push_str("  printf(\"HIP_VERSION %lld\\n\", (long long)HIP_VERSION);\n");
    src.push_str(&printf_lines(&common));
    src.push_str("#if HIP_VERSION >= 50300000\n");
    src.push_str(&printf_lines(&current));
    src.push_str("#else\n");
    src.push_str(&printf_lines(&rocm52));
    src.push_str("#endif\n");
    // The attribute is in the ROCm 6.2 headers and later (not in 5.2's);
    // in between it may or may not be, so only those are compared.
    src.push_str("#if HIP_VERSION >= 60200000\n");
    src.push_str(&printf_lines(std::slice::from_ref(&attr)));
    src.push_str("#endif\n");
    src.push_str("  return 0;\n}\n");
    let Some(out) = compile("vmm", include, &src, true) else {
        return;
    };
    let mut lines = out.lines();
    let version: i64 = lines
        .next()
        .and_then(|l| l.strip_prefix("HIP_VERSION "))
        .and_then(|v| v.parse().ok())
        .expect("HIP_VERSION line");
    let mut expected = common;
    if version >= i64::from(HIP_VERSION_ALLOCATION_PROP_REORDERED) {
        expected.extend(current);
    } else {
        expected.extend(rocm52);
    }
    if version >= 60_200_000 {
        expected.push(attr);
    }
    let lines: Vec<&str> = lines.collect();
    assert_eq!(lines.len(), expected.len(), "{out}");
    for (line, (expr, value)) in lines.iter().zip(&expected) {
        let (name, got) = line.rsplit_once(' ').expect("name value");
        assert_eq!(name, expr);
        assert_eq!(
            got.parse::<i64>().expect("number"),
            *value,
            "{expr} differs from {HEADER} (HIP_VERSION {version})"
        );
    }
    println!(
        "checked {} layout facts against HIP_VERSION {version}",
        lines.len()
    );
}

/// The two `hipMemAllocationProp` layouts as the ROCm headers declare them
/// (5.3 and later: CUDA's order; 5.2: compression first), checked without a
/// header so that the one the installed header cannot confirm is pinned too.
#[test]
fn allocation_prop_layouts_are_the_documented_ones() {
    let off = |v: &[(String, i64)], f: &str| {
        v.iter()
            .find(|(e, _)| e == &format!("offsetof(hipMemAllocationProp, {f})"))
            .map(|(_, o)| *o)
            .expect("field")
    };
    let cur = current_prop_layout();
    assert_eq!(size_of::<hipMemAllocationProp>(), 32);
    assert_eq!(
        [
            "type",
            "requestedHandleType",
            "location",
            "win32HandleMetaData",
            "allocFlags"
        ]
        .map(|f| off(&cur, f)),
        [0, 4, 8, 16, 24]
    );
    assert_eq!(
        ["allocFlags.gpuDirectRDMACapable", "allocFlags.usage"].map(|f| off(&cur, f)),
        [25, 26]
    );
    let old = rocm52_prop_layout();
    assert_eq!(size_of::<hipMemAllocationProp_rocm52>(), 32);
    assert_eq!(
        [
            "compressionType",
            "location",
            "requestedHandleType",
            "type",
            "usage",
            "win32HandleMetaData"
        ]
        .map(|f| off(&old, f)),
        [0, 4, 12, 16, 20, 24]
    );
    assert_eq!(
        (size_of::<hipMemLocation>(), size_of::<hipMemAccessDesc>()),
        (8, 12)
    );
    // In every header that has it, the attribute follows the memory-pool one.
    assert_eq!(
        hipDeviceAttributeVirtualMemoryManagementSupported,
        hipDeviceAttributeMemoryPoolsSupported + 1
    );
}
