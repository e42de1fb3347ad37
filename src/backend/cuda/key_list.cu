// Cost: n x k pointer writes (8 bytes each) and reads of idx / cnt: 16 x 512 x 12 bytes ~ 100 KB
// at a C16 decode step, launch-latency bound (one launch per sequence and attention layer).
// Test: tests/cuda/key_list_test.cpp (exact: pointers are integers).
#include "backend/cuda/key_list.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

namespace {

__global__ void fill_pick_keys_kernel(const float **keys, int64_t L, int64_t col0, const int32_t *idx,
                                      const int32_t *cnt, int k, const float *entries, int64_t hd) {
    const int64_t r = blockIdx.y;
    const int c = cnt[r];
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x)
        keys[r * L + col0 + j] = j < c ? entries + int64_t(idx[r * k + j]) * hd : nullptr;
}

}  // namespace

Status fill_pick_keys(const float **keys, int64_t L, int64_t col0, const int32_t *idx, const int32_t *cnt, int64_t n,
                      int k, const float *entries, int64_t hd, cudaStream_t stream) {
    if (n <= 0 || k <= 0) return Status::ok();
    if (col0 < 0 || col0 + k > L || n > 65535)
        return Status::invalid_argument("fill_pick_keys: " + std::to_string(k) + " picks at column " +
                                        std::to_string(col0) + " of lists of " + std::to_string(L) + ", " +
                                        std::to_string(n) + " rows");
    const int threads = 128, blocks = (k + threads - 1) / threads;
    fill_pick_keys_kernel<<<dim3(blocks, unsigned(n)), threads, 0, stream>>>(keys, L, col0, idx, cnt, k, entries, hd);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
