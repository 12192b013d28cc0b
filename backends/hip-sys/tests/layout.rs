//! Checks the hand-written declarations against the vendor header
//! `hip/hip_runtime_api.h` (Debian: `libamdhip64-dev`): constant values and
//! type sizes by compiling and running a small C program, and every entry's
//! signature by assigning the header's function to a pointer of the Rust
//! signature (spelled in C) under `-Werror`. Skips, printing why, when no C
//! compiler or no header is installed.

use std::ffi::{c_int, c_uint};
use std::path::{Path, PathBuf};
use std::process::Command;

use cachalot_hip_sys::*;

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
            println!("skipped: no C compiler ({}): {e}", cc());
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
        println!("skipped: {HEADER} not found (install libamdhip64-dev)");
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
        println!("skipped: {HEADER} not found (install libamdhip64-dev)");
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
    ];
    let mut src = String::from("#include <hip/hip_runtime_api.h>\n");
    for p in protos {
        src.push_str(p);
        src.push('\n');
    }
    compile("sigs", include, &src, false);
}
