#include "backend/cuda/dense.cuh"

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

namespace {

constexpr int WARPS = 4;       // outputs per block
constexpr int ROW_CHUNK = 8;   // activation rows per pass over a weight row

template <bool BF16>
__device__ __forceinline__ float wval(const void *w, int64_t i) {
    if constexpr (BF16) return __uint_as_float(uint32_t(static_cast<const uint16_t *>(w)[i]) << 16);
    else return static_cast<const float *>(w)[i];
}

// One warp per output column n, all M rows in chunks of ROW_CHUNK (the weight row is re-read per
// chunk, from L2 after the first). Bytes: N*K*sizeof(w) + M*K*4*ceil(N/WARPS)/L2 reuse + M*N*4;
// FLOPs 2*M*N*K. Correctness first: scalar loads, not a bandwidth kernel (these weights are
// small next to the FP8 / MXFP4 ones; the head is the exception, see docs/perf).
template <bool BF16>
__global__ void dense_kernel(const float *__restrict__ x, const void *__restrict__ w, float *__restrict__ y, int64_t M,
                             int64_t N, int64_t K) {
    const int lane = threadIdx.x & 31;
    const int64_t n = int64_t(blockIdx.x) * WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    const int64_t wrow = n * K;
    for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
        float acc[ROW_CHUNK];
#pragma unroll
        for (int r = 0; r < ROW_CHUNK; r++) acc[r] = 0.0f;
        const int rows = int(M - m0 < ROW_CHUNK ? M - m0 : ROW_CHUNK);
        for (int64_t k = lane; k < K; k += 32) {
            const float wv = wval<BF16>(w, wrow + k);
#pragma unroll
            for (int r = 0; r < ROW_CHUNK; r++)
                if (r < rows) acc[r] = fmaf(x[(m0 + r) * K + k], wv, acc[r]);
        }
#pragma unroll
        for (int r = 0; r < ROW_CHUNK; r++) {
            float v = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && r < rows) y[(m0 + r) * N + n] = v;
        }
    }
}

}  // namespace

Status dense_linear(const float *x, const void *w, bool w_bf16, float *y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t stream) {
    if (M < 1 || N < 1 || K < 1 || !x || !w || !y) return Status::invalid_argument("dense_linear: bad shape or null");
    const dim3 grid(unsigned((N + WARPS - 1) / WARPS)), block(32 * WARPS);
    if (w_bf16) dense_kernel<true><<<grid, block, 0, stream>>>(x, w, y, M, N, K);
    else dense_kernel<false><<<grid, block, 0, stream>>>(x, w, y, M, N, K);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
