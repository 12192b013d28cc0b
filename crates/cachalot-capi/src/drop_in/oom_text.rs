//! The out-of-memory message of the drop-in: PyTorch's text first, word
//! for word as its caching allocator writes it (PyTorch's tests, HF
//! accelerate and Lightning match on it), then cachalot's report.

use cachalot::Error;
use cachalot::core::error::{OomReport, format_size};

use crate::Failure;

/// PyTorch's own text for a request of 2^60 bytes or more.
pub const OVER_1EB: &str = "CUDA out of memory. Tried to allocate more than 1EB memory.";

/// PyTorch's message for the failed allocation `r` describes
/// (`DeviceCachingAllocator::malloc`, PyTorch 2.11): "Tried to allocate"
/// names the segment size tried. The per-process part that PyTorch reads
/// from NVML is left out (as PyTorch does without NVML).
pub fn pytorch_text(r: &OomReport) -> String {
    let allowed = r
        .allowed
        .map_or_else(String::new, |a| format!("{} allowed; ", format_size(a)));
    // `allocated` counts the free blocks cached in private pools, as PyTorch's
    // "allocated by PyTorch" does
    let private = if r.private_pool_cached > 0 {
        format!(
            "with {} allocated in private pools (e.g., CUDA Graphs), ",
            format_size(r.private_pool_cached)
        )
    } else {
        String::new()
    };
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} \
         is free. {allowed}Of the allocated memory {} is allocated by PyTorch, {private}and {} is \
         reserved by PyTorch but unallocated. If reserved but unallocated memory is large try \
         setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
         documentation for Memory Management  \
         (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
        format_size(r.segment_size),
        r.device,
        format_size(r.total),
        format_size(r.device_free),
        format_size(r.allocated),
        format_size(r.reserved.saturating_sub(r.allocated)),
    )
}

/// The drop-in's failure for `e`: an out-of-memory error gets PyTorch's
/// text, then "cachalot: " and cachalot's report on the next line; any
/// other error is unchanged.
pub fn failure(e: Error) -> Failure {
    let message = match &e {
        Error::OutOfMemory(r) => Some(format!("{}\ncachalot: {r}", pytorch_text(r))),
        Error::NeverFits {
            report: Some(r), ..
        } => Some(format!("{}\ncachalot: {e}", pytorch_text(r))),
        Error::NeverFits { report: None, .. } => Some(OVER_1EB.to_string()),
        _ => None,
    };
    let mut f = Failure::from(e);
    if let Some(m) = message {
        f.message = m;
    }
    f
}
