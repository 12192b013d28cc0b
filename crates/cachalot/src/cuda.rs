//! The CUDA backend (`cachalot-cuda`) and its `cudarc` interop.
//!
//! Everything of [`cachalot_cuda`] is here: the backend ([`CudaBackend`],
//! streams, events, graphs) and the interop for Rust programs written with
//! [`cudarc`] (re-exported, so the versions match):
//!
//! * [`CudaAllocator`]: a caching allocator opened on the program's own
//!   `Arc<CudaContext>` (no second context), allocating on its
//!   `Arc<CudaStream>`s;
//! * [`Slice<T>`], with [`View`] / [`ViewMut`] sub-slices: typed buffers that
//!   implement cudarc's `DeviceSlice<T>`, `DevicePtr<T>` and `DevicePtrMut<T>`,
//!   so `memcpy_htod`, `memcpy_dtoh`, `memset_zeros`, cuBLAS calls and
//!   `launch_builder(..).arg(&buf)` take them unchanged.
//!
//! ```no_run
//! use cachalot::cuda::{CudaAllocator, cudarc::driver::CudaContext};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = CudaContext::new(0)?; // the program's own context
//! let (compute, copy) = (ctx.new_stream()?, ctx.new_stream()?);
//! let alloc = CudaAllocator::new(&ctx)?; // cachalot on that context
//! alloc.register_stream(&copy)?; // uses on `copy` will be recorded
//! let mut x = alloc.alloc_zeros::<f32>(&compute, 1 << 20)?; // owned by `compute`
//! copy.memcpy_htod(&vec![1.0f32; 1 << 20], &mut x)?; // a use on `copy`: recorded
//! compute.join(&copy)?; // ordering stays the program's
//! let host = compute.clone_dtoh(&x)?; // any cudarc call takes the Slice
//! drop(x); // back to the cache, stream-ordered, no synchronization
//! assert_eq!(host[0], 1.0);
//! # Ok(())
//! # }
//! ```
//!
//! The stream-safety rules are those of [`cachalot_cuda::interop`]: a use
//! on a stream other than the buffer's own is recorded (`record_stream`)
//! when cudarc asks for the pointer on that stream; dropping returns the
//! block to the cache stream-ordered with no synchronization; a kernel
//! launch counts as a use on the buffer's own stream (call
//! [`Slice::record_stream`] before launching it elsewhere); cross-stream
//! ordering is the program's, as in PyTorch.

pub use cachalot_cuda::*;

#[cfg(test)]
mod tests {
    /// The code lines of the first ```rust block after `heading` in `text`
    /// (doc-comment markers and trailing `//` comments removed).
    fn code_after(text: &str, heading: &str) -> Vec<String> {
        let start = text.find(heading).expect("heading present");
        text[start..]
            .lines()
            .map(|l| l.trim_start().trim_start_matches("//!").trim())
            .skip_while(|l| !l.starts_with("```"))
            .skip(1)
            .take_while(|l| !l.starts_with("```"))
            .map(|l| l.split(" //").next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    /// The cudarc example of docs/rust.md is this module's compiled doc
    /// test: every code line of it appears there.
    #[test]
    fn readme_example_is_the_compiled_doc_test() {
        let readme = code_after(include_str!("../../../docs/rust.md"), "## cudarc programs");
        let doc = code_after(include_str!("cuda.rs"), "//! * [`CudaAllocator`]");
        assert!(readme.len() >= 9, "{readme:?}");
        for line in &readme {
            assert!(
                doc.contains(line),
                "docs/rust.md line not in the doc test: {line}\n{doc:?}"
            );
        }
    }
}
