//! Allocating on two streams with the global allocator of the (mock) device:
//! a producer stream fills buffers that a consumer stream reads, so each
//! buffer is marked with `record_stream` before it is dropped; then the
//! statistics and the `torch.cuda.memory_summary()`-style table.
//!
//! Run with `cargo run -p cachalot --example two_streams` (set
//! `CACHALOT_BACKEND=cuda` and build with `--features cuda` for a GPU).

use cachalot::{BackendKind, DeviceBuffer, accelerator};

fn main() -> Result<(), cachalot::Error> {
    // The mock unless CACHALOT_BACKEND names another compiled-in backend.
    if std::env::var_os(cachalot::BACKEND_ENV).is_none() {
        cachalot::init(BackendKind::Mock)?;
    }
    println!(
        "backend: {}, devices: {}",
        cachalot::backend_kind()?,
        accelerator::device_count()?
    );

    let producer = cachalot::default_stream(None);
    let consumer = cachalot::new_stream(None)?;

    let mut kept = Vec::new();
    for step in 0..8u64 {
        // Activations on the producer stream, read by the consumer stream.
        let act = DeviceBuffer::on_stream((step + 1) << 20, producer)?;
        act.record_stream(consumer)?;
        // A small scratch buffer on the consumer stream.
        let scratch = DeviceBuffer::on_stream(4096 + step * 512, consumer)?;
        if step % 3 == 0 {
            kept.push(act);
        }
        drop(scratch);
    }
    println!(
        "allocated {} B (peak {} B), reserved {} B (peak {} B), {} buffers kept",
        accelerator::memory_allocated(None)?,
        accelerator::max_memory_allocated(None)?,
        accelerator::memory_reserved(None)?,
        accelerator::max_memory_reserved(None)?,
        kept.len()
    );
    let stats = accelerator::memory_stats(None)?;
    println!(
        "memory_stats: {} keys; num_device_alloc = {}, active.all.current = {}",
        stats.len(),
        stats["num_device_alloc"],
        stats["active.all.current"]
    );
    print!("{}", cachalot::memory_summary(None, false)?);

    drop(kept);
    accelerator::empty_cache()?;
    println!(
        "after empty_cache: reserved {} B",
        accelerator::memory_reserved(None)?
    );
    Ok(())
}
