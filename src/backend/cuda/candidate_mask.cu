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

// One row's block selection: scores row [T], mask out [T].
__device__ __forceinline__ void select_blocks(const float *row, int64_t T, int64_t visible, int64_t bs, int topk_blocks,
                                              uint8_t *out) {
    __shared__ dev::select_smem sm;
    const int64_t nb = (T + bs - 1) / bs;
    const int64_t pinned = visible >= 1 ? (visible - 1) / bs : -1;
    auto load = [&](int64_t b) {
        if (b == pinned) return __int_as_float(0x7f800000);
        float m = -__int_as_float(0x7f800000);
        const int64_t end = (b + 1) * bs < T ? (b + 1) * bs : T;
        for (int64_t t = b * bs; t < end; t++) m = m < row[t] ? row[t] : m;  // std::max(m, x)
        return m;
    };
    const int64_t k = nb < topk_blocks ? nb : topk_blocks;
    const dev::select_threshold th = dev::block_select(load, nb, uint32_t(k), sm);
    dev::block_emit(load, nb, th, sm, [&](int64_t b, uint32_t key, bool sel) {
        const uint8_t in = sel && key != dev::NEG_INF_KEY;
        const int64_t end = (b + 1) * bs < T ? (b + 1) * bs : T;
        for (int64_t t = b * bs; t < end; t++) out[t] = in;
    });
}

__global__ void candidate_kernel(const float *scores, candidate_params p, uint8_t *mask) {
    const int64_t s = blockIdx.x;
    select_blocks(scores + s * p.T, p.T, (p.p0 + s + 1) / p.ratio, p.block_size, p.topk_blocks, mask + s * p.T);
}

struct candidate_table {
    candidate_row r[CANDIDATE_ROWS_MAX];
};
__global__ void candidate_rows_kernel(const float *scores, int64_t ld, const __grid_constant__ candidate_table tab, int bs,
                                      int topk_blocks, uint8_t *mask) {
    const candidate_row &r = tab.r[blockIdx.x];
    if (r.T > 0) select_blocks(scores + blockIdx.x * ld, r.T, r.visible, bs, topk_blocks, mask + blockIdx.x * ld);
}

struct apply_table {
    candidate_apply_row r[CANDIDATE_ROWS_MAX];
};
__global__ void apply_rows_kernel(float *scores, int64_t ld, const __grid_constant__ apply_table tab) {
    const candidate_apply_row &r = tab.r[blockIdx.y];
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (r.mask && t < r.T && !r.mask[t]) scores[blockIdx.y * ld + t] = -__int_as_float(0x7f800000);
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

Status candidate_mask_rows(const float *scores, int64_t ld, const candidate_row *rows, int n, int block_size,
                           int topk_blocks, uint8_t *mask, cudaStream_t stream) {
    if (n < 0 || n > CANDIDATE_ROWS_MAX || ld < 0 || block_size < 1 || topk_blocks < 1 || ld / block_size >= (int64_t(1) << 31))
        return Status::invalid_argument("candidate_mask_rows: " + std::to_string(n) + " rows (<= " +
                                        std::to_string(CANDIDATE_ROWS_MAX) + "), ld " + std::to_string(ld) +
                                        ", block_size " + std::to_string(block_size) + ", topk_blocks " +
                                        std::to_string(topk_blocks));
    if (n == 0 || ld == 0) return Status::ok();
    if (!scores || !mask || !rows) return Status::invalid_argument("candidate_mask_rows: null scores, rows or mask");
    candidate_table tab{};
    for (int i = 0; i < n; i++) {
        if (rows[i].T < 0 || rows[i].T > ld || rows[i].visible < 0)
            return Status::invalid_argument("candidate_mask_rows: row " + std::to_string(i) + " T " +
                                            std::to_string(rows[i].T) + " (0..ld), visible " + std::to_string(rows[i].visible));
        tab.r[i] = rows[i];
    }
    candidate_rows_kernel<<<unsigned(n), THREADS, 0, stream>>>(scores, ld, tab, block_size, topk_blocks, mask);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status apply_candidate_rows(float *scores, int64_t ld, const candidate_apply_row *rows, int n, cudaStream_t stream) {
    if (n < 0 || n > CANDIDATE_ROWS_MAX || ld < 0)
        return Status::invalid_argument("apply_candidate_rows: " + std::to_string(n) + " rows, ld " + std::to_string(ld));
    if (n == 0 || ld == 0) return Status::ok();
    if (!scores || !rows) return Status::invalid_argument("apply_candidate_rows: null scores or rows");
    apply_table tab{};
    for (int i = 0; i < n; i++) {
        if (rows[i].T < 0 || rows[i].T > ld)
            return Status::invalid_argument("apply_candidate_rows: row " + std::to_string(i) + " T " + std::to_string(rows[i].T));
        tab.r[i] = rows[i];
    }
    apply_rows_kernel<<<dim3(unsigned((ld + 255) / 256), unsigned(n)), 256, 0, stream>>>(scores, ld, tab);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
