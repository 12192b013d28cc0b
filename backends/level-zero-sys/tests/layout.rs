//! Checks the hand-written declarations against the vendor header
//! `level_zero/ze_api.h` (Debian: `libze-dev`): constant values, struct sizes
//! and field offsets by compiling and running a small C program, and every
//! entry's signature by assigning the header's function to a pointer of the
//! Rust signature (spelled in C) under `-Werror`. Skips, printing why, when
//! no C compiler or no header is installed (fails instead under
//! `CACHALOT_REQUIRE_GPU=1`).

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use cachalot_level_zero_sys::*;

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

const HEADER: &str = "level_zero/ze_api.h";

fn header_dir() -> Option<String> {
    if let Ok(dir) = std::env::var("CACHALOT_ZE_INCLUDE") {
        return Some(dir);
    }
    ["/usr/include", "/usr/local/include"]
        .iter()
        .find(|d| Path::new(d).join(HEADER).exists())
        .map(|d| d.to_string())
}

fn compile(name: &str, include: &str, src: &str, run: bool) -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let dir =
        std::env::temp_dir().join(format!("cachalot-ze-layout-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).expect("write C source");
    let exe = dir.join(name);
    let mut cmd = Command::new(&cc);
    cmd.args(["-Werror", "-Wall", "-Wno-unused-variable"])
        .arg(format!("-I{include}"))
        .arg(&c);
    if run {
        cmd.arg("-o").arg(&exe);
    } else {
        cmd.arg("-fsyntax-only");
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            skip(format_args!("no C compiler ({cc}): {e}"));
            return None;
        }
    };
    assert!(
        out.status.success(),
        "C check against {HEADER} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = if run {
        let out = Command::new(&exe).output().expect("run layout probe");
        assert!(out.status.success());
        String::from_utf8(out.stdout).expect("utf-8")
    } else {
        String::new()
    };
    let _ = std::fs::remove_dir_all(&dir);
    Some(stdout)
}

macro_rules! layout {
    ($v:ident; $( $ty:ident { $($field:ident),* } )*) => {
        $(
            $v.push((format!("sizeof({})", stringify!($ty)), size_of::<$ty>() as i64));
            $v.push((format!("alignof({})", stringify!($ty)), align_of::<$ty>() as i64));
            $( $v.push((
                format!("offsetof({}, {})", stringify!($ty), stringify!($field)),
                offset_of!($ty, $field) as i64,
            )); )*
        )*
    };
}

#[cfg_attr(miri, ignore = "runs a C compiler: process spawning Miri cannot run")]
#[test]
fn constants_sizes_and_offsets_match_header() {
    let Some(include) = header_dir() else {
        skip(format_args!("{HEADER} not found (install libze-dev)"));
        return;
    };
    let mut expected: Vec<(String, i64)> = [
        ("ZE_RESULT_SUCCESS", ZE_RESULT_SUCCESS),
        ("ZE_RESULT_NOT_READY", ZE_RESULT_NOT_READY),
        ("ZE_RESULT_ERROR_DEVICE_LOST", ZE_RESULT_ERROR_DEVICE_LOST),
        (
            "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
            ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY,
        ),
        (
            "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY,
        ),
        (
            "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE",
            ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE,
        ),
        (
            "ZE_RESULT_ERROR_UNINITIALIZED",
            ZE_RESULT_ERROR_UNINITIALIZED,
        ),
        (
            "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
            ZE_RESULT_ERROR_UNSUPPORTED_FEATURE,
        ),
        (
            "ZE_RESULT_ERROR_INVALID_ARGUMENT",
            ZE_RESULT_ERROR_INVALID_ARGUMENT,
        ),
        (
            "ZE_RESULT_ERROR_INVALID_NULL_HANDLE",
            ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
        ),
        ("ZE_RESULT_ERROR_INVALID_SIZE", ZE_RESULT_ERROR_INVALID_SIZE),
        (
            "ZE_RESULT_ERROR_UNSUPPORTED_SIZE",
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE,
        ),
        ("ZE_RESULT_ERROR_UNKNOWN", ZE_RESULT_ERROR_UNKNOWN),
        (
            "ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES",
            ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES,
        ),
        (
            "ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES",
            ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES,
        ),
        (
            "ZE_STRUCTURE_TYPE_CONTEXT_DESC",
            ZE_STRUCTURE_TYPE_CONTEXT_DESC,
        ),
        (
            "ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC",
            ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
        ),
        (
            "ZE_STRUCTURE_TYPE_EVENT_POOL_DESC",
            ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
        ),
        ("ZE_STRUCTURE_TYPE_EVENT_DESC", ZE_STRUCTURE_TYPE_EVENT_DESC),
        (
            "ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC",
            ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
        ),
        ("ZE_INIT_FLAG_GPU_ONLY", ZE_INIT_FLAG_GPU_ONLY),
        (
            "ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE",
            ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE,
        ),
        (
            "ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS",
            ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
        ),
        (
            "ZE_COMMAND_QUEUE_PRIORITY_NORMAL",
            ZE_COMMAND_QUEUE_PRIORITY_NORMAL,
        ),
        (
            "ZE_EVENT_POOL_FLAG_HOST_VISIBLE",
            ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
        ),
        ("ZE_EVENT_SCOPE_FLAG_HOST", ZE_EVENT_SCOPE_FLAG_HOST),
        ("ZE_MAX_DEVICE_NAME", ZE_MAX_DEVICE_NAME as u32),
        (
            "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE",
            ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE,
        ),
        (
            "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT",
            ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT,
        ),
        (
            "ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC",
            ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC,
        ),
        (
            "ZE_MEMORY_ACCESS_ATTRIBUTE_NONE",
            ZE_MEMORY_ACCESS_ATTRIBUTE_NONE,
        ),
        (
            "ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE",
            ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE,
        ),
        (
            "ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY",
            ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY,
        ),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), i64::from(*v)))
    .collect();
    for (ty, size) in [
        ("ze_result_t", size_of::<ze_result_t>()),
        ("ze_structure_type_t", size_of::<ze_structure_type_t>()),
        ("ze_init_flags_t", size_of::<ze_init_flags_t>()),
        (
            "ze_command_queue_mode_t",
            size_of::<ze_command_queue_mode_t>(),
        ),
        (
            "ze_command_queue_priority_t",
            size_of::<ze_command_queue_priority_t>(),
        ),
        ("ze_event_pool_flags_t", size_of::<ze_event_pool_flags_t>()),
        (
            "ze_event_scope_flags_t",
            size_of::<ze_event_scope_flags_t>(),
        ),
        (
            "ze_device_mem_alloc_flags_t",
            size_of::<ze_device_mem_alloc_flags_t>(),
        ),
        ("ze_driver_handle_t", size_of::<ze_driver_handle_t>()),
        ("ze_event_handle_t", size_of::<ze_event_handle_t>()),
        (
            "ze_physical_mem_handle_t",
            size_of::<ze_physical_mem_handle_t>(),
        ),
        (
            "ze_physical_mem_flags_t",
            size_of::<ze_physical_mem_flags_t>(),
        ),
        (
            "ze_memory_access_attribute_t",
            size_of::<ze_memory_access_attribute_t>(),
        ),
    ] {
        expected.push((format!("sizeof({ty})"), size as i64));
    }
    layout!(expected;
        ze_context_desc_t { stype, pNext, flags }
        ze_command_queue_desc_t { stype, pNext, ordinal, index, flags, mode, priority }
        ze_command_queue_group_properties_t { stype, pNext, flags, maxMemoryFillPatternSize, numQueues }
        ze_device_mem_alloc_desc_t { stype, pNext, flags, ordinal }
        ze_device_memory_properties_t { stype, pNext, flags, maxClockRate, maxBusWidth, totalSize, name }
        ze_event_pool_desc_t { stype, pNext, flags, count }
        ze_event_desc_t { stype, pNext, index, signal, wait }
        ze_physical_mem_desc_t { stype, pNext, flags, size }
    );
    let mut src = String::from(
        "#include <level_zero/ze_api.h>\n#include <stdio.h>\n#include <stddef.h>\n#include <stdalign.h>\nint main(void) {\n",
    );
    for (expr, _) in &expected {
        src.push_str(&format!(
            "  printf(\"%s %lld\\n\", \"{expr}\", (long long)({expr}));\n"
        ));
    }
    src.push_str("  return 0;\n}\n");
    let Some(out) = compile("consts", &include, &src, true) else {
        return;
    };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), expected.len());
    for (line, (expr, value)) in lines.iter().zip(&expected) {
        let (name, got) = line.rsplit_once(' ').expect("name value");
        assert_eq!(name, expr);
        assert_eq!(
            got.parse::<i64>().expect("number"),
            *value,
            "{expr} differs from {HEADER}"
        );
    }
}

#[cfg_attr(miri, ignore = "runs a C compiler: process spawning Miri cannot run")]
#[test]
fn signatures_match_header() {
    let Some(include) = header_dir() else {
        skip(format_args!("{HEADER} not found (install libze-dev)"));
        return;
    };
    // Each line mirrors one ZeApi entry's Rust signature in C; the compiler
    // rejects the assignment (-Werror) if the header's prototype differs.
    let protos = [
        "ze_result_t (*f_zeInit)(ze_init_flags_t) = zeInit;",
        "ze_result_t (*f_zeDriverGet)(uint32_t*, ze_driver_handle_t*) = zeDriverGet;",
        "ze_result_t (*f_zeDeviceGet)(ze_driver_handle_t, uint32_t*, ze_device_handle_t*) = zeDeviceGet;",
        "ze_result_t (*f_zeDeviceGetCommandQueueGroupProperties)(ze_device_handle_t, uint32_t*, ze_command_queue_group_properties_t*) = zeDeviceGetCommandQueueGroupProperties;",
        "ze_result_t (*f_zeDeviceGetMemoryProperties)(ze_device_handle_t, uint32_t*, ze_device_memory_properties_t*) = zeDeviceGetMemoryProperties;",
        "ze_result_t (*f_zeContextCreate)(ze_driver_handle_t, const ze_context_desc_t*, ze_context_handle_t*) = zeContextCreate;",
        "ze_result_t (*f_zeContextDestroy)(ze_context_handle_t) = zeContextDestroy;",
        "ze_result_t (*f_zeCommandListCreateImmediate)(ze_context_handle_t, ze_device_handle_t, const ze_command_queue_desc_t*, ze_command_list_handle_t*) = zeCommandListCreateImmediate;",
        "ze_result_t (*f_zeCommandListDestroy)(ze_command_list_handle_t) = zeCommandListDestroy;",
        "ze_result_t (*f_zeCommandListAppendBarrier)(ze_command_list_handle_t, ze_event_handle_t, uint32_t, ze_event_handle_t*) = zeCommandListAppendBarrier;",
        "ze_result_t (*f_zeCommandListAppendWaitOnEvents)(ze_command_list_handle_t, uint32_t, ze_event_handle_t*) = zeCommandListAppendWaitOnEvents;",
        "ze_result_t (*f_zeEventPoolCreate)(ze_context_handle_t, const ze_event_pool_desc_t*, uint32_t, ze_device_handle_t*, ze_event_pool_handle_t*) = zeEventPoolCreate;",
        "ze_result_t (*f_zeEventPoolDestroy)(ze_event_pool_handle_t) = zeEventPoolDestroy;",
        "ze_result_t (*f_zeEventCreate)(ze_event_pool_handle_t, const ze_event_desc_t*, ze_event_handle_t*) = zeEventCreate;",
        "ze_result_t (*f_zeEventDestroy)(ze_event_handle_t) = zeEventDestroy;",
        "ze_result_t (*f_zeEventHostSynchronize)(ze_event_handle_t, uint64_t) = zeEventHostSynchronize;",
        "ze_result_t (*f_zeEventQueryStatus)(ze_event_handle_t) = zeEventQueryStatus;",
        "ze_result_t (*f_zeEventHostReset)(ze_event_handle_t) = zeEventHostReset;",
        "ze_result_t (*f_zeMemAllocDevice)(ze_context_handle_t, const ze_device_mem_alloc_desc_t*, size_t, size_t, ze_device_handle_t, void**) = zeMemAllocDevice;",
        "ze_result_t (*f_zeMemFree)(ze_context_handle_t, void*) = zeMemFree;",
        "ze_result_t (*f_zeVirtualMemReserve)(ze_context_handle_t, const void*, size_t, void**) = zeVirtualMemReserve;",
        "ze_result_t (*f_zeVirtualMemFree)(ze_context_handle_t, const void*, size_t) = zeVirtualMemFree;",
        "ze_result_t (*f_zeVirtualMemQueryPageSize)(ze_context_handle_t, ze_device_handle_t, size_t, size_t*) = zeVirtualMemQueryPageSize;",
        "ze_result_t (*f_zePhysicalMemCreate)(ze_context_handle_t, ze_device_handle_t, ze_physical_mem_desc_t*, ze_physical_mem_handle_t*) = zePhysicalMemCreate;",
        "ze_result_t (*f_zePhysicalMemDestroy)(ze_context_handle_t, ze_physical_mem_handle_t) = zePhysicalMemDestroy;",
        "ze_result_t (*f_zeVirtualMemMap)(ze_context_handle_t, const void*, size_t, ze_physical_mem_handle_t, size_t, ze_memory_access_attribute_t) = zeVirtualMemMap;",
        "ze_result_t (*f_zeVirtualMemUnmap)(ze_context_handle_t, const void*, size_t) = zeVirtualMemUnmap;",
        "ze_result_t (*f_zeVirtualMemSetAccessAttribute)(ze_context_handle_t, const void*, size_t, ze_memory_access_attribute_t) = zeVirtualMemSetAccessAttribute;",
    ];
    let mut src = String::from("#include <level_zero/ze_api.h>\n");
    for p in protos {
        src.push_str(p);
        src.push('\n');
    }
    compile("sigs", &include, &src, false);
}
