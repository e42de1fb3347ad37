// Sparse attention rows (engine attend_row) on the GPU, for every head of R query rows at once.
//
// Four launches, each with every sum in an order fixed by (L, hd) alone:
//  1. scores: s[r, h, i] = float(fp64 sum over d = 0 .. hd-1 of q[r, h, d] * k_i[d]) * scale
//     (-inf for nullptr entries and the pad up to whole 64-entry blocks), on the fp64 tensor
//     cores (mma m8n8k4: one step adds four products of consecutive d). The products are exact
//     in fp64, so wherever the partial sums are exact in fp64 (the official numerics' keys are
//     fp8 / fp4 values: 4-bit significands times q's 24) any order gives the host's cpu::dot bits,
//     and OFFICIAL's bf16 weights follow; elsewhere the step and the host's sequential fmas
//     differ in fp64 roundings, which reach the fp32 score about once in 10^7. A block computes a
//     tile of heads x keys from shared memory holding q and k as fp64 (converted once when
//     staged). The tile size follows R (small tiles so that one row still fills the GPU, large
//     tiles for big batches); it changes which thread runs a chain, never the chain. The small
//     tiles stage all of hd in one go (scores_whole_kernel): a DCH-chunk loop pays one memory
//     latency per chunk, which at decode is all the kernel does.
//  2. softmax: one warp per (r, h) turns the scores into P.V weights in place:
//     TRANSFORMERS: m = max(sink, scores), den = exp(sink - m) + sum exp(s - m), w = exp(s - m) / den
//     OFFICIAL: per block of 64 entries the running max m_b (real scores only; blocks before the
//     first real key are skipped, as the host does), rescale_b = exp(m_{b-1} - m_b), den = den *
//     rescale_b + sum exp(s - m_b), w = bf16(exp(s - m_b)); after the last block den += exp(sink
//     - m). Every den sum runs sequentially in list order, as the host's does (the lanes' exps
//     are shuffled to all lanes one at a time): a butterfly order moved den by an fp32 ulp now and
//     then, and OFFICIAL's bf16(acc / den) can turn that into a bf16 ulp. exp is fp64 rounded
//     once (glibc expf is within an ulp of it).
//  3. P.V: per (row, 64-entry block, heads, dims), part_b[h, d] = the fp64 sum over the block's
//     64 entries of w * k[d] in list order (null entries staged as zeros with weight 0), on the
//     fp64 tensor cores from zero, four entries a step. fp64 because the host sums in fp64: w * k
//     is exact in fp64, so the sum is the host's chain to the bit wherever its partial sums are
//     exact (OFFICIAL's bf16 weights times fp8 / fp4 keys), and an fp64 rounding away elsewhere.
//     An fp32 chain (the first version of this kernel) rounds at every step; at hd 40, where the
//     engine leaves the keys unquantized, a few outputs per 10^4 then crossed a bf16 rounding
//     boundary, and inside the OFFICIAL engine (bf16 and fp8 roundings downstream) one such ulp
//     grew to 2.4e-2 in the fixture's logits.
//  4. fold: acc = 0; for each block b in order: acc = acc * rescale_b + part_b (TRANSFORMERS:
//     acc + part_b), in fp64; out = float(acc) (TRANSFORMERS) or bf16(float(acc) / den) (OFFICIAL).
//     With one block (L <= 64: every fixture list) this is the host's chain exactly; with more,
//     the host adds each product to acc * rescale_b directly, a difference of fp64 roundings
//     that reaches an fp32 output about once in 10^8.
// When R alone fills the GPU, 3 and 4 run in one kernel that loops over the blocks and keeps
// acc in registers (same operations, same bits); otherwise each block is its own CTA and its
// part_b goes through the workspace to a fold kernel, so a single row still uses ~160 CTAs.
//
// Roofline (V4.1: H = 64, hd = 512, L = 640 = 128 window + 512 top-k):
//  bytes from HBM per call: keys R * L * hd * 4 (1.31 MB per row, less where rows share keys in
//  L2) + q and out R * H * hd * 4 * 2 (0.26 MB per row); the scores, weights and partials stay
//  in L2. FLOPs: 2 * R * H * L * hd for the scores and as many for P.V, 84 MFLOP per row: 64
//  FLOP per HBM byte against a ~14 FLOP/byte ridge for the H200's 67 TFLOP/s of fp64 tensor
//  cores, so a prefill (R in the thousands) is bound by them: 1.25 ms per 1024 rows at peak.
//  The large tiles read 8 fp64 fragments from shared memory per 16 mma steps of a warp (1 FLOP
//  per shared byte, above the tensor cores' need). R = 1 is ~1.3 us of arithmetic spread over
//  ~160 CTAs per launch, i.e. launch- and latency-bound.
//
// Invariants: hd % 4 == 0; q, out, the key rows and a caller's workspace 16-byte aligned; out
// aliases neither q nor a key row. Graph-replayable when given a workspace (or after the
// per-stream buffer has grown to the shape).
// Test: tests/cuda/attention_test.cpp (tolerances there).
#include "backend/cuda/attention.cuh"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/dmma.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int BLK = 64;         // the reference kernel's block of list entries
constexpr int PV_HEADS = 64;    // heads of either P.V tile (the keys are read once per 64 heads)
constexpr int SOFTMAX_WARPS = 4;
constexpr int FOLD_THREADS = 256;

__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ float4 load4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

// A key entry's format (cache_pack.cuh key_record: the low 4 bits of its address) and record.
__device__ __forceinline__ uint32_t key_tag(const float *p) { return uint32_t(reinterpret_cast<uintptr_t>(p) & 15u); }
__device__ __forceinline__ const uint8_t *key_bytes(const float *p) {
    return reinterpret_cast<const uint8_t *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
}
// Channels d .. d + 3 (d % 4 == 0) of key p in two steps, so that a thread's loads are all in
// flight before any is used: fetch_key4 reads fp32 channels, or a packed record's code word and
// scale byte (in .x and .y); key4_value, given the key's tag, gives the channels' values, for a
// record by cache_pack's own unpack halves (the same bits). (A decode at the load, not inlined to
// spare the fp32 path's registers, left a thread's packed loads one after another: attention
// over FP8 window rows made a C1 step 8% slower, H100 session 27.)
// FP8_UE8M0_64_BF16_TAIL (V4's): channels from hd - 64 on are the record's bf16 tail, fetched as
// their 8 bytes (.x, .y) and marked in .z. Out of line: inline, its registers spilled the chunked
// scores kernel (8 bytes, ptxas), where the other formats spill none.
__device__ __noinline__ float4 fetch_tail_key4(const uint8_t *rec, int d, int hd) {
    const int cols = hd - int(KEY_BF16_TAIL);
    if (d >= cols) {
        const uint2 t = *reinterpret_cast<const uint2 *>(rec + key_tail_offset(hd) + 2 * (d - cols));
        return make_float4(__uint_as_float(t.x), __uint_as_float(t.y), 1.0f, 0.0f);
    }
    return make_float4(__uint_as_float(dev::quad_codes<dev::qkind::FP8_UE8M0>(rec, d / 4)),
                       __uint_as_float(rec[cols + d / 64]), 0.0f, 0.0f);
}
__device__ __forceinline__ float4 fetch_key4(const float *p, int d, int hd) {
    using dev::qkind;
    const uint32_t tag = key_tag(p);
    if (tag == uint32_t(key_format::F32)) return load4(p + d);
    const uint8_t *rec = key_bytes(p);
    if (tag == uint32_t(key_format::FP8_UE8M0_64_BF16_TAIL)) return fetch_tail_key4(rec, d, hd);
    const bool fp8 = tag == uint32_t(key_format::FP8_UE8M0_32);
    const uint32_t code = fp8 ? dev::quad_codes<qkind::FP8_UE8M0>(rec, d / 4) : dev::quad_codes<qkind::FP4_E4M3>(rec, d / 4);
    const uint32_t scale = rec[fp8 ? hd + d / 32 : hd / 2 + d / 16];
    return make_float4(__uint_as_float(code), __uint_as_float(scale), 0.0f, 0.0f);
}
__device__ __forceinline__ float4 packed_decode4(float4 f, uint32_t tag) {
    using dev::qkind;
    const uint32_t code = __float_as_uint(f.x);
    if (tag == uint32_t(key_format::FP8_UE8M0_64_BF16_TAIL) && f.z != 0.0f) {
        const uint32_t hi = __float_as_uint(f.y);
        return make_float4(dev::bf16_value(uint16_t(code & 0xffffu)), dev::bf16_value(uint16_t(code >> 16)),
                           dev::bf16_value(uint16_t(hi & 0xffffu)), dev::bf16_value(uint16_t(hi >> 16)));
    }
    const uint8_t scale = uint8_t(__float_as_uint(f.y));
    return tag == uint32_t(key_format::FP4_E4M3_16) ? dev::quad_values<qkind::FP4_E4M3>(code, scale)
                                                    : dev::quad_values<qkind::FP8_UE8M0>(code, scale);
}
// The decode is not inlined: inlined into the P.V kernel's unrolled stash it spilled 316 bytes
// (ptxas), where the fp32 path spills none.
__device__ __noinline__ float4 packed_value4(float4 f, uint32_t tag) { return packed_decode4(f, tag); }
__device__ __forceinline__ float4 key4_value(float4 f, uint32_t tag) {
    return tag == uint32_t(key_format::F32) ? f : packed_value4(f, tag);
}
// Load and decode in one call, for a fetch whose registers must stay few (the LOOP P.V kernel).
__device__ __noinline__ float4 packed_key4(const float *p, int d, int hd) {
    return packed_decode4(fetch_key4(p, d, hd), key_tag(p));
}
// A fetch loop's tags: 4 bits for each of a thread's up to 8 key quads.
constexpr int MAX_KEY_FETCHES = 8;

// Four fp64 accumulators (4 consecutive dims of one head).
struct dbl4 {
    double x = 0, y = 0, z = 0, w = 0;
};
__device__ __forceinline__ dbl4 load_d4(const double *p) {
    const double2 a = reinterpret_cast<const double2 *>(p)[0], b = reinterpret_cast<const double2 *>(p)[1];
    return {a.x, a.y, b.x, b.y};
}

// One step of the block fold and the final write, shared by the looping P.V kernel and the fold
// kernel so both produce the same bits. __dmul_rn / __dadd_rn: never contracted to an fma.
__device__ __forceinline__ double fold1(double acc, double part, float rescale, bool official) {
    return official ? __dadd_rn(__dmul_rn(acc, double(rescale)), part) : __dadd_rn(acc, part);
}
__device__ __forceinline__ dbl4 fold4(dbl4 a, dbl4 p, float rescale, bool official) {
    return {fold1(a.x, p.x, rescale, official), fold1(a.y, p.y, rescale, official), fold1(a.z, p.z, rescale, official),
            fold1(a.w, p.w, rescale, official)};
}
__device__ __forceinline__ float finish1(double acc, float den, bool official) {
    return official ? dev::round_bf16(__fdiv_rn(float(acc), den)) : float(acc);
}
__device__ __forceinline__ float4 finish4(dbl4 a, float den, bool official) {
    return make_float4(finish1(a.x, den, official), finish1(a.y, den, official), finish1(a.z, den, official),
                       finish1(a.w, den, official));
}

// acc[a][b] += A_a x B_b over a warp's WM x WN tiles of 8 x 8, row tiles in pairs where WM allows.
template <int WM, int WN>
__device__ __forceinline__ void dmma_tiles(double (&acc)[WM][WN][2], const double (&a)[WM], const double (&b)[WN]) {
#pragma unroll
    for (int i = 0; i + 1 < WM; i += 2)
#pragma unroll
        for (int j = 0; j < WN; j++) dmma2(acc[i][j], acc[i + 1][j], a[i], a[i + 1], b[j]);
    if constexpr (WM % 2 == 1) {
#pragma unroll
        for (int j = 0; j < WN; j++) dmma(acc[WM - 1][j], a[WM - 1], b[j]);
    }
}

// Four floats as doubles into shared memory (two 16-byte stores).
__device__ __forceinline__ void stash4(double *p, float4 v) {
    reinterpret_cast<double2 *>(p)[0] = make_double2(v.x, v.y);
    reinterpret_cast<double2 *>(p)[1] = make_double2(v.z, v.w);
}

// Shared-memory rows of doubles are padded to a pitch of 4 mod 16 doubles: the 16 lanes of a
// 64-bit fragment load (rows g = 0..3 at column t, or rows t at column g) then hit 32 distinct
// banks.
__host__ __device__ constexpr int pitch_of(int cols) { return cols + 4; }

// CTAs per SM the tile kernels are compiled for (a register cap of 65536 / (32 * warps * it)):
// 4-warp tiles three, so that one CTA stages while the others multiply; 8-warp tiles two.
__host__ __device__ constexpr int tile_min_blocks(int warps) { return warps == 8 ? 2 : warps == 4 ? 3 : 1; }

// A warp's WM x WN score tiles (heads from hw0, list entries from i0 + wn0 of row r) to sc,
// times scale, -inf for null entries: the one epilogue of both score kernels, so their bits agree.
template <int WM, int WN>
__device__ __forceinline__ void store_scores(const double (&acc)[WM][WN][2], const float *const *kp, int r, int H, int hw0,
                                             int wn0, int i0, int Lp, float scale, float *sc) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int a = 0; a < WM; a++) {
        const int h = hw0 + 8 * a + g;
        if (h >= H) continue;
#pragma unroll
        for (int b = 0; b < WN; b++) {
            const int j = wn0 + 8 * b + 2 * t;
            const float s0 = kp[j] ? __fmul_rn(float(acc[a][b][0]), scale) : -INFINITY;
            const float s1 = kp[j + 1] ? __fmul_rn(float(acc[a][b][1]), scale) : -INFINITY;
            *reinterpret_cast<float2 *>(sc + (size_t(r) * H + h) * Lp + i0 + j) = make_float2(s0, s1);
        }
    }
}

// Scores of one (row r, HS heads, KS list entries) tile: S = Q K^T over hd on fp64 tensor cores.
// Warp (wm, wn) of NWM x NWN holds 8 WM heads x 8 WN entries; the tile is staged DCH dims at a
// time as fp64 (converted once), the next chunk's floats in registers while this one is used.
// Every score is the chain of hd / 4 steps from d = 0 whatever the tile (a zero-padded step past
// hd adds exact zeros), so its bits depend on (hd) alone, not on R or the tile chosen.
template <int WM, int WN, int NWM, int NWN, int DCH>
__global__ void __launch_bounds__(32 * NWM * NWN, tile_min_blocks(NWM * NWN))
    scores_kernel(const float *q, const float *const *keys, int H, int L, int hd, float scale, int Lp, float *sc) {
    pdl_enter();
    constexpr int HS = 8 * WM * NWM, KS = 8 * WN * NWN, NT = 32 * NWM * NWN, P = pitch_of(DCH), C4 = DCH / 4;
    constexpr int QV = HS * C4 / NT, KV = KS * C4 / NT;  // float4 loads per thread and chunk
    static_assert(HS * C4 % NT == 0 && KS * C4 % NT == 0, "the chunk must split evenly over the threads");
    extern __shared__ __align__(16) double smem_d[];
    double *q_s = smem_d, *k_s = smem_d + HS * P;
    __shared__ const float *kp[KS];
    const int r = blockIdx.z, h0 = blockIdx.y * HS, i0 = blockIdx.x * KS, tid = threadIdx.x;
    for (int j = tid; j < KS; j += NT) kp[j] = i0 + j < L ? keys[size_t(r) * L + i0 + j] : nullptr;
    __syncthreads();
    static_assert(KV <= MAX_KEY_FETCHES, "a thread's key quads must fit the tag word");
    float4 qr[QV], kr[KV];
    uint32_t ktag = 0;
    auto fetch = [&](int d0) {
#pragma unroll
        for (int u = 0; u < QV; u++) {
            const int e = tid + u * NT, h = h0 + e / C4, d = d0 + 4 * (e % C4);
            qr[u] = (h < H && d < hd) ? load4(q + (size_t(r) * H + h) * hd + d) : zero4();
        }
        ktag = 0;
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int e = tid + u * NT, d = d0 + 4 * (e % C4);
            const float *p = kp[e / C4];
            kr[u] = (p && d < hd) ? fetch_key4(p, d, hd) : zero4();
            if (p) ktag |= key_tag(p) << (4 * u);
        }
    };
    auto stash = [&]() {
#pragma unroll
        for (int u = 0; u < QV; u++) {
            const int e = tid + u * NT;
            stash4(q_s + (e / C4) * P + 4 * (e % C4), qr[u]);
        }
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int e = tid + u * NT;
            stash4(k_s + (e / C4) * P + 4 * (e % C4), key4_value(kr[u], (ktag >> (4 * u)) & 15u));
        }
    };
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm0 = (warp % NWM) * 8 * WM, wn0 = (warp / NWM) * 8 * WN;
    double acc[WM][WN][2];
#pragma unroll
    for (int a = 0; a < WM; a++)
#pragma unroll
        for (int b = 0; b < WN; b++) acc[a][b][0] = acc[a][b][1] = 0.0;
    fetch(0);
    for (int d0 = 0; d0 < hd; d0 += DCH) {
        stash();
        __syncthreads();
        if (d0 + DCH < hd) fetch(d0 + DCH);
#pragma unroll
        for (int s = 0; s < DCH / 4; s++) {
            double qa[WM], kb[WN];
#pragma unroll
            for (int a = 0; a < WM; a++) qa[a] = q_s[(wm0 + 8 * a + g) * P + 4 * s + t];
#pragma unroll
            for (int b = 0; b < WN; b++) kb[b] = k_s[(wn0 + 8 * b + g) * P + 4 * s + t];
            dmma_tiles<WM, WN>(acc, qa, kb);
        }
        __syncthreads();
    }
    store_scores<WM, WN>(acc, kp, r, H, h0 + wm0, wn0, i0, Lp, scale, sc);
}

// The scores tile of scores_kernel with the whole of hd staged at once, as fp32 (converted to
// fp64 as each fragment is read: exact, so the same chains and bits): a row's decode call has too
// few tiles to hide the DCH-chunk loop's one memory latency per chunk (hd 512: 16 chunks in a
// chain, ~15 us at R = 1 on the H200), while here every copy of the tile is in flight at once.
// Pitch = (hd rounded up to 32) + 4 floats: 4 mod 32, so the 32 lanes of a fragment read (rows g,
// columns t) hit 32 banks; the columns past hd are zeros, the zero-padded steps of scores_kernel.
// NWM x NWN warps each take 8 WM heads x 8 WN entries (WM = 2: one m16n8k4 a step on sm_90); all
// NWT warps of the CTA stage and decode the rows first. At a decode row the kernel is a chain of
// instructions per warp (ncu, H100, session 29: 16 CTAs, ~6,600 instructions a warp at 0.21 issued
// per scheduler, 18 us; half of them the packed keys' decode), so the decode tile takes 16 entries
// on 2 MMA warps with 4 warps staging: twice the CTAs, each warp staging 8 rows, not 12, and
// decoding 4 keys, not 8.
__host__ __device__ constexpr int whole_pitch(int hd) { return (hd + 31) / 32 * 32 + 4; }
template <int WM, int WN, int NWM, int NWN>
constexpr size_t scores_whole_smem(int hd) {
    return size_t(8 * WM * NWM + 8 * WN * NWN) * whole_pitch(hd) * sizeof(float);
}

template <int WM, int WN, int NWM, int NWN, int NWT>
__global__ void __launch_bounds__(32 * NWT)
    scores_whole_kernel(const float *q, const float *const *keys, int H, int L, int hd, float scale, int Lp, float *sc) {
    static_assert(NWT >= NWM * NWN, "every MMA warp stages too");
    pdl_enter();
    constexpr int HS = 8 * WM * NWM, KS = 8 * WN * NWN, NW = NWT;
    extern __shared__ __align__(16) float smem_f[];
    const int P = whole_pitch(hd), C = P / 4 - 1;  // float4 columns staged per row (hd rounded up to 32)
    float *q_s = smem_f, *k_s = smem_f + HS * P;
    __shared__ const float *kp[KS];
    const int r = blockIdx.z, h0 = blockIdx.y * HS, i0 = blockIdx.x * KS, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    for (int j = tid; j < KS; j += 32 * NW) kp[j] = i0 + j < L ? keys[size_t(r) * L + i0 + j] : nullptr;
    __syncthreads();
    // A warp a row: HS q rows then KS key rows, 16-byte copies; missing rows and the pad as zeros.
    // A packed key's record is copied as it is to the end of its row's slot, then decoded into
    // the slot in place (each lane's quads read before any is written: at most hd 1024; longer
    // packed rows are decoded straight from global memory).
    constexpr int MAXQ = 8;
    for (int row = warp; row < HS + KS; row += NW) {
        const float *src = row < HS ? (h0 + row < H ? q + (size_t(r) * H + h0 + row) * hd : nullptr) : kp[row - HS];
        const uint32_t tag = src ? key_tag(src) : 0u;
        float *dst = smem_f + row * P;
        if (tag != 0 && C <= 32 * MAXQ) {
            const int rb = int(key_record_bytes(key_format(tag), hd));
            uint8_t *raw = reinterpret_cast<uint8_t *>(dst + P) - rb;
            for (int c = lane; c < rb / 16; c += 32) cp_async16(raw + 16 * c, key_bytes(src) + 16 * c, 16);
            continue;
        }
        for (int c = lane; c < C; c += 32) {
            if (src && 4 * c < hd && tag == 0) cp_async16(dst + 4 * c, src + 4 * c, 16);
            else if (src && 4 * c < hd) *reinterpret_cast<float4 *>(dst + 4 * c) = key4_value(fetch_key4(src, 4 * c, hd), tag);
            else *reinterpret_cast<float4 *>(dst + 4 * c) = zero4();
        }
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (C <= 32 * MAXQ) {
        for (int row = HS + warp; row < HS + KS; row += NW) {
            const float *src = kp[row - HS];
            const uint32_t tag = src ? key_tag(src) : 0u;
            if (tag == 0) continue;
            float *dst = smem_f + row * P;
            // The record's copy, tagged as its key: read by the same fetch and decode as in global memory.
            const float *raw = key_record(reinterpret_cast<const uint8_t *>(dst + P) - key_record_bytes(key_format(tag), hd),
                                          key_format(tag));
            float4 v[MAXQ];
#pragma unroll
            for (int k = 0; k < MAXQ; k++) {
                const int c = lane + 32 * k;
                v[k] = zero4();
                if (c < C && 4 * c < hd) v[k] = packed_decode4(fetch_key4(raw, 4 * c, hd), tag);
            }
            __syncwarp();
#pragma unroll
            for (int k = 0; k < MAXQ; k++)
                if (lane + 32 * k < C) *reinterpret_cast<float4 *>(dst + 4 * (lane + 32 * k)) = v[k];
        }
        __syncthreads();
    }
    if (warp >= NWM * NWN) return;  // staging only
    const int g = lane >> 2, t = lane & 3;
    const int wm0 = (warp % NWM) * 8 * WM, wn0 = (warp / NWM) * 8 * WN;
    const float *qa_p[WM], *kb_p[WN];
#pragma unroll
    for (int a = 0; a < WM; a++) qa_p[a] = q_s + (wm0 + 8 * a + g) * P + t;
#pragma unroll
    for (int b = 0; b < WN; b++) kb_p[b] = k_s + (wn0 + 8 * b + g) * P + t;
    double acc[WM][WN][2];
#pragma unroll
    for (int a = 0; a < WM; a++)
#pragma unroll
        for (int b = 0; b < WN; b++) acc[a][b][0] = acc[a][b][1] = 0.0;
#pragma unroll 8
    for (int s = 0; s < C; s++) {
        double qa[WM], kb[WN];
#pragma unroll
        for (int a = 0; a < WM; a++) qa[a] = double(qa_p[a][4 * s]);
#pragma unroll
        for (int b = 0; b < WN; b++) kb[b] = double(kb_p[b][4 * s]);
        dmma_tiles<WM, WN>(acc, qa, kb);
    }
    store_scores<WM, WN>(acc, kp, r, H, h0 + wm0, wn0, i0, Lp, scale, sc);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// acc + v(lane 0) + v(lane 1) + ... + v(lane 31), one add at a time: the host's sequential
// order over 32 consecutive list entries. Every lane ends with the same bits.
__device__ __forceinline__ float seq_sum(float acc, float v) {
#pragma unroll
    for (int j = 0; j < 32; j++) acc = __fadd_rn(acc, __shfl_sync(0xffffffffu, v, j));
    return acc;
}

// One warp per (r, h): scores -> weights in place; OFFICIAL also rescale [R, H, nblk] and den [R, H].
// Only -inf marks a missing key, so a NaN score (bad input) still poisons the output as on the host.
__global__ void __launch_bounds__(32 * SOFTMAX_WARPS)
    softmax_kernel(float *sc, const float *sink, int RH, int H, int L, int Lp, int nblk, bool official,
                   float *rescale, float *den_out) {
    pdl_enter();
    const int rh = blockIdx.x * SOFTMAX_WARPS + int(threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (rh >= RH) return;
    float *s = sc + size_t(rh) * Lp;
    const float snk = sink[rh % H];
    if (!official) {
        float m = snk;
        for (int i = lane; i < L; i += 32) m = fmaxf(m, s[i]);
        m = warp_max(m);
        // Lp is a multiple of 64: every lane takes part in every shuffle.
        float den = exp_f(__fsub_rn(snk, m));
#pragma unroll 2  // lets the exps of the next entries overlap the add chain
        for (int i = lane; i < Lp; i += 32) {
            const float e = s[i] != -INFINITY ? exp_f(__fsub_rn(s[i], m)) : 0.0f;
            s[i] = e;
            den = seq_sum(den, e);
        }
        for (int i = lane; i < Lp; i += 32) s[i] = __fdiv_rn(s[i], den);
        return;
    }
    // Branch-free, so that the shuffles and exps of consecutive blocks can overlap; only m and
    // den carry from one block to the next.
    float m = -INFINITY, den = 0.0f;
#pragma unroll 2
    for (int b = 0; b < nblk; b++) {
        float *sb = s + b * BLK;
        const float s1 = sb[lane], s2 = sb[lane + 32];
        const float bm = fmaxf(m, warp_max(fmaxf(s1, s2)));
        // Before the first real key (bm = -inf) the host skips the block: rescale 1 and zero
        // weights leave acc and den at 0. At the first real block m = -inf and rescale is 0.
        const float rs = bm > -INFINITY ? exp_f(__fsub_rn(m, bm)) : 1.0f;
        const float e1 = s1 != -INFINITY ? exp_f(__fsub_rn(s1, bm)) : 0.0f;
        const float e2 = s2 != -INFINITY ? exp_f(__fsub_rn(s2, bm)) : 0.0f;
        den = __fadd_rn(__fmul_rn(den, rs), seq_sum(seq_sum(0.0f, e1), e2));
        sb[lane] = dev::round_bf16(e1), sb[lane + 32] = dev::round_bf16(e2);
        if (lane == 0) rescale[size_t(rh) * nblk + b] = rs;
        m = bm;
    }
    // No real key: m = -inf, den = inf and out = 0 / inf = 0, as on the host.
    den = __fadd_rn(den, exp_f(__fsub_rn(snk, m)));
    if (lane == 0) den_out[rh] = den;
}

// P.V of row blockIdx.z for HS heads from hg * HS and DS dims from blockIdx.x * DS, on fp64
// tensor cores: part_b = W_b K_b, the chain of 16 steps over block b's 64 entries from zero,
// whatever the tile. LOOP: all blocks, folded in registers (fold4's operations) and out written;
// otherwise block blockIdx.y / hgroups alone, its part_b written for fold_kernel (same bits).
// Weights and keys are staged as fp64, converted once; null entries are zero rows with weight 0.
template <int WM, int WN, int NWM, int NWN, bool LOOP>
__global__ void __launch_bounds__(32 * NWM * NWN, tile_min_blocks(NWM * NWN))
    pv_kernel(const float *const *keys, int H, int L, int hd, const float *w, int Lp, int nblk, int hgroups, const float *rescale,
              const float *den, bool official, double *part, float *out) {
    pdl_enter();
    constexpr int HS = 8 * WM * NWM, DS = 8 * WN * NWN, NT = 32 * NWM * NWN, PW = pitch_of(BLK), PK = pitch_of(DS);
    extern __shared__ __align__(16) double smem_d[];
    double *w_s = smem_d, *k_s = smem_d + HS * PW;  // w_s[head][entry], k_s[entry][dim]
    const int r = blockIdx.z, hg = blockIdx.y % hgroups;
    const int h0 = hg * HS, d0 = blockIdx.x * DS, tid = threadIdx.x;
    const int b0 = LOOP ? 0 : blockIdx.y / hgroups, b1 = LOOP ? nblk : b0 + 1;
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm0 = (warp % NWM) * 8 * WM, wn0 = (warp / NWM) * 8 * WN;
    double acc[LOOP ? WM : 1][LOOP ? WN : 1][2] = {};
    // The next block's floats wait in registers while this one is multiplied.
    constexpr int KV = BLK * (DS / 4) / NT, WV = HS * (BLK / 4) / NT;  // float4 loads per thread and block
    static_assert(BLK * (DS / 4) % NT == 0 && HS * (BLK / 4) % NT == 0, "a block must split evenly over the threads");
    // Packed keys: decoded at the stash (all of a thread's loads in flight first), except in the
    // LOOP kernel, whose next block's fetch overlaps the MMAs: there the decode call comes with
    // the load (the tag word across the MMA loop spilled 52 bytes, ptxas; LOOP serves prefills,
    // bound by the fp64 MMAs).
    static_assert(KV <= MAX_KEY_FETCHES, "a thread's key quads must fit the tag word");
    float4 kr[KV], wr[WV];
    uint32_t ktag = 0;
    auto fetch = [&](int b) {
        ktag = 0;
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int e = tid + u * NT, i = b * BLK + e / (DS / 4), dk = d0 + 4 * (e % (DS / 4));
            const float *p = i < L ? keys[size_t(r) * L + i] : nullptr;
            if constexpr (LOOP) {
                kr[u] = !(p && dk < hd) ? zero4() : key_tag(p) == 0 ? load4(p + dk) : packed_key4(p, dk, hd);
            } else {
                kr[u] = (p && dk < hd) ? fetch_key4(p, dk, hd) : zero4();
                if (p) ktag |= key_tag(p) << (4 * u);
            }
        }
#pragma unroll
        for (int u = 0; u < WV; u++) {
            const int e = tid + u * NT, h = h0 + e / (BLK / 4);
            wr[u] = h < H ? load4(w + (size_t(r) * H + h) * Lp + size_t(b) * BLK + 4 * (e % (BLK / 4))) : zero4();
        }
    };
    if (b0 < b1) fetch(b0);
    for (int b = b0; b < b1; b++) {
        if (b > b0) __syncthreads();  // the previous block's tiles are still being read
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int e = tid + u * NT;
            stash4(k_s + (e / (DS / 4)) * PK + 4 * (e % (DS / 4)), LOOP ? kr[u] : key4_value(kr[u], (ktag >> (4 * u)) & 15u));
        }
#pragma unroll
        for (int u = 0; u < WV; u++) {
            const int e = tid + u * NT;
            stash4(w_s + (e / (BLK / 4)) * PW + 4 * (e % (BLK / 4)), wr[u]);
        }
        __syncthreads();
        if (LOOP && b + 1 < b1) fetch(b + 1);
        double pb[WM][WN][2];
#pragma unroll
        for (int a = 0; a < WM; a++)
#pragma unroll
            for (int n = 0; n < WN; n++) pb[a][n][0] = pb[a][n][1] = 0.0;
#pragma unroll 2
        for (int s = 0; s < BLK / 4; s++) {
            double wa[WM], kb[WN];
#pragma unroll
            for (int a = 0; a < WM; a++) wa[a] = w_s[(wm0 + 8 * a + g) * PW + 4 * s + t];
#pragma unroll
            for (int n = 0; n < WN; n++) kb[n] = k_s[(4 * s + t) * PK + wn0 + 8 * n + g];
            dmma_tiles<WM, WN>(pb, wa, kb);
        }
#pragma unroll
        for (int a = 0; a < WM; a++) {
            const int h = h0 + wm0 + 8 * a + g;
            if (h >= H) continue;
            const float rs = (LOOP && official) ? rescale[(size_t(r) * H + h) * nblk + b] : 1.0f;
#pragma unroll
            for (int n = 0; n < WN; n++) {
                const int d = d0 + wn0 + 8 * n + 2 * t;
                if (d >= hd) continue;
                if constexpr (!LOOP) {
                    *reinterpret_cast<double2 *>(part + ((size_t(r) * nblk + b) * H + h) * hd + d) =
                        make_double2(pb[a][n][0], pb[a][n][1]);
                } else {
                    acc[a][n][0] = fold1(acc[a][n][0], pb[a][n][0], rs, official);
                    acc[a][n][1] = fold1(acc[a][n][1], pb[a][n][1], rs, official);
                }
            }
        }
    }
    if constexpr (LOOP) {
#pragma unroll
        for (int a = 0; a < WM; a++) {
            const int h = h0 + wm0 + 8 * a + g;
            if (h >= H) continue;
            const size_t rh = size_t(r) * H + h;
            const float dn = official ? den[rh] : 1.0f;
#pragma unroll
            for (int n = 0; n < WN; n++) {
                const int d = d0 + wn0 + 8 * n + 2 * t;
                if (d >= hd) continue;
                *reinterpret_cast<float2 *>(out + rh * hd + d) =
                    make_float2(finish1(acc[a][n][0], dn, official), finish1(acc[a][n][1], dn, official));
            }
        }
    }
}

// One thread per 4 output dims: the blocks' partials folded in block order.
__global__ void __launch_bounds__(FOLD_THREADS)
    fold_kernel(const double *part, const float *rescale, const float *den, int64_t n4, int H, int hd, int nblk,
                bool official, float *out) {
    pdl_enter();
    const int64_t idx = int64_t(blockIdx.x) * FOLD_THREADS + threadIdx.x;
    if (idx >= n4) return;
    const int64_t rh = idx / (hd / 4), r = rh / H, h = rh % H, d = 4 * (idx % (hd / 4));
    dbl4 acc;
    for (int b = 0; b < nblk; b++) {
        const dbl4 p = load_d4(part + ((r * nblk + b) * H + h) * hd + d);
        acc = fold4(acc, p, official ? rescale[rh * nblk + b] : 1.0f, official);
    }
    *reinterpret_cast<float4 *>(out + rh * hd + d) = finish4(acc, official ? den[rh] : 1.0f, official);
}

// Dynamic shared memory of each tile shape, in bytes.
template <int WM, int WN, int NWM, int NWN, int DCH>
constexpr size_t scores_smem() {
    return size_t(8 * WM * NWM + 8 * WN * NWN) * pitch_of(DCH) * sizeof(double);
}
template <int WM, int WN, int NWM, int NWN>
constexpr size_t pv_smem() {
    return (size_t(8 * WM * NWM) * pitch_of(BLK) + size_t(BLK) * pitch_of(8 * WN * NWN)) * sizeof(double);
}

// The device facts and kernel attributes a launch needs, each asked of the runtime once per device
// (per kernel): a decode step's first attention cores are issued while the GPU waits for them
// (session 29's host trace: each core's launches came with three cudaGetDevice, two attribute
// queries and two cudaFuncSetAttribute calls).
struct device_facts {
    int sms = 1, optin = 48 * 1024;
};

const device_facts &current_facts() {
    static std::mutex mu;
    static std::map<int, device_facts> by_device;
    int dev = 0;
    (void)cudaGetDevice(&dev);
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_device.find(dev);
    if (it != by_device.end()) return it->second;
    device_facts f;
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0) f.sms = n;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess && n > 0) f.optin = n;
    return by_device.emplace(dev, f).first->second;
}

// Raises a kernel's dynamic shared-memory opt-in to at least smem bytes on the current device; a
// host call (legal while the stream is captured), made only when the kernel's opt-in on this
// device is below smem.
Status ensure_smem_optin(const void *kernel, size_t smem) {
    static std::mutex mu;
    static std::map<std::pair<const void *, int>, size_t> set;
    int dev = 0;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    size_t &have = set[{kernel, dev}];
    if (have >= smem) return Status::ok();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    have = smem;
    return Status::ok();
}

// A tile kernel with smem bytes of dynamic shared memory (the opt-in above 48 KB raised once).
template <class... P, class... A>
Status launch_tiles(void (*kernel)(P...), size_t smem, dim3 grid, int threads, cudaStream_t stream, A &&...args) {
    if (smem > 48 * 1024) DS41RT_RETURN_IF_ERROR(ensure_smem_optin(reinterpret_cast<const void *>(kernel), smem));
    DS41RT_CUDA_RETURN_IF_ERROR(launch_pdl(kernel, grid, unsigned(threads), smem, stream, std::forward<A>(args)...));
    return Status::ok();
}

// Where each scratch array lives in the workspace and which launch shapes run.
struct attention_plan {
    int nblk = 0, Lp = 0;
    bool big_scores = false;  // 64 x 64 score tiles instead of 16 x 32 with hd staged whole (8 x 32 if it does not fit)
    bool loop_pv = false;     // P.V folds in registers over 64 x 64 tiles (no partials)
    size_t part = 0, sc = 0, rescale = 0, den = 0, bytes = 0;  // offsets in floats (part: fp64); bytes in total
};

int current_sm_count() { return current_facts().sms; }

// The largest dynamic shared memory a block may opt in to on the current device.
int current_smem_optin() { return current_facts().optin; }

attention_plan make_plan(const attention_batch &b, int sms) {
    attention_plan p;
    p.nblk = (std::max(b.L, 0) + BLK - 1) / BLK;
    p.Lp = p.nblk * BLK;
    const int64_t R = std::max(b.R, 0), H = std::max(b.H, 0), hd = std::max(b.hd, 0);
    // Tile choices follow how many CTAs the batch makes; they never change a result.
    p.big_scores = R * ((H + 63) / 64) * p.nblk >= 2 * int64_t(sms);
    p.loop_pv = R * ((hd + 63) / 64) * ((H + PV_HEADS - 1) / PV_HEADS) >= int64_t(sms);
    auto round4 = [](size_t n) { return (n + 3) / 4 * 4; };  // float4 alignment of each array
    size_t off = 0;
    p.part = off;
    if (!p.loop_pv) off += 2 * round4(size_t(R * p.nblk * H * hd));  // doubles
    p.sc = off;
    off += round4(size_t(R * H * p.Lp));
    p.rescale = off;
    off += round4(size_t(R * H * p.nblk));
    p.den = off;
    off += round4(size_t(R * H));
    p.bytes = off * sizeof(float);
    return p;
}

// The fallback workspace: one buffer per (device, stream), grown (at least doubling) when a larger
// shape comes. A replaced buffer is never freed: work already queued, or a graph captured on the
// stream, may still use it; the doubling bounds what is kept to twice the largest buffer.
Result<void *> stream_workspace(size_t bytes, cudaStream_t stream) {
    static std::mutex mu;
    static std::map<std::pair<int, cudaStream_t>, std::pair<void *, size_t>> buffers;
    int dev = 0;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    auto &[ptr, have] = buffers[{dev, stream}];
    if (have >= bytes) return ptr;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return Status::invalid_argument("attention: the stream is being captured and its workspace must grow to " +
                                        std::to_string(bytes) +
                                        " bytes; pass attention_batch::workspace or run the shape once first");
    const size_t grow = std::max(bytes, 2 * have);
    void *fresh = nullptr;
    if (cudaMalloc(&fresh, grow) != cudaSuccess) {
        // The stream-ordered pool may hold freed memory back for reuse (a prefill's temporaries,
        // engine/cuda device_model keeps up to 8 GiB): once its pending frees are done, hand
        // that back and try once more.
        (void)cudaGetLastError();
        cudaMemPool_t pool = nullptr;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        DS41RT_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, dev));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool, 0));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&fresh, grow));
    }
    ptr = fresh, have = grow;
    return ptr;
}

bool misaligned(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; }

}  // namespace

size_t attention_workspace_bytes(const attention_batch &b) { return make_plan(b, current_sm_count()).bytes; }

Status run_attention(const attention_batch &b, cudaStream_t stream) {
    if (b.R < 0 || b.H < 0 || b.L < 0)
        return Status::invalid_argument("attention: negative shape R " + std::to_string(b.R) + ", H " +
                                        std::to_string(b.H) + ", L " + std::to_string(b.L));
    if (b.hd <= 0 || b.hd % 4 != 0)
        return Status::invalid_argument("attention: hd must be a positive multiple of 4, got " + std::to_string(b.hd));
    if (b.R == 0 || b.H == 0) return Status::ok();
    if (!b.q || !b.out || !b.sink || (b.L > 0 && !b.keys))
        return Status::invalid_argument("attention: q, out, sink (and keys when L > 0) are required");
    if (misaligned(b.q) || misaligned(b.out) || misaligned(b.workspace))
        return Status::invalid_argument("attention: q, out and workspace must be 16-byte aligned");
    const size_t n = size_t(b.R) * size_t(b.H) * size_t(b.hd);
    if (b.q < b.out + n && b.out < b.q + n) return Status::invalid_argument("attention: out overlaps q");
    if (b.R > 65535) return Status::invalid_argument("attention: R " + std::to_string(b.R) + " above 65535");
    if (b.L == 0) {  // no keys: P.V is empty and the host writes zeros in both numerics
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.out, 0, n * sizeof(float), stream));
        return Status::ok();
    }
    const attention_plan p = make_plan(b, current_sm_count());
    const int hgroups = (b.H + PV_HEADS - 1) / PV_HEADS;
    if (int64_t(p.nblk) * hgroups > 65535)
        return Status::invalid_argument("attention: L " + std::to_string(b.L) + " x H " + std::to_string(b.H) +
                                        " exceeds the launch grid");
    float *ws = static_cast<float *>(b.workspace);
    if (!ws) {
        auto got = stream_workspace(p.bytes, stream);
        if (!got) return got.status();
        ws = static_cast<float *>(*got);
    }
    float *sc = ws + p.sc, *rescale = ws + p.rescale, *den = ws + p.den;

    if (p.big_scores) {
        DS41RT_RETURN_IF_ERROR(launch_tiles(scores_kernel<4, 4, 2, 2, 32>, scores_smem<4, 4, 2, 2, 32>(),
                                            dim3(unsigned(p.Lp / 64), unsigned((b.H + 63) / 64), unsigned(b.R)), 128, stream, b.q,
                                            b.keys, b.H, b.L, b.hd, b.scale, p.Lp, sc));
    } else if (scores_whole_smem<2, 1, 1, 2>(b.hd) <= size_t(current_smem_optin())) {
        DS41RT_RETURN_IF_ERROR(launch_tiles(scores_whole_kernel<2, 1, 1, 2, 4>, scores_whole_smem<2, 1, 1, 2>(b.hd),
                                            dim3(unsigned(p.Lp / 16), unsigned((b.H + 15) / 16), unsigned(b.R)), 128, stream,
                                            b.q, b.keys, b.H, b.L, b.hd, b.scale, p.Lp, sc));
    } else {
        DS41RT_RETURN_IF_ERROR(launch_tiles(scores_kernel<1, 4, 1, 1, 32>, scores_smem<1, 4, 1, 1, 32>(),
                                            dim3(unsigned(p.Lp / 32), unsigned((b.H + 7) / 8), unsigned(b.R)), 32, stream, b.q,
                                            b.keys, b.H, b.L, b.hd, b.scale, p.Lp, sc));
    }
    const int RH = b.R * b.H;
    (void)launch_pdl(softmax_kernel, (RH + SOFTMAX_WARPS - 1) / SOFTMAX_WARPS, 32 * SOFTMAX_WARPS, 0, stream, sc,
                     b.sink, RH, b.H, b.L, p.Lp, p.nblk, b.official, rescale, den);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (p.loop_pv)
        return launch_tiles(pv_kernel<4, 2, 2, 4, true>, pv_smem<4, 2, 2, 4>(),
                            dim3(unsigned((b.hd + 63) / 64), unsigned(hgroups), unsigned(b.R)), 256, stream, b.keys, b.H, b.L,
                            b.hd, sc, p.Lp, p.nblk, hgroups, rescale, den, b.official, nullptr, b.out);
    double *part = reinterpret_cast<double *>(ws + p.part);
    DS41RT_RETURN_IF_ERROR(launch_tiles(pv_kernel<2, 4, 4, 1, false>, pv_smem<2, 4, 4, 1>(),
                                        dim3(unsigned((b.hd + 31) / 32), unsigned(hgroups * p.nblk), unsigned(b.R)), 128, stream,
                                        b.keys, b.H, b.L, b.hd, sc, p.Lp, p.nblk, hgroups, rescale, den, b.official, part,
                                        b.out));
    const int64_t n4 = int64_t(n / 4);
    (void)launch_pdl(fold_kernel, unsigned((n4 + FOLD_THREADS - 1) / FOLD_THREADS), FOLD_THREADS, 0, stream, part,
                     rescale, den, n4, b.H, b.hd, p.nblk, b.official, b.out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
