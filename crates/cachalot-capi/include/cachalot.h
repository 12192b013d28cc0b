/*
 * cachalot.h: C ABI of the cachalot caching device-memory allocator
 * (libcachalot_capi.so, crate crates/cachalot-capi).
 *
 * PyTorch loads cachalot_malloc / cachalot_free through
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "cachalot_malloc", "cachalot_free")
 * (python/cachalot_torch/, install(mode="pluggable")); the C++ shim of
 * python/cachalot_torch/ uses the functions of the second part.
 *
 * Conventions
 *  - Functions returning int return CACHALOT_OK (0) or a positive
 *    CACHALOT_ERR_* code. cachalot_malloc returns NULL on error and
 *    cachalot_free returns nothing (PyTorch's signatures): ask
 *    cachalot_last_error_code(). Every call first clears the calling
 *    thread's last error; a failing call sets it (code + message).
 *  - No panic crosses this boundary (CACHALOT_ERR_PANIC reports one).
 *  - A negative or out-of-range device, or a pointer this allocator did not
 *    hand out (or one inside a live allocation), is an error code, never a
 *    crash. Error messages echo at most 64 characters of any input.
 *  - Streams are raw cudaStream_t values; 0 is the legacy default stream
 *    (PyTorch's default stream). A CUDA stream passed here must stay alive
 *    while memory allocated or recorded on it is live or cached (PyTorch
 *    never destroys its streams). On the mock backend a stream is the mock's
 *    stream index (0 = default), made with cachalot_stream_create.
 *  - Thread-safe: every function may be called from any thread.
 */
#ifndef CACHALOT_H
#define CACHALOT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as cudaStream_t / CUstream, without including CUDA headers. */
typedef struct CUstream_st *cachalot_stream_t;

/* Status codes. */
#define CACHALOT_OK 0
#define CACHALOT_ERR_INVALID_ARGUMENT 1 /* bad device, size, string, stream */
#define CACHALOT_ERR_OUT_OF_MEMORY 2    /* out of memory now; retry may help */
#define CACHALOT_ERR_NEVER_FITS 3       /* the request can never fit */
#define CACHALOT_ERR_INVALID_POINTER 4  /* not allocated by this allocator */
#define CACHALOT_ERR_DOUBLE_FREE 5      /* not a live allocation (double free) */
#define CACHALOT_ERR_CONFIG 6           /* bad configuration key or value */
#define CACHALOT_ERR_CAPTURE 7          /* misuse of graph capture */
#define CACHALOT_ERR_BACKEND 8          /* a driver call failed */
#define CACHALOT_ERR_NO_DEVICE 9        /* no backend or device */
#define CACHALOT_ERR_PANIC 10           /* internal panic caught (a bug) */
#define CACHALOT_ERR_INTERIOR_POINTER 11 /* inside a live allocation, not its start */

/* Chooses the backend: "cuda", "mock" ("hip", "level-zero" when compiled
 * in); NULL or "" detects it (CACHALOT_BACKEND, else CUDA when a GPU is
 * usable, else the mock). Optional. Another backend once chosen: error. */
int cachalot_init(const char *backend);

/* Chooses the backend as cachalot_init does, without touching its driver:
 * the devices are counted (CUDA's cuInit) at the first call that needs a
 * device, as PyTorch initializes CUDA at its first use. Not compiled in:
 * an error now; no device: an error at that first call. NULL or "": an
 * error. */
int cachalot_select(const char *backend);

/* The backend in use ("cuda", "mock", ...): a static string; NULL on error. */
const char *cachalot_backend_name(void);

/* Number of devices of the backend; -1 on error. */
int cachalot_device_count(void);

/* PyTorch's alloc_fn. Allocates size bytes on device for use on stream.
 * NULL for size == 0 (success) and on error (also printed to stderr). */
void *cachalot_malloc(ssize_t size, int device, cachalot_stream_t stream);

/* PyTorch's free_fn. Frees ptr from cachalot_malloc on device; size and
 * stream are those of the allocation (ignored: cachalot knows both). NULL is
 * a no-op. Errors (unknown pointer, double free, interior pointer, bad
 * device) set the last error and are printed to stderr. */
void cachalot_free(void *ptr, ssize_t size, int device, cachalot_stream_t stream);

/* Marks the allocation ptr on device as used on stream too (PyTorch's
 * record_stream): not reused before stream's work queued up to its free has
 * completed. */
int cachalot_record_stream(void *ptr, int device, cachalot_stream_t stream);

/* Releases unused cached memory of device (-1: every device) to the driver. */
int cachalot_empty_cache(int device);

/* Peak statistics of device (-1: every device) := current values. */
int cachalot_reset_peak_stats(int device);

/* The flat statistics of device, PyTorch's 122 keys of
 * torch.cuda.memory_stats() ("reserved_bytes.all.peak", ...), as a JSON
 * object of integers. Release with cachalot_string_free. A device not yet
 * used reads as zeros. NULL on error. */
char *cachalot_memory_stats_json(int device);

/* Releases a string returned by cachalot (NULL: no-op). */
void cachalot_string_free(char *s);

/* Applies a configuration string with PyTorch's grammar
 * ("max_split_size_mb:256,garbage_collection_threshold:0.8", ...) to every
 * device, now and when first used. On error (CACHALOT_ERR_CONFIG, naming the
 * key, the value and the allowed range; also a string over 64 KiB) nothing
 * changes. Memory stays flat however often it is called. */
int cachalot_set_config(const char *config);

/* Creates a stream on device owned by the allocator (lives as long as the
 * process); writes its handle to *out. */
int cachalot_stream_create(int device, cachalot_stream_t *out);

/* Printing of cachalot_malloc / cachalot_free failures to stderr: on
 * (non-zero, the default) or off (0). */
void cachalot_set_error_logging(int on);

/* The calling thread's last error code (CACHALOT_OK after a success). */
int cachalot_last_error_code(void);

/* The calling thread's last error message, NULL after a success. Valid
 * until the thread's next cachalot call. */
const char *cachalot_last_error(void);

/* ------------------------------------------------------------------------
 * The rest of PyTorch's CUDAAllocator interface (for the C++ shim of
 * python/cachalot_torch/; see docs/pytorch-shim.md). Pool ids are PyTorch's
 * MempoolId_t (pool_hi, pool_lo); (0, 0) is the default pool.
 * ------------------------------------------------------------------------ */


/* Allocates size bytes on device for use on stream; writes the address to
 * *out (NULL for 0 bytes). Prints nothing. On CACHALOT_ERR_OUT_OF_MEMORY /
 * CACHALOT_ERR_NEVER_FITS the last error message is cachalot's OOM report. */
int cachalot_alloc(size_t size, int device, cachalot_stream_t stream, void **out);

/* cachalot_alloc into private pool (pool_hi, pool_lo), which must have a use
 * (cachalot_pool_create_or_incref) and no capture recording into it
 * (otherwise CACHALOT_ERR_CAPTURE): a torch.cuda.use_mem_pool allocation. */
int cachalot_alloc_in_pool(size_t size, int device, cachalot_stream_t stream,
                           uint64_t pool_hi, uint64_t pool_lo, void **out);

/* Frees ptr wherever it was allocated (device_hint first, -1: no hint).
 * NULL: no-op. Unknown: CACHALOT_ERR_INVALID_POINTER; double free:
 * CACHALOT_ERR_DOUBLE_FREE. Prints nothing. */
int cachalot_raw_delete(void *ptr, int device_hint);

/* PyTorch's c10::CachingAllocator::Stat and DeviceStats, field for field
 * (arrays: [all, small_pool, large_pool]). */
typedef struct {
  int64_t current, peak, allocated, freed;
} cachalot_stat_t;

typedef struct {
  cachalot_stat_t allocation[3], segment[3], active[3], inactive_split[3],
      allocated_bytes[3], reserved_bytes[3], active_bytes[3],
      inactive_split_bytes[3], requested_bytes[3];
  cachalot_stat_t oversize_allocations, oversize_segments;
  int64_t num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc,
      num_device_free, max_split_size; /* max_split_size -1: unlimited */
} cachalot_device_stats_t;

/* Writes device's statistics (zeros for a device not yet used). out_size:
 * sizeof(cachalot_device_stats_t); a mismatch is INVALID_ARGUMENT. */
int cachalot_get_stats(int device, cachalot_device_stats_t *out, size_t out_size);

/* Cumulative counters of device (-1: every device) := 0. */
int cachalot_reset_accumulated_stats(int device);

/* Memory fraction of device, in [0, 1] (else INVALID_ARGUMENT, no change). */
int cachalot_set_memory_fraction(int device, double fraction);
int cachalot_get_memory_fraction(int device, double *out);

/* Free and total device bytes as the driver reports them (NULL: skipped). */
int cachalot_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes);

/* PyTorch's cacheInfo: *largest := max(*largest, largest cached free block);
 * a 0 on entry starts from the device's free bytes. */
int cachalot_cache_info(int device, size_t *largest);

/* Graph-capture pool: routes every stream capturing into the same capture as
 * stream to pool (created, or one more use). Call before the capture begins
 * on stream. Already recording / (0,0) / released pool: CACHALOT_ERR_CAPTURE. */
int cachalot_pool_begin(int device, uint64_t pool_hi, uint64_t pool_lo,
                        cachalot_stream_t stream);
/* Stops routing to pool (after the capture ended). Not recording: CAPTURE. */
int cachalot_pool_end(int device, uint64_t pool_hi, uint64_t pool_lo);
/* One more use of pool, created if new (MemPool(), use_mem_pool begin). */
int cachalot_pool_create_or_incref(int device, uint64_t pool_hi, uint64_t pool_lo);
/* One use less; at zero the pool's free segments are released. Unknown pool
 * or no use left: CACHALOT_ERR_CAPTURE. */
int cachalot_pool_release(int device, uint64_t pool_hi, uint64_t pool_lo);
/* Uses of pool (0: unknown or released). */
int cachalot_pool_use_count(int device, uint64_t pool_hi, uint64_t pool_lo, int *out);
/* *out := 1 when pool's allocated blocks are exactly ptrs[0..n), else 0.
 * Unknown pool: CACHALOT_ERR_CAPTURE. */
int cachalot_pool_check_live(int device, uint64_t pool_hi, uint64_t pool_lo,
                             const void *const *ptrs, size_t n, int *out);

/* Memory history of one device on (keeping max_entries, clamped to 2^22;
 * cleared when clear != 0; every context kept, nothing skipped) or off. */
int cachalot_record_history(int device, int enabled, uint64_t max_entries, int clear);
int cachalot_history_enabled(int device, int *out);

/* PyTorch's recordHistory: device -1 = every device, also those used later.
 * record_context: 0 never, 1 state, 2 alloc, 3 all (PyTorch's RecordContext).
 * skip_actions: names ("alloc", "free_requested", ...; at most 64); an
 * unknown one is CACHALOT_ERR_INVALID_ARGUMENT ("Unknown TraceEntry action:
 * ...") and changes nothing. On again while on: entries kept unless clear. */
int cachalot_history_configure(int device, int enabled, uint64_t max_entries,
                               int record_context, int clear,
                               const char *const *skip_actions, size_t num_skip);

/* A caller's context (PyTorch: a heap std::shared_ptr<c10::GatheredContext>).
 * cachalot calls release(data) exactly once, from any thread (possibly
 * holding an allocator lock: it must not call cachalot), when it drops its
 * last reference. NULL data: no context. */
typedef struct {
  void *data;
  void (*release)(void *data);
} cachalot_context_t;

/* The calling thread's context for its allocator calls until the matching
 * exit (nesting, at most 64 deep). cachalot owns ctx from the call on, also
 * when it fails. */
int cachalot_context_enter(cachalot_context_t ctx);
void cachalot_context_exit(void);
/* The calling thread's compile-context stack (kept while some history is
 * on) and user metadata ("" clears), copied into the entries it records.
 * Strings at most 64 KiB. user_metadata's result is valid until the
 * thread's next call of it. */
int cachalot_history_push_compile_context(const char *name);
void cachalot_history_pop_compile_context(void);
int cachalot_history_set_user_metadata(const char *metadata);
const char *cachalot_history_user_metadata(void);
/* A record_function annotation (n <= 64 key/value pairs) while on. */
int cachalot_history_record_annotation(int device, const char *const *keys,
                                       const char *const *values, size_t n);

/* The profiler's memory events: device and block size of a live allocation
 * (CACHALOT_ERR_INVALID_POINTER when none holds ptr), and a device's
 * allocated / reserved bytes now. */
int cachalot_block_lookup(const void *ptr, int *device, uint64_t *size);
int cachalot_memory_totals(int device, uint64_t *allocated, uint64_t *reserved);

typedef struct {
  uint64_t address, size, requested_size;
  int32_t state; /* 0 active_allocated, 1 active_pending_free, 2 inactive */
  int32_t reserved;
  void *context; /* the allocation's context data, or NULL */
} cachalot_block_t;

typedef struct {
  uint64_t address, total_size, allocated_size, active_size, requested_size;
  uint64_t stream; /* raw cudaStream_t value */
  uint64_t pool_hi, pool_lo;
  uint64_t first_block, num_blocks; /* blocks[first_block .. +num_blocks) */
  int32_t device, is_small, is_expandable, reserved;
  void *context; /* the segment allocation's context data, or NULL */
} cachalot_segment_t;

typedef struct {
  int32_t action; /* TraceEntry::Action order: alloc 0 .. oom 8 */
  int32_t device;
  uint64_t addr, size, stream, time_us;
  void *context;               /* the entry's context data, or NULL */
  const char *compile_context; /* NULL: none ("N/A") */
  const char *user_metadata;   /* NULL: none ("") */
} cachalot_trace_t;

typedef struct {
  int32_t device, reserved;
  uint64_t time_us;
  size_t num_pairs;
  const char *const *keys, *const *values;
} cachalot_annotation_t;

typedef struct {
  const cachalot_segment_t *segments;
  size_t num_segments;
  const cachalot_block_t *blocks;
  size_t num_blocks;
  const cachalot_trace_t *traces;
  size_t num_traces;
  uint64_t max_split_size; /* UINT64_MAX: unlimited */
  double garbage_collection_threshold;
  int32_t expandable_segments, graph_capture_record_stream_reuse;
  uint64_t roundup_power2_divisions[16];
  const char *last_config;
  const cachalot_annotation_t *annotations;
  size_t num_annotations;
} cachalot_snapshot_t;

/* Snapshot of device: all segments, or pool's for pool != (0,0); history
 * entries and annotations when include_traces; context pointers and strings
 * valid until cachalot_snapshot_free. With the history on, a snapshot entry
 * is recorded after the copy. Release with cachalot_snapshot_free. A device
 * not in use yet writes NULL to *out (success; nothing is opened). */
int cachalot_snapshot(int device, uint64_t pool_hi, uint64_t pool_lo,
                      int include_traces, cachalot_snapshot_t **out);
void cachalot_snapshot_free(cachalot_snapshot_t *s);

/* ----- pool checkpoints (cudagraph trees: getCheckpointState /
 * setCheckpointPoolState) ----- */

typedef struct CachalotCheckpoint cachalot_checkpoint_t; /* opaque */

typedef struct {
  void *const *freed; /* blocks of the pool that were allocated, now freed */
  size_t num_freed;
  void *const *allocated; /* blocks allocated again at their addresses */
  size_t num_allocated;
} cachalot_checkpoint_delta_t;

/* Saves the layout of private pool (every segment and block, which are
 * allocated). Default / unknown / released pool: CACHALOT_ERR_CAPTURE.
 * Release with cachalot_checkpoint_free. */
int cachalot_pool_checkpoint(int device, uint64_t pool_hi, uint64_t pool_lo,
                             cachalot_checkpoint_t **out);
void cachalot_checkpoint_free(cachalot_checkpoint_t *c);
/* Restores the checkpoint's pool: frees every block of the pool allocated
 * now, allocates every block allocated in the checkpoint again at its
 * address (each then freed with cachalot_raw_delete). A checkpoint that no
 * longer applies: CACHALOT_ERR_CAPTURE, nothing changed. Release the delta
 * with cachalot_checkpoint_delta_free. */
int cachalot_pool_restore(int device, const cachalot_checkpoint_t *c,
                          cachalot_checkpoint_delta_t **out);
void cachalot_checkpoint_delta_free(cachalot_checkpoint_delta_t *d);

/* ----- CUDA IPC (torch.multiprocessing; PyTorch 2.11's wire format) ----- */

/* Writes the shareable handle of the live allocation at ptr (on device_hint
 * first, then on every device in use; PyTorch's format, or cachalot's 'r'
 * for pages in physical runs of different sizes, which PyTorch's format
 * cannot describe) to buf and its length to *len, the
 * allocation's offset in what it maps to *offset. buf too short:
 * CACHALOT_ERR_INVALID_ARGUMENT with the length needed in *len. Unknown
 * pointer: CACHALOT_ERR_INVALID_POINTER ("invalid device pointer"). */
int cachalot_ipc_share(const void *ptr, int device_hint, uint8_t *buf, size_t buf_len,
                       size_t *len, uint64_t *offset);
/* Opens another process's handle (either allocator's) on device: *out :=
 * the address of the segment or first page it maps. A handle already open
 * here: the same address, one more user. */
int cachalot_ipc_open(int device, const uint8_t *handle, size_t handle_len, void **out);
/* One user less of what cachalot_ipc_open opened at ptr; the last unmaps. */
int cachalot_ipc_close(int device, const void *ptr);

/* ----- pools with options, the cache off, segment trackers ----- */

/* A pool's user allocator (PyTorch's MemPool(allocator=...)): alloc writes a
 * segment's address (0: none now, out of memory) and returns 0, or returns
 * non-zero with a NUL-terminated message in err[errlen]; free likewise;
 * release is called once when cachalot no longer needs ctx. All are called
 * from any thread with cachalot's device lock held: never call cachalot
 * from them. */
typedef int (*cachalot_source_alloc_fn)(void *ctx, size_t size, uint64_t *addr,
                                        char *err, size_t errlen);
typedef int (*cachalot_source_free_fn)(void *ctx, uint64_t addr, size_t size,
                                       char *err, size_t errlen);
typedef void (*cachalot_source_release_fn)(void *ctx);

/* Creates private pool (pool_hi, pool_lo) with one use, every segment from
 * alloc_fn, back through free_fn (never expandable segments). release_fn
 * (may be NULL) runs once when the pool is deleted, or before an error
 * returns. A pool that exists already is an error. */
int cachalot_pool_create_with_source(int device, uint64_t pool_hi, uint64_t pool_lo,
                                     cachalot_source_alloc_fn alloc_fn,
                                     cachalot_source_free_fn free_fn,
                                     cachalot_source_release_fn release_fn, void *ctx);
/* PyTorch's setUseOnOOM: while on, default-pool allocations that find no
 * memory take the pool's cached free blocks (same stream) before the cache
 * is released. Off for an unknown pool is a no-op. */
int cachalot_pool_set_use_on_oom(int device, uint64_t pool_hi, uint64_t pool_lo, int on);
/* PyTorch's setNoSplit: the pool's blocks are never split. */
int cachalot_pool_set_no_split(int device, uint64_t pool_hi, uint64_t pool_lo);

/* torch.cuda.caching_allocator_enable: off, cachalot_alloc and
 * cachalot_alloc_in_pool give each request a device allocation of its own
 * (no stats, no pools), freed by cachalot_raw_delete at once, ignored by
 * cachalot_record_stream. PYTORCH_NO_CUDA_MEMORY_CACHING set: off at start. */
int cachalot_caching_enable(int enabled);
int cachalot_caching_enabled(int *out);

/* A segment event: action 3 segment_alloc (after the memory is obtained),
 * 4 segment_free (before it is returned), 5 segment_map, 6 segment_unmap. */
typedef struct {
  int32_t action, device;
  uint64_t addr, size, stream;
  uint64_t pool_hi, pool_lo; /* owning pool; (0, 0): the default pools */
} cachalot_segment_event_t;
typedef void (*cachalot_segment_tracker_fn)(void *ctx, const cachalot_segment_event_t *e);

/* Attaches a tracker called with ctx for every segment event of every device
 * (from any thread, with cachalot's device lock held: never call cachalot
 * from it). Trackers are never detached; at most 1024. */
int cachalot_attach_segment_tracker(cachalot_segment_tracker_fn callback, void *ctx);

/* Every configuration key cachalot accepts, comma-separated (a static
 * string). */
const char *cachalot_config_keys(void);

/* The configuration in force on device (its allocator's, else the one it
 * would start with now): what _snapshot()["allocator_settings"] shows.
 * last_config is valid until the calling thread's next call. */
typedef struct {
  uint64_t max_split_size; /* UINT64_MAX: unlimited */
  double garbage_collection_threshold;
  int32_t expandable_segments, graph_capture_record_stream_reuse;
  uint64_t roundup_power2_divisions[16];
  const char *last_config;
  int32_t release_lock_on_malloc; /* release_lock_on_cudamalloc */
} cachalot_config_info_t;
int cachalot_current_config(int device, cachalot_config_info_t *out);

#ifdef __cplusplus
}
#endif

#endif /* CACHALOT_H */
