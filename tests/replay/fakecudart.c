/* fakecudart.c  A stand-in libcudart.so.12 that, like the real runtime, calls the driver
 * API for the work: the probes must count each runtime call once, not twice. Some calls
 * are tail calls (same stack frame as the runtime call), some are not. */
#include "fakecuda.h"

static volatile unsigned long runtime_calls;

cudaError_t cudaRuntimeGetVersion(int *version) { *version = 12040; return 0; }

cudaError_t cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shmem,
                             cudaStream_t s)
{
    cudaError_t rc = cuLaunchKernel((CUfunction)func, g.x, g.y, g.z, b.x, b.y, b.z,
                                    (unsigned int)shmem, s, args, 0);
    runtime_calls++;
    return rc;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *func, void **args)
{
    CUlaunchConfig d = {c->gridDim.x, c->gridDim.y, c->gridDim.z, c->blockDim.x, c->blockDim.y,
                        c->blockDim.z, (unsigned int)c->dynamicSmemBytes, c->stream, 0, 0};
    cudaError_t rc = cuLaunchKernelEx(&d, (CUfunction)func, args, 0);
    runtime_calls++;
    return rc;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return cuMemcpy((CUdeviceptr)dst, (CUdeviceptr)src, n);            /* a tail call */
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    cudaError_t rc = cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, s);
    runtime_calls++;
    return rc;
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t rc = cuCtxSynchronize();
    runtime_calls++;
    return rc;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) { return cuStreamSynchronize(s); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cuEventSynchronize(e); }

cudaError_t cudaMalloc(void **p, size_t n)
{
    cudaError_t rc = cuMemAlloc_v2((CUdeviceptr *)p, n);
    runtime_calls++;
    return rc;
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { return cuMemAllocAsync((CUdeviceptr *)p, n, s); }
cudaError_t cudaFree(void *p) { return cuMemFree_v2((CUdeviceptr)p); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return cuMemFreeAsync((CUdeviceptr)p, s); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) { return cuMemHostAlloc(p, n, flags); }
cudaError_t cudaMallocHost(void **p, size_t n) { return cuMemAllocHost_v2(p, n); }
cudaError_t cudaFreeHost(void *p) { return cuMemFreeHost(p); }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags) { return cuMemHostRegister_v2(p, n, flags); }
cudaError_t cudaHostUnregister(void *p) { return cuMemHostUnregister(p); }

cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s)
{
    cudaError_t rc = cuGraphLaunch(g, s);
    runtime_calls++;
    return rc;
}
