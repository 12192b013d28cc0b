/*
 * cachalot.h: C ABI of the cachalot caching device-memory allocator
 * (libcachalot_capi.so, crate crates/cachalot-capi).
 *
 * PyTorch loads cachalot_malloc / cachalot_free through
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "cachalot_malloc", "cachalot_free")
 * (see python/cachalot_torch.py).
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

#ifdef __cplusplus
}
#endif

#endif /* CACHALOT_H */
