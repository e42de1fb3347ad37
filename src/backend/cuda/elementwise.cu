#include "backend/cuda/elementwise.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

// Bytes: 8 per element (read + write), no FLOPs to speak of.
__global__ void round_kernel(float *x, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        x[i] = dev::round_bf16(x[i]);
}

// Bytes: 12 per element; one add.
__global__ void add_kernel(const float *a, const float *b, float *out, int64_t n, bool rb) {
    pdl_enter();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = __fadd_rn(a[i], b[i]);
        out[i] = rb ? dev::round_bf16(v) : v;
    }
}

// Bytes: 8 per element moved; no FLOPs.
__global__ void gather_kernel(const float *x, const int32_t *idx, int64_t n, int64_t D, float *out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * D; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = x[int64_t(idx[i / D]) * D + i % D];
}

// Bytes: 12 per element; one add (and a multiply). Distinct rows per call: no races.
__global__ void scatter_add_kernel(float *acc, const float *y, const int32_t *idx, const float *w, int64_t n, int64_t D,
                                   bool rb) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * D; i += int64_t(gridDim.x) * blockDim.x) {
        float v = y[i];
        if (rb) v = dev::round_bf16(v);
        if (w) v = __fmul_rn(v, w[i / D]);
        float *a = acc + int64_t(idx[i / D]) * D + i % D;
        *a = __fadd_rn(*a, v);
    }
}

// copy_floats: copy blockIdx.y, strided over its blocks. Bytes: 8 per float; a launch's latency
// for the decode sizes (a 512-float row per sequence), which is what one launch instead of one
// cudaMemcpyAsync per copy saves.
struct copy_batch {
    float_copy c[COPY_BATCH];
};
__global__ void copy_kernel(const __grid_constant__ copy_batch b) {
    pdl_enter();
    const float_copy &c = b.c[blockIdx.y];
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < c.n; i += int64_t(gridDim.x) * blockDim.x)
        c.dst[i] = c.src[i];
}

// Bytes: 4 (K + 1) per element (each route's row read once, acc written once); K adds. One
// thread per (row, channel): its routes fold in the order pos lists them.
__global__ void sum_routes_kernel(float *acc, const float *y, const int32_t *pos, const float *w, int64_t S, int K,
                                  int64_t D, bool rb) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < S * D; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / D, d = i % D;
        float a = 0.0f;
        for (int k = 0; k < K; k++) {
            const int32_t p = pos[t * K + k];
            if (p < 0) continue;
            float v = y[int64_t(p) * D + d];
            if (rb) v = dev::round_bf16(v);
            if (w) v = __fmul_rn(v, w[p]);
            a = __fadd_rn(a, v);
        }
        acc[i] = a;
    }
}

unsigned blocks_for(int64_t n) { return unsigned(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

}  // namespace

Status round_bf16_inplace(float *x, int64_t n, cudaStream_t stream) {
    if (n <= 0) return Status::ok();
    round_kernel<<<blocks_for(n), 256, 0, stream>>>(x, n);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status add_rows(const float *a, const float *b, float *out, int64_t n, bool round_bf16, cudaStream_t stream) {
    if (n <= 0) return Status::ok();
    (void)launch_pdl(add_kernel, blocks_for(n), 256, 0, stream, a, b, out, n, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status gather_rows(const float *x, const int32_t *idx, int64_t n, int64_t D, float *out, cudaStream_t stream) {
    if (n <= 0) return Status::ok();
    gather_kernel<<<blocks_for(n * D), 256, 0, stream>>>(x, idx, n, D, out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status scatter_add_rows(float *acc, const float *y, const int32_t *idx, const float *weight, int64_t n, int64_t D,
                        bool round_bf16, cudaStream_t stream) {
    if (n <= 0) return Status::ok();
    scatter_add_kernel<<<blocks_for(n * D), 256, 0, stream>>>(acc, y, idx, weight, n, D, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status sum_routes(float *acc, const float *y, const int32_t *pos, const float *weight, int64_t S, int K, int64_t D,
                  bool round_bf16, cudaStream_t stream) {
    if (S <= 0) return Status::ok();
    if (K <= 0 || !acc || !y || !pos) return Status::invalid_argument("sum_routes: K " + std::to_string(K) + " or a null pointer");
    sum_routes_kernel<<<blocks_for(S * D), 256, 0, stream>>>(acc, y, pos, weight, S, K, D, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status copy_floats(const float_copy *copies, int count, cudaStream_t stream) {
    if (count < 0 || (count > 0 && !copies)) return Status::invalid_argument("copy_floats: bad copy list");
    for (int i0 = 0; i0 < count; i0 += COPY_BATCH) {
        copy_batch b{};
        int k = 0;
        int64_t longest = 0;
        for (int i = i0; i < count && i < i0 + COPY_BATCH; i++) {
            const float_copy &c = copies[i];
            if (c.n < 0 || (c.n > 0 && (!c.src || !c.dst)))
                return Status::invalid_argument("copy_floats: copy " + std::to_string(i) + " has a null pointer or n < 0");
            if (c.n == 0) continue;
            b.c[k++] = c;
            longest = std::max(longest, c.n);
        }
        if (k == 0) continue;
        const unsigned blocks = unsigned(std::min<int64_t>((longest + 255) / 256, 64));
        (void)launch_pdl(copy_kernel, dim3(blocks, unsigned(k)), 256, 0, stream, b);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
