//! Streams the caller owns (added for the C ABI, `cachalot-capi`): finding a
//! stream of the table by its native handle, and adding a CUDA stream made
//! elsewhere (e.g. by PyTorch) to the table.

use super::{AnyAllocator, DeviceAllocator, Engine, Stream};
use crate::backend::FacadeBackend;

impl DeviceAllocator {
    /// The stream of this device's table whose native handle
    /// ([`Self::stream_handle`]) is `handle`, if there is one. The default
    /// stream (slot 0) is found first.
    pub fn stream_by_handle(&self, handle: u64) -> Option<Stream> {
        let slot = dispatch!(&self.inner, e => e
            .streams
            .read()
            .iter()
            .position(|s| handle_of(e, *s) == handle));
        slot.map(|slot| Stream {
            device: self.index,
            slot: slot as u32,
        })
    }

    /// Adds a CUDA stream that the caller made and keeps alive (a PyTorch
    /// stream, say) to this device's stream table and returns its handle;
    /// a stream already in the table returns its existing handle. The
    /// allocator never destroys it. Errors when the backend is not CUDA.
    ///
    /// Build the [`cachalot_cuda::CudaStream`] with the unsafe
    /// [`cachalot_cuda::CudaBackend::wrap_stream`]: the stream must outlive
    /// every use of the returned [`Stream`] by this allocator.
    #[cfg(feature = "cuda")]
    pub fn adopt_cuda_stream(
        &self,
        stream: cachalot_cuda::CudaStream,
    ) -> Result<Stream, cachalot_core::Error> {
        let AnyAllocator::Cuda(e) = &self.inner else {
            return Err(cachalot_core::Error::InvalidArgument(format!(
                "cannot adopt a CUDA stream on a {} device",
                self.kind
            )));
        };
        let mut table = e.streams.write();
        let slot = match table.iter().position(|s| *s == stream) {
            Some(i) => i,
            None => {
                table.push(stream);
                table.len() - 1
            }
        };
        let slot = u32::try_from(slot)
            .map_err(|_| cachalot_core::Error::InvalidArgument("too many streams".into()))?;
        Ok(Stream {
            device: self.index,
            slot,
        })
    }
}

fn handle_of<B: FacadeBackend>(_: &Engine<B>, s: B::Stream) -> u64 {
    B::stream_handle(s)
}
