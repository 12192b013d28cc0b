/* C smoke test of include/cachalot.h against libcachalot_capi.so, on the
 * mock backend. Built and run by tests/c_smoke.rs; prints "smoke: ok". */
#include <stdio.h>
#include <string.h>

#include "cachalot.h"

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            const char *e = cachalot_last_error();                         \
            fprintf(stderr, "smoke: line %d: %s (last error: %s)\n",      \
                    __LINE__, #cond, e ? e : "none");                      \
            return 1;                                                      \
        }                                                                  \
    } while (0)

int main(void) {
    /* PyTorch's signatures, as CUDAPluggableAllocator loads them. */
    void *(*alloc_fn)(ssize_t, int, cachalot_stream_t) = cachalot_malloc;
    void (*free_fn)(void *, ssize_t, int, cachalot_stream_t) = cachalot_free;

    CHECK(cachalot_init("mock") == CACHALOT_OK);
    CHECK(strcmp(cachalot_backend_name(), "mock") == 0);
    CHECK(cachalot_device_count() == 1);
    cachalot_set_error_logging(0);

    /* Set before the device's first use: applied when it is created. */
    CHECK(cachalot_set_config("max_split_size_mb:bogus") == CACHALOT_ERR_CONFIG);
    CHECK(strstr(cachalot_last_error(), "max_split_size_mb") != NULL);
    CHECK(cachalot_set_config("max_split_size_mb:40") == CACHALOT_OK);
    CHECK(cachalot_last_error() == NULL);

    void *p = alloc_fn(5 << 20, 0, NULL);
    CHECK(p != NULL);
    void *q = alloc_fn(100, 0, NULL);
    CHECK(q != NULL && q != p);
    /* 50 MiB >= max_split_size (40 MiB): an oversize allocation. */
    void *big = alloc_fn(50 << 20, 0, NULL);
    CHECK(big != NULL);

    char *json = cachalot_memory_stats_json(0);
    CHECK(json != NULL);
    CHECK(strstr(json, "\"allocated_bytes.all.current\":") != NULL);
    CHECK(strstr(json, "\"oversize_allocations.current\":1,") != NULL);
    cachalot_string_free(json);

    free_fn(big, 50 << 20, 0, NULL);
    free_fn(p, 5 << 20, 0, NULL);
    CHECK(cachalot_last_error_code() == CACHALOT_OK);
    free_fn(p, 5 << 20, 0, NULL);
    CHECK(cachalot_last_error_code() == CACHALOT_ERR_DOUBLE_FREE);
    free_fn((void *)0x10, 1, 0, NULL);
    CHECK(cachalot_last_error_code() == CACHALOT_ERR_INVALID_POINTER);
    CHECK(alloc_fn(16, 3, NULL) == NULL);
    CHECK(cachalot_last_error_code() == CACHALOT_ERR_INVALID_ARGUMENT);

    cachalot_stream_t side = NULL;
    CHECK(cachalot_stream_create(0, &side) == CACHALOT_OK);
    CHECK(cachalot_record_stream(q, 0, side) == CACHALOT_OK);
    free_fn(q, 100, 0, NULL);
    CHECK(cachalot_empty_cache(-1) == CACHALOT_OK);
    CHECK(cachalot_reset_peak_stats(0) == CACHALOT_OK);

    json = cachalot_memory_stats_json(0);
    CHECK(json != NULL);
    CHECK(strstr(json, "\"allocated_bytes.all.current\":0,") != NULL);
    CHECK(strstr(json, "\"reserved_bytes.all.current\":0,") != NULL);
    cachalot_string_free(json);

    printf("smoke: ok\n");
    return 0;
}
