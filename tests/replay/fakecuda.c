/* fakecuda.c  A stand-in libcuda.so.1: the driver API entry points gpuwhy traces.
 * "Device" memory is host memory; copies really copy; syncs sleep a known time. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "fakecuda.h"

static volatile unsigned long long launched_threads;

static void sleep_us(long us)
{
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0)
        ;
}

unsigned long long fakecuda_launched_threads(void) { return launched_threads; }
CUresult cuDriverGetVersion(int *version) { *version = 12040; return 0; }

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream s, void **params, void **extra)
{
    launched_threads += (unsigned long long)gx * gy * gz * bx * by * bz;
    return 0;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    launched_threads += (unsigned long long)c->gridDimX * c->gridDimY * c->gridDimZ *
                        c->blockDimX * c->blockDimY * c->blockDimZ;
    return 0;
}

static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    memmove((void *)dst, (const void *)src, n);
    return 0;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return copy(d, (CUdeviceptr)s, n); }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return copy((CUdeviceptr)d, s, n); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { return copy(d, (CUdeviceptr)s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { return copy((CUdeviceptr)d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(d, s, n); }
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, s, n); }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(d, s, n); }

CUresult cuStreamSynchronize(CUstream s) { sleep_us(STREAM_SYNC_US); return 0; }
CUresult cuCtxSynchronize(void) { sleep_us(CTX_SYNC_US); return 0; }
CUresult cuEventSynchronize(CUevent e) { sleep_us(EVENT_SYNC_US); return 0; }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n)
{
    void *p;
    if (n > MAX_FAKE_ALLOC || !(p = malloc(n)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)p;
    return 0;
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s) { return cuMemAlloc_v2(dptr, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)p); return 0; }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { free((void *)p); return 0; }

CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags)
{
    return (*pp = malloc(n)) ? 0 : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemAllocHost_v2(void **pp, size_t n) { return cuMemHostAlloc(pp, n, 0); }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) { return 0; }
CUresult cuMemHostUnregister(void *p) { return 0; }
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { launched_threads += 1; return 0; }
