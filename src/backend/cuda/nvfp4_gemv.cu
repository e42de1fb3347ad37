// NVFP4 W4A4 decode GEMV on Hopper (no FP4 tensor cores: both operands are decoded in registers
// and multiplied as fp16 on mma.m16n8k16). Reference: backend/cpu nvfp4_w4a4_linear on the
// weights dequantized by model/nvfp4 (w = e2m1 * fp32(e4m3 * weight_scale_2)).
//
// Shapes: w [N, K/2] bytes (E2M1, low nibble = even k) and scale [N, K/16] E4M3, both as the
// checkpoint stores them; x [M, K] fp32; y [M, N] fp32; M <= 16, K % 32 == 0.
//
// Cost at V4.1 decode (no prefill shape: this is the decode kernel; prefill wants grouped GEMMs):
// one expert matrix (2304 x 5120 gate / up, or 5120 x 2304 down) is 5.90 MB of codes + 0.74 MB
// of scales = 6.64 MB (0.5625 B per weight) and 2 * M * 11.8 M FLOP: 3.6 * M FLOP per byte,
// under 60 at M = 16 against a ridge of ~200, so HBM binds. The six experts' w1 + w3 of one
// token (12 matrices, 79.6 MB) take ~18.5 us at the H200's ~4.3 TB/s copy rate; their w2 (39.8
// MB) ~9.3 us. The issue rate binds second: per 16-row x 128-k chunk (1,152 bytes) a warp spends
// ~170 instructions (mostly the code decode, ~3.5 per pair of weights; estimated from the PTX,
// not yet profiled), and 4.3 TB/s needs one chunk per ~280 issue slots of the whole GPU (132 SMs
// x 4 schedulers x ~1.98 GHz): ~60% of issue, so the decode is written for instruction count.
//
// Numerics (why the result is within fp32 summation error of the CPU's fp64 sum):
//  - x: nvfp4_quant_x_kernel reproduces backend/cpu nvfp4_fake_quant_act bit for bit (the same
//    IEEE fp32 divisions and products, E4M3 RNE saturating, E2M1 ties as ModelOpt's comparison
//    chain, bf16 RNE): xq is a bf16 value. It is stored as fp16 after a per-row power-of-two
//    shift that puts the row's largest |xq| in [2^14, 2^15): exact for every element down to
//    2^-31 of the row's largest (8 bf16 bits need fp16 values >= 2^-17); smaller ones round
//    with an absolute error of at most 2^-39 of that largest, far under fp32 summation error.
//  - w: an E2M1 code becomes its E4M3 byte (value * 2^-6, exact; 9 integer ops per 8 codes, as
//    gemv.cu), cvt.rn.f16x2.e4m3x2 makes it fp16 (exact), and one fp16 multiply by the E4M3
//    block scale (fp16, exact) gives code * scale * 2^-6: a multiple of 2^-16 with at most 6
//    significant bits and |.| <= 42, so exact in fp16 (subnormals kept: mul.rn.f16x2 without
//    .ftz). The block scale is folded into the operand, so an MMA may mix 16-blocks.
//  - products on the tensor cores are exact; a chunk's 8 MMAs chain in the accumulator (the
//    tensor core's own fp32 addition of 128 products), then one IEEE fp32 add per chunk into
//    the running sum; y = sum * (weight_scale_2 * rowmul * 2^-8), the shifts exact. The CPU
//    instead rounds each weight to fp32 once (w = fp32(code * fp32(scale * ws2))): a relative
//    2^-24 per weight, random in sign.
//
// Fragment layout: a warp owns 16 weight rows x one K slice and walks it in 128-k chunks. Lane
// (g = lane / 4, t = lane % 4) reads bytes [16t, 16t + 16) of the chunk's 64 bytes of rows g and
// g + 8 (one 16-byte load each; a warp load covers 8 whole 64-byte row segments), i.e. k
// [32t, 32t + 32): four 8-code words w, inside 16-block 2t + w / 2. A word's codes 0, 2, 4, 6 and
// 1, 3, 5, 7 become fp16 pairs (0,2), (4,6) for one MMA and (1,3), (5,7) for the next, so in
// logical k the MMA sees a permutation of the physical k; x is stored with the same permutation
// (each 8-k group of a row as [k0 k2 k4 k6 k1 k3 k5 k7] fp16, 16 bytes), so lane t's B fragments
// for a word are one 16-byte load. A dot product may sum its k in any order.
//
// Work and memory: items (16 rows x K slice) go one per warp; weights and scales stream with
// three chunks in flight per warp (registers, ld.global.nc with no L1 allocation and a 256-byte
// L2 prefetch, since the slice's next chunks of a row follow); x (small, shared by every tile)
// comes through L1. Split K when the launch has fewer tiles than resident warps, as gemv: each
// slice writes an fp32 partial, the last to arrive (atomic counter per tile) sums them in slice
// order and writes y, then resets the counter. Deterministic.
//
// Invariants: y does not alias x or w; matrices sharing x share M, K and input_scale (the plan
// checks). Graph-replayable: yes (weights, scalars and shapes are fixed per plan; x is read from
// device memory at run time). Test: tests/cuda/nvfp4_gemv_test.cpp, relative Frobenius error
// <= 1e-5 and every element within 1e-4 of the max |ref| against the CPU reference.
#include "backend/cuda/nvfp4_gemv.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/splitk_plan.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int WARPS = 4;        // warps per block, each on its own item
constexpr int MAX_JOBS = 24;    // matrices per launch (kernel parameter space)
constexpr int CHUNK_K = 128;    // k per chunk: 64 bytes of each of 16 rows
constexpr int MIN_CHUNKS = 2;   // thinnest K slice
constexpr int QUANT_THREADS = 256;

struct job {
    const uint8_t *w, *scale;
    const uint4 *xs;       // quantized x: [M][K / 8] groups of 8 fp16 in fragment order
    const float *rowmul;   // [M] per-row power of two the fp16 x was divided by
    float *y, *partials;
    unsigned *counters;
    float alpha;           // weight_scale_2 * 2^-8 (the decode's 2^-6 and x's 2^14 shift)
    int N, K, M;
    int ksplit, chunks_per_split, item_begin;
};

struct batch {
    job jobs[MAX_JOBS];
    int njobs, items;
};

struct quant_job {
    const float *x;  // [M, K]
    uint4 *xs;       // [M, K / 8]
    float *rowmul;   // [M]
    float input_scale;
    int M, K;
};

struct quant_batch {
    quant_job jobs[MAX_JOBS];
    int njobs;
};

// ---- activation quantization --------------------------------------------------------------
// One 16-block of a row as backend/cpu nvfp4_fake_quant_act computes it (see its comment for
// ModelOpt's definition): s = fp32(e4m3(min(amax / (6 gs), 448)) * gs), s = 1 below 1e-5, then
// bf16(fp32(e2m1_magnitude(|x| / s) * s)) with x's sign. Every step is the same IEEE fp32
// operation as the host's, so xq is bit-identical.
__device__ __forceinline__ void quant_block16(const float *__restrict__ p, float gs, float six_gs, float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 f = __ldg(reinterpret_cast<const float4 *>(p) + i);
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
    }
    // The producer's activations are bf16: fp32 rows are cast first (backend/cpu does the same).
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = dev::round_bf16(v[i]);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(v[i]));
    float s = dev::e4m3_value(dev::e4m3_code(fminf(__fdiv_rn(amax, six_gs), 448.0f)));
    s = __fmul_rn(s, gs);
    if (!(s >= 1e-5f)) s = 1.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const float mag = dev::e2m1_value(dev::e2m1_code(__fdiv_rn(fabsf(v[i]), s)));
        const float q = __fmul_rn(mag, s);
        v[i] = dev::round_bf16(v[i] >= 0.0f ? q : -q);
    }
}

// One block per (x, row): pass 1 finds the row's largest |xq|, pass 2 recomputes xq (cheaper
// than holding the row) and writes it as fp16 shifted by a power of two, in fragment order.
// Bytes per call: M * K * (4 read + 2 written); ~20 ops per element.
__global__ void __launch_bounds__(QUANT_THREADS) nvfp4_quant_x_kernel(const __grid_constant__ quant_batch b) {
    const quant_job &J = b.jobs[blockIdx.y];
    const int m = blockIdx.x;
    if (m >= J.M) return;
    const float gs = J.input_scale, six_gs = __fmul_rn(6.0f, gs);
    const float *row = J.x + size_t(m) * J.K;
    const int nblk = J.K / 16;
    float rmax = 0.0f;
    for (int blk = threadIdx.x; blk < nblk; blk += QUANT_THREADS) {
        float v[16];
        quant_block16(row + blk * 16, gs, six_gs, v);
#pragma unroll
        for (int i = 0; i < 16; i++) rmax = fmaxf(rmax, fabsf(v[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) rmax = fmaxf(rmax, __shfl_xor_sync(0xffffffffu, rmax, o));
    __shared__ float warp_max[QUANT_THREADS / 32];
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = rmax;
    __syncthreads();
    rmax = 0.0f;
#pragma unroll
    for (int w = 0; w < QUANT_THREADS / 32; w++) rmax = fmaxf(rmax, warp_max[w]);
    // rowmul = 2^(E - 127) <= rmax < 2^(E - 126) for the biased exponent E of rmax (E >= 14, so
    // that 1 / rowmul * 2^14 = 2^(141 - E) stays a normal float); x16 = xq * 2^(141 - E).
    const int E = max(14, int((__float_as_uint(rmax) >> 23) & 0xffu));
    const float up = __uint_as_float(uint32_t(268 - E) << 23);
    if (threadIdx.x == 0) J.rowmul[m] = __uint_as_float(uint32_t(E) << 23);
    uint4 *out = J.xs + size_t(m) * (J.K / 8);
    for (int blk = threadIdx.x; blk < nblk; blk += QUANT_THREADS) {
        float v[16];
        quant_block16(row + blk * 16, gs, six_gs, v);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float *u = v + 8 * h;
            auto pair = [&](int a, int c) {
                const __half2 p = __floats2half2_rn(__fmul_rn(u[a], up), __fmul_rn(u[c], up));
                return *reinterpret_cast<const uint32_t *>(&p);
            };
            out[blk * 2 + h] = make_uint4(pair(0, 2), pair(4, 6), pair(1, 3), pair(5, 7));
        }
    }
}

// ---- GEMV --------------------------------------------------------------------------------------

// Eight E2M1 codes (nibble j = code j) as E4M3 bytes equal to value * 2^-6: even = codes 0, 2,
// 4, 6 and odd = codes 1, 3, 5, 7, one per byte. Magnitude bits move to E4M3 bits 4..2 and the
// sign to bit 7 (e = 0 lands on E4M3 subnormals, e > 0 on normals; both exact).
__device__ __forceinline__ void e2m1x8_to_e4m3_split(uint32_t w, uint32_t &even, uint32_t &odd) {
    even = ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);
    odd = ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);
}

// Two E4M3 bytes (the low 16 bits) as an fp16 pair, exactly (cvt.rn.f16x2.e4m3x2).
__device__ __forceinline__ uint32_t e4m3x2_to_h2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// fp16x2 product, round to nearest, subnormals kept (no .ftz).
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 weight bytes, read once per token: no L1 allocation; ask L2 for the whole 256-byte line
// pair, which holds this row's next chunks of the slice.
__device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// One chunk's weight operands of a lane: 16 bytes of rows g and g + 8 (k [32t, 32t + 32) of
// the chunk) and their two E4M3 block scales each (blocks 2t, 2t + 1 of the chunk).
struct chunk_regs {
    uint4 wa, wb;
    uint32_t sa, sb;  // low 16 bits: two E4M3 bytes, block 2t in the low byte
};

// The four words of one row's 16 bytes, decoded and scaled: word w yields the MMA operands
// p[w][0] = codes (0, 2), [1] = (4, 6), [2] = (1, 3), [3] = (5, 7), each * block scale * 2^-6.
__device__ __forceinline__ void decode_word(uint32_t word, uint32_t scale_h2, uint32_t (&p)[4]) {
    uint32_t even, odd;
    e2m1x8_to_e4m3_split(word, even, odd);
    p[0] = hmul2(e4m3x2_to_h2(even), scale_h2);
    p[1] = hmul2(e4m3x2_to_h2(even >> 16), scale_h2);
    p[2] = hmul2(e4m3x2_to_h2(odd), scale_h2);
    p[3] = hmul2(e4m3x2_to_h2(odd >> 16), scale_h2);
}

template <int NT>  // token tiles of 8 (M <= 8 * NT)
__global__ void __launch_bounds__(WARPS * 32) nvfp4_gemv_kernel(const __grid_constant__ batch b) {
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (item >= b.items) return;  // uniform across the warp
    int j = 0;
    while (j + 1 < b.njobs && item >= b.jobs[j + 1].item_begin) ++j;
    const job &J = b.jobs[j];
    const int N = J.N, K = J.K, M = J.M;
    const int local = item - J.item_begin, ksplit = J.ksplit;
    const int tile = local / ksplit, ks = local - tile * ksplit;
    const int g = lane >> 2, t = lane & 3;
    const int ra = tile * 16 + g, rb = ra + 8;
    const bool ok_a = ra < N, ok_b = rb < N;
    const int nchunks = (K + CHUNK_K - 1) / CHUNK_K;
    const int c0 = ks * J.chunks_per_split, c1 = min(nchunks, c0 + J.chunks_per_split);

    const uint8_t *wa_row = J.w + size_t(ok_a ? ra : 0) * (K / 2) + 16 * t;
    const uint8_t *wb_row = J.w + size_t(ok_b ? rb : 0) * (K / 2) + 16 * t;
    const uint16_t *sa_row = reinterpret_cast<const uint16_t *>(J.scale + size_t(ok_a ? ra : 0) * (K / 16)) + t;
    const uint16_t *sb_row = reinterpret_cast<const uint16_t *>(J.scale + size_t(ok_b ? rb : 0) * (K / 16)) + t;
    // This lane's x rows (tokens nt * 8 + g), at k [32t, ...) of chunk 0.
    const uint4 *xrow[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        xok[nt] = nt * 8 + g < M;
        xrow[nt] = J.xs + size_t(xok[nt] ? nt * 8 + g : 0) * (K / 8) + 4 * t;
    }

    auto load = [&](chunk_regs &r, int c) {
        // K % 32 == 0: a lane's 32-k segment is wholly inside or wholly past K.
        const bool live = c < c1 && c * CHUNK_K + 32 * t < K;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        r.wa = live && ok_a ? ld_stream16(wa_row + size_t(c) * (CHUNK_K / 2)) : zero;
        r.wb = live && ok_b ? ld_stream16(wb_row + size_t(c) * (CHUNK_K / 2)) : zero;
        r.sa = live && ok_a ? uint32_t(__ldg(sa_row + size_t(c) * (CHUNK_K / 32))) : 0u;
        r.sb = live && ok_b ? uint32_t(__ldg(sb_row + size_t(c) * (CHUNK_K / 32))) : 0u;
    };

    float acc[NT][4] = {};
    auto compute = [&](const chunk_regs &r, int c) {
        const bool live = c * CHUNK_K + 32 * t < K;
        // x first: its loads (L1 / L2 hits) are in flight while the weights decode.
        uint4 xv[4][NT];
#pragma unroll
        for (int w = 0; w < 4; w++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                xv[w][nt] = live && xok[nt] ? __ldg(xrow[nt] + size_t(c) * (CHUNK_K / 8) + w) : make_uint4(0, 0, 0, 0);
        const uint32_t sa = e4m3x2_to_h2(r.sa), sb = e4m3x2_to_h2(r.sb);  // (block 2t, block 2t + 1)
        const uint32_t sa_lo = __byte_perm(sa, 0, 0x1010), sa_hi = __byte_perm(sa, 0, 0x3232);
        const uint32_t sb_lo = __byte_perm(sb, 0, 0x1010), sb_hi = __byte_perm(sb, 0, 0x3232);
        float d[NT][4] = {};
        const uint32_t wa[4] = {r.wa.x, r.wa.y, r.wa.z, r.wa.w}, wb[4] = {r.wb.x, r.wb.y, r.wb.z, r.wb.w};
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint32_t pa[4], pb[4];
            decode_word(wa[w], w < 2 ? sa_lo : sa_hi, pa);
            decode_word(wb[w], w < 2 ? sb_lo : sb_hi, pb);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mma_f16(d[nt], pa[0], pb[0], pa[1], pb[1], xv[w][nt].x, xv[w][nt].y);
                mma_f16(d[nt], pa[2], pb[2], pa[3], pb[3], xv[w][nt].z, xv[w][nt].w);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] = __fadd_rn(acc[nt][i], d[nt][i]);
    };

    // Three chunks in flight; the loop is unrolled by three so each buffer is a fixed set of
    // registers (a run-time index would move them to local memory).
    chunk_regs r0, r1, r2;
    load(r0, c0), load(r1, c0 + 1), load(r2, c0 + 2);
    for (int c = c0; c < c1; c += 3) {
        compute(r0, c);
        load(r0, c + 3);
        if (c + 1 < c1) {
            compute(r1, c + 1);
            load(r1, c + 4);
        }
        if (c + 2 < c1) {
            compute(r2, c + 2);
            load(r2, c + 5);
        }
    }

    // acc[nt][i]: row (i < 2 ? ra : rb), token nt * 8 + 2t + (i & 1).
    auto store = [&](const float (&v)[NT][4]) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = nt * 8 + 2 * t + (i & 1);
                const int r = i < 2 ? ra : rb;
                if (m < M && r < N) J.y[size_t(m) * N + r] = __fmul_rn(v[nt][i], __fmul_rn(J.alpha, J.rowmul[m]));
            }
    };
    if (ksplit == 1) {
        store(acc);
        return;
    }
    constexpr int SLOT = NT * 4 * 32;  // floats per work item
    float *mine = J.partials + (size_t(tile) * ksplit + ks) * SLOT;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) mine[(nt * 4 + i) * 32 + lane] = acc[nt][i];
    __threadfence();
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(J.counters + tile, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != unsigned(ksplit - 1)) return;
    __threadfence();
    float sum[NT][4] = {};
    const float *first = J.partials + size_t(tile) * ksplit * SLOT;
    for (int s = 0; s < ksplit; s++)  // slice order: deterministic
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) sum[nt][i] = __fadd_rn(sum[nt][i], __ldcg(first + size_t(s) * SLOT + (nt * 4 + i) * 32 + lane));
    store(sum);
    if (lane == 0) J.counters[tile] = 0;
}

// ---- host --------------------------------------------------------------------------------------

int tiles_of(const nvfp4_matrix &m) { return (m.N + 15) / 16; }
int chunks_of(const nvfp4_matrix &m) { return (m.K + CHUNK_K - 1) / CHUNK_K; }
using splitk::align256;
using splitk::token_tiles;

// Quantized x and its row multipliers (16 floats, the most rows).
size_t x_bytes(const nvfp4_matrix &m) { return align256(size_t(m.M) * m.K * 2) + align256(16 * sizeof(float)); }

bool same_x(const nvfp4_matrix &a, const nvfp4_matrix &b) {
    return a.x == b.x && a.M == b.M && a.K == b.K && a.input_scale == b.input_scale;
}

template <int NT>
int blocks_per_sm() {
    static const int blocks = splitk::resident_blocks(nvfp4_gemv_kernel<NT>, WARPS * 32);
    return blocks;
}

bool aligned(const void *p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

// Workspace layout: [tile counters][split-K partials][quantized x, one per distinct x].
Result<nvfp4_gemv_plan> plan_nvfp4_gemv(const device_info &dev, const std::vector<nvfp4_matrix> &mats) {
    nvfp4_gemv_plan plan;
    long total_tiles = 0;
    for (size_t i = 0; i < mats.size(); i++) {
        const nvfp4_matrix &m = mats[i];
        const std::string what = "nvfp4 gemv matrix " + std::to_string(i) + " (" + std::to_string(m.N) + " x " +
                                 std::to_string(m.K) + ", M " + std::to_string(m.M) + ")";
        if (m.M < 1 || m.N < 1 || m.K < 1) return Status::invalid_argument(what + ": empty shape");
        if (m.M > 16) return Status::not_supported(what + ": at most 16 activation rows per launch");
        if (m.K % 32 != 0) return Status::not_supported(what + ": K must be a multiple of 32");
        if (!m.w || !m.scale || !m.x || !m.y) return Status::invalid_argument(what + ": w, scale, x and y must be set");
        if (!aligned(m.w, 16) || !aligned(m.scale, 2) || !aligned(m.x, 16) || !aligned(m.y, 4))
            return Status::invalid_argument(what + ": w and x must be 16-byte aligned, scale 2-byte, y 4-byte");
        if (!(std::isfinite(m.weight_scale_2) && m.weight_scale_2 > 0) || !(std::isfinite(m.input_scale) && m.input_scale > 0))
            return Status::invalid_argument(what + ": weight_scale_2 " + std::to_string(m.weight_scale_2) + " and input_scale " +
                                            std::to_string(m.input_scale) + " must be positive and finite");
        for (size_t k = 0; k < i; k++)
            if (mats[k].x == m.x && !same_x(mats[k], m) && (mats[k].M != m.M || mats[k].K != m.K))
                return Status::invalid_argument(what + ": shares x with matrix " + std::to_string(k) + " at another M or K");
        total_tiles += tiles_of(m);
    }
    plan.mats = mats;
    // One wave of work items when K slicing can provide it (gemv.cu's reasoning): the resident
    // warp count comes from the device, never from a baked-in SM count.
    const int nt = token_tiles(mats);
    const int want = splitk::slices_wanted(
        long(dev.sm_count) * (nt == 1 ? blocks_per_sm<1>() : blocks_per_sm<2>()) * WARPS, total_tiles);
    const int slot_floats = nt * 4 * 32;
    splitk::workspace_layout ws;
    for (const nvfp4_matrix &m : plan.mats) {
        const int ks = splitk::slice_count(chunks_of(m), want, MIN_CHUNKS);
        plan.ksplit.push_back(ks);
        ws.add(size_t(tiles_of(m)), ks, size_t(slot_floats));
    }
    plan.workspace_bytes = splitk::place_x(plan.mats, ws.x_begin(), same_x, x_bytes, &plan.x_offset);
    return plan;
}

Status run_nvfp4_gemv(const nvfp4_gemv_plan &plan, void *workspace, cudaStream_t stream) {
    char *ws = static_cast<char *>(workspace);
    const int nt = token_tiles(plan.mats);
    const int slot_floats = nt * 4 * 32;
    splitk::workspace_layout layout;
    for (size_t i = 0; i < plan.mats.size(); i++) layout.add(size_t(tiles_of(plan.mats[i])), plan.ksplit[i], 0);
    unsigned *counters = reinterpret_cast<unsigned *>(ws);
    float *partials = reinterpret_cast<float *>(ws + layout.counters_bytes());
    auto xs_of = [&](size_t i) { return reinterpret_cast<uint4 *>(ws + plan.x_offset[i]); };
    auto rowmul_of = [&](size_t i) {
        const nvfp4_matrix &m = plan.mats[i];
        return reinterpret_cast<float *>(ws + plan.x_offset[i] + align256(size_t(m.M) * m.K * 2));
    };

    // Quantize every distinct x once.
    quant_batch qb{};
    int max_m = 1;
    auto flush = [&]() -> Status {
        if (qb.njobs == 0) return Status::ok();
        nvfp4_quant_x_kernel<<<dim3(unsigned(max_m), unsigned(qb.njobs)), QUANT_THREADS, 0, stream>>>(qb);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        qb.njobs = 0, max_m = 1;
        return Status::ok();
    };
    for (size_t i = 0; i < plan.mats.size(); i++) {
        if (!splitk::first_use(plan.x_offset, i)) continue;
        const nvfp4_matrix &m = plan.mats[i];
        quant_job &Q = qb.jobs[qb.njobs++];
        Q.x = m.x, Q.xs = xs_of(i), Q.rowmul = rowmul_of(i), Q.input_scale = m.input_scale, Q.M = m.M, Q.K = m.K;
        max_m = std::max(max_m, m.M);
        if (qb.njobs == MAX_JOBS) DS41RT_RETURN_IF_ERROR(flush());
    }
    DS41RT_RETURN_IF_ERROR(flush());

    size_t first = 0;
    while (first < plan.mats.size()) {
        batch b{};
        int items = 0;
        size_t i = first;
        for (; i < plan.mats.size() && b.njobs < MAX_JOBS; i++) {
            const nvfp4_matrix &m = plan.mats[i];
            const int ks = plan.ksplit[i];
            job &J = b.jobs[b.njobs++];
            J.w = m.w, J.scale = m.scale, J.y = m.y;
            J.xs = xs_of(i), J.rowmul = rowmul_of(i);
            J.alpha = m.weight_scale_2 * (1.0f / 256.0f);
            J.N = m.N, J.K = m.K, J.M = m.M;
            J.ksplit = ks;
            J.chunks_per_split = splitk::slice_len(chunks_of(m), ks);  // as plan_nvfp4_gemv
            J.item_begin = items;
            J.partials = partials, J.counters = counters;
            if (ks > 1) {
                counters += tiles_of(m);
                partials += size_t(tiles_of(m)) * ks * slot_floats;
            }
            items += tiles_of(m) * ks;
        }
        b.items = items;
        const int grid = (items + WARPS - 1) / WARPS;
        if (nt == 1)
            nvfp4_gemv_kernel<1><<<grid, WARPS * 32, 0, stream>>>(b);
        else
            nvfp4_gemv_kernel<2><<<grid, WARPS * 32, 0, stream>>>(b);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        first = i;
    }
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
