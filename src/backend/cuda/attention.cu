// Sparse attention rows (engine attend_row) on the GPU, for every head of R query rows at once.
//
// Four launches, each with every sum in an order fixed by (L, hd) alone:
//  1. scores: s[r, h, i] = float(fp64 sum over d = 0 .. hd-1 of q[r, h, d] * k_i[d]) * scale
//     (-inf for nullptr entries and the pad up to whole 64-entry blocks): the host's cpu::dot
//     exactly (fp32 products are exact in fp64 and the sum runs in the same sequential order),
//     so the scores, and OFFICIAL's bf16 weights, are the host's bits. A block computes a tile of
//     heads x keys from shared memory holding q and k as fp64 (converted once when staged); the
//     inner loop is bound by shared-memory loads either way, so fp64 costs about what fp32
//     would. The tile size follows R (small tiles so that one row still fills the GPU, large
//     tiles for big batches); it changes which thread runs a chain, never the chain.
//  2. softmax: one warp per (r, h) turns the scores into P.V weights in place:
//     TRANSFORMERS: m = max(sink, scores), den = exp(sink - m) + sum exp(s - m), w = exp(s - m) / den
//     OFFICIAL: per block of 64 entries the running max m_b (real scores only; blocks before the
//     first real key are skipped, as the host does), rescale_b = exp(m_{b-1} - m_b), den = den *
//     rescale_b + sum exp(s - m_b), w = bf16(exp(s - m_b)); after the last block den += exp(sink
//     - m). Every den sum runs sequentially in list order, as the host's does (the lanes' exps
//     are shuffled to all lanes one at a time): a butterfly order moved den by an fp32 ulp now and
//     then, and OFFICIAL's bf16(acc / den) can turn that into a bf16 ulp. exp is fp64 rounded
//     once (glibc expf is within an ulp of it).
//  3. P.V: per (row, 64-entry block, 64 heads, 32 dims), part_b[h, d] = fp64 fma chain over the
//     block's 64 entries of w * k[d] in list order (null entries staged as zeros with weight 0).
//     fp64 because the host sums in fp64: w * k is exact in fp64, so the chain is the host's to
//     the bit. An fp32 chain (the first version of this kernel) rounds at every step; at hd 40,
//     where the engine leaves the keys unquantized, a few outputs per 10^4 then crossed a bf16
//     rounding boundary, and inside the OFFICIAL engine (bf16 and fp8 roundings downstream) one
//     such ulp grew to 2.4e-2 in the fixture's logits. (At hd 64 the keys are fp8/fp4 values and
//     the fp32 chain happened to be exact.)
//  4. fold: acc = 0; for each block b in order: acc = acc * rescale_b + part_b (TRANSFORMERS:
//     acc + part_b), in fp64; out = float(acc) (TRANSFORMERS) or bf16(float(acc) / den) (OFFICIAL).
//     With one block (L <= 64: every fixture list) this is the host's chain exactly; with more,
//     the host adds each product to acc * rescale_b directly, a difference of fp64 roundings
//     that reaches an fp32 output about once in 10^8.
// When R alone fills the GPU, 3 and 4 run in one kernel that loops over the blocks and keeps
// acc in registers (same operations, same bits); otherwise each block is its own CTA and its
// part_b goes through the workspace to a fold kernel, so a single row still uses ~160 CTAs.
//
// Roofline (V4.1 decode: H = 64, hd = 512, L = 640 = 128 window + 512 top-k):
//  bytes from HBM per call: keys R * L * hd * 4 (1.31 MB per row) + q and out R * H * hd * 4 * 2
//  (0.26 MB per row); the scores, weights and partials (R * H * L * 4 * 3 + 2 * R * 10 * H * hd
//  * 4 at small R) stay in L2. FLOPs: 2 * R * H * L * hd for the scores (fp64 FMA) and as many
//  for P.V (fp64 FMA too), 84 MFLOP per row: 64 FLOP per HBM byte against a ~7 FLOP/byte fp64
//  ridge, so the bound is the CUDA cores, not bandwidth: R = 16 needs 1.34 GFLOP of fp64 (40 us
//  at the H200's 34 TFLOP/s); the shared-memory loads of these tiles cap it near that rate or
//  below. R = 1 is ~2 us of arithmetic spread over
//  ~160 CTAs per launch, i.e. launch- and latency-bound. Reaching the ~5 us HBM bound at R = 16
//  needs tensor cores with split operands (hi + lo halves, as gemv.cu does for x): not done here.
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

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int BLK = 64;         // the reference kernel's block of list entries
constexpr int PV_HEADS = 64;    // heads of one P.V CTA (the keys are read once per 64 heads)
constexpr int PV_DIMS = 32;     // dims of one P.V CTA
constexpr int PV_THREADS = 128; // 16 head slots x 8 dim quads, 4 heads x 4 dims per thread
constexpr int SOFTMAX_WARPS = 4;
constexpr int FOLD_THREADS = 256;

__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ __forceinline__ float4 load4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

// Four fp64 accumulators (4 consecutive dims of one head).
struct dbl4 {
    double x = 0, y = 0, z = 0, w = 0;
};
__device__ __forceinline__ dbl4 load_d4(const double *p) {
    const double2 a = reinterpret_cast<const double2 *>(p)[0], b = reinterpret_cast<const double2 *>(p)[1];
    return {a.x, a.y, b.x, b.y};
}
__device__ __forceinline__ void store_d4(double *p, dbl4 v) {
    reinterpret_cast<double2 *>(p)[0] = make_double2(v.x, v.y);
    reinterpret_cast<double2 *>(p)[1] = make_double2(v.z, v.w);
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

// Scores of HS heads x KS list entries of row blockIdx.z; each thread TH heads x TK entries.
// Per d it does TH + TK shared loads for TH * TK fp64 FMAs. Shared rows are padded by one
// double so the 16 entries a warp reads at one d cover the 32 banks once. The next DCH dims are
// loaded into registers while the current ones are multiplied, so a CTA waits on memory about
// once per chunk instead of load-then-compute (at R = 1 each SM holds only about one CTA).
template <int HS, int KS, int TH, int TK, int DCH>
__global__ void __launch_bounds__((HS / TH) * (KS / TK))
    scores_kernel(const float *q, const float *const *keys, int H, int L, int hd, float scale, int Lp, float *sc) {
    pdl_enter();
    constexpr int KX = KS / TK, HY = HS / TH, NT = KX * HY, C4 = DCH / 4;
    constexpr int QV = HS * C4 / NT, KV = KS * C4 / NT;  // float4 loads per thread and chunk
    static_assert(HS * C4 % NT == 0 && KS * C4 % NT == 0, "the chunk must split evenly over the threads");
    __shared__ double q_s[HS][DCH + 1];
    __shared__ double k_s[KS][DCH + 1];
    __shared__ const float *kp[KS];
    const int r = blockIdx.z, h0 = blockIdx.y * HS, i0 = blockIdx.x * KS, tid = threadIdx.x;
    for (int j = tid; j < KS; j += NT) kp[j] = i0 + j < L ? keys[size_t(r) * L + i0 + j] : nullptr;
    __syncthreads();
    float4 qr[QV], kr[KV];
    auto fetch = [&](int d0) {
#pragma unroll
        for (int u = 0; u < QV; u++) {
            const int e = tid + u * NT, row = e / C4, h = h0 + row, d = d0 + 4 * (e % C4);
            qr[u] = (h < H && d < hd) ? load4(q + (size_t(r) * H + h) * hd + d) : zero4();
        }
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int e = tid + u * NT, d = d0 + 4 * (e % C4);
            const float *p = kp[e / C4];
            kr[u] = (p && d < hd) ? load4(p + d) : zero4();
        }
    };
    auto stash = [&]() {
#pragma unroll
        for (int u = 0; u < QV; u++) {
            const int e = tid + u * NT, row = e / C4, c = 4 * (e % C4);
            q_s[row][c] = qr[u].x, q_s[row][c + 1] = qr[u].y, q_s[row][c + 2] = qr[u].z, q_s[row][c + 3] = qr[u].w;
        }
#pragma unroll
        for (int u = 0; u < KV; u++) {
            const int e = tid + u * NT, row = e / C4, c = 4 * (e % C4);
            k_s[row][c] = kr[u].x, k_s[row][c + 1] = kr[u].y, k_s[row][c + 2] = kr[u].z, k_s[row][c + 3] = kr[u].w;
        }
    };
    const int tk = tid % KX, th = tid / KX;
    double acc[TH][TK];
#pragma unroll
    for (int a = 0; a < TH; a++)
#pragma unroll
        for (int b = 0; b < TK; b++) acc[a][b] = 0.0;
    fetch(0);
    for (int d0 = 0; d0 < hd; d0 += DCH) {
        stash();
        __syncthreads();
        if (d0 + DCH < hd) fetch(d0 + DCH);
        // Dims past hd are zeros on both sides: fma(0, 0, acc) leaves acc as it is. fma equals
        // the host's acc + product because the product of two floats is exact in fp64.
#pragma unroll 8
        for (int dd = 0; dd < DCH; dd++) {
            double qa[TH], kb[TK];
#pragma unroll
            for (int a = 0; a < TH; a++) qa[a] = q_s[th + a * HY][dd];
#pragma unroll
            for (int b = 0; b < TK; b++) kb[b] = k_s[tk + b * KX][dd];
#pragma unroll
            for (int a = 0; a < TH; a++)
#pragma unroll
                for (int b = 0; b < TK; b++) acc[a][b] = fma(qa[a], kb[b], acc[a][b]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < TH; a++) {
        const int h = h0 + th + a * HY;
        if (h >= H) continue;
#pragma unroll
        for (int b = 0; b < TK; b++) {
            const int j = tk + b * KX;
            sc[(size_t(r) * H + h) * Lp + i0 + j] = kp[j] ? __fmul_rn(float(acc[a][b]), scale) : -INFINITY;
        }
    }
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

// P.V over list blocks [chunk * bper, ...) of row blockIdx.z for heads hg * 64 .. and dims
// blockIdx.x * 32 ..: part != nullptr writes each block's part_b (bper = 1); otherwise folds
// all blocks in registers and writes out. The tiles are staged as fp64 (converted once, not per
// FMA): 16 KB of keys and 32 KB of weights, the static limit exactly, so the weight rows have no
// pad; instead head hh's entry i sits at column (i + hh) % 64, which puts the 4 heads a warp
// reads at one i in distinct banks.
__global__ void __launch_bounds__(PV_THREADS)
    pv_kernel(const float *const *keys, int H, int L, int hd, const float *w, int Lp, int nblk, int bper,
              int hgroups, const float *rescale, const float *den, bool official, double *part, float *out) {
    pdl_enter();
    __shared__ __align__(16) double k_s[BLK][PV_DIMS];
    __shared__ double w_s[PV_HEADS][BLK];
    const int r = blockIdx.z, hg = blockIdx.y % hgroups, chunk = blockIdx.y / hgroups;
    const int h0 = hg * PV_HEADS, d0 = blockIdx.x * PV_DIMS, tid = threadIdx.x, th = tid / 8, td = tid % 8;
    const int b0 = chunk * bper, b1 = min(nblk, b0 + bper), d = d0 + 4 * td;
    dbl4 acc[4];
    for (int b = b0; b < b1; b++) {
        if (b > b0) __syncthreads();  // the previous block's tiles are still being read
        for (int e = tid; e < BLK * (PV_DIMS / 4); e += PV_THREADS) {
            const int row = e / (PV_DIMS / 4), c = e % (PV_DIMS / 4), i = b * BLK + row, dk = d0 + 4 * c;
            const float *p = i < L ? keys[size_t(r) * L + i] : nullptr;
            const float4 v = (p && dk < hd) ? load4(p + dk) : zero4();
            store_d4(&k_s[row][4 * c], {v.x, v.y, v.z, v.w});
        }
        for (int e = tid; e < PV_HEADS * BLK; e += PV_THREADS) {
            const int hh = e / BLK, i = e % BLK, h = h0 + hh;
            w_s[hh][(i + hh) & (BLK - 1)] = h < H ? w[(size_t(r) * H + h) * Lp + size_t(b) * BLK + i] : 0.0f;
        }
        __syncthreads();
        dbl4 bp[4];
        // fma(w, k, acc) = acc + w * k rounded once, the host's step: w * k is exact in fp64.
#pragma unroll 2
        for (int i = 0; i < BLK; i++) {
            const dbl4 kv = load_d4(&k_s[i][4 * td]);
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const int hh = th + 16 * a;
                const double wv = w_s[hh][(i + hh) & (BLK - 1)];
                bp[a].x = fma(wv, kv.x, bp[a].x);
                bp[a].y = fma(wv, kv.y, bp[a].y);
                bp[a].z = fma(wv, kv.z, bp[a].z);
                bp[a].w = fma(wv, kv.w, bp[a].w);
            }
        }
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int h = h0 + th + 16 * a;
            if (h >= H || d >= hd) continue;
            if (part) {
                store_d4(part + ((size_t(r) * nblk + b) * H + h) * hd + d, bp[a]);
            } else {
                const float rs = official ? rescale[(size_t(r) * H + h) * nblk + b] : 1.0f;
                acc[a] = fold4(acc[a], bp[a], rs, official);
            }
        }
    }
    if (part) return;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int h = h0 + th + 16 * a;
        if (h >= H || d >= hd) continue;
        const size_t rh = size_t(r) * H + h;
        *reinterpret_cast<float4 *>(out + rh * hd + d) = finish4(acc[a], official ? den[rh] : 1.0f, official);
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

// Where each scratch array lives in the workspace and which launch shapes run.
struct attention_plan {
    int nblk = 0, Lp = 0;
    bool big_scores = false;  // 32 x 64 score tiles instead of 8 x 32
    bool loop_pv = false;     // P.V folds in registers (no partials)
    size_t part = 0, sc = 0, rescale = 0, den = 0, bytes = 0;  // offsets in floats (part: fp64); bytes in total
};

int current_sm_count() {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return std::max(n, 1);
}

attention_plan make_plan(const attention_batch &b, int sms) {
    attention_plan p;
    p.nblk = (std::max(b.L, 0) + BLK - 1) / BLK;
    p.Lp = p.nblk * BLK;
    const int64_t R = std::max(b.R, 0), H = std::max(b.H, 0), hd = std::max(b.hd, 0);
    // Tile choices follow how many CTAs the batch makes; they never change a result.
    p.big_scores = R * ((H + 31) / 32) * p.nblk >= 2 * int64_t(sms);
    p.loop_pv = R * ((hd + PV_DIMS - 1) / PV_DIMS) * ((H + PV_HEADS - 1) / PV_HEADS) >= int64_t(sms);
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
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&fresh, grow));
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
        const dim3 grid(unsigned(p.Lp / 64), unsigned((b.H + 31) / 32), unsigned(b.R));
        (void)launch_pdl(scores_kernel<32, 64, 4, 4, 32>, grid, (32 / 4) * (64 / 4), 0, stream, b.q, b.keys, b.H, b.L,
                         b.hd, b.scale, p.Lp, sc);
    } else {
        const dim3 grid(unsigned(p.Lp / 32), unsigned((b.H + 7) / 8), unsigned(b.R));
        (void)launch_pdl(scores_kernel<8, 32, 2, 2, 64>, grid, (8 / 2) * (32 / 2), 0, stream, b.q, b.keys, b.H, b.L,
                         b.hd, b.scale, p.Lp, sc);
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const int RH = b.R * b.H;
    (void)launch_pdl(softmax_kernel, (RH + SOFTMAX_WARPS - 1) / SOFTMAX_WARPS, 32 * SOFTMAX_WARPS, 0, stream, sc,
                     b.sink, RH, b.H, b.L, p.Lp, p.nblk, b.official, rescale, den);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const unsigned dim_tiles = unsigned((b.hd + PV_DIMS - 1) / PV_DIMS);
    if (p.loop_pv) {
        const dim3 grid(dim_tiles, unsigned(hgroups), unsigned(b.R));
        (void)launch_pdl(pv_kernel, grid, PV_THREADS, 0, stream, b.keys, b.H, b.L, b.hd, sc, p.Lp, p.nblk, p.nblk,
                         hgroups, rescale, den, b.official, nullptr, b.out);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    double *part = reinterpret_cast<double *>(ws + p.part);
    const dim3 grid(dim_tiles, unsigned(hgroups * p.nblk), unsigned(b.R));
    (void)launch_pdl(pv_kernel, grid, PV_THREADS, 0, stream, b.keys, b.H, b.L, b.hd, sc, p.Lp, p.nblk, 1, hgroups,
                     rescale, den, b.official, part, b.out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const int64_t n4 = int64_t(n / 4);
    (void)launch_pdl(fold_kernel, unsigned((n4 + FOLD_THREADS - 1) / FOLD_THREADS), FOLD_THREADS, 0, stream, part,
                     rescale, den, n4, b.H, b.hd, p.nblk, b.official, b.out);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
