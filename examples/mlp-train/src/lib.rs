//! A real Rust GPU workload on `cudarc`, run three ways with the same
//! numbers out: cudarc's own allocation (`CudaStream::alloc`, i.e.
//! `cuMemAllocAsync`), plain `cuMemAlloc`/`cuMemFree` per tensor, and
//! cachalot ([`cachalot::cuda::CudaAllocator`]).
//!
//! The workload: an MLP (ReLU hidden layers, softmax cross-entropy) trained
//! with SGD, forward and backward with cuBLAS SGEMMs and NVRTC-compiled
//! kernels, on batches whose size changes every step, so that every step
//! allocates a few dozen temporaries of varying sizes (activations,
//! gradients, per-row losses) and frees each as soon as it is dead, as an
//! autograd engine does. Two streams: the *copy* stream allocates each
//! batch and copies it in (one step ahead), the *compute* stream waits for
//! it and runs the step, so batch buffers are used on a stream other than
//! their own.
//!
//! Determinism: the kernels have no atomics and sum in a fixed order, the
//! GEMMs run on one cuBLAS handle on one stream, and every way sees the
//! same inputs, so the per-step losses must be bit-identical across ways
//! ([`losses_identical`]).

use std::cell::Cell;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cachalot::core::rng::SplitMix64;
use cachalot::cuda::CudaAllocator;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceSlice, LaunchConfig, PushKernelArg, SyncOnDrop, sys,
};

/// An error of the workload: a driver, cuBLAS, NVRTC or cachalot error,
/// or a bad setting, with what was being done.
#[derive(Debug)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

/// Result of the workload.
pub type Result<T> = std::result::Result<T, RunError>;

fn err<E: fmt::Display>(what: &'static str) -> impl FnOnce(E) -> RunError {
    move |e| RunError(format!("{what}: {e}"))
}

/// The NVRTC source of the kernels.
pub const KERNELS: &str = r#"
extern "C" __global__ void bias_act(float* y, const float* b, int rows, int cols, int relu) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    float v = y[i] + b[i % cols];
    y[i] = (relu && v < 0.0f) ? 0.0f : v;
}
extern "C" __global__ void relu_bwd(float* g, const float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && a[i] <= 0.0f) g[i] = 0.0f;
}
extern "C" __global__ void col_sum(const float* g, float* out, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++) s += g[r * cols + c];
    out[c] = s;
}
extern "C" __global__ void softmax_xent(const float* logits, const float* labels, float* grad,
                                        float* row_loss, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* x = logits + r * cols;
    float m = -3.0e38f;
    for (int c = 0; c < cols; c++) m = fmaxf(m, x[c]);
    float s = 0.0f;
    for (int c = 0; c < cols; c++) s += expf(x[c] - m);
    int lab = (int)labels[r];
    row_loss[r] = logf(s) - (x[lab] - m);
    float inv = 1.0f / (float)rows;
    for (int c = 0; c < cols; c++) {
        float p = expf(x[c] - m) / s;
        grad[r * cols + c] = (p - (c == lab ? 1.0f : 0.0f)) * inv;
    }
}
extern "C" __global__ void mean_into(const float* v, int n, float* out, int idx) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += v[i];
    out[idx] = s / (float)n;
}
extern "C" __global__ void sgd(float* w, const float* g, float lr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] -= lr * g[i];
}
"#;

/// The kernel names of [`KERNELS`].
pub const KERNEL_NAMES: [&str; 6] = [
    "bias_act",
    "relu_bwd",
    "col_sum",
    "softmax_xent",
    "mean_into",
    "sgd",
];

/// The workload's shape and length.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Layer widths: input, hidden..., classes (at least two entries).
    pub widths: Vec<usize>,
    /// Batch sizes, cycled one per step.
    pub batches: Vec<usize>,
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub steps: usize,
    /// Extra steps after the timed ones that sample the driver's free
    /// memory after every allocation (the peak-memory pass): at least one
    /// cycle of `batches`, so that every batch size, the largest
    /// included, is in it (a way that gives memory back at every
    /// synchronization, as the driver's pool does, would otherwise show
    /// the peak of the smaller batches only).
    pub memory_steps: usize,
    /// SGD learning rate.
    pub lr: f32,
    /// Seed of the weights and data.
    pub seed: u64,
}

/// Most elements one buffer of the workload may have (`i32` kernel indices).
pub const MAX_ELEMENTS: usize = i32::MAX as usize;

impl Config {
    /// The measured configuration: five layers up to 4096 wide, batches
    /// of 256 to 1024 rows.
    pub fn standard() -> Self {
        Self {
            widths: vec![1024, 4096, 2048, 2048, 1024, 512],
            batches: vec![512, 768, 256, 1024, 640, 384, 896, 320],
            warmup: 8,
            steps: 40,
            memory_steps: 8,
            lr: 0.05,
            seed: 0x5eed,
        }
    }

    /// A small configuration for tests.
    pub fn tiny() -> Self {
        Self {
            widths: vec![64, 96, 48, 16],
            batches: vec![32, 17, 48],
            warmup: 2,
            steps: 4,
            memory_steps: 3,
            lr: 0.1,
            seed: 7,
        }
    }

    /// Checks the configuration (sizes bounded, counts non-zero).
    pub fn validate(&self) -> Result<()> {
        if self.widths.len() < 2 || self.widths.contains(&0) {
            return Err(RunError(format!(
                "widths must have at least two non-zero entries: {:?}",
                self.widths
            )));
        }
        if self.batches.is_empty() || self.batches.contains(&0) {
            return Err(RunError(format!(
                "batches must be non-zero: {:?}",
                self.batches
            )));
        }
        if self.steps == 0 {
            return Err(RunError("steps must be at least 1".into()));
        }
        if self.memory_steps < self.batches.len() {
            return Err(RunError(format!(
                "memory_steps ({}) must cover every batch size ({} of them)",
                self.memory_steps,
                self.batches.len()
            )));
        }
        let wmax = self.widths.iter().max().copied().unwrap_or(0);
        let bmax = self.batches.iter().max().copied().unwrap_or(0);
        let too_big = |a: usize, b: usize| a.checked_mul(b).is_none_or(|n| n > MAX_ELEMENTS);
        if too_big(wmax, wmax) || too_big(wmax, bmax) {
            return Err(RunError(format!(
                "a buffer of {wmax} x {} elements exceeds {MAX_ELEMENTS}",
                wmax.max(bmax)
            )));
        }
        if !self.lr.is_finite() {
            return Err(RunError("lr must be finite".into()));
        }
        Ok(())
    }

    /// All steps run (warm-up, timed, memory pass).
    pub fn total_steps(&self) -> usize {
        self.warmup + self.steps + self.memory_steps
    }

    /// The batch size of step `i`.
    pub fn batch(&self, i: usize) -> usize {
        self.batches[i % self.batches.len()]
    }

    /// Number of classes (the last width).
    pub fn classes(&self) -> usize {
        self.widths[self.widths.len() - 1]
    }
}

/// A small deterministic generator (cachalot's [`SplitMix64`]).
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The initial weights and biases, layer by layer (scaled uniform).
pub fn init_params(cfg: &Config) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut rng = Rng::new(cfg.seed);
    cfg.widths
        .windows(2)
        .map(|w| {
            let scale = (3.0 / w[0] as f32).sqrt();
            let weights = (0..w[0] * w[1]).map(|_| rng.uniform() * scale).collect();
            let bias = (0..w[1]).map(|_| rng.uniform() * 0.01).collect();
            (weights, bias)
        })
        .collect()
}

/// One batch: row-major inputs (`rows x widths[0]`) and labels (class
/// index as `f32`): the label of a row is the argmax of its first
/// `classes` inputs, which the network can learn.
pub fn batch_data(cfg: &Config, step: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = cfg.batch(step);
    let d = cfg.widths[0];
    let classes = cfg.classes().min(d);
    let mut rng = Rng::new(cfg.seed ^ (step as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let x: Vec<f32> = (0..rows * d).map(|_| rng.uniform()).collect();
    let labels = x
        .chunks(d)
        .map(|row| {
            let mut best = 0;
            for c in 1..classes {
                if row[c] > row[best] {
                    best = c;
                }
            }
            best as f32
        })
        .collect();
    (x, labels)
}

/// Host time spent in allocation and free calls, and how many, for one way.
#[derive(Debug, Default)]
pub struct AllocClock {
    nanos: Cell<u64>,
    calls: Cell<u64>,
    pending: Cell<Option<Instant>>,
    sample: Cell<bool>,
    min_free: Cell<usize>,
    /// The lowest free figure within the current memory step.
    step_min_free: Cell<usize>,
}

impl AllocClock {
    fn add(&self, d: Duration) {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.set(self.nanos.get().saturating_add(n));
        self.calls.set(self.calls.get() + 1);
    }

    /// (host time, calls) so far, then zero.
    pub fn take(&self) -> (Duration, u64) {
        let r = (Duration::from_nanos(self.nanos.get()), self.calls.get());
        self.nanos.set(0);
        self.calls.set(0);
        r
    }

    fn sample_free(&self) {
        if self.sample.get()
            && let Ok((free, _)) = cudarc::driver::result::mem_get_info()
        {
            self.min_free.set(self.min_free.get().min(free));
            self.step_min_free.set(self.step_min_free.get().min(free));
        }
    }
}

/// A buffer of one way with its allocation clock: dropping it adds the
/// time of the inner buffer's drop (its free) to the clock.
pub struct Timed<B> {
    inner: B,
    _tail: Tail,
}

struct Tail(Rc<AllocClock>);

impl<B> Drop for Timed<B> {
    fn drop(&mut self) {
        // `inner` is dropped right after this, then `_tail` reads the clock.
        self._tail.0.pending.set(Some(Instant::now()));
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        if let Some(t) = self.0.pending.take() {
            self.0.add(t.elapsed());
        }
    }
}

impl<B: DeviceSlice<f32>> DeviceSlice<f32> for Timed<B> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.inner.stream()
    }
}

impl<B: DevicePtr<f32>> DevicePtr<f32> for Timed<B> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.inner.device_ptr(stream)
    }
}

impl<B: DevicePtrMut<f32>> DevicePtrMut<f32> for Timed<B> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.inner.device_ptr_mut(stream)
    }
}

/// One way of allocating device memory for the workload.
pub trait Way {
    /// Its buffer of `f32`s.
    type Buf: DevicePtr<f32> + DevicePtrMut<f32>;
    /// Its name in the report.
    fn name(&self) -> &'static str;
    /// `len` uninitialized `f32`s for use on `stream` (every buffer of the
    /// workload is written before it is read).
    fn alloc(&self, stream: &Arc<CudaStream>, len: usize) -> Result<Self::Buf>;
    /// Called before the way's run (after the baseline free memory is read).
    fn prepare(&self, _ctx: &Arc<CudaContext>) -> Result<()> {
        Ok(())
    }
    /// Called after the way's run, its buffers dropped and the context
    /// synchronized.
    fn finish(&self, _ctx: &Arc<CudaContext>) -> Result<()> {
        Ok(())
    }
    /// Cachalot's own figures, for the cachalot way: (peak reserved,
    /// peak allocated, device allocation calls).
    fn cachalot_stats(&self) -> Option<(i64, i64, i64)> {
        None
    }
}

/// cudarc's own allocation: `CudaStream::alloc` (`cuMemAllocAsync` from the
/// device's default pool, with cudarc's read/write events per buffer).
/// With `retain`, the pool's release threshold is raised to "never" for
/// the run (by default, 0, the pool gives its memory back to the device
/// at every synchronization), then restored and the pool trimmed.
pub struct CudarcWay {
    /// Keep the pool's memory across synchronizations.
    pub retain: bool,
}

/// Sets the release threshold of the default memory pool of `ctx`'s
/// device, and trims the pool when it is 0.
fn set_release_threshold(ctx: &Arc<CudaContext>, bytes: u64) -> Result<()> {
    ctx.bind_to_thread().map_err(err("binding the context"))?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and the context's own device.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(err("cuDeviceGetDefaultMemPool"))?;
    let mut value = bytes;
    // SAFETY: the release threshold attribute takes a pointer to a
    // cuuint64_t, valid for the call; `pool` is the device's default pool.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut value).cast(),
        )
    }
    .result()
    .map_err(err("cuMemPoolSetAttribute"))?;
    if bytes == 0 {
        // SAFETY: trimming the default pool to nothing; no pointers.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) }
            .result()
            .map_err(err("cuMemPoolTrimTo"))?;
    }
    Ok(())
}

impl Way for CudarcWay {
    type Buf = CudaSlice<f32>;
    fn name(&self) -> &'static str {
        if self.retain {
            "cudarc-retain"
        } else {
            "cudarc"
        }
    }
    fn alloc(&self, stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<f32>> {
        // SAFETY: the workload writes every buffer before reading it.
        unsafe { stream.alloc::<f32>(len) }.map_err(err("cuMemAllocAsync"))
    }
    fn prepare(&self, ctx: &Arc<CudaContext>) -> Result<()> {
        if self.retain {
            set_release_threshold(ctx, u64::MAX)?;
        }
        Ok(())
    }
    fn finish(&self, ctx: &Arc<CudaContext>) -> Result<()> {
        if self.retain {
            set_release_threshold(ctx, 0)?;
        }
        Ok(())
    }
}

/// Plain `cuMemAlloc` per tensor; freed with a context synchronization and
/// `cuMemFree` (what `cuMemFree` implies for memory still in use).
pub struct PlainWay;

/// A buffer of [`PlainWay`].
pub struct PlainBuf {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
}

impl DeviceSlice<f32> for PlainBuf {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl DevicePtr<f32> for PlainBuf {
    fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl DevicePtrMut<f32> for PlainBuf {
    fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl Drop for PlainBuf {
    fn drop(&mut self) {
        let ctx = self.stream.context();
        ctx.record_err(ctx.synchronize());
        // SAFETY: `ptr` came from cuMemAlloc and is freed once, after every
        // stream of the context finished its work (synchronized above).
        ctx.record_err(unsafe { cudarc::driver::result::free_sync(self.ptr) });
    }
}

impl Way for PlainWay {
    type Buf = PlainBuf;
    fn name(&self) -> &'static str {
        "cuMemAlloc"
    }
    fn alloc(&self, stream: &Arc<CudaStream>, len: usize) -> Result<PlainBuf> {
        stream
            .context()
            .bind_to_thread()
            .map_err(err("binding the context"))?;
        let bytes = len.checked_mul(4).ok_or_else(|| RunError("size".into()))?;
        // SAFETY: plain allocation; the address is owned by the PlainBuf.
        let ptr =
            unsafe { cudarc::driver::result::malloc_sync(bytes) }.map_err(err("cuMemAlloc"))?;
        Ok(PlainBuf {
            ptr,
            len,
            stream: Arc::clone(stream),
        })
    }
}

/// cachalot's caching allocator on the program's context, with the name
/// it has in the report.
pub struct CachalotWay {
    /// The allocator.
    pub alloc: Arc<CudaAllocator>,
    /// The way's name (e.g. `cachalot`, `cachalot-expandable`).
    pub name: &'static str,
}

impl Way for CachalotWay {
    type Buf = cachalot::cuda::Slice<f32>;
    fn name(&self) -> &'static str {
        self.name
    }
    fn alloc(&self, stream: &Arc<CudaStream>, len: usize) -> Result<Self::Buf> {
        // SAFETY: the workload writes every buffer before reading it.
        unsafe { self.alloc.alloc::<f32>(stream, len) }.map_err(err("cachalot alloc"))
    }
    fn cachalot_stats(&self) -> Option<(i64, i64, i64)> {
        let s = self.alloc.stats();
        Some((
            s.reserved_bytes.0[0].peak,
            s.allocated_bytes.0[0].peak,
            s.num_device_alloc,
        ))
    }
}

/// What the run shares across ways: the context, the two streams, cuBLAS
/// on the compute stream and the compiled kernels.
pub struct Gpu {
    /// The program's context.
    pub ctx: Arc<CudaContext>,
    /// The compute stream.
    pub compute: Arc<CudaStream>,
    /// The copy stream.
    pub copy: Arc<CudaStream>,
    blas: CudaBlas,
    _module: Arc<CudaModule>,
    k: Kernels,
}

struct Kernels {
    bias_act: CudaFunction,
    relu_bwd: CudaFunction,
    col_sum: CudaFunction,
    softmax_xent: CudaFunction,
    mean_into: CudaFunction,
    sgd: CudaFunction,
}

/// Why the GPU cannot be used here (no driver, no device, no cuBLAS or
/// NVRTC library), or `None` when it can. Loads nothing that panics: every
/// library is probed with cudarc's `is_culib_present` first.
pub fn gpu_unavailable() -> Option<String> {
    // SAFETY: each probe only tries to dlopen the library's candidate names.
    let (cuda, blas, rtc) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
        )
    };
    if !cuda {
        return Some("the CUDA driver library (libcuda) is not loadable".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return Some("the CUDA driver reports no device".into()),
        Err(e) => return Some(format!("cuInit / cuDeviceGetCount failed: {e}")),
    }
    if !blas {
        return Some(
            "libcublas is not loadable under the names cudarc tries (libcublas.so, libcublas.so.12, ...; see scripts/device/cudarc_example.sh)".into(),
        );
    }
    if !rtc {
        return Some(
            "libnvrtc is not loadable under the names cudarc tries (libnvrtc.so, libnvrtc.so.12, ...; see scripts/device/cudarc_example.sh)".into(),
        );
    }
    None
}

impl Gpu {
    /// Opens device 0 with two streams, cuBLAS and the kernels. Call
    /// [`gpu_unavailable`] first: cudarc panics on a missing library.
    pub fn open() -> Result<Self> {
        if let Some(why) = gpu_unavailable() {
            return Err(RunError(why));
        }
        let ctx = CudaContext::new(0).map_err(err("CudaContext::new(0)"))?;
        let compute = ctx.new_stream().map_err(err("new_stream"))?;
        let copy = ctx.new_stream().map_err(err("new_stream"))?;
        let blas = CudaBlas::new(Arc::clone(&compute)).map_err(err("cublasCreate"))?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(err("NVRTC compile"))?;
        let module = ctx.load_module(ptx).map_err(err("cuModuleLoadData"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| RunError(format!("kernel {name}: {e}")))
        };
        let k = Kernels {
            bias_act: f("bias_act")?,
            relu_bwd: f("relu_bwd")?,
            col_sum: f("col_sum")?,
            softmax_xent: f("softmax_xent")?,
            mean_into: f("mean_into")?,
            sgd: f("sgd")?,
        };
        Ok(Self {
            ctx,
            compute,
            copy,
            blas,
            _module: module,
            k,
        })
    }

    /// The driver's free device memory now.
    pub fn free_memory(&self) -> Result<usize> {
        self.ctx
            .mem_get_info()
            .map(|(free, _)| free)
            .map_err(err("cuMemGetInfo"))
    }
}

fn cfg1d(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(u32::try_from(n).unwrap_or(u32::MAX).min(i32::MAX as u32))
}

fn int(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The buffers of one way, with its clock.
struct Mem<'w, W: Way> {
    way: &'w W,
    clock: Rc<AllocClock>,
}

impl<W: Way> Mem<'_, W> {
    fn alloc(&self, stream: &Arc<CudaStream>, len: usize) -> Result<Timed<W::Buf>> {
        let t = Instant::now();
        let inner = self.way.alloc(stream, len)?;
        self.clock.add(t.elapsed());
        self.clock.sample_free();
        Ok(Timed {
            inner,
            _tail: Tail(Rc::clone(&self.clock)),
        })
    }
}

/// y = a · w (row-major: a is rows x k, w is k x n, y is rows x n).
fn gemm_fwd<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
    g: &Gpu,
    a: &A,
    w: &B,
    y: &mut C,
    rows: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: int(n),
        n: int(rows),
        k: int(k),
        alpha: 1.0f32,
        lda: int(n),
        ldb: int(k),
        beta: 0.0f32,
        ldc: int(n),
    };
    // SAFETY: the shapes match the buffers' lengths (rows*k, k*n, rows*n).
    unsafe { g.blas.gemm(cfg, w, a, y) }.map_err(err("cublasSgemm (forward)"))
}

/// da = g · wᵀ (g: rows x n, w: k x n... here w is k x n row-major, da rows x k).
fn gemm_dx<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
    gpu: &Gpu,
    g: &A,
    w: &B,
    da: &mut C,
    rows: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: int(k),
        n: int(rows),
        k: int(n),
        alpha: 1.0f32,
        lda: int(n),
        ldb: int(n),
        beta: 0.0f32,
        ldc: int(k),
    };
    // SAFETY: the shapes match the buffers' lengths (rows*n, k*n, rows*k).
    unsafe { gpu.blas.gemm(cfg, w, g, da) }.map_err(err("cublasSgemm (dX)"))
}

/// dw = aᵀ · g (a: rows x k, g: rows x n, dw: k x n).
fn gemm_dw<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
    gpu: &Gpu,
    a: &A,
    g: &B,
    dw: &mut C,
    rows: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_T,
        m: int(n),
        n: int(k),
        k: int(rows),
        alpha: 1.0f32,
        lda: int(n),
        ldb: int(k),
        beta: 0.0f32,
        ldc: int(n),
    };
    // SAFETY: the shapes match the buffers' lengths (rows*n, rows*k, k*n).
    unsafe { gpu.blas.gemm(cfg, g, a, dw) }.map_err(err("cublasSgemm (dW)"))
}

fn launch_err(name: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> RunError {
    move |e| RunError(format!("launching {name}: {e}"))
}

/// The per-way model: parameters in the way's buffers.
struct Model<B> {
    params: Vec<(B, B)>,
}

/// The timings and figures of one way.
#[derive(Clone, Debug, PartialEq)]
pub struct WayReport {
    /// The way's name.
    pub way: &'static str,
    /// Wall time of each timed step (from its start to the compute
    /// stream's synchronization at its end).
    pub step_times: Vec<Duration>,
    /// Host time in allocation and free calls over the timed steps.
    pub alloc_time: Duration,
    /// Allocation plus free calls over the timed steps.
    pub alloc_calls: u64,
    /// Peak device memory from the driver's free-memory figure during the
    /// memory pass (baseline free minus the lowest free seen), weights
    /// included.
    pub driver_peak: u64,
    /// The same figure for each step of the memory pass: (batch rows,
    /// bytes), so that a way's peak can be compared batch size by batch
    /// size.
    pub driver_peak_by_step: Vec<(usize, u64)>,
    /// cachalot's own peak reserved / allocated bytes and device calls.
    pub cachalot: Option<(i64, i64, i64)>,
    /// The loss of every step (warm-up, timed, memory pass).
    pub losses: Vec<f32>,
}

/// Summary statistics of a sample of durations, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// 10th percentile.
    pub p10: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// Median and spread (nearest-rank percentiles) of `times`; `None` when empty.
pub fn spread(times: &[Duration]) -> Option<Spread> {
    if times.is_empty() {
        return None;
    }
    let mut ms: Vec<f64> = times.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    let rank = |p: f64| ms[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let median = if n % 2 == 1 {
        ms[n / 2]
    } else {
        (ms[n / 2 - 1] + ms[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        p10: rank(0.1),
        p90: rank(0.9),
        min: ms[0],
        max: ms[n - 1],
    })
}

/// Whether every report has bit-identical losses to the first; the first
/// step where two differ otherwise.
pub fn losses_identical(reports: &[WayReport]) -> std::result::Result<(), String> {
    let Some(first) = reports.first() else {
        return Ok(());
    };
    for r in &reports[1..] {
        if r.losses.len() != first.losses.len() {
            return Err(format!(
                "{} ran {} steps, {} ran {}",
                first.way,
                first.losses.len(),
                r.way,
                r.losses.len()
            ));
        }
        if let Some(i) =
            (0..r.losses.len()).find(|&i| r.losses[i].to_bits() != first.losses[i].to_bits())
        {
            return Err(format!(
                "step {i}: {} has loss {:e}, {} has {:e}",
                first.way, first.losses[i], r.way, r.losses[i]
            ));
        }
    }
    Ok(())
}

/// Runs the workload the way `way` and reports its figures.
pub fn run_way<W: Way>(
    gpu: &Gpu,
    way: &W,
    cfg: &Config,
    data: &[(Vec<f32>, Vec<f32>)],
) -> Result<WayReport> {
    cfg.validate()?;
    if data.len() < cfg.total_steps() {
        return Err(RunError(format!(
            "{} batches given for {} steps",
            data.len(),
            cfg.total_steps()
        )));
    }
    gpu.ctx.synchronize().map_err(err("synchronize"))?;
    let baseline = gpu.free_memory()?;
    let clock = Rc::new(AllocClock {
        min_free: Cell::new(baseline),
        step_min_free: Cell::new(baseline),
        ..AllocClock::default()
    });
    way.prepare(&gpu.ctx)?;
    let mem = Mem {
        way,
        clock: Rc::clone(&clock),
    };
    let (s, copy) = (&gpu.compute, &gpu.copy);
    // Parameters and the loss log: allocated once, on the compute stream.
    let mut params = Vec::new();
    for (w, b) in init_params(cfg) {
        let mut dw = mem.alloc(s, w.len())?;
        s.memcpy_htod(&w, &mut dw).map_err(err("upload weights"))?;
        let mut db = mem.alloc(s, b.len())?;
        s.memcpy_htod(&b, &mut db).map_err(err("upload biases"))?;
        params.push((dw, db));
    }
    let mut model = Model { params };
    let total = cfg.total_steps();
    let mut losses = mem.alloc(s, total)?;
    let mut step_times = Vec::with_capacity(cfg.steps);
    let mut alloc_time = Duration::ZERO;
    let mut alloc_calls = 0;
    let mut by_step = Vec::with_capacity(cfg.memory_steps);
    // the first batch, prefetched
    let mut next = Some(upload(&mem, copy, &data[0])?);
    for step in 0..total {
        let timed = step >= cfg.warmup && step < cfg.warmup + cfg.steps;
        if step == cfg.warmup + cfg.steps {
            gpu.ctx.synchronize().map_err(err("synchronize"))?;
            clock.sample.set(true);
        }
        clock.take();
        let t = Instant::now();
        let (x, labels) = next.take().ok_or_else(|| RunError("no batch".into()))?;
        s.join(copy).map_err(err("join"))?;
        train_step(gpu, &mem, &mut model, cfg, step, &x, &labels, &mut losses)?;
        if step + 1 < total {
            next = Some(upload(&mem, copy, &data[step + 1])?);
        }
        drop((x, labels));
        s.synchronize().map_err(err("synchronize"))?;
        let elapsed = t.elapsed();
        let (a, n) = clock.take();
        if timed {
            step_times.push(elapsed);
            alloc_time += a;
            alloc_calls += n;
        }
        if clock.sample.get() {
            let low = clock.step_min_free.replace(baseline);
            by_step.push((cfg.batch(step), baseline.saturating_sub(low) as u64));
        }
    }
    gpu.ctx.synchronize().map_err(err("synchronize"))?;
    let losses_host = s.clone_dtoh(&losses).map_err(err("read losses"))?;
    let min_free = clock.min_free.get();
    let report = WayReport {
        way: way.name(),
        step_times,
        alloc_time,
        alloc_calls,
        driver_peak: baseline.saturating_sub(min_free) as u64,
        driver_peak_by_step: by_step,
        cachalot: way.cachalot_stats(),
        losses: losses_host,
    };
    drop(losses);
    drop(model);
    gpu.ctx.synchronize().map_err(err("synchronize"))?;
    way.finish(&gpu.ctx)?;
    Ok(report)
}

type Batch<B> = (Timed<B>, Timed<B>);

/// Allocates a batch on the copy stream and queues its copy there.
fn upload<W: Way>(
    mem: &Mem<'_, W>,
    copy: &Arc<CudaStream>,
    batch: &(Vec<f32>, Vec<f32>),
) -> Result<Batch<W::Buf>> {
    let mut x = mem.alloc(copy, batch.0.len())?;
    copy.memcpy_htod(&batch.0, &mut x)
        .map_err(err("copy inputs"))?;
    let mut y = mem.alloc(copy, batch.1.len())?;
    copy.memcpy_htod(&batch.1, &mut y)
        .map_err(err("copy labels"))?;
    Ok((x, y))
}

/// Forward, loss, backward and SGD update of one step.
#[allow(clippy::too_many_arguments)]
fn train_step<W: Way>(
    gpu: &Gpu,
    mem: &Mem<'_, W>,
    model: &mut Model<Timed<W::Buf>>,
    cfg: &Config,
    step: usize,
    x: &Timed<W::Buf>,
    labels: &Timed<W::Buf>,
    losses: &mut Timed<W::Buf>,
) -> Result<()> {
    let s = &gpu.compute;
    let k = &gpu.k;
    let rows = cfg.batch(step);
    let layers = cfg.widths.len() - 1;
    // forward: acts[l] is the output of layer l
    let mut acts: Vec<Timed<W::Buf>> = Vec::with_capacity(layers);
    for l in 0..layers {
        let (din, dout) = (cfg.widths[l], cfg.widths[l + 1]);
        let mut y = mem.alloc(s, rows * dout)?;
        {
            let input: &Timed<W::Buf> = if l == 0 { x } else { &acts[l - 1] };
            gemm_fwd(gpu, input, &model.params[l].0, &mut y, rows, din, dout)?;
        }
        let relu = i32::from(l + 1 < layers);
        let (n, r, c) = (rows * dout, int(rows), int(dout));
        let (py, _gy) = y.device_ptr_mut(s);
        let (pb, _gb) = model.params[l].1.device_ptr(s);
        // SAFETY: bias_act(float* y, const float* b, int rows, int cols,
        // int relu) over rows*cols elements of `y` and cols of `b`.
        unsafe {
            s.launch_builder(&k.bias_act)
                .arg(&py)
                .arg(&pb)
                .arg(&r)
                .arg(&c)
                .arg(&relu)
                .launch(cfg1d(n))
        }
        .map_err(launch_err("bias_act"))?;
        drop((_gy, _gb));
        acts.push(y);
    }
    // loss and its gradient
    let classes = cfg.classes();
    let mut grad = mem.alloc(s, rows * classes)?;
    {
        let mut row_loss = mem.alloc(s, rows)?;
        {
            let (pl, _g1) = acts[layers - 1].device_ptr(s);
            let (py, _g2) = labels.device_ptr(s);
            let (pg, _g3) = grad.device_ptr_mut(s);
            let (pr, _g4) = row_loss.device_ptr_mut(s);
            let (r, c) = (int(rows), int(classes));
            // SAFETY: softmax_xent(logits, labels, grad, row_loss, rows,
            // cols) with rows*cols logits and grad, rows labels and losses.
            unsafe {
                s.launch_builder(&k.softmax_xent)
                    .arg(&pl)
                    .arg(&py)
                    .arg(&pg)
                    .arg(&pr)
                    .arg(&r)
                    .arg(&c)
                    .launch(cfg1d(rows))
            }
            .map_err(launch_err("softmax_xent"))?;
        }
        let (pr, _g1) = row_loss.device_ptr(s);
        let (po, _g2) = losses.device_ptr_mut(s);
        let (r, idx) = (int(rows), int(step));
        // SAFETY: mean_into(v, n, out, idx): n values of `row_loss`, index
        // idx < total steps of `losses`; one thread.
        unsafe {
            s.launch_builder(&k.mean_into)
                .arg(&pr)
                .arg(&r)
                .arg(&po)
                .arg(&idx)
                .launch(LaunchConfig::for_num_elems(1))
        }
        .map_err(launch_err("mean_into"))?;
    }
    // backward, last layer first; `grad` is dL/d(output of layer l)
    for l in (0..layers).rev() {
        let (din, dout) = (cfg.widths[l], cfg.widths[l + 1]);
        let out = acts.pop();
        drop(out);
        let input: &Timed<W::Buf> = if l == 0 { x } else { &acts[l - 1] };
        let mut dw = mem.alloc(s, din * dout)?;
        gemm_dw(gpu, input, &grad, &mut dw, rows, din, dout)?;
        let mut db = mem.alloc(s, dout)?;
        launch_col_sum(gpu, &grad, &mut db, rows, dout)?;
        let dx = if l > 0 {
            let mut dx = mem.alloc(s, rows * din)?;
            gemm_dx(gpu, &grad, &model.params[l].0, &mut dx, rows, din, dout)?;
            launch_relu_bwd(gpu, &mut dx, input, rows * din)?;
            Some(dx)
        } else {
            None
        };
        let (w, b) = &mut model.params[l];
        launch_sgd(gpu, w, &dw, cfg.lr, din * dout)?;
        launch_sgd(gpu, b, &db, cfg.lr, dout)?;
        drop((dw, db));
        match dx {
            Some(dx) => grad = dx,
            None => break,
        }
    }
    Ok(())
}

fn launch_col_sum<A: DevicePtr<f32>, B: DevicePtrMut<f32>>(
    gpu: &Gpu,
    g: &A,
    out: &mut B,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let s = &gpu.compute;
    let (pg, _g1) = g.device_ptr(s);
    let (po, _g2) = out.device_ptr_mut(s);
    let (r, c) = (int(rows), int(cols));
    // SAFETY: col_sum(g, out, rows, cols): rows*cols of `g`, cols of `out`.
    unsafe {
        s.launch_builder(&gpu.k.col_sum)
            .arg(&pg)
            .arg(&po)
            .arg(&r)
            .arg(&c)
            .launch(cfg1d(cols))
    }
    .map(drop)
    .map_err(launch_err("col_sum"))
}

fn launch_relu_bwd<A: DevicePtrMut<f32>, B: DevicePtr<f32>>(
    gpu: &Gpu,
    g: &mut A,
    a: &B,
    n: usize,
) -> Result<()> {
    let s = &gpu.compute;
    let (pg, _g1) = g.device_ptr_mut(s);
    let (pa, _g2) = a.device_ptr(s);
    let nn = int(n);
    // SAFETY: relu_bwd(g, a, n): n elements of both.
    unsafe {
        s.launch_builder(&gpu.k.relu_bwd)
            .arg(&pg)
            .arg(&pa)
            .arg(&nn)
            .launch(cfg1d(n))
    }
    .map(drop)
    .map_err(launch_err("relu_bwd"))
}

fn launch_sgd<A: DevicePtrMut<f32>, B: DevicePtr<f32>>(
    gpu: &Gpu,
    w: &mut A,
    g: &B,
    lr: f32,
    n: usize,
) -> Result<()> {
    let s = &gpu.compute;
    let (pw, _g1) = w.device_ptr_mut(s);
    let (pg, _g2) = g.device_ptr(s);
    let nn = int(n);
    // SAFETY: sgd(w, g, lr, n): n elements of both.
    unsafe {
        s.launch_builder(&gpu.k.sgd)
            .arg(&pw)
            .arg(&pg)
            .arg(&lr)
            .arg(&nn)
            .launch(cfg1d(n))
    }
    .map(drop)
    .map_err(launch_err("sgd"))
}

/// The three ways' reports as a table.
pub fn table(reports: &[WayReport]) -> String {
    let mut out = format!(
        "{:<20} {:>9} {:>9} {:>9} {:>12} {:>9} {:>13} {:>15}\n",
        "way",
        "median_ms",
        "p10_ms",
        "p90_ms",
        "alloc_us/st",
        "allocs/st",
        "peak_MiB(drv)",
        "cachalot_peak"
    );
    for r in reports {
        let sp = spread(&r.step_times);
        let steps = r.step_times.len().max(1) as f64;
        let cach = match r.cachalot {
            Some((reserved, _, _)) => format!("{:.1} MiB", reserved as f64 / 1048576.0),
            None => "-".into(),
        };
        out.push_str(&format!(
            "{:<20} {:>9.3} {:>9.3} {:>9.3} {:>12.1} {:>9.1} {:>13.1} {:>15}\n",
            r.way,
            sp.map_or(0.0, |s| s.median),
            sp.map_or(0.0, |s| s.p10),
            sp.map_or(0.0, |s| s.p90),
            r.alloc_time.as_secs_f64() * 1e6 / steps,
            r.alloc_calls as f64 / steps,
            r.driver_peak as f64 / 1048576.0,
            cach
        ));
    }
    out
}

/// The driver's peak of every way in each step of the memory pass, one
/// column per step (headed by its batch rows), in MiB.
pub fn peaks_by_step(reports: &[WayReport]) -> String {
    let Some(first) = reports.first() else {
        return String::new();
    };
    let mut out = format!("{:<20}", "peak_MiB by rows");
    for &(rows, _) in &first.driver_peak_by_step {
        out.push_str(&format!(" {rows:>7}"));
    }
    out.push('\n');
    for r in reports {
        out.push_str(&format!("{:<20}", r.way));
        for &(_, bytes) in &r.driver_peak_by_step {
            out.push_str(&format!(" {:>7.1}", bytes as f64 / 1048576.0));
        }
        out.push('\n');
    }
    out
}

/// One line per (cachalot way, cudarc way) pair: step time and peak
/// memory of cachalot relative to the driver pool's.
pub fn verdicts(reports: &[WayReport]) -> Vec<String> {
    let median = |r: &WayReport| spread(&r.step_times).map_or(0.0, |s| s.median);
    let mut out = Vec::new();
    for c in reports.iter().filter(|r| r.cachalot.is_some()) {
        for d in reports.iter().filter(|r| r.way.starts_with("cudarc")) {
            let (mc, md) = (median(c), median(d));
            out.push(format!(
                "{} vs {}: median step {:.3} vs {:.3} ms ({}), peak {:.1} vs {:.1} MiB ({}), alloc host time {:.1} vs {:.1} us/step",
                c.way,
                d.way,
                mc,
                md,
                if mc <= md { "no slower" } else { "SLOWER" },
                c.driver_peak as f64 / 1048576.0,
                d.driver_peak as f64 / 1048576.0,
                if c.driver_peak <= d.driver_peak { "no higher" } else { "HIGHER" },
                c.alloc_time.as_secs_f64() * 1e6 / c.step_times.len().max(1) as f64,
                d.alloc_time.as_secs_f64() * 1e6 / d.step_times.len().max(1) as f64,
            ));
        }
    }
    out
}

/// The reports as one JSON value.
pub fn json(cfg: &Config, reports: &[WayReport], identical: bool) -> serde_json::Value {
    let ways: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            let sp = spread(&r.step_times);
            let steps = r.step_times.len().max(1) as f64;
            serde_json::json!({
                "way": r.way,
                "steps": r.step_times.len(),
                "step_ms_median": sp.map(|s| s.median),
                "step_ms_p10": sp.map(|s| s.p10),
                "step_ms_p90": sp.map(|s| s.p90),
                "step_ms_min": sp.map(|s| s.min),
                "step_ms_max": sp.map(|s| s.max),
                "alloc_host_us_per_step": r.alloc_time.as_secs_f64() * 1e6 / steps,
                "alloc_calls_per_step": r.alloc_calls as f64 / steps,
                "peak_bytes_driver": r.driver_peak,
                "peak_bytes_driver_by_step": r
                    .driver_peak_by_step
                    .iter()
                    .map(|&(rows, bytes)| serde_json::json!({"rows": rows, "bytes": bytes}))
                    .collect::<Vec<_>>(),
                "cachalot_peak_reserved": r.cachalot.map(|c| c.0),
                "cachalot_peak_allocated": r.cachalot.map(|c| c.1),
                "cachalot_device_allocs": r.cachalot.map(|c| c.2),
                "final_loss": r.losses.last(),
            })
        })
        .collect();
    serde_json::json!({
        "workload": "mlp-train",
        "widths": cfg.widths,
        "batches": cfg.batches,
        "warmup": cfg.warmup,
        "timed_steps": cfg.steps,
        "losses_identical": identical,
        "ways": ways,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak-memory pass sees every batch size, the largest included
    /// (it saw 512, 768 and 256 rows only when it was three steps long,
    /// while cachalot's own peak covered the 1,024-row steps too), and a
    /// configuration whose pass is shorter than a cycle is refused.
    #[test]
    fn the_memory_pass_covers_every_batch_size() {
        for cfg in [Config::standard(), Config::tiny()] {
            cfg.validate().unwrap();
            let first = cfg.warmup + cfg.steps;
            let mut seen: Vec<usize> = (first..cfg.total_steps()).map(|i| cfg.batch(i)).collect();
            seen.sort_unstable();
            seen.dedup();
            let mut all = cfg.batches.clone();
            all.sort_unstable();
            all.dedup();
            assert_eq!(seen, all);
        }
        let short = Config {
            memory_steps: 3,
            ..Config::standard()
        };
        assert!(short.validate().is_err());
    }

    #[test]
    fn spread_is_median_and_nearest_rank() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        let s = spread(&ms(&[5, 1, 3, 2, 4])).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert_eq!((s.p10, s.p90), (1.0, 5.0));
        let s = spread(&ms(&[4, 1, 3, 2])).unwrap();
        assert_eq!(s.median, 2.5);
        let s = spread(&ms(&(1..=20).collect::<Vec<_>>())).unwrap();
        assert_eq!((s.p10, s.p90), (2.0, 18.0));
        assert!(spread(&[]).is_none());
    }

    #[test]
    fn loss_comparison_is_bitwise() {
        let r = |way, losses: Vec<f32>| WayReport {
            way,
            step_times: vec![],
            alloc_time: Duration::ZERO,
            alloc_calls: 0,
            driver_peak: 0,
            driver_peak_by_step: Vec::new(),
            cachalot: None,
            losses,
        };
        let a = r("a", vec![1.0, 0.5]);
        assert!(losses_identical(&[a.clone(), r("b", vec![1.0, 0.5])]).is_ok());
        let e = losses_identical(&[a.clone(), r("b", vec![1.0, 0.5000001])]).unwrap_err();
        assert!(e.starts_with("step 1:"), "{e}");
        assert!(losses_identical(&[a.clone(), r("b", vec![1.0])]).is_err());
        // -0.0 == 0.0 as floats, but not bit for bit
        assert!(losses_identical(&[r("a", vec![0.0]), r("b", vec![-0.0])]).is_err());
        assert!(losses_identical(&[]).is_ok());
    }

    #[test]
    fn configs_are_validated() {
        Config::standard().validate().unwrap();
        Config::tiny().validate().unwrap();
        let bad = |f: fn(&mut Config)| {
            let mut c = Config::tiny();
            f(&mut c);
            c.validate().unwrap_err()
        };
        bad(|c| c.widths = vec![4]);
        bad(|c| c.widths = vec![4, 0, 2]);
        bad(|c| c.batches.clear());
        bad(|c| c.steps = 0);
        bad(|c| c.widths = vec![1 << 20, 1 << 20]);
        bad(|c| c.lr = f32::NAN);
    }

    #[test]
    fn data_is_deterministic_and_labels_are_argmax() {
        let cfg = Config::tiny();
        assert_eq!(batch_data(&cfg, 3), batch_data(&cfg, 3));
        assert_ne!(batch_data(&cfg, 1).0, batch_data(&cfg, 2).0);
        let (x, y) = batch_data(&cfg, 1);
        assert_eq!(x.len(), cfg.batch(1) * cfg.widths[0]);
        assert_eq!(y.len(), cfg.batch(1));
        let d = cfg.widths[0];
        for (r, &label) in y.iter().enumerate() {
            let row = &x[r * d..r * d + cfg.classes()];
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            assert_eq!(row[label as usize], max);
        }
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
        let p = init_params(&cfg);
        assert_eq!(p.len(), cfg.widths.len() - 1);
        assert_eq!(p[0].0.len(), 64 * 96);
        assert_eq!(p, init_params(&cfg));
    }

    #[test]
    fn table_and_json_carry_every_way() {
        let cfg = Config::tiny();
        let rep = WayReport {
            way: "cachalot",
            step_times: vec![Duration::from_millis(2); 3],
            alloc_time: Duration::from_micros(30),
            alloc_calls: 12,
            driver_peak: 3 << 20,
            driver_peak_by_step: vec![(32, 3 << 20), (17, 1 << 20)],
            cachalot: Some((4 << 20, 2 << 20, 5)),
            losses: vec![2.0, 1.5],
        };
        let t = table(std::slice::from_ref(&rep));
        let mut d = rep.clone();
        d.way = "cudarc";
        d.cachalot = None;
        d.driver_peak = 2 << 20;
        let v = verdicts(&[rep.clone(), d]);
        assert_eq!(v.len(), 1);
        assert!(
            v[0].contains("cachalot vs cudarc")
                && v[0].contains("no slower")
                && v[0].contains("HIGHER"),
            "{v:?}"
        );
        assert!(
            t.contains("cachalot") && t.contains("2.000") && t.contains("4.0 MiB"),
            "{t}"
        );
        let p = peaks_by_step(std::slice::from_ref(&rep));
        assert!(
            p.contains("     32      17") && p.contains("    3.0     1.0"),
            "{p}"
        );
        let j = json(&cfg, &[rep], true);
        assert_eq!(j["ways"][0]["peak_bytes_driver_by_step"][1]["rows"], 17);
        assert_eq!(j["ways"][0]["alloc_calls_per_step"], 4.0);
        assert_eq!(j["ways"][0]["cachalot_peak_reserved"], 4 << 20);
        assert_eq!(j["ways"][0]["final_loss"], 1.5);
        assert_eq!(j["losses_identical"], true);
    }

    #[test]
    fn timed_buffers_charge_their_drop_to_the_clock() {
        struct Slow;
        impl Drop for Slow {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let clock = Rc::new(AllocClock::default());
        drop(Timed {
            inner: Slow,
            _tail: Tail(Rc::clone(&clock)),
        });
        let (t, n) = clock.take();
        assert_eq!(n, 1);
        assert!(t >= Duration::from_millis(5), "{t:?}");
        assert_eq!(clock.take(), (Duration::ZERO, 0));
    }
}
