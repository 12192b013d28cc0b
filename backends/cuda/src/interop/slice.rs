//! [`Slice`], [`View`] and [`ViewMut`]: typed device memory from a
//! [`CudaAllocator`] and its borrowed ranges, as cudarc's types, and their
//! kernel arguments.

use super::*;

/// `len` elements of `T` in device memory from a [`CudaAllocator`],
/// returned to the cache (stream-ordered, without synchronizing) when
/// dropped. cudarc's `CudaSlice<T>` counterpart: it implements
/// [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`], and kernel launches
/// take `&Slice<T>` / `&mut Slice<T>` as arguments.
pub struct Slice<T> {
    pub(super) core: Core,
    pub(super) len: usize,
    pub(super) _t: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Slice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slice")
            .field("ptr", &format_args!("{:#x}", self.core.ptr))
            .field("len", &self.len)
            .field("stream", &self.core.uses.own())
            .finish()
    }
}

/// The element range `bounds` of a buffer of `len` elements, checked.
pub(super) fn range(bounds: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize), Error> {
    let start = match bounds.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match bounds.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => Err(Error::InvalidArgument(format!(
            "range {:?}..{:?} out of bounds of {len} elements",
            bounds.start_bound(),
            bounds.end_bound()
        ))),
    }
}

/// The device address of element `start` of the buffer at `ptr`.
pub(super) fn offset<T>(ptr: u64, start: usize) -> u64 {
    // In range: `start <= len` and the block holds `len * size_of::<T>()`
    // bytes from `ptr`, so the sum is inside (or one past) the block.
    ptr + (start * size_of::<T>()) as u64
}

impl<T> Slice<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device address (0 for an empty slice). Using it directly
    /// bypasses rule 1: record other streams with [`Slice::record_stream`].
    pub fn raw_ptr(&self) -> u64 {
        self.core.ptr
    }

    /// The stream the slice was allocated on (its own stream).
    pub fn stream(&self) -> &Arc<CudarcStream> {
        &self.core.stream
    }

    /// The allocator the slice came from.
    pub fn allocator(&self) -> &Arc<CudaAllocator> {
        &self.core.alloc
    }

    /// The streams other than its own that the slice was recorded on.
    pub fn recorded_streams(&self) -> Vec<CudaStream> {
        self.core.uses.recorded()
    }

    /// Marks the slice as used on `stream` (PyTorch's
    /// `Tensor.record_stream`): needed before launching a kernel with it on
    /// a stream other than its own (rule 3); copies and cuBLAS calls do it
    /// themselves. Registers the stream. Errors for a stream of another
    /// context.
    pub fn record_stream(&self, stream: &Arc<CudarcStream>) -> Result<(), Error> {
        self.core.record_stream(stream)
    }

    /// A view of the whole slice.
    pub fn as_view(&self) -> View<'_, T> {
        View {
            core: &self.core,
            ptr: self.core.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }

    /// A mutable view of the whole slice.
    pub fn as_view_mut(&mut self) -> ViewMut<'_, T> {
        ViewMut {
            core: &self.core,
            ptr: self.core.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }

    /// The elements `bounds`; an out-of-range one is [`Error::InvalidArgument`].
    pub fn slice(&self, bounds: impl RangeBounds<usize>) -> Result<View<'_, T>, Error> {
        self.as_view().into_slice(bounds)
    }

    /// The elements `bounds`, mutable; out of range is [`Error::InvalidArgument`].
    pub fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> Result<ViewMut<'_, T>, Error> {
        self.as_view_mut().into_slice_mut(bounds)
    }

    /// Two mutable views, `[0, mid)` and `[mid, len)`; `mid > len` is
    /// [`Error::InvalidArgument`].
    pub fn split_at_mut(&mut self, mid: usize) -> Result<(ViewMut<'_, T>, ViewMut<'_, T>), Error> {
        self.as_view_mut().into_split_at_mut(mid)
    }

    /// Frees the slice now, returning any error (dropping it keeps the
    /// error for [`CudaAllocator::take_error`]).
    pub fn free(mut self) -> Result<(), Error> {
        // The drop that follows sees address 0 and frees nothing.
        let p = std::mem::take(&mut self.core.ptr);
        self.core.alloc.engine.free(p)
    }
}

/// `&[T]` in a [`Slice`]: a sub-range, by [`Slice::slice`] / [`Slice::as_view`].
pub struct View<'a, T> {
    core: &'a Core,
    ptr: u64,
    len: usize,
    _t: PhantomData<&'a [T]>,
}

/// `&mut [T]` in a [`Slice`]: by [`Slice::slice_mut`], [`Slice::as_view_mut`],
/// [`Slice::split_at_mut`].
pub struct ViewMut<'a, T> {
    core: &'a Core,
    ptr: u64,
    len: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T> std::fmt::Debug for View<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<T> std::fmt::Debug for ViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewMut")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<'a, T> View<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the view's first element.
    pub fn raw_ptr(&self) -> u64 {
        self.ptr
    }

    /// A sub-view; out of range is [`Error::InvalidArgument`].
    pub fn slice(&self, bounds: impl RangeBounds<usize>) -> Result<View<'a, T>, Error> {
        let (s, e) = range(bounds, self.len)?;
        Ok(View {
            core: self.core,
            ptr: offset::<T>(self.ptr, s),
            len: e - s,
            _t: PhantomData,
        })
    }

    fn into_slice(self, bounds: impl RangeBounds<usize>) -> Result<View<'a, T>, Error> {
        self.slice(bounds)
    }
}

impl<'a, T> ViewMut<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the view's first element.
    pub fn raw_ptr(&self) -> u64 {
        self.ptr
    }

    /// The same elements, read-only.
    pub fn as_view(&self) -> View<'_, T> {
        View {
            core: self.core,
            ptr: self.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }

    /// A mutable sub-view; out of range is [`Error::InvalidArgument`].
    pub fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> Result<ViewMut<'_, T>, Error> {
        let (s, e) = range(bounds, self.len)?;
        Ok(ViewMut {
            core: self.core,
            ptr: offset::<T>(self.ptr, s),
            len: e - s,
            _t: PhantomData,
        })
    }

    fn into_slice_mut(self, bounds: impl RangeBounds<usize>) -> Result<ViewMut<'a, T>, Error> {
        let (s, e) = range(bounds, self.len)?;
        Ok(ViewMut {
            core: self.core,
            ptr: offset::<T>(self.ptr, s),
            len: e - s,
            _t: PhantomData,
        })
    }

    /// Two disjoint mutable views, `[0, mid)` and `[mid, len)`.
    pub fn split_at_mut(&mut self, mid: usize) -> Result<(ViewMut<'_, T>, ViewMut<'_, T>), Error> {
        let (core, ptr, len) = (self.core, self.ptr, self.len);
        ViewMut::<T> {
            core,
            ptr,
            len,
            _t: PhantomData,
        }
        .into_split_at_mut(mid)
    }

    fn into_split_at_mut(self, mid: usize) -> Result<(ViewMut<'a, T>, ViewMut<'a, T>), Error> {
        if mid > self.len {
            return Err(Error::InvalidArgument(format!(
                "split at {mid} out of bounds of {} elements",
                self.len
            )));
        }
        let left = ViewMut {
            core: self.core,
            ptr: self.ptr,
            len: mid,
            _t: PhantomData,
        };
        let right = ViewMut {
            core: self.core,
            ptr: offset::<T>(self.ptr, mid),
            len: self.len - mid,
            _t: PhantomData,
        };
        Ok((left, right))
    }
}

macro_rules! cudarc_traits {
    ($ty:ident $(<$l:lifetime>)?) => {
        impl<$($l,)? T> DeviceSlice<T> for $ty<$($l,)? T> {
            fn len(&self) -> usize {
                self.len
            }
            fn stream(&self) -> &Arc<CudarcStream> {
                &self.core_ref().stream
            }
        }

        impl<$($l,)? T> DevicePtr<T> for $ty<$($l,)? T> {
            fn device_ptr<'s>(
                &'s self,
                stream: &'s CudarcStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'s>) {
                (self.ptr_value(), self.core_ref().on_use(stream))
            }
        }
    };
}

macro_rules! cudarc_mut_traits {
    ($ty:ident $(<$l:lifetime>)?) => {
        impl<$($l,)? T> DevicePtrMut<T> for $ty<$($l,)? T> {
            fn device_ptr_mut<'s>(
                &'s mut self,
                stream: &'s CudarcStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'s>) {
                (self.ptr_value(), self.core_ref().on_use(stream))
            }
        }
    };
}

impl<T> Slice<T> {
    fn core_ref(&self) -> &Core {
        &self.core
    }
    fn ptr_value(&self) -> u64 {
        self.core.ptr
    }
}
impl<T> View<'_, T> {
    fn core_ref(&self) -> &Core {
        self.core
    }
    fn ptr_value(&self) -> u64 {
        self.ptr
    }
}
impl<T> ViewMut<'_, T> {
    fn core_ref(&self) -> &Core {
        self.core
    }
    fn ptr_value(&self) -> u64 {
        self.ptr
    }
}

cudarc_traits!(Slice);
cudarc_traits!(View<'v>);
cudarc_traits!(ViewMut<'v>);
cudarc_mut_traits!(Slice);
cudarc_mut_traits!(ViewMut<'v>);

// Kernel arguments: the device address, pushed as cudarc pushes a
// `CudaSlice`'s (a pointer to a `CUdeviceptr` that lives as long as the
// borrow). A launch counts as a use on the buffer's own stream (rule 3).

// SAFETY: the pushed pointer is to `arg.core.ptr`, a `u64` (`CUdeviceptr`)
// inside the slice, borrowed for `'b`, which outlives the builder (`'b: 'a`),
// so it stays valid until the launch reads it.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b Slice<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b Slice<T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.core.ptr)
    }
}

// SAFETY: as for `&Slice<T>`, through a unique borrow.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut Slice<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut Slice<T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.core.ptr)
    }
}

// SAFETY: the pushed pointer is to the view's `ptr` field, borrowed for
// `'b: 'a`, so it outlives the builder.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b View<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b View<'c, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}

// SAFETY: as for `&View`, through a unique borrow.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut ViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut ViewMut<'c, T>) -> &mut Self {
        <Self as PushKernelArg<&'b u64>>::arg(self, &arg.ptr)
    }
}
