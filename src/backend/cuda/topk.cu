// Per-row top-k with lower-index ties (engine::top_indices_ordered) by radix select
// (topk_kernel.cuh) and a bitonic sort of the k picks.
//
// Shapes: v [rows, ld] fp32, the first n columns of each row; idx [rows, k] int32 (-1 past the
// count); count [rows] int32.
// Cost: five reads of each row (four histogram passes and the emit pass), 4n bytes each, from
// L2 after the first (a 65536-wide row is 256 KB); the sort is k log^2 k compare-exchanges in
// shared memory. Decode (16 rows of 65536, k 512): 4.2 MB from DRAM, ~21 MB from L2, 16 blocks:
// bound by one SM's L2 read rate per row (~100-200 GB/s), ~10-20 us; a multi-block split of each
// row would be the next step if it shows in a profile. Prefill (thousands of rows): the blocks
// fill the GPU and the bound is L2 bandwidth. Router (16 rows of 384, k 6): launch-bound. A row
// with no more values than k (an indexer list early in a sequence) skips the radix passes: all
// are picked, only the sort remains (7 us at C1 with them, ncu H200 2026-12-02).
// Invariants: a fixed result for fixed input (no order depends on atomics: the picks are
// collected in any order and then sorted by (key, index), all distinct). Graph-replayable: yes.
// Test: tests/cuda/topk_test.cpp, exact equality with engine::top_indices_ordered.
#include "backend/cuda/topk.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/topk_kernel.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 512;

__global__ void topk_kernel(const float *v, int64_t n, int64_t ld, int k, int32_t *idx, int32_t *count) {
    __shared__ dev::select_smem sm;
    __shared__ uint64_t pick[TOPK_MAX_K];  // (key << 32) | ~index: larger is better, all distinct
    __shared__ uint32_t n_pick;
    const int64_t r = blockIdx.x;
    const float *row = v + r * ld;
    const int kk = int(n < int64_t(k) ? n : int64_t(k));
    int32_t *out = idx + r * k;
    if (kk == 0) {
        for (int i = threadIdx.x; i < k; i += blockDim.x) out[i] = -1;
        if (threadIdx.x == 0) count[r] = 0;
        return;
    }
    if (kk == n) {  // every value is picked (a short list at decode): no threshold to find
        for (int i = threadIdx.x; i < kk; i += blockDim.x)
            pick[i] = (uint64_t(dev::order_key(row[i])) << 32) | uint64_t(~uint32_t(i));
    } else {
        auto load = [row](int64_t i) { return row[i]; };
        const dev::select_threshold th = dev::block_select(load, n, uint32_t(kk), sm);
        if (threadIdx.x == 0) n_pick = 0;
        __syncthreads();
        dev::block_emit(load, n, th, sm, [&](int64_t i, uint32_t key, bool sel) {
            if (sel) pick[atomicAdd(&n_pick, 1u)] = (uint64_t(key) << 32) | uint64_t(~uint32_t(i));
        });
    }
    int p2 = 1;
    while (p2 < kk) p2 <<= 1;
    for (int i = kk + threadIdx.x; i < p2; i += blockDim.x) pick[i] = 0;  // below every real pick
    __syncthreads();
    // Bitonic sort, descending.
    for (int size = 2; size <= p2; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < p2; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const uint64_t a = pick[i], b = pick[j];
                    if ((i & size) == 0 ? a < b : a > b) {
                        pick[i] = b;
                        pick[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    // -inf picks sort last; they and the slots past kk read -1.
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const bool real = i < kk && uint32_t(pick[i] >> 32) != dev::NEG_INF_KEY;
        out[i] = real ? int32_t(~uint32_t(pick[i])) : -1;
    }
    if (threadIdx.x == 0) {
        int c = kk;
        while (c > 0 && uint32_t(pick[c - 1] >> 32) == dev::NEG_INF_KEY) c--;
        count[r] = c;
    }
}

}  // namespace

Status topk_lower_index(const float *v, int64_t rows, int64_t n, int64_t ld, int k, int32_t *idx, int32_t *count,
                        cudaStream_t stream) {
    if (rows < 0 || n < 0 || n > ld || n >= (int64_t(1) << 31) || k < 1 || k > TOPK_MAX_K || rows > INT32_MAX)
        return Status::invalid_argument("topk_lower_index: rows " + std::to_string(rows) + ", n " + std::to_string(n) +
                                        ", ld " + std::to_string(ld) + ", k " + std::to_string(k) + " (1 <= k <= " +
                                        std::to_string(TOPK_MAX_K) + ", n <= ld, n < 2^31)");
    if (rows == 0) return Status::ok();
    if (!v || !idx || !count) return Status::invalid_argument("topk_lower_index: null v, idx or count");
    topk_kernel<<<unsigned(rows), THREADS, 0, stream>>>(v, n, ld, k, idx, count);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
