//! Compiles and links the PyTorch C++ shim (`python/cachalot_torch/shim.cpp`)
//! with g++ against a torch installation's headers and libraries and the
//! built cdylib, with `-Wall -Wextra -Werror -Woverloaded-virtual
//! -Wl,--no-undefined`: every pure virtual of PyTorch's `CUDAAllocator` is
//! overridden (the shim instantiates its subclass), every override matches
//! a virtual of that torch version, and every symbol resolves in `libc10`,
//! `libc10_cuda`, `libcudart` and this crate's C ABI.
//!
//! Needs a torch tree, which `cargo test` does not have by itself: set
//! `CACHALOT_TORCH_DIR` (the `torch/` package folder, with `include/` and
//! `lib/`, e.g. unpacked from the wheel), `CACHALOT_CUDA_INCLUDE` (a folder
//! with `cuda_runtime_api.h` and `crt/host_config.h`, e.g. from the
//! `nvidia-cuda-runtime` and `nvidia-cuda-crt` wheels) and
//! `CACHALOT_CUDART_DIR` (a folder with `libcudart.so.13`). Without them it
//! prints `skipped: <reason>`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).map(PathBuf::from)
}

fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test binary's folder");
    let name = "libcachalot_capi.so";
    [deps.join(name), deps.parent().unwrap_or(deps).join(name)]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("libcachalot_capi.so next to the test binary")
}

#[test]
#[cfg_attr(miri, ignore = "runs g++")]
fn shim_compiles_and_links_against_torch() {
    let (Some(torch), Some(cuda_inc), Some(cudart)) = (
        var("CACHALOT_TORCH_DIR"),
        var("CACHALOT_CUDA_INCLUDE"),
        var("CACHALOT_CUDART_DIR"),
    ) else {
        println!(
            "skipped: set CACHALOT_TORCH_DIR, CACHALOT_CUDA_INCLUDE and CACHALOT_CUDART_DIR \
             to build the PyTorch shim against a torch tree"
        );
        return;
    };
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shim = manifest.join("../../python/cachalot_torch/shim.cpp");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libcachalot_torch_shim.so");
    let output = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-fPIC", "-shared"])
        .args(["-Wall", "-Wextra", "-Werror", "-Woverloaded-virtual"])
        .arg("-isystem")
        .arg(torch.join("include"))
        .arg("-isystem")
        .arg(&cuda_inc)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(&shim)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(torch.join("lib"))
        .arg("-L")
        .arg(&cudart)
        .args(["-lc10", "-lc10_cuda", "-l:libcudart.so.13"])
        .arg(cdylib())
        .arg("-Wl,--no-undefined")
        .output()
        .unwrap_or_else(|e| panic!("running {cxx}: {e}"));
    assert!(
        output.status.success(),
        "building the shim failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // the install entry points are exported
    let nm = Command::new("nm").arg("-D").arg(&out).output();
    if let Ok(nm) = nm {
        let syms = String::from_utf8_lossy(&nm.stdout);
        assert!(syms.contains("cachalot_torch_install"), "{syms}");
        assert!(syms.contains("cachalot_torch_installed"), "{syms}");
    }
}
