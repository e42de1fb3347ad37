// Prefill GEMM (v1) in official numerics on the FP8 tensor cores: mma.sync m16n8k32 e4m3 x e4m3
// -> fp32, one MMA per 32-k block, each block's fp32 partial multiplied by its (x scale * w scale)
// and added into the accumulator. Reference: backend/cpu matmul_nt of fake_quant_fp8_ue8m0(x)
// against the dequantized weight.
//
// Roofline at V4.1 prefill, M = 2048: expert w1 (MXFP4 2304 x 5120) is 2 * 2048 * 2304 * 5120 =
// 48.3 GFLOP over 5.9 MB of weight + 42 MB of x (read as 10.5 MB of E4M3): ~800 FLOP per byte
// against the H200's ~300 FLOP/byte ridge (1,278 TFLOP/s dense FP8 / ~4.3 TB/s), so the bound is
// the tensor-core rate: ~38 us at peak. wq_b (FP8 32768 x 1280) 172 GFLOP, wo_b (FP8 5120 x 8192)
// 172 GFLOP: ~135 us each at peak. The quantization pre-passes move M * K * 5 bytes (x read,
// codes written) plus, for MXFP4, N * K * 1.5 bytes (decode to E4M3 codes): a few us.
//
// This is the portable kernel (sm_80 and up); on sm_90a run_gemm_fp8 takes gemm_fp8_sm90.cu's
// wgmma path instead (BF16 operands, there: the E4M3 wgmma's block sums are not exact). Here the
// per-32-k scale multiply needs each block's partial in registers, which mma.sync gives for free.
// Issue budget per warp per 32-k block (64 x 64 warp tile): 32 MMAs, 8 ldmatrix, 128 FFMA for the
// scaled accumulate, plus 16 FMUL (FP8: one weight scale per 32-row group) or 128 FMUL (MXFP4: a
// weight scale per row) for the combined scales.
//
// Passes: (1) x -> E4M3 codes [Mp, Kp] + scales [Kp / 32, Mp] (the CPU quantizer's operations,
// bit-exact; 128-blocks write their scale to each of their four 32-k slots); (2) weight scales
// -> fp32 [Kp / 32, Np] per (row, 32 k); (3) MXFP4 only: codes -> E4M3 bytes [Np, Kp] (every
// E2M1 value is an E4M3 value); (4) the GEMM. Padding is zero codes and zero scales, so the
// GEMM loads activation tiles without bounds checks; FP8 weights are read in place, with rows
// past N and k past K zero-filled by cp.async.
//
// GEMM tiles: 128 (M) x 256 (N) per block, 8 warps of 64 x 64, 128 k per stage, three stages of
// cp.async (60 KB each: both operand tiles plus their scales). Fragment mapping: gemm_fp8_layout.h.
//
// Invariants: K % 32 == 0, K % act_block == 0, FP8 block_out % 32 == 0. No split K: every output
// sums its 32-k blocks in increasing k, so row m's bits do not depend on M (batch invariance).
// Graph-replayable: yes (no state kept between runs).
// Test: tests/cuda/gemm_fp8_test.cpp: relative Frobenius error vs the CPU reference <= 1e-5,
// NaN-poisoned y, rows of a large M bit-identical to the same rows run alone.
#include "backend/cuda/gemm_fp8.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/gemm_fp8_layout.h"
#include "backend/cuda/gemm_fp8_sm90.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace gemm_fp8_layout;

constexpr int STAGES = 3;
constexpr int A_BYTES = BM * PITCH, B_BYTES = BN * PITCH, SX_BYTES = KB * BM * 4, SW_BYTES = KB * BN * 4;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES + SX_BYTES + SW_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
static_assert(KB * BN / 4 == THREADS && KB * BM / 4 <= THREADS, "one 16-byte scale copy per thread");
static_assert(A_BYTES % 16 == 0 && B_BYTES % 16 == 0 && SX_BYTES % 16 == 0, "16-byte aligned regions");

constexpr int PREP_THREADS = 256;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
size_t align256(size_t v) { return (v + 255) / 256 * 256; }

struct layout {
    int64_t mp, np, kp, kbp;
    size_t xq, sx, sw, wq, total;
};

layout layout_of(const gemm_fp8_args &a) {
    layout l;
    l.mp = round_up(a.M, BM), l.np = round_up(a.N, BN), l.kp = round_up(a.K, BK), l.kbp = l.kp / 32;
    l.xq = 0;
    l.sx = align256(size_t(l.mp * l.kp));
    l.sw = l.sx + align256(size_t(l.kbp * l.mp) * 4);
    l.wq = l.sw + align256(size_t(l.kbp * l.np) * 4);
    l.total = l.wq + (a.fp4 ? align256(size_t(l.np * l.kp)) : 0);
    return l;
}

// (1) One thread per 4 channels of the padded [Mp, Kp] grid; the act_block / 4 lanes of a block
// agree on its amax by shuffles (a warp covers 128 channels of one row, blocks aligned). Bytes:
// M * K * 4 read, Mp * Kp written.
__global__ void quant_x_kernel(const float *x, int M, int K, int64_t mp, int64_t kp, int lanes, uint8_t *xq, float *sx) {
    const int64_t per_row = kp / 4, total = mp * per_row;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= total) return;  // total is a multiple of 32: whole warps leave together
    const int64_t m = t / per_row;
    const int k = int(t % per_row) * 4;
    const bool live = m < M && k < K;  // K % act_block == 0: a block is all live or all padding
    float4 v = live ? *reinterpret_cast<const float4 *>(x + m * K + k) : make_float4(0, 0, 0, 0);
    const float amax = dev::block_amax(v, lanes);
    uchar4 c = make_uchar4(0, 0, 0, 0);
    float s = 0.0f;
    if (live) {
        const dev::block_scale bs = dev::scale_of<dev::qkind::FP8_UE8M0>(amax);
        s = bs.s;
        c.x = dev::code_of<dev::qkind::FP8_UE8M0>(v.x, s);
        c.y = dev::code_of<dev::qkind::FP8_UE8M0>(v.y, s);
        c.z = dev::code_of<dev::qkind::FP8_UE8M0>(v.z, s);
        c.w = dev::code_of<dev::qkind::FP8_UE8M0>(v.w, s);
    }
    *reinterpret_cast<uchar4 *>(xq + m * kp + k) = c;
    if (k % 32 == 0) sx[(k / 32) * mp + m] = s;
}

// (2) Weight scales as fp32 per (32-k block, row), zero in the padding. Bytes: Kp / 32 * Np * 4.
__global__ void weight_scale_kernel(const uint8_t *scale, bool fp4, int N, int K, int bo, int bi, int64_t np,
                                    int64_t kbp, float *sw) {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= kbp * np) return;
    const int64_t kb = t / np, n = t % np;
    float v = 0.0f;
    if (n < N && kb < K / 32) {
        const int scols = (K + bi - 1) / bi;
        v = dev::e8m0_value(fp4 ? scale[n * (K / 32) + kb] : scale[(n / bo) * scols + kb * 32 / bi]);
    }
    sw[t] = v;
}

// (3) MXFP4 codes -> E4M3 bytes, 8 codes per thread. Bytes: N * K / 2 read, Np * Kp written.
__global__ void decode_fp4_kernel(const uint8_t *w, int N, int K, int64_t np, int64_t kp, uint8_t *wq) {
    const int64_t per_row = kp / 8;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= np * per_row) return;
    const int64_t n = t / per_row;
    const int k = int(t % per_row) * 8;
    uint32_t packed = 0;
    if (n < N && k < K) packed = *reinterpret_cast<const uint32_t *>(w + n * (K / 2) + k / 2);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo |= uint32_t(dev::e4m3_code(dev::e2m1_value(uint8_t((packed >> (4 * i)) & 0xfu)))) << (8 * i);
        hi |= uint32_t(dev::e4m3_code(dev::e2m1_value(uint8_t((packed >> (16 + 4 * i)) & 0xfu)))) << (8 * i);
    }
    *reinterpret_cast<uint2 *>(wq + n * kp + k) = make_uint2(lo, hi);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint8_t *p) {
    const unsigned a = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct gemm_job {
    const uint8_t *xq;  // [Mp, Kp]
    const float *sx;    // [Kp / 32, Mp]
    const float *sw;    // [Kp / 32, Np]
    const uint8_t *w;   // FP8: the checkpoint's [N, K]; MXFP4: the decoded [Np, Kp]
    int64_t ldw, wrows, wk;  // row stride of w; rows and k that hold data (the rest zero-filled)
    int64_t mp, np, kp;
    float *y;
    int M, N;
    bool round_bf16;
};

__device__ __forceinline__ void load_stage(const gemm_job &J, uint8_t *st, int kt, int64_t m0, int64_t n0, int tid) {
    uint8_t *sa = st, *sb = st + A_BYTES;
    float *ssx = reinterpret_cast<float *>(st + A_BYTES + B_BYTES), *ssw = ssx + KB * BM;
    const int64_t kbyte = int64_t(kt) * BK;
#pragma unroll
    for (int i = 0; i < BM * BK / 16 / THREADS; i++) {
        const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
        cp_async16(sa + r * PITCH + ch * 16, J.xq + (m0 + r) * J.kp + kbyte + ch * 16, 16);
    }
#pragma unroll
    for (int i = 0; i < BN * BK / 16 / THREADS; i++) {
        const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
        const int64_t n = n0 + r, k = kbyte + ch * 16;
        const bool live = n < J.wrows && k < J.wk;
        cp_async16(sb + r * PITCH + ch * 16, live ? J.w + n * J.ldw + k : J.w, live ? 16 : 0);
    }
    if (tid < KB * BM / 4) {
        const int kb = tid / (BM / 4), j = tid % (BM / 4);
        cp_async16(ssx + kb * BM + j * 4, J.sx + (int64_t(kt) * KB + kb) * J.mp + m0 + j * 4, 16);
    }
    {
        const int kb = tid / (BN / 4), j = tid % (BN / 4);
        cp_async16(ssw + kb * BN + j * 4, J.sw + (int64_t(kt) * KB + kb) * J.np + n0 + j * 4, 16);
    }
}

// One stage: KB k blocks of 32, each 32 MMAs per warp, each scaled into acc. The A fragments of
// a k block stay in registers while B walks its n tiles two at a time (a 64 x 64 warp tile has
// 128 accumulators; holding every B fragment and weight scale as well would spill).
template <bool FP4>
__device__ __forceinline__ void compute_stage(const uint8_t *st, int wm, int wn, int lane, float (&acc)[MT][NT][4]) {
    const uint8_t *sa = st, *sb = st + A_BYTES;
    const float *ssx = reinterpret_cast<const float *>(st + A_BYTES + B_BYTES), *ssw = ssx + KB * BM;
    const int g = lane >> 2, q = lane & 3;
#pragma unroll 1
    for (int kb = 0; kb < KB; kb++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) ldsm_x4(a[mt], sa + a_ldsm_offset(wm, mt, kb, lane));
        float sxa[MT], sxb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            sxa[mt] = ssx[kb * BM + wm * WM + mt * 16 + g];
            sxb[mt] = ssx[kb * BM + wm * WM + mt * 16 + g + 8];
        }
        // FP8 grids have block_out % 32 == 0 and warp columns start on a multiple of 32, so
        // n tiles 0-3 share one weight scale and 4-7 another.
        float fa[2][MT], fb[2][MT];
        if constexpr (!FP4) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float w = ssw[kb * BN + wn * WN + h * 32];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) fa[h][mt] = sxa[mt] * w, fb[h][mt] = sxb[mt] * w;
            }
        }
#pragma unroll
        for (int p = 0; p < NT / 2; p++) {
            uint32_t b[4];  // b0, b1 of n tile 2p, then of n tile 2p + 1
            ldsm_x4(b, sb + b_ldsm_offset(wn, p, kb, lane));
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int nt = 2 * p + j;
                float2 w = make_float2(0.0f, 0.0f);
                if constexpr (FP4) w = *reinterpret_cast<const float2 *>(ssw + kb * BN + wn * WN + nt * 8 + 2 * q);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_e4m3(d, a[mt], b[2 * j], b[2 * j + 1]);
                    float s0, s1, s2, s3;
                    if constexpr (FP4) {
                        s0 = sxa[mt] * w.x, s1 = sxa[mt] * w.y, s2 = sxb[mt] * w.x, s3 = sxb[mt] * w.y;
                    } else {
                        s0 = s1 = fa[nt / (NT / 2)][mt], s2 = s3 = fb[nt / (NT / 2)][mt];
                    }
                    acc[mt][nt][0] = fmaf(d[0], s0, acc[mt][nt][0]);
                    acc[mt][nt][1] = fmaf(d[1], s1, acc[mt][nt][1]);
                    acc[mt][nt][2] = fmaf(d[2], s2, acc[mt][nt][2]);
                    acc[mt][nt][3] = fmaf(d[3], s3, acc[mt][nt][3]);
                }
            }
        }
    }
}

__device__ __forceinline__ void store_pair(const gemm_job &J, int64_t m, int64_t n, float v0, float v1) {
    if (m >= J.M || n >= J.N) return;
    if (J.round_bf16) v0 = dev::round_bf16(v0), v1 = dev::round_bf16(v1);
    float *p = J.y + m * J.N + n;
    if (n + 1 < J.N && reinterpret_cast<uintptr_t>(p) % 8 == 0) {
        *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
    } else {
        p[0] = v0;
        if (n + 1 < J.N) p[1] = v1;
    }
}

template <bool FP4>
__global__ void __launch_bounds__(THREADS, 1) gemm_kernel(const __grid_constant__ gemm_job J) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    // M tiles vary fastest: a wave covers all M tiles of a few weight column tiles, so each weight
    // tile comes from HBM about once and the (smaller) quantized x is what L2 serves again.
    const int64_t m0 = int64_t(blockIdx.x) * BM, n0 = int64_t(blockIdx.y) * BN;
    const int KT = int(J.kp / BK);

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT) load_stage(J, smem + s * STAGE_BYTES, s, m0, n0, tid);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free to refill
        const int nk = kt + STAGES - 1;
        if (nk < KT) load_stage(J, smem + (nk % STAGES) * STAGE_BYTES, nk, m0, n0, tid);
        cp_async_commit();
        compute_stage<FP4>(smem + (kt % STAGES) * STAGE_BYTES, wm, wn, lane, acc);
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int64_t m = m0 + c_row(wm, mt, lane, 0), n = n0 + c_col(wn, nt, lane, 0);
            store_pair(J, m, n, acc[mt][nt][0], acc[mt][nt][1]);
            store_pair(J, m + 8, n, acc[mt][nt][2], acc[mt][nt][3]);
        }
}

// The contract of both entry points: K a multiple of 32 and of act_block (32 or 128), FP8 scale
// blocks multiples of 32.
bool shape_ok(int N, int K, int act_block, bool fp4, int bo, int bi) {
    return N > 0 && K > 0 && K % 32 == 0 && (act_block == 32 || act_block == 128) && K % act_block == 0 &&
           (fp4 || (bo > 0 && bo % 32 == 0 && bi > 0 && bi % 32 == 0));
}

Status check(const gemm_fp8_args &a) {
    const std::string shape = "gemm_fp8: M " + std::to_string(a.M) + ", N " + std::to_string(a.N) + ", K " +
                              std::to_string(a.K) + ", act_block " + std::to_string(a.act_block) + ", block " +
                              std::to_string(a.block_out) + "x" + std::to_string(a.block_in) + (a.fp4 ? " (MXFP4)" : " (FP8)");
    if (a.M < 0 || !shape_ok(a.N, a.K, a.act_block, a.fp4 || a.bf16_weight, a.block_out, a.block_in))
        return Status::not_supported(shape + " (K a multiple of 32 and of act_block 32 or 128; FP8 blocks multiples of 32)");
    if (int64_t(a.N) > int64_t(BN) * 65535) return Status::not_supported(shape + ": N too large for one grid");
    if (a.M == 0) return Status::ok();
    if (!a.x || !a.w || (!a.scale && !a.bf16_weight) || !a.y) return Status::invalid_argument(shape + ": null pointer");
    if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return Status::invalid_argument(shape + ": x not 16-byte aligned");
    if (reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return Status::invalid_argument(shape + ": w not 16-byte aligned");
    return Status::ok();
}

unsigned blocks_for(int64_t threads) { return unsigned((threads + PREP_THREADS - 1) / PREP_THREADS); }

// The single product as the wgmma kernel's one group.
gemm_fp8_grouped_args as_group(const gemm_fp8_args &a) {
    gemm_fp8_grouped_args g;
    g.x = a.x, g.R = a.M, g.K = a.K, g.act_block = a.act_block, g.N = a.N;
    g.fp4 = a.fp4, g.block_out = a.block_out, g.block_in = a.block_in, g.exact_x = a.exact_x;
    g.bf16_weight = a.bf16_weight, g.round_bf16 = a.round_bf16;
    g.groups.push_back({0, a.M, a.w, a.scale, a.y});
    return g;
}

}  // namespace

size_t gemm_fp8_workspace_bytes(const gemm_fp8_args &a) {
    if (a.M <= 0 || a.N <= 0 || a.K <= 0) return 0;
    return std::max(layout_of(a).total, gemm_fp8_sm90::workspace_bytes(as_group(a)));  // either kernel may run
}

bool gemm_fp8_kernel_usable(const device_info &dev, gemm_fp8_kernel k) {
    return k != gemm_fp8_kernel::WGMMA || gemm_fp8_sm90::usable(dev, false);
}

Status run_gemm_fp8(const device_info &dev, const gemm_fp8_args &a, void *workspace, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(check(a));
    if (!gemm_fp8_kernel_usable(dev, a.kernel))
        return Status::not_supported("gemm_fp8: the wgmma kernel needs sm_90a code in this build and a cc 9.0 device (" +
                                     dev.name + " is " + std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor) + ")");
    if (a.M == 0) return Status::ok();
    const bool fits = gemm_fp8_sm90::fits(as_group(a));
    if ((a.kernel == gemm_fp8_kernel::WGMMA || a.exact_x || a.bf16_weight) && !fits)
        return Status::not_supported("gemm_fp8: a shape the wgmma kernel does not take");
    const bool wgmma =
        a.kernel == gemm_fp8_kernel::WGMMA || (a.kernel == gemm_fp8_kernel::AUTO && fits && gemm_fp8_sm90::usable(dev, true));
    if (!wgmma && (a.exact_x || a.bf16_weight))
        return Status::not_supported("gemm_fp8: exact x and BF16 weights need the wgmma kernel");
    if (!wgmma && dev.smem_per_block_optin < SMEM_BYTES)
        return Status::not_supported("gemm_fp8: needs " + std::to_string(SMEM_BYTES) + " bytes of shared memory per block, device " +
                                     dev.name + " allows " + std::to_string(dev.smem_per_block_optin));
    if (!workspace) return Status::invalid_argument("gemm_fp8: null workspace");
    if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return Status::invalid_argument("gemm_fp8: workspace not 256-byte aligned");
    if (wgmma) return gemm_fp8_sm90::run(as_group(a), workspace, stream);
    const layout l = layout_of(a);
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    uint8_t *xq = ws + l.xq, *wq = ws + l.wq;
    float *sx = reinterpret_cast<float *>(ws + l.sx), *sw = reinterpret_cast<float *>(ws + l.sw);

    quant_x_kernel<<<blocks_for(l.mp * l.kp / 4), PREP_THREADS, 0, stream>>>(a.x, a.M, a.K, l.mp, l.kp, a.act_block / 4, xq, sx);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    weight_scale_kernel<<<blocks_for(l.kbp * l.np), PREP_THREADS, 0, stream>>>(a.scale, a.fp4, a.N, a.K, a.block_out,
                                                                                a.block_in, l.np, l.kbp, sw);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    gemm_job J;
    J.xq = xq, J.sx = sx, J.sw = sw;
    J.mp = l.mp, J.np = l.np, J.kp = l.kp;
    J.y = a.y, J.M = a.M, J.N = a.N, J.round_bf16 = a.round_bf16;
    if (a.fp4) {
        decode_fp4_kernel<<<blocks_for(l.np * l.kp / 8), PREP_THREADS, 0, stream>>>(a.w, a.N, a.K, l.np, l.kp, wq);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        J.w = wq, J.ldw = l.kp, J.wrows = l.np, J.wk = l.kp;
    } else {
        J.w = a.w, J.ldw = a.K, J.wrows = a.N, J.wk = a.K;
    }
    const dim3 grid(unsigned(l.mp / BM), unsigned(l.np / BN));
    if (a.fp4) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
        gemm_kernel<true><<<grid, THREADS, SMEM_BYTES, stream>>>(J);
    } else {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
        gemm_kernel<false><<<grid, THREADS, SMEM_BYTES, stream>>>(J);
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

size_t gemm_fp8_grouped_workspace_bytes(const gemm_fp8_grouped_args &a) {
    return a.N <= 0 || a.K <= 0 || a.groups.empty() ? 0 : gemm_fp8_sm90::workspace_bytes(a);
}

Status run_gemm_fp8_grouped(const device_info &dev, const gemm_fp8_grouped_args &a, void *workspace, cudaStream_t stream) {
    const std::string shape = "gemm_fp8 grouped: " + std::to_string(a.groups.size()) + " groups, N " + std::to_string(a.N) +
                              ", K " + std::to_string(a.K) + (a.fp4 ? " (MXFP4)" : " (FP8)");
    if (!gemm_fp8_sm90::usable(dev, true)) return Status::not_supported(shape + ": needs the wgmma kernel (sm_90a)");
    if (!shape_ok(a.N, a.K, a.act_block, a.fp4, a.block_out, a.block_in))
        return Status::not_supported(shape + " (K a multiple of 32 and of act_block 32 or 128; FP8 blocks multiples of 32)");
    if (!gemm_fp8_sm90::fits(a)) return Status::not_supported(shape + " (FP8 blocks powers of two; weights under 2^31 bytes)");
    if (!a.x || reinterpret_cast<uintptr_t>(a.x) % 16 != 0)
        return Status::invalid_argument(shape + ": x null or not 16-byte aligned");
    for (const gemm_fp8_group &g : a.groups) {
        if (g.rows < 0 || g.row0 < 0 || g.row0 + g.rows > a.R)
            return Status::invalid_argument(shape + ": a group's rows outside x's " + std::to_string(a.R));
        if (g.rows > 0 && (!g.w || !g.scale || !g.y || reinterpret_cast<uintptr_t>(g.w) % 16 != 0))
            return Status::invalid_argument(shape + ": a group's weight, scales or y null, or its weight not 16-byte aligned");
    }
    if (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
        return Status::invalid_argument(shape + ": workspace null or not 256-byte aligned");
    return gemm_fp8_sm90::run(a, workspace, stream);
}

}  // namespace ds41rt::backend::cuda
