#include "backend/cuda/l2_prefetch.cuh"

#include <cstdint>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

// sm_90: a warp a block, a 16 KB chunk a thread, so a 32 MB budget spreads over 64 SMs' TMA units
// (on 4 SMs, 32 KB a thread, the prefetch of 16 MB held its stream ~25 us: H100, session 29).
constexpr int THREADS = 32;
constexpr unsigned CHUNK = 16u << 10;

struct ranges_arg {
    l2_range r[L2_RANGES];
    int n;
};

// No bytes move into the SM and none are written: sm_90's bulk prefetch hands the TMA unit
// CHUNK bytes per instruction; below sm_90, one prefetch.global.L2 per 128-byte line.
__global__ void __launch_bounds__(THREADS) l2_prefetch_kernel(ranges_arg a) {
    pdl_trigger();  // nothing here is any kernel's input: the next one may become resident at once
    const size_t tid = size_t(blockIdx.x) * THREADS + threadIdx.x, nthreads = size_t(gridDim.x) * THREADS;
    for (int i = 0; i < a.n; i++) {
        const char *p = static_cast<const char *>(a.r[i].p);
        const size_t bytes = a.r[i].bytes & ~size_t(15);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        for (size_t off = tid * CHUNK; off < bytes; off += nthreads * CHUNK) {
            const unsigned n = bytes - off < CHUNK ? unsigned(bytes - off) : CHUNK;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
        }
#else
        for (size_t off = tid * 128; off < bytes; off += nthreads * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
    }
    // Stream order for what follows: a kernel launched after this one waits for its end, which
    // so comes after the end of the kernel before it.
    pdl_wait();
}

}  // namespace

Status l2_prefetch(const l2_range *ranges, int n, size_t budget, cudaStream_t stream) {
    if (n < 0 || n > L2_RANGES) return Status::invalid_argument("l2_prefetch: " + std::to_string(n) + " ranges (at most 8)");
    ranges_arg a{};
    size_t total = 0;
    for (int i = 0; i < n && total < budget; i++) {
        if (reinterpret_cast<uintptr_t>(ranges[i].p) % 16 != 0)
            return Status::invalid_argument("l2_prefetch: range " + std::to_string(i) + " is not 16-byte aligned");
        const size_t b = ranges[i].bytes < budget - total ? ranges[i].bytes : budget - total;
        if (b < 16) continue;
        a.r[a.n++] = {ranges[i].p, b};
        total += b;
    }
    if (a.n == 0) return Status::ok();
    int dev = 0, sms = 0;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int cc = 0;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
    // sm_90: a chunk a thread; below, a wave of blocks walking the lines.
    const size_t chunks = (total + CHUNK - 1) / CHUNK;
    const unsigned blocks = cc >= 9 ? unsigned((chunks + THREADS - 1) / THREADS) : unsigned(sms);
    DS41RT_CUDA_RETURN_IF_ERROR(launch_pdl(l2_prefetch_kernel, dim3(blocks), dim3(THREADS), 0, stream, a));
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
