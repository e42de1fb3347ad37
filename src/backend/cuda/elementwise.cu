#include "backend/cuda/elementwise.cuh"

#include "backend/cuda/cuda_status.h"
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
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = __fadd_rn(a[i], b[i]);
        out[i] = rb ? dev::round_bf16(v) : v;
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
    add_kernel<<<blocks_for(n), 256, 0, stream>>>(a, b, out, n, round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
