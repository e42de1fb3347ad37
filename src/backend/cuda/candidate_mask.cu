// Level-one candidate blocks of the V4.1 indexer (engine v41_model.cpp indexer(), spec 4.7).
//
// Shapes: scores [S, T] fp32; mask [S, T] uint8.
// Cost: the radix select of topk_kernel.cuh over the T / block_size block scores, each block
// score recomputed from its block_size scores on every pass: five reads of a score row (4 T
// bytes each; from L2 after the first) and one write of T mask bytes. Decode (S 16, T 65536):
// 4.2 MB from DRAM, ~17 MB from L2, 16 blocks; bound by one SM's L2 read rate per row, ~10-20 us.
// Prefill rows fill the GPU. apply_candidate_mask: 5 S T bytes, bandwidth-bound.
// Invariants: the selection is a function of the values alone (ties by lower block index), so
// the mask is deterministic. Graph-replayable: yes.
// Test: tests/cuda/candidate_mask_test.cpp, exact equality with the host loop.
#include "backend/cuda/candidate_mask.cuh"

#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/topk_kernel.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 512;

__global__ void candidate_kernel(const float *scores, candidate_params p, uint8_t *mask) {
    __shared__ dev::select_smem sm;
    const int64_t s = blockIdx.x, T = p.T, bs = p.block_size, nb = (T + bs - 1) / bs;
    const float *row = scores + s * T;
    uint8_t *out = mask + s * T;
    const int64_t visible = (p.p0 + s + 1) / p.ratio;
    const int64_t pinned = visible >= 1 ? (visible - 1) / bs : -1;
    auto load = [&](int64_t b) {
        if (b == pinned) return __int_as_float(0x7f800000);
        float m = -__int_as_float(0x7f800000);
        const int64_t end = (b + 1) * bs < T ? (b + 1) * bs : T;
        for (int64_t t = b * bs; t < end; t++) m = m < row[t] ? row[t] : m;  // std::max(m, x)
        return m;
    };
    const int64_t k = nb < p.topk_blocks ? nb : p.topk_blocks;
    const dev::select_threshold th = dev::block_select(load, nb, uint32_t(k), sm);
    dev::block_emit(load, nb, th, sm, [&](int64_t b, uint32_t key, bool sel) {
        const uint8_t in = sel && key != dev::NEG_INF_KEY;
        const int64_t end = (b + 1) * bs < T ? (b + 1) * bs : T;
        for (int64_t t = b * bs; t < end; t++) out[t] = in;
    });
}

__global__ void apply_kernel(float *scores, const uint8_t *mask, int64_t n) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n && !mask[i]) scores[i] = -__int_as_float(0x7f800000);
}

}  // namespace

Status candidate_mask(const float *scores, const candidate_params &p, uint8_t *mask, cudaStream_t stream) {
    if (p.S < 0 || p.S > INT32_MAX || p.T < 0 || p.p0 < 0 || p.ratio < 1 || p.block_size < 1 || p.topk_blocks < 1 ||
        p.T / p.block_size >= (int64_t(1) << 31))
        return Status::invalid_argument("candidate_mask: S " + std::to_string(p.S) + ", T " + std::to_string(p.T) +
                                        ", p0 " + std::to_string(p.p0) + ", ratio " + std::to_string(p.ratio) +
                                        ", block_size " + std::to_string(p.block_size) + ", topk_blocks " +
                                        std::to_string(p.topk_blocks));
    if (p.S == 0 || p.T == 0) return Status::ok();
    if (!scores || !mask) return Status::invalid_argument("candidate_mask: null scores or mask");
    candidate_kernel<<<unsigned(p.S), THREADS, 0, stream>>>(scores, p, mask);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status apply_candidate_mask(float *scores, const uint8_t *mask, int64_t S, int64_t T, cudaStream_t stream) {
    if (S < 0 || T < 0)
        return Status::invalid_argument("apply_candidate_mask: S " + std::to_string(S) + ", T " + std::to_string(T));
    const int64_t n = S * T;
    if (n == 0) return Status::ok();
    if (!scores || !mask) return Status::invalid_argument("apply_candidate_mask: null scores or mask");
    apply_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(scores, mask, n);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
