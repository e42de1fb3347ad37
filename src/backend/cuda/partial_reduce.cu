// Rank-ordered FP32 sum of TP partials (partial_reduce.cuh has the contract and the cost).
#include "backend/cuda/partial_reduce.cuh"

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

namespace {

// One element per thread iteration; the rank loop is the fixed order (no FMA: only adds).
__global__ void reduce_partials_kernel(partial_set parts, int64_t n, float *out) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        float s = parts.p[0][i];
        for (int r = 1; r < parts.tp; r++) s = __fadd_rn(s, parts.p[r][i]);
        out[i] = s;
    }
}

}  // namespace

Status reduce_partials(const partial_set &parts, int64_t n, float *out, cudaStream_t stream) {
    if (parts.tp < 1 || parts.tp > MAX_REDUCE_RANKS)
        return Status::invalid_argument("reduce_partials: TP " + std::to_string(parts.tp) + " (1.." +
                                        std::to_string(MAX_REDUCE_RANKS) + ")");
    for (int r = 0; r < parts.tp; r++)
        if (!parts.p[r]) return Status::invalid_argument("reduce_partials: partial of rank " + std::to_string(r) + " is null");
    if (n <= 0) return Status::ok();
    const unsigned blocks = unsigned(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024);
    reduce_partials_kernel<<<blocks, 256, 0, stream>>>(parts, n, out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
