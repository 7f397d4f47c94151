/* C ABI of symmpool, for torch.cuda.memory.CUDAPluggableAllocator and any
 * other C caller. Errors never cross this boundary as exceptions: malloc
 * returns NULL, and every failure is printed to stderr and kept for
 * symmpool_last_error() on the calling thread. */
#ifndef SYMMPOOL_C_API_H
#define SYMMPOOL_C_API_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `size` bytes on `device`, ordered on `stream`. NULL for size 0 or on error. */
void* symmpool_malloc(size_t size, int device, cudaStream_t stream);

/* Frees what symmpool_malloc returned; `size` must be the size asked for. */
void symmpool_free(void* ptr, size_t size, int device, cudaStream_t stream);

/* Gives cached, unused segments of `device` back to the driver. Returns the
 * bytes released, or -1 on error. */
long long symmpool_empty_cache(int device);

/* The last error on this thread, or "" if none. */
const char* symmpool_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SYMMPOOL_C_API_H */
