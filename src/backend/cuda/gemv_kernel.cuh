// The decode GEMV's work-item body and activation split (gemv.cu says what they compute and
// why): shared by gemv.cu, whose kernels take their jobs as kernel parameters, and moe_routed.cu,
// whose kernels read them from device memory. One body, so both give the same bits for the same
// job and K slicing. Internal to backend/cuda: include only from .cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda/atomic>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/numerics.cuh"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda::gemv_detail {

constexpr int WARPS = 4;      // warps per block; each runs its own work item
constexpr int MAX_JOBS = 24;  // matrices per launch (kernel parameter space)
#ifndef DS41RT_GEMV_STAGES
#define DS41RT_GEMV_STAGES 3
#endif
#ifndef DS41RT_GEMV_CHUNK
#define DS41RT_GEMV_CHUNK 128
#endif
constexpr int STAGES = DS41RT_GEMV_STAGES;  // per-warp ring of weight tiles in flight (cp.async)
constexpr int CHUNK = DS41RT_GEMV_CHUNK;    // bytes of each of the 16 rows per stage (128 or 256)
// Shared-memory row pitch per format, chosen so the fragment reads are free of bank conflicts:
// FP8 reads 8 bytes at 8q per row (pitch = 8 words mod 32: rows of a half-warp land 8 words
// apart), MXFP4 reads 4 bytes at 4q (pitch = 4 words mod 32: rows land 4 words apart).
constexpr int PITCH_FP8 = CHUNK + 32, PITCH_FP4 = CHUNK + 16;
constexpr int LANES_PER_ROW = CHUNK / 16, ROWS_PER_COPY = 32 / LANES_PER_ROW, COPIES = 16 / ROWS_PER_COPY;
constexpr int STAGE_BYTES = 16 * PITCH_FP8;
// MXFP4 stages also carry their rows' E8M0 scales (16 rows x CHUNK / 16 k blocks) after the codes.
constexpr int FP4_SCALE_OFF = 16 * PITCH_FP4, FP4_SCALES = CHUNK / 16;
static_assert(FP4_SCALE_OFF + 16 * FP4_SCALES <= STAGE_BYTES, "MXFP4 scales must fit in the stage");
constexpr int SMEM_BYTES = WARPS * STAGES * STAGE_BYTES;
// MXFP4 one-token items (ONE) take their x codes and activation scales through the ring with the
// weights, into space each stage has spare: the stage's x (32 bytes a k block, in k order) in
// the rows' padding (16 bytes a row), token 0's scales (4 bytes a k block) after the weight
// scales. Loaded per k block from global memory, x was the routed one-token kernel's longest
// stall at V4.1 C1 (ncu source view: 33% of the warp samples, long scoreboard, on the byte
// permutes right after x's loads); through the ring six experts' w1 + w3 took 37.4 us against 45.1
// and the C1 step's median 3.94 / 3.92 ms against 4.05 / 4.06 (H200, 2026-12-02, session 20 runs 1
// and 3). FP8's one-token items take x and its scales the same way, in their rows' padding, and
// the word of their tile's weight-scale row that holds the stage's scales after them, so their
// stage loop has no global load left either (ncu, H100, session 28 run 1: the FP8 one-token
// GEMVs stalled 61% of their cycles on long scoreboard). x alone through the ring had not moved
// the step (H200 session 20: 3.93 / 3.92 ms; wo_b alone lost 0.7 us): the weight-scale loads
// stayed behind the stage wait.
template <bool FP4>
struct one_x {
    static constexpr int PITCH = FP4 ? PITCH_FP4 : PITCH_FP8, PAD = PITCH - CHUNK, KPS = CHUNK / (FP4 ? 16 : 32);
    static constexpr int PIECES = KPS * 32 / 16;  // 16-byte copies of a stage's x
    static constexpr int X_ROWS = KPS * 32 / PAD;  // padding rows the x takes
    // Activation scales: MXFP4 after the weight scales; FP8 in the next padding row, then the
    // tile's weight-scale word (FP8 only: MXFP4's weight scales ride in the ring already).
    static constexpr int SX_OFF = FP4 ? FP4_SCALE_OFF + 16 * FP4_SCALES : X_ROWS * PITCH + CHUNK;
    static constexpr int WS_OFF = (X_ROWS + 1) * PITCH + CHUNK;
    // Byte b of the stage's x: row b / PAD's padding.
    __host__ __device__ static constexpr int at(int b) { return (b / PAD) * PITCH + CHUNK + b % PAD; }
    static_assert(32 % PAD == 0 && PIECES + KPS + 1 <= 32, "a k block's x spans whole padding rows; one copy a lane");
    static_assert(SX_OFF % 16 == 0 && SX_OFF + 4 * KPS <= STAGE_BYTES, "the scales fit in the stage, 16-byte aligned");
    static_assert(FP4 || X_ROWS + 2 <= 16, "FP8: x, its scales and the weight-scale word in the rows' padding");
};
constexpr int SX_TOKENS = 16;  // official mode: per-token activation scales, [K / 32][16]
constexpr int X8_BYTES = 1;    // official mode's split x per channel: the E4M3 byte

struct job {
    const uint8_t *w, *scale;
    const void *xs;     // x as split_x_kernel (or x's producer: gemv_split) left it
    const float *sx;    // official mode: activation scales [K / 32][SX_TOKENS]
    float *y, *partials;
    unsigned *counters;
    int N, K, M;
    int ldy;            // y's row stride in floats (N when rows are contiguous)
    int scols, sshift;  // FP8: scale columns, log2(block_in / 32)
    int row_block_shift; // FP8: log2(block_out / 16)
    int ksplit, kb_per_split, item_begin;
    bool round_out;      // y rounded to bf16 where it is written (gemv_matrix::round_bf16_out)
};

struct batch {
    job jobs[MAX_JOBS];
    int njobs, items;
};


__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }

// Two E4M3 bytes (low byte = lower k) as an fp16 pair, exactly.
__device__ __forceinline__ uint32_t fp8x2_to_h2(uint32_t two) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
// Four E4M3 bytes as two fp16 pairs (bytes 0-1, bytes 2-3): the halves of w feed the
// conversions directly (F2FP reads .H1), where fp8x2_to_h2(w >> 16) costs a shift first.
__device__ __forceinline__ void fp8x4_to_h2x2(uint32_t w, uint32_t &lo, uint32_t &hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
}

// Byte b (= codes 2b, 2b+1 of a 4-byte word w) as an fp16 pair equal to value * 2^-14: the sign
// goes to bit 15 and the 3 magnitude bits to bits 11..9, which lands e = 0 on fp16 subnormals
// (m * 0.5 * 2^-14) and e > 0 on normals, both exact.
template <int B>
__device__ __forceinline__ uint32_t e2m1_byte_to_h2(uint32_t w) {
    const uint32_t b = (w >> (8 * B)) & 0xffu;
    return ((b & 0x8u) << 12) | ((b & 0x7u) << 9) | ((b & 0x80u) << 24) | ((b & 0x70u) << 21);
}

// Eight E2M1 codes (nibble j = code j) as four fp16 pairs equal to value * 2^-14: pairs (0, 2),
// (4, 6), (1, 3), (5, 7). Such an fp16 has a zero low byte and a high byte s000 e1 e0 m 0 (the
// sign at bit 15, the magnitude at bits 11..9: e = 0 lands on subnormals, m * 0.5 * 2^-14; e > 0
// on normals, both exact), so the codes first become those bytes, even codes in ev and odd ones
// in od (byte b: code 2b / 2b + 1; the odd codes' signs are in place already), and a byte permute
// then sets two of them over zero low bytes: 11 integer ops for 8 codes, where building each
// pair's sign and magnitude in place took 15.
__device__ __forceinline__ void e2m1x8_to_h2x4(uint32_t w, uint32_t (&o)[4]) {
    const uint32_t ev = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu);
    const uint32_t od = (w & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu);
    o[0] = __byte_perm(ev, 0u, 0x1404), o[1] = __byte_perm(ev, 0u, 0x3424);
    o[2] = __byte_perm(od, 0u, 0x1404), o[3] = __byte_perm(od, 0u, 0x3424);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


// x for the tensor cores (split_x_rows; gemv.cu runs one job per blockIdx.y).
//  reference: for each 4 consecutive k, one 16-byte word {hi(k, k+1), hi(k+2, k+3), lo(k, k+1),
//    lo(k+2, k+3)}: word r of a row holds k = 4r = (k block r / 8, lane slot (r % 8) / 2, half
//    r % 2), exactly the 4 k a thread feeds one m16n8k16, so B fragments are one 16-byte load.
//  official: E4M3 bytes in natural order (a thread's 8 bytes at 8q become the B fragments of
//    both m16n8k16 of a 32-k block); the scales transposed to [K / 32][SX_TOKENS], so a thread's
//    two tokens are adjacent, and repeated for each 32-k block of a larger act_block, so the
//    kernels index them by k block at a fixed stride.
struct split_job {
    const float *x;
    void *xs;
    float *sx;
    int M, K, act_block;
    int ldx;  // x's row stride in floats (K when rows are contiguous); xs is always [M][K]
};
struct split_batch {
    split_job jobs[MAX_JOBS];
    int njobs;
};

// The CPU's fake_quant_fp8_ue8m0 per activation block: s = pow2_ceil(max(amax, 1e-4) / 448),
// q = e4m3(clamp(x / s)); x / s as x * (1 / s), exact for a power of two. Every producer of an
// official split (split_x_rows, hc_collapse_norm) quantizes through these.
__device__ __forceinline__ float act_scale(float amax) { return dev::pow2_ceil(fmaxf(amax, 1e-4f) * (1.0f / 448.0f)); }
__device__ __forceinline__ float act_inv(float s) { return __int_as_float((254 - int(dev::e8m0_code(s))) << 23); }
__device__ __forceinline__ uint8_t act_code(float x, float inv) { return dev::e4m3_code(fminf(fmaxf(x * inv, -448.0f), 448.0f)); }

// Thread tid of nthreads (nthreads a multiple of 32) splits its share of J.
__device__ __forceinline__ void split_x_rows(const split_job &J, int tid, int nthreads) {
    if (J.act_block == 0) {
        const int row_words = J.K / 4, words = J.M * row_words;
        uint4 *xs = static_cast<uint4 *>(J.xs);
        for (int r = tid; r < words; r += nthreads) {
            const int m = r / row_words;
            const float4 v = reinterpret_cast<const float4 *>(J.x + size_t(m) * J.ldx)[r - m * row_words];
            const __half2 h01 = __floats2half2_rn(v.x, v.y), h23 = __floats2half2_rn(v.z, v.w);
            const __half2 l01 = __floats2half2_rn(v.x - __low2float(h01), v.y - __high2float(h01));
            const __half2 l23 = __floats2half2_rn(v.z - __low2float(h23), v.w - __high2float(h23));
            xs[r] = make_uint4(h2_bits(h01), h2_bits(h23), h2_bits(l01), h2_bits(l23));
        }
        return;
    }
    // Official: one warp per (row, act block); lanes stride the block.
    const int lane = tid & 31;
    const int blocks = J.K / J.act_block, total = J.M * blocks;
    uint8_t *xq = static_cast<uint8_t *>(J.xs);
    for (int i = (tid) >> 5; i < total; i += (nthreads) >> 5) {
        const int m = i / blocks, blk = i % blocks;
        const float *p = J.x + size_t(m) * J.ldx + size_t(blk) * J.act_block;
        float amax = 0.0f;
        for (int k = lane; k < J.act_block; k += 32) amax = fmaxf(amax, fabsf(p[k]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float s = act_scale(amax), inv = act_inv(s);
        for (int k = lane; k < J.act_block; k += 32) xq[size_t(m) * J.K + size_t(blk) * J.act_block + k] = act_code(p[k], inv);
        if (lane < J.act_block / 32) J.sx[(blk * (J.act_block / 32) + lane) * SX_TOKENS + m] = s;
    }
}

// One 32-k block of a 16-row tile into acc. la / lb: this thread's weight bytes of rows ra / rb
// (FP8: 8 bytes at 8q; MXFP4: 4 bytes at 4q, in .x). sa / sb: the rows' weight scales.
// Official mode's per-k-block operands besides the weights, loaded ahead of the weight wait.
template <int NT>
struct x8_operands {
    uint2 x[NT];    // this thread's 8 E4M3 bytes of token nt * 8 + g: k 8q .. 8q+7 of the block
    float2 sx[NT];  // activation scales of tokens nt * 8 + 2q, 2q + 1
};

// This lane's x rows (token nt * 8 + g; official: E4M3 bytes from 8q, W = uint2; reference: the
// fp16 word pairs from 32q bytes, W = uint4) and official activation scales (tokens 2q, 2q + 1),
// addressed once per work item: a k block's loads then add its offset to these bases (an
// immediate within an unrolled stage). Addressed per k block instead, each load redid the 64-bit
// row arithmetic under the m < M predicate (the routed one-tile expert kernel's full stage: 714
// static instructions).
template <int NT, typename W>
struct x_lane {
    const W *x[NT];
    bool ok[NT];  // token nt * 8 + g < M
    const float2 *sx;
};

template <int NT, typename W>
__device__ __forceinline__ x_lane<NT, W> x_lane_of(const void *xs, const float *sx, size_t row_words, int M, int g, int q) {
    x_lane<NT, W> L;
    constexpr int LANE_WORDS = sizeof(W) == 8 ? 1 : 2;  // 8 bytes (official) or 32 (reference) per q
    const W *base = static_cast<const W *>(xs) + LANE_WORDS * q;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int m = nt * 8 + g;
        L.ok[nt] = m < M;
        L.x[nt] = base + (L.ok[nt] ? m : 0) * row_words;
    }
    L.sx = reinterpret_cast<const float2 *>(sx) + q;
    return L;
}

template <int NT>
__device__ __forceinline__ x8_operands<NT> load_x(const x_lane<NT, uint2> &L, int k32) {
    x8_operands<NT> o;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        o.x[nt] = L.ok[nt] ? __ldg(L.x[nt] + k32 * 4) : make_uint2(0, 0);
        o.sx[nt] = __ldg(L.sx + k32 * (SX_TOKENS / 2) + nt * 4);
    }
    return o;
}

// Reference mode's operands of one k block: this thread's two 16-byte words of token nt * 8 + g
// (word h: the fp16 hi and lo pairs of its physical k 4h .. 4h+3), loaded ahead of the weight
// wait as official mode's are. (Loaded after it, per k block, wo_a's GEMV at M = 1 stalled on
// them: ncu long-scoreboard 11.5 warp cycles per instruction, against 5-9 for the official ones.)
template <int NT>
struct xref_operands {
    uint4 x[NT][2];
};

template <int NT>
__device__ __forceinline__ xref_operands<NT> load_x(const x_lane<NT, uint4> &L, int k32) {
    xref_operands<NT> o;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) o.x[nt][h] = L.ok[nt] ? __ldg(L.x[nt] + k32 * 8 + h) : make_uint4(0, 0, 0, 0);
    return o;
}

// Official mode. Weights and x become fp16 (E4M3 converts exactly; MXFP4 codes are placed in fp16
// bits as value * 2^-14) for two m16n8k16: k 8q .. 8q+3 of each row in the first, 8q+4 ..
// 8q+7 in the second. Hopper has no FP8 mma.sync: ptxas lowers m16n8k32.e4m3 to the same two
// HMMA and conversions plus an fp32 add of the accumulator input, which a pair that starts from
// zero does not need. (x kept as fp16 in memory would save its 4 conversions a tile, but doubles
// its loads and registers: six experts' w1 + w3 at M = 16 then ran 68 -> 79 us, H200 2026-12-01.)
// ONE: the item has one token (M = 1), whose sums are acc[0][0] and acc[0][2] (token 2q of lanes
// q = 0); the other two are left at zero, which stores and partial sums of M = 1 ignore or add.
// DS41RT_GEMV_PROBE (benchmark builds only; wrong sums): bit 1 replaces the weights' conversions
// (MXFP4 decode, FP8 cvt) by one mask a word, bit 2 x's, so a probe build's time says what the
// conversions cost a launch (is the kernel bound by its instruction issue or by its memory?).
#ifndef DS41RT_GEMV_PROBE
#define DS41RT_GEMV_PROBE 0
#endif
constexpr uint32_t PROBE_MASK = 0x3c003c00u;  // finite fp16 pairs, whatever the bits

template <bool FP4, int NT, bool ONE>
__device__ __forceinline__ void kblock(uint2 la, uint2 lb, float sa, float sb, const x8_operands<NT> &o,
                                       float (&acc)[NT][4]) {
    float d[NT][4] = {};
    uint32_t a[4];  // a[0], a[2]: row ra; a[1], a[3]: row rb
    constexpr bool PW = DS41RT_GEMV_PROBE & 1, PX = DS41RT_GEMV_PROBE & 2;
    auto x_pair = [](uint32_t four, uint32_t &b0, uint32_t &b1) {
        if constexpr (PX) b0 = b1 = four & PROBE_MASK;
        else fp8x4_to_h2x2(four, b0, b1);
    };
    if constexpr (FP4) {
        // Weights straight to fp16 pairs: the first MMA takes k 8q + {0, 2, 1, 3}, the second
        // 8q + {4, 6, 5, 7}; x's bytes are permuted to the same pairs before their cvt. (Through
        // E4M3 bytes the weights took 9 integer ops and 4 cvt per 8 codes.)
        uint32_t wa[4], wb[4];
        if constexpr (PW) {
#pragma unroll
            for (int i = 0; i < 4; i++) wa[i] = la.x & PROBE_MASK, wb[i] = lb.x & PROBE_MASK;
        } else {
            e2m1x8_to_h2x4(la.x, wa);
            e2m1x8_to_h2x4(lb.x, wb);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            a[0] = wa[h], a[2] = wa[h + 2], a[1] = wb[h], a[3] = wb[h + 2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t b[2];
                x_pair(PX ? (h ? o.x[nt].y : o.x[nt].x) : __byte_perm(o.x[nt].x, o.x[nt].y, h ? 0x7564 : 0x3120), b[0], b[1]);
                mma_f16(d[nt], a, b[0], b[1]);
            }
        }
    } else {  // first k 8q .. 8q+3, then 8q+4 .. 8q+7
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (PW) {
                const uint32_t wa4 = h ? la.y : la.x, wb4 = h ? lb.y : lb.x;
                a[0] = a[2] = wa4 & PROBE_MASK, a[1] = a[3] = wb4 & PROBE_MASK;
            } else {
                fp8x4_to_h2x2(h ? la.y : la.x, a[0], a[2]);
                fp8x4_to_h2x2(h ? lb.y : lb.x, a[1], a[3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t b[2];
                x_pair(h ? o.x[nt].y : o.x[nt].x, b[0], b[1]);
                mma_f16(d[nt], a, b[0], b[1]);
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        acc[nt][0] += d[nt][0] * (sa * o.sx[nt].x), acc[nt][2] += d[nt][2] * (sb * o.sx[nt].x);
        if constexpr (!ONE) acc[nt][1] += d[nt][1] * (sa * o.sx[nt].y), acc[nt][3] += d[nt][3] * (sb * o.sx[nt].y);
    }
}

// Reference mode's k block (ONE instances are official only; the parameter keeps one call site).
template <bool FP4, int NT, bool ONE>
__device__ __forceinline__ void kblock(uint2 la, uint2 lb, float sa, float sb, const xref_operands<NT> &o,
                                       float (&acc)[NT][4]) {
    float d[NT][4] = {};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t a[4];
        if constexpr (FP4) {  // byte 2h holds physical k 4h, 4h+1; byte 2h+1 holds 4h+2, 4h+3
            a[0] = h ? e2m1_byte_to_h2<2>(la.x) : e2m1_byte_to_h2<0>(la.x);
            a[2] = h ? e2m1_byte_to_h2<3>(la.x) : e2m1_byte_to_h2<1>(la.x);
            a[1] = h ? e2m1_byte_to_h2<2>(lb.x) : e2m1_byte_to_h2<0>(lb.x);
            a[3] = h ? e2m1_byte_to_h2<3>(lb.x) : e2m1_byte_to_h2<1>(lb.x);
        } else {  // word h holds physical k 4h .. 4h+3
            const uint32_t wa4 = h ? la.y : la.x, wb4 = h ? lb.y : lb.x;
            a[0] = fp8x2_to_h2(wa4), a[2] = fp8x2_to_h2(wa4 >> 16);
            a[1] = fp8x2_to_h2(wb4), a[3] = fp8x2_to_h2(wb4 >> 16);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint4 xv = o.x[nt][h];
            mma_f16(d[nt], a, xv.x, xv.y);
            mma_f16(d[nt], a, xv.z, xv.w);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        acc[nt][0] += d[nt][0] * sa, acc[nt][1] += d[nt][1] * sa;
        acc[nt][2] += d[nt][2] * sb, acc[nt][3] += d[nt][3] * sb;
    }
}

// The first stages of an item's weight rows (what its prologue will copy) into L2, for a warp
// about to finish another item: the prologue then waits on L2, not HBM. A hint: no data moves
// into shared memory and nothing changes in any sum.
template <bool FP4>
__device__ __forceinline__ void prefetch_item_head(const job &J, int local) {
    constexpr int KB_BYTES = FP4 ? 16 : 32, LINES = (STAGES - 1) * CHUNK / 128;  // 128-byte lines per row
    const int lane = threadIdx.x & 31, nkb = J.K / 32;
    const int tile = local / J.ksplit, ks = local - tile * J.ksplit;
    const int kb0 = ks * J.kb_per_split, kb1 = min(nkb, kb0 + J.kb_per_split);
    const size_t row_bytes = size_t(J.K) / (FP4 ? 2 : 1);
    for (int i = lane; i < 16 * LINES; i += 32) {
        const int r = tile * 16 + (i & 15), line = i >> 4;
        if (r < J.N && line * 128 < (kb1 - kb0) * KB_BYTES)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(J.w + size_t(r) * row_bytes + size_t(kb0) * KB_BYTES + line * 128));
    }
}

// Whether a launch of one-token items takes the ONE instance (below) for this weight format:
// DS41RT_GEMV_ONE=all (default) / fp4 (MXFP4 only) / 0 (none), for comparing. Read once (gemv.cu).
bool one_token_instance(bool fp4);

// NT: token tiles of 8 (M <= 8 * NT). ONE: every item of the launch has M = 1 (kblock), a
// separate kernel instance: as a branch inside one, the two bodies' registers spilled.
template <bool FP4, bool X8, int NT, bool L2HINT = false, bool ONE = false>
__device__ __forceinline__ void gemv_item(const job &J, int local) {
    static_assert(!ONE || (NT == 1 && X8), "one token is one token tile; ONE instances are official only");
    constexpr bool XR = ONE;  // x (and FP8's weight scales) through the ring (one_x)
    constexpr int KB_BYTES = FP4 ? 16 : 32, KPS = CHUNK / KB_BYTES, PITCH = FP4 ? PITCH_FP4 : PITCH_FP8;
    const int lane = threadIdx.x & 31;
    const int N = J.N, K = J.K, M = J.M, nkb = K / 32;
    const int ksplit = J.ksplit;
    const int tile = local / ksplit, ks = local - tile * ksplit;
    const int g = lane >> 2, q = lane & 3;
    const int ra = tile * 16 + g, rb = ra + 8;
    const int kb0 = ks * J.kb_per_split, kb1 = min(nkb, kb0 + J.kb_per_split);  // kb0 % KPS == 0
    const size_t row_bytes = size_t(K) / (FP4 ? 2 : 1);

    // This lane's cp.async sources: 16 bytes at column (lane % LANES_PER_ROW) * 16 of rows
    // lane / LANES_PER_ROW + i * ROWS_PER_COPY; each warp instruction covers whole row segments.
    const int col = (lane % LANES_PER_ROW) * 16, col_kb = col / KB_BYTES, row0 = lane / LANES_PER_ROW;
    const uint8_t *src[COPIES];
    bool row_ok[COPIES];
#pragma unroll
    for (int i = 0; i < COPIES; i++) {
        const int r = tile * 16 + row0 + ROWS_PER_COPY * i;
        row_ok[i] = r < N;
        src[i] = J.w + size_t(row_ok[i] ? r : 0) * row_bytes + size_t(kb0) * KB_BYTES + col;
    }
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t *ring = smem + (threadIdx.x >> 5) * (STAGES * STAGE_BYTES);
    const int nstage = (kb1 - kb0 + KPS - 1) / KPS;
    // MXFP4 scale rows ride in the ring when every stage's 4-byte pieces are aligned (K % 128 ==
    // 0, all real shapes); otherwise they are read from global memory per k block.
    const bool ring_scales = FP4 && nkb % 4 == 0;
    // XR: x's copies of stage s (one per lane, lanes past PIECES + KPS (+ 1) idle). FP8 also
    // copies the 4-byte word of its tile's weight-scale row holding the stage's scales (scols % 4
    // == 0 and a 4-byte aligned row, i.e. K % 128 == 0: all real shapes; otherwise they are read
    // from global memory per k block as before).
    using OX = one_x<FP4>;
    const uint8_t *ws_row = FP4 ? nullptr : J.scale + size_t(tile >> J.row_block_shift) * J.scols;
    const bool ring_ws = XR && !FP4 && J.scols % 4 == 0 && (reinterpret_cast<uintptr_t>(J.scale) & 3u) == 0;
    auto ws_word = [&](int kbs) { return (kbs >> J.sshift) & ~3; };  // the word's first scale index
    auto issue_x = [&](int s) {
        if constexpr (XR) {
            if (s < nstage) {
                uint8_t *stage = ring + (s % STAGES) * STAGE_BYTES;
                const int kbs = kb0 + s * KPS;
                if (lane < OX::PIECES) {
                    const bool ok = kbs + lane / 2 < kb1;
                    cp_async16_ca(stage + OX::at(16 * lane), static_cast<const uint8_t *>(J.xs) + size_t(kbs) * 32 + 16 * lane,
                                  ok ? 16 : 0);
                } else if (lane < OX::PIECES + KPS) {
                    const int u = lane - OX::PIECES;
                    const bool ok = kbs + u < kb1;
                    cp_async4(stage + OX::SX_OFF + 4 * u, J.sx + size_t(ok ? kbs + u : 0) * SX_TOKENS, ok ? 4 : 0);
                } else if (!FP4 && lane == OX::PIECES + KPS && ring_ws) {
                    cp_async4(stage + OX::WS_OFF, ws_row + ws_word(kbs), 4);
                }
            }
        }
    };
    auto issue = [&](int s, bool with_x) {
        if (with_x) issue_x(s);
        if (s < nstage) {
            uint8_t *stage = ring + (s % STAGES) * STAGE_BYTES;
            uint8_t *dst = stage + row0 * PITCH + col;
            const bool k_ok = kb0 + s * KPS + col_kb < kb1;
#pragma unroll
            for (int i = 0; i < COPIES; i++)
                cp_async16<L2HINT>(dst + ROWS_PER_COPY * i * PITCH, src[i] + size_t(s) * CHUNK, row_ok[i] && k_ok ? 16 : 0);
            if (FP4 && ring_scales) {
#pragma unroll
                for (int j = 0; j < FP4_SCALES / 8; j++) {  // 16 rows x FP4_SCALES / 4 pieces
                    const int c = lane + 32 * j, row = c / (FP4_SCALES / 4), part = c % (FP4_SCALES / 4);
                    const int r = tile * 16 + row, kb = kb0 + s * KPS + 4 * part;
                    const bool ok = r < N && kb < kb1;
                    cp_async4(stage + FP4_SCALE_OFF + row * FP4_SCALES + 4 * part,
                              ok ? J.scale + size_t(r) * nkb + kb : J.scale, ok ? 4 : 0);
                }
            }
        }
        cp_async_commit();  // an empty group at the tail keeps the wait count uniform
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) issue(s, false);
    // The weights are no kernel's output: their first stages are on their way before the launch
    // waits for its predecessor (pdl.cuh), whose output x is read from here on.
    pdl_wait();
    if constexpr (XR) {  // the first stages' x: one more group, which stage 0 waits for too
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) issue_x(s);
        cp_async_commit();
    }
    auto stage_wait = [&](int s) {
        if (XR && s == 0) cp_async_wait<0>();
        else cp_async_wait<STAGES - 2>();
        __syncwarp();
    };
    // XR: this lane's x bytes (k 8q .. 8q+7 of a k block) in a stage, k block 0.
    const int x_at = OX::at(8 * q);

    // Scales and x, addressed from k block 0 of the slice.
    const uint8_t *scale_a, *scale_b;
    if constexpr (FP4) {
        scale_a = J.scale + size_t(ra < N ? ra : 0) * nkb;
        scale_b = J.scale + size_t(rb < N ? rb : 0) * nkb;
    } else {
        scale_a = scale_b = J.scale + size_t(tile >> J.row_block_shift) * J.scols;
    }
    // x rows in words: official 32-k blocks of 4 8-byte words (E4M3), reference of 8 16-byte
    // words (fp16 hi / lo pairs).
    using XW = std::conditional_t<X8, uint2, uint4>;
    const x_lane<NT, XW> xl = XR ? x_lane<NT, XW>{} : x_lane_of<NT, XW>(J.xs, J.sx, size_t(K / 32) * (X8 ? 4 : 8), M, g, q);
    // XR: k block u's operands from the stage (every lane takes token 0's x: the other columns'
    // products are never stored, and a column's sums read only its own x).
    auto ring_x = [&](const uint8_t *st, int u, float sxu) {
        x8_operands<NT> o{};
        o.x[0] = *reinterpret_cast<const uint2 *>(st + x_at + (u * 32 / OX::PAD) * OX::PITCH);
        o.sx[0] = make_float2(sxu, 0.0f);
        return o;
    };
    // MXFP4: the decode trick's 2^-14 (both modes) stays in the sums, which the store multiplies
    // back by 2^14 (exact: a power of two), so the per-block scales are the codes' bits alone.
    constexpr float FOLD = FP4 ? 16384.0f : 1.0f;

    float acc[NT][4] = {};
    for (int s = 0; s < nstage; s++) {
        const uint8_t *st = ring + (s % STAGES) * STAGE_BYTES;
        const int kb = kb0 + s * KPS;
        auto weights = [&](int u, uint2 &la, uint2 &lb) {
            if constexpr (FP4) {
                la = make_uint2(*reinterpret_cast<const uint32_t *>(st + g * PITCH + u * 16 + 4 * q), 0);
                lb = make_uint2(*reinterpret_cast<const uint32_t *>(st + (g + 8) * PITCH + u * 16 + 4 * q), 0);
            } else {
                la = *reinterpret_cast<const uint2 *>(st + g * PITCH + u * 32 + 8 * q);
                lb = *reinterpret_cast<const uint2 *>(st + (g + 8) * PITCH + u * 32 + 8 * q);
            }
        };
        auto scale_of = [&](int k32, float &sa, float &sb) {
            if constexpr (FP4) {
                if (ring_scales) {  // only after the stage's wait
                    sa = dev::e8m0_byte_value<0>(st[FP4_SCALE_OFF + g * FP4_SCALES + (k32 - kb)]);
                    sb = dev::e8m0_byte_value<0>(st[FP4_SCALE_OFF + (g + 8) * FP4_SCALES + (k32 - kb)]);
                } else {
                    sa = dev::e8m0_byte_value<0>(__ldg(scale_a + k32));
                    sb = dev::e8m0_byte_value<0>(__ldg(scale_b + k32));
                }
            } else {
                sa = sb = dev::e8m0_value(__ldg(scale_a + (k32 >> J.sshift)));
            }
        };
        // Four ring scales of each row (k blocks g0 .. g0+3 of the stage) from one 4-byte read.
        auto ring_scales4 = [&](int g0, float (&sa)[4], float (&sb)[4]) {
            const uint32_t wa = *reinterpret_cast<const uint32_t *>(st + FP4_SCALE_OFF + g * FP4_SCALES + g0);
            const uint32_t wb = *reinterpret_cast<const uint32_t *>(st + FP4_SCALE_OFF + (g + 8) * FP4_SCALES + g0);
            sa[0] = dev::e8m0_byte_value<0>(wa), sb[0] = dev::e8m0_byte_value<0>(wb);
            sa[1] = dev::e8m0_byte_value<1>(wa), sb[1] = dev::e8m0_byte_value<1>(wb);
            sa[2] = dev::e8m0_byte_value<2>(wa), sb[2] = dev::e8m0_byte_value<2>(wb);
            sa[3] = dev::e8m0_byte_value<3>(wa), sb[3] = dev::e8m0_byte_value<3>(wb);
        };
        if (kb + KPS <= kb1) {
            // A full stage, in groups of 4 k blocks: the scales and x do not come through the ring,
            // so the first group's are requested before waiting on it and their latency hides
            // behind the weights'. Groups bound the registers held.
#pragma unroll
            for (int g0 = 0; g0 < KPS; g0 += 4) {
                float sa[4], sb[4];
                // Scales from the ring wait for the stage (MXFP4's rows, XR FP8's tile word).
                const bool early = !(FP4 && ring_scales) && !ring_ws;
                if (early)
#pragma unroll
                    for (int u = 0; u < 4; u++) scale_of(kb + g0 + u, sa[u], sb[u]);
                // x ahead too, but reference mode's at two token tiles would hold 64 registers
                // (ptxas: 80 -> 134 a thread for FP8), so those stay per k block.
                constexpr bool X_AHEAD = X8 || NT == 1;
                std::conditional_t<X8, x8_operands<NT>, xref_operands<NT>> o[4];
                if constexpr (X_AHEAD && !XR)
#pragma unroll
                    for (int u = 0; u < 4; u++) o[u] = load_x<NT>(xl, kb + g0 + u);
                if (g0 == 0) stage_wait(s);
                if (FP4 && !early) ring_scales4(g0, sa, sb);
                if (!FP4 && ring_ws) {
                    const uint32_t w = *reinterpret_cast<const uint32_t *>(st + OX::WS_OFF);
                    const int w0 = ws_word(kb);
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        sa[u] = sb[u] = dev::e8m0_value((w >> (8 * (((kb + g0 + u) >> J.sshift) - w0))) & 0xffu);
                }
                if constexpr (XR) {
                    const float4 sx4 = *reinterpret_cast<const float4 *>(st + OX::SX_OFF + 4 * g0);
                    o[0] = ring_x(st, g0, sx4.x), o[1] = ring_x(st, g0 + 1, sx4.y);
                    o[2] = ring_x(st, g0 + 2, sx4.z), o[3] = ring_x(st, g0 + 3, sx4.w);
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    uint2 la, lb;
                    weights(g0 + u, la, lb);
                    kblock<FP4, NT, ONE>(la, lb, sa[u], sb[u], X_AHEAD ? o[u] : load_x<NT>(xl, kb + g0 + u), acc);
                }
            }
        } else {
            stage_wait(s);
#pragma unroll 1  // a partial stage: rare (one per item at most), kept small
            for (int u = 0; kb + u < kb1; u++) {
                uint2 la, lb;
                float sa, sb;
                weights(u, la, lb);
                scale_of(kb + u, sa, sb);
                if constexpr (XR)
                    kblock<FP4, NT, ONE>(la, lb, sa, sb,
                                         ring_x(st, u, *reinterpret_cast<const float *>(st + OX::SX_OFF + 4 * u)), acc);
                else kblock<FP4, NT, ONE>(la, lb, sa, sb, load_x<NT>(xl, kb + u), acc);
            }
        }
        __syncwarp();  // every lane is done with this slot before it is refilled
        issue(s + STAGES - 1, true);
    }
    cp_async_wait<0>();

    // acc[nt][i]: row (i < 2 ? ra : rb), token nt * 8 + 2q + (i & 1).
    auto store = [&](const float (&v)[NT][4]) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = nt * 8 + 2 * q + (i & 1);
                const int r = i < 2 ? ra : rb;
                const float y = v[nt][i] * FOLD;
                if (m < M && r < N) J.y[size_t(m) * J.ldy + r] = J.round_out ? dev::round_bf16(y) : y;
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
    // One release-acquire counter step for the warp, not a fence per lane (ncu: membar 1.5 warp
    // cycles per instruction of the small split GEMVs): the warp barrier orders every lane's
    // partial before lane 0's release, and lane 0's acquire before every lane's reads of the other
    // slices' partials (CUTLASS's semaphore pattern, at warp scope).
    __syncwarp();
    unsigned prev = 0;
    if (lane == 0) {
        ::cuda::atomic_ref<unsigned, ::cuda::thread_scope_device> counter(J.counters[tile]);
        prev = counter.fetch_add(1u, ::cuda::memory_order_acq_rel);
    }
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != unsigned(ksplit - 1)) return;
    __syncwarp();
    float sum[NT][4] = {};
    const float *first = J.partials + size_t(tile) * ksplit * SLOT;
#pragma unroll 8
    for (int s = 0; s < ksplit; s++)  // unrolled: the slices' loads are in flight together
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) sum[nt][i] += __ldcg(first + size_t(s) * SLOT + (nt * 4 + i) * 32 + lane);
    store(sum);
    if (lane == 0) J.counters[tile] = 0;
}

}  // namespace ds41rt::backend::cuda::gemv_detail
