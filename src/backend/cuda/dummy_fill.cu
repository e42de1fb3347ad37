// Dummy weight fills (see dummy_fill.cuh): one tensor's stored bytes from (seed, id, position).
//
// Layout: FP8_BLOCK codes E4M3 [nrows, ncols] + E8M0 [scale rows, scale cols] of the window;
// MXFP4 codes [nrows, ncols / 2] + E8M0 [nrows, ceil(ncols / 32)]; NVFP4 codes as MXFP4 + E4M3
// [nrows, ncols / 16]; EXL3 trellis [ncols / 16, nrows / 16, 16 K] u16 + suh [ncols], svh [nrows]
// fp16; BF16 / F32 / I64 [nrows, ncols].
//
// Cost (no reads; bytes written = dummy_bytes()): the V4.1 Flash text part is 501 GB (routed
// experts 289 GB, the two Engram tables ~200 GB, which live in host memory), so a GPU's worth
// (~130 GB) is ~27 ms of writes at the ~4.8 TB/s roof. The fill is ALU-bound below that roof:
// a quantized thread writes 16 bytes (16 FP8 or 32 FP4 codes) from 2 or 4 splitmix64 finalizers
// (~25 integer ops each, 64-bit multiplies included) plus a shared-memory lookup and a byte
// insert per code, ~6 integer ops per byte for FP8, ~11 for MXFP4; at H200's ~17 T int32 ops/s
// that is ~3 and ~1.5 TB/s. BF16 / F32 / I64 hash once per element (~30 ops per 2-8 bytes) on
// ~1% of the bytes. NVFP4 is MXFP4's code kernel with an E4M3 scale plane twice as dense. EXL3
// trellis: one finalizer per 8 bytes of random bits, ~4 integer ops per byte, near the write roof.
// Either way 10 GB takes milliseconds; the test prints the measured GB/s.
//
// Invariants: each output byte is written by exactly one thread; values depend only on (key,
// global row, global column) and, for FP8, the block's jitter hashed from (key, block), so a
// window equals the same range of a whole fill and the scale kernel agrees with the code kernel
// without talking to it. No NaN code: the tables hold finite codes only.
//
// Replay: graph-capturable (tables travel in kernel parameters; no device state).
// Test: tests/cuda/dummy_fill_test.cpp: bytes equal to fill_dummy_host (backend/cpu) bit for bit;
// dequantized std within 0.5% of dummy_encoding_for's and 3% of the target; no NaN codes.
#include "backend/cuda/dummy_fill.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

using cpu::DUMMY_JITTERS;
using cpu::DUMMY_LEVELS;
using cpu::dummy_code_tables;
using cpu::dummy_layout;

constexpr int THREADS = 256;
constexpr unsigned MAX_BLOCKS = 1u << 20;  // grid-stride beyond this (an Engram table: 6e9 chunks)

struct quant_params {
    uint8_t *w;
    int64_t nrows, ncols;  // window
    int64_t row0, col0;    // window origin in the tensor
    int64_t cols;          // tensor columns
    int bo, bi;            // scale grid
    int64_t scale_cols;    // tensor scale-grid columns
    uint64_t key;
};

// Bytewise: a parameter struct of bytes promises no wider alignment (768 bytes, 3 per thread).
__device__ __forceinline__ void load_tables(const dummy_code_tables &t, uint8_t (*s)[DUMMY_LEVELS], int n_tables) {
    for (int i = threadIdx.x; i < n_tables * DUMMY_LEVELS; i += blockDim.x)
        s[i / DUMMY_LEVELS][i % DUMMY_LEVELS] = t.code[i / DUMMY_LEVELS][i % DUMMY_LEVELS];
    __syncthreads();
}

// 16 bytes, little-endian words; vector-wide when whole and aligned, bytewise at a row's end.
__device__ __forceinline__ void store16(uint8_t *dst, const uint32_t (&v)[4], int64_t n_bytes) {
    if (n_bytes >= 16 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
        return;
    }
    for (int64_t i = 0; i < n_bytes && i < 16; i++) dst[i] = uint8_t(v[i / 4] >> (8 * (i % 4)));
}

// One thread per 16 codes of a row, all in one scale block (block_in % 16 == 0, col0 % 16 == 0):
// codes c .. c+15 are the bytes of groups c/8 and c/8 + 1.
__global__ void fill_fp8_kernel(quant_params p, dummy_code_tables tabs) {
    __shared__ uint8_t tab[DUMMY_JITTERS][DUMMY_LEVELS];
    load_tables(tabs, tab, DUMMY_JITTERS);
    const int64_t cpr = (p.ncols + 15) / 16, n = p.nrows * cpr, gpr = (p.cols + 7) / 8;
    for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < n; ch += int64_t(gridDim.x) * blockDim.x) {
        const int64_t wr = ch / cpr, wc = (ch - wr * cpr) * 16;
        const int64_t r = p.row0 + wr, c = p.col0 + wc;
        const uint8_t *t = tab[cpu::dummy_block_jitter(p.key, (r / p.bo) * p.scale_cols + c / p.bi)];
        const uint64_t h[2] = {cpu::dummy_group_bits(p.key, r, gpr, c / 8), cpu::dummy_group_bits(p.key, r, gpr, c / 8 + 1)};
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {  // word i: codes 4i .. 4i+3 = bytes 4 (i % 2) .. of h[i / 2]
            const uint32_t bits = uint32_t(h[i / 2] >> (32 * (i % 2)));
            v[i] = uint32_t(t[bits & 0xff]) | uint32_t(t[(bits >> 8) & 0xff]) << 8 |
                   uint32_t(t[(bits >> 16) & 0xff]) << 16 | uint32_t(t[bits >> 24]) << 24;
        }
        store16(p.w + wr * p.ncols + wc, v, p.ncols - wc);
    }
}

// One thread per 32 codes (16 bytes) of a row; col0 % 8 == 0 (MXFP4: % 32, NVFP4: % 16), ncols
// even. Codes past a row's end are computed and not stored.
__global__ void fill_fp4_kernel(quant_params p, dummy_code_tables tabs) {
    __shared__ uint8_t tab[1][DUMMY_LEVELS];
    load_tables(tabs, tab, 1);
    const int64_t cpr = (p.ncols + 31) / 32, n = p.nrows * cpr, gpr = (p.cols + 7) / 8, row_bytes = p.ncols / 2;
    for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < n; ch += int64_t(gridDim.x) * blockDim.x) {
        const int64_t wr = ch / cpr, wc = (ch - wr * cpr) * 32;
        const int64_t r = p.row0 + wr, c = p.col0 + wc;
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {  // word i: codes 8i .. 8i+7 = the bytes of group c/8 + i
            const uint64_t h = cpu::dummy_group_bits(p.key, r, gpr, c / 8 + i);
            uint32_t word = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {  // byte b: codes 2b (low nibble) and 2b + 1
                const uint32_t lo = tab[0][(h >> (16 * b)) & 0xff], hi = tab[0][(h >> (16 * b + 8)) & 0xff];
                word |= (lo | hi << 4) << (8 * b);
            }
            v[i] = word;
        }
        store16(p.w + wr * row_bytes + wc / 2, v, row_bytes - wc / 2);
    }
}

enum class scale_rule { E8M0, E8M0_JITTER, NVFP4_E4M3 };

// One thread per scale byte of the window: E8M0 127 + e (+ the block's jitter for FP8), or
// NVFP4's E4M3 byte of the block.
__global__ void fill_scales_kernel(uint8_t *s, int64_t srows, int64_t scols, int64_t br0, int64_t bc0,
                                   int64_t scale_cols, int base, uint64_t key, scale_rule rule) {
    const int64_t n = srows * scols;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t block = (br0 + i / scols) * scale_cols + bc0 + i % scols;
        s[i] = rule == scale_rule::NVFP4_E4M3 ? cpu::dummy_nvfp4_scale(key, block)
               : uint8_t(base + (rule == scale_rule::E8M0_JITTER ? cpu::dummy_block_jitter(key, block) : 0));
    }
}

struct exl3_params {
    uint16_t *trellis, *sv;        // window tiles; suh [ncols] then svh [nrows]
    int64_t ta, tb;                // window tiles along in / out
    int64_t a0, b0, tiles_out;     // window origin in tiles, the tensor's tiles along out
    int64_t nrows, ncols, row0, col0;
    int k;
    uint16_t suh_mag;
    uint64_t key;
};

// One thread per 8 words (16 bytes) of a tile's 16 K words: two hashes.
__global__ void fill_exl3_trellis_kernel(exl3_params p) {
    const int chunks = 2 * p.k;  // 16 K words / 8
    const int64_t n = p.ta * p.tb * chunks;
    for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < n; ch += int64_t(gridDim.x) * blockDim.x) {
        const int64_t lt = ch / chunks;
        const int part = int(ch - lt * chunks);
        const int64_t la = lt / p.tb, lb = lt - la * p.tb;
        const int64_t tile = (p.a0 + la) * p.tiles_out + p.b0 + lb;
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = uint32_t(cpu::dummy_exl3_word(p.key, tile, p.k, 8 * part + 2 * i)) |
                   uint32_t(cpu::dummy_exl3_word(p.key, tile, p.k, 8 * part + 2 * i + 1)) << 16;
        store16(reinterpret_cast<uint8_t *>(p.trellis + ch * 8), v, 16);
    }
}

__global__ void fill_exl3_vectors_kernel(exl3_params p) {
    const int64_t n = p.ncols + p.nrows;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        p.sv[i] = i < p.ncols ? cpu::dummy_exl3_suh(p.key, p.col0 + i, p.suh_mag)
                              : cpu::dummy_exl3_svh(p.key, p.row0 + i - p.ncols);
}

struct plain_params {
    void *w;
    int64_t nrows, ncols, row0, col0, cols;
    uint64_t key;
    dummy_dist dist;
    float mean, std;
    int64_t range;
};

// One thread per element (grid-stride): T = float, uint16_t (bf16 bits) or int64_t (ids).
template <typename T>
__global__ void fill_plain_kernel(plain_params p) {
    const int64_t n = p.nrows * p.ncols;
    T *w = static_cast<T *>(p.w);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = p.row0 + i / p.ncols, c = p.col0 + i % p.ncols;
        if constexpr (sizeof(T) == 8) {
            w[i] = cpu::dummy_index_value(p.key, r, c, p.range);
        } else {
            const float v = cpu::dummy_plain_value(p.key, r, c, p.cols, p.dist, p.mean, p.std);
            if constexpr (sizeof(T) == 2)
                w[i] = dev::bf16_bits(v);
            else
                w[i] = v;
        }
    }
}

unsigned grid_for(int64_t n) { return unsigned(std::clamp<int64_t>((n + THREADS - 1) / THREADS, 1, MAX_BLOCKS)); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Status fill_dummy(const dummy_tensor_desc &d, void *weight, void *scale, uint64_t seed, cudaStream_t stream) {
    auto Lr = cpu::dummy_prepare(d, seed);
    if (!Lr) return Lr.status();
    const dummy_layout &L = Lr.value();
    const int64_t n = L.nrows * L.ncols;
    if (n == 0) return Status::ok();
    if (!weight || (L.quantized && !scale))
        return Status::invalid_argument(std::string("fill_dummy: ") + (d.name ? d.name : "<unnamed>") + ": null " +
                                        (weight ? "scale" : "weight") + " pointer");
    if (d.format == dummy_format::EXL3) {
        exl3_params ep{static_cast<uint16_t *>(weight), static_cast<uint16_t *>(scale), L.ncols / 16, L.nrows / 16,
                       L.col0 / 16, L.row0 / 16, d.rows / 16, L.nrows, L.ncols, L.row0, L.col0, d.exl3_bits,
                       L.enc.suh_bits, L.key};
        fill_exl3_trellis_kernel<<<grid_for(ep.ta * ep.tb * 2 * ep.k), THREADS, 0, stream>>>(ep);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        fill_exl3_vectors_kernel<<<grid_for(L.nrows + L.ncols), THREADS, 0, stream>>>(ep);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    if (L.quantized) {
        quant_params qp{static_cast<uint8_t *>(weight), L.nrows, L.ncols, L.row0, L.col0, d.cols, L.bo, L.bi,
                        L.scale_cols, L.key};
        if (L.jitter)
            fill_fp8_kernel<<<grid_for(L.nrows * ceil_div(L.ncols, 16)), THREADS, 0, stream>>>(qp, L.tables);
        else
            fill_fp4_kernel<<<grid_for(L.nrows * ceil_div(L.ncols, 32)), THREADS, 0, stream>>>(qp, L.tables);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        const int64_t srows = ceil_div(L.nrows, L.bo), scols = ceil_div(L.ncols, L.bi);
        fill_scales_kernel<<<grid_for(srows * scols), THREADS, 0, stream>>>(static_cast<uint8_t *>(scale), srows, scols,
                                                                           L.row0 / L.bo, L.col0 / L.bi, L.scale_cols,
                                                                           127 + L.enc.scale_exp, L.key,
                                                                           d.format == dummy_format::NVFP4 ? scale_rule::NVFP4_E4M3
                                                                           : L.jitter ? scale_rule::E8M0_JITTER
                                                                                      : scale_rule::E8M0);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    plain_params pp{weight, L.nrows, L.ncols, L.row0, L.col0, d.cols, L.key, d.dist, float(d.mean), float(d.std),
                    d.index_range};
    switch (d.format) {
    case dummy_format::F32:  fill_plain_kernel<float><<<grid_for(n), THREADS, 0, stream>>>(pp); break;
    case dummy_format::BF16: fill_plain_kernel<uint16_t><<<grid_for(n), THREADS, 0, stream>>>(pp); break;
    case dummy_format::I64:  fill_plain_kernel<int64_t><<<grid_for(n), THREADS, 0, stream>>>(pp); break;
    default:                 return Status::not_supported("fill_dummy: unknown format");
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
