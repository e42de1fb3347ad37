#include "backend/cuda/mhc.cuh"

#include <cooperative_groups.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/dmma.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int THREADS = 256;
constexpr int MAX_HC = 8;

// hc_project's layout: a cluster of P_CL blocks splits flat into P_CL contiguous ranges; a block
// takes P_TOK tokens and P_OUT outputs of its range, so X is read n_out / P_OUT times and fn
// S / P_TOK times (from L2 after the first), and even S = 1 spreads over P_CL * n_out / P_OUT
// blocks (96 for V4.1). Every (token, output) dot has one fixed order, set by flat alone (not
// S, P_OUT or the tile a token falls in): thread t of rank q sums quads (4 consecutive k)
// q * ceil(ceil(flat / 4) / P_CL) + t + i * P_THREADS in ascending i, k ascending inside a
// quad; a warp butterfly (xor 16 .. 1); warps 0..7 in order; ranks 0..7 in order (over DSMEM).
// All of it in fp64 on exact fp32 x fp32 products, rounded to fp32 once, as the host's fp64
// sums: the two agree unless the exact sum lies within ~2^-29 relative of an fp32 rounding
// boundary.
constexpr int P_CL = 8;  // the portable cluster size every sm_90 part schedules
constexpr int P_THREADS = 256;
constexpr int P_TOK = 4;
constexpr int P_OUT_WIDE = 6;   // outputs per block: 6 reads X 4 times for V4.1's 24 mixes,
constexpr int P_OUT_NARROW = 2;  // 2 spreads one tile of tokens (S <= 4) over 3x the blocks

// Sums v[i] over the block into out[i] (shared): butterfly in each warp, then the warps in order.
template <int NV>
__device__ void block_sums(double (&v)[NV], double *warp_part, double *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        double s = v[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) warp_part[warp * NV + i] = s;
    }
    __syncthreads();
    if (threadIdx.x < NV) {
        double s = 0;
        for (int w = 0; w < P_THREADS / 32; w++) s += warp_part[w * NV + threadIdx.x];
        out[threadIdx.x] = s;
    }
}

// Quad q of the row at p: one 16-byte load, or element loads past flat (never summed).
template <bool VEC>
__device__ __forceinline__ void load_quad(const float *p, int64_t q, int64_t flat, float (&v)[4]) {
    if constexpr (VEC) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(p) + q);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = 4 * q + e < flat ? __ldg(p + 4 * q + e) : 0.0f;
    }
}

// Bytes per call from DRAM: S * flat * 4 + n_out * flat * 4 (+ L2 re-reads: X n_out / P_OUT
// times, fn S / P_TOK times); FLOPs 2 * S * flat * (n_out + 1) in fp64 (H200: ~64 fp64 FMAs per
// SM per clock, so S = 16 is ~1000 clocks of math). A few microseconds at S <= 16: one round of
// loads per thread, then two cluster barriers.
template <bool VEC, int P_OUT>
__global__ void __cluster_dims__(P_CL, 1, 1) __launch_bounds__(P_THREADS)
    project_kernel(const float *X, int64_t S, int64_t flat, const float *fn, int64_t n_out, float eps,
                   bool fold_after, float *m) {
    constexpr int P_NV = P_TOK * (P_OUT + 1);  // per-thread sums: dots [t][j], then sums of squares [t]
    __shared__ double warp_part[P_THREADS / 32 * P_NV];
    __shared__ double sums[P_NV];      // this block's totals, read by rank 0 over DSMEM
    __shared__ double ss_sums[P_TOK];  // normalize first: this block's sums of squares, read by all ranks
    __shared__ float inv_s[P_TOK];
    const cg::cluster_group cl = cg::this_cluster();
    const int rank = int(cl.block_rank());
    const int64_t j0 = int64_t(blockIdx.x / P_CL) * P_OUT, s0 = int64_t(blockIdx.y) * P_TOK;
    const int64_t nq = (flat + 3) / 4, qpr = (nq + P_CL - 1) / P_CL;
    const int64_t q0 = rank * qpr, q1 = q0 + qpr < nq ? q0 + qpr : nq;
    const float *xr[P_TOK], *wr[P_OUT];  // rows past S / n_out repeat the last one and store nothing
#pragma unroll
    for (int t = 0; t < P_TOK; t++) xr[t] = X + (s0 + t < S ? s0 + t : S - 1) * flat;
#pragma unroll
    for (int j = 0; j < P_OUT; j++) wr[j] = fn + (j0 + j < n_out ? j0 + j : n_out - 1) * flat;
    float inv[P_TOK];
#pragma unroll
    for (int t = 0; t < P_TOK; t++) inv[t] = 1.0f;
    if (!fold_after) {  // transformers' order needs each token's full sum of squares first
        double ss[P_TOK];
#pragma unroll
        for (int t = 0; t < P_TOK; t++) ss[t] = 0;
        for (int64_t q = q0 + threadIdx.x; q < q1; q += P_THREADS)
#pragma unroll
            for (int t = 0; t < P_TOK; t++) {
                float xv[4];
                load_quad<VEC>(xr[t], q, flat, xv);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (VEC || 4 * q + e < flat) ss[t] = fma(double(xv[e]), double(xv[e]), ss[t]);
            }
        block_sums<P_TOK>(ss, warp_part, ss_sums);
        cl.sync();
        if (threadIdx.x < P_TOK) {
            double tot = 0;
            for (int r = 0; r < P_CL; r++) tot += cl.map_shared_rank(ss_sums, r)[threadIdx.x];
            inv_s[threadIdx.x] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(tot / double(flat)), eps)));
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < P_TOK; t++) inv[t] = inv_s[t];
    }
    double acc[P_NV];
#pragma unroll
    for (int i = 0; i < P_NV; i++) acc[i] = 0;
    for (int64_t q = q0 + threadIdx.x; q < q1; q += P_THREADS) {
        float xv[P_TOK][4], wv[P_OUT][4];
#pragma unroll
        for (int t = 0; t < P_TOK; t++) load_quad<VEC>(xr[t], q, flat, xv[t]);
#pragma unroll
        for (int j = 0; j < P_OUT; j++) load_quad<VEC>(wr[j], q, flat, wv[j]);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (!VEC && 4 * q + e >= flat) continue;
#pragma unroll
            for (int t = 0; t < P_TOK; t++) {
                const double xd = double(xv[t][e]);
                // Products of two fp32 values are exact in fp64, so fma adds exactly what the
                // host's s += double(a) * b adds.
                const double xs = fold_after ? xd : double(__fmul_rn(xv[t][e], inv[t]));
                if (fold_after) acc[P_TOK * P_OUT + t] = fma(xd, xd, acc[P_TOK * P_OUT + t]);
#pragma unroll
                for (int j = 0; j < P_OUT; j++) acc[t * P_OUT + j] = fma(xs, double(wv[j][e]), acc[t * P_OUT + j]);
            }
        }
    }
    block_sums<P_NV>(acc, warp_part, sums);
    cl.sync();
    if (rank == 0 && threadIdx.x < P_TOK * P_OUT) {
        const int t = threadIdx.x / P_OUT, j = threadIdx.x % P_OUT;
        double dot = 0, ss = 0;
        for (int r = 0; r < P_CL; r++) {
            const double *rs = cl.map_shared_rank(sums, r);
            dot += rs[threadIdx.x];
            ss += rs[P_TOK * P_OUT + t];
        }
        float out = float(dot);
        if (fold_after) {
            // cpu::dot rounds the sum of squares to fp32 before the mean (engine hc_project).
            const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(double(float(ss)) / double(flat)), eps)));
            out = __fmul_rn(out, rs);
        }
        if (s0 + t < S && j0 + j < n_out) m[(s0 + t) * n_out + j0 + j] = out;
    }
    cl.sync();  // the other ranks' shared memory must outlive rank 0's reads
}

// hc_project for prefill (fold_after, S >= dmma_min_s()): m = X fn^T on the fp64 tensor cores, a
// GEMM of S x n_out (<= 32) over flat. project_kernel's clusters are shaped for one token: at 8192
// tokens it took 1.4 ms for 6.7 GFLOP (H200, session 12), reading X four times. Here a block takes
// 32 tokens x 32 outputs and streams its X rows once, 64 k a step, staged as fp64; each warp 16
// tokens x 16 outputs (two m16n8k4 a k4 step). Sums of squares: thread (row, quad) adds its
// quads' squares in k order, the 16 quads of a row then in quad order. Order: fixed by flat alone
// (not S), another one than project_kernel's; both are fp64 sums of exact products rounded once,
// so they differ only where an exact sum sits within ~2^-29 of an fp32 rounding boundary.
// Bytes: S flat 4 once + fn from L2 per block; FLOPs 2 S flat (n_out + 1).
constexpr int PD_TOK = 32, PD_OUT = 32, PD_K = 64, PD_THREADS = 128, PD_P = PD_K + 4;  // pitch: 4 mod 16 doubles
constexpr int PD_QUADS = PD_K / 4, PD_ROWS = PD_THREADS / PD_QUADS, PD_U = PD_TOK / PD_ROWS;  // a thread: PD_U rows' quad
static_assert(PD_TOK == PD_OUT && PD_TOK % PD_ROWS == 0, "x and fn tiles are staged alike");

__global__ void __launch_bounds__(PD_THREADS)
    project_dmma_kernel(const float *X, int64_t S, int64_t flat, const float *fn, int64_t n_out, float eps, float *m) {
    __shared__ __align__(16) double x_s[PD_TOK * PD_P], f_s[PD_OUT * PD_P];
    __shared__ double ss_s[PD_TOK][PD_QUADS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int64_t s0 = int64_t(blockIdx.x) * PD_TOK;
    // Staging: thread tid holds quad tid % PD_QUADS of rows tid / PD_QUADS + PD_ROWS u of each step.
    const int quad = tid % PD_QUADS, row0 = tid / PD_QUADS;
    const float *xr[PD_U], *fr[PD_U];
    bool xlive[PD_U], flive[PD_U];
#pragma unroll
    for (int u = 0; u < PD_U; u++) {
        const int row = row0 + PD_ROWS * u;
        xlive[u] = s0 + row < S, flive[u] = row < n_out;
        xr[u] = X + (xlive[u] ? s0 + row : 0) * flat + 4 * quad;
        fr[u] = fn + (flive[u] ? row : 0) * flat + 4 * quad;
    }
    float4 xv[PD_U], fv[PD_U];
    auto fetch = [&](int64_t k0) {
        const bool k_live = k0 + 4 * quad < flat;  // flat % 4 == 0: a quad is all in or all out
#pragma unroll
        for (int u = 0; u < PD_U; u++) {
            xv[u] = xlive[u] && k_live ? __ldg(reinterpret_cast<const float4 *>(xr[u] + k0)) : make_float4(0, 0, 0, 0);
            fv[u] = flive[u] && k_live ? __ldg(reinterpret_cast<const float4 *>(fr[u] + k0)) : make_float4(0, 0, 0, 0);
        }
    };
    const int wm0 = (warp & 1) * 16, wn0 = (warp >> 1) * 16;
    double acc[2][2][2] = {}, ss[PD_U] = {};
    fetch(0);
    for (int64_t k0 = 0; k0 < flat; k0 += PD_K) {
#pragma unroll
        for (int u = 0; u < PD_U; u++) {
            const int row = row0 + PD_ROWS * u;
            reinterpret_cast<double2 *>(x_s + row * PD_P + 4 * quad)[0] = make_double2(xv[u].x, xv[u].y);
            reinterpret_cast<double2 *>(x_s + row * PD_P + 4 * quad)[1] = make_double2(xv[u].z, xv[u].w);
            reinterpret_cast<double2 *>(f_s + row * PD_P + 4 * quad)[0] = make_double2(fv[u].x, fv[u].y);
            reinterpret_cast<double2 *>(f_s + row * PD_P + 4 * quad)[1] = make_double2(fv[u].z, fv[u].w);
            // Products of two floats are exact in fp64: fma adds exactly the product.
            ss[u] = fma(double(xv[u].x), double(xv[u].x), ss[u]);
            ss[u] = fma(double(xv[u].y), double(xv[u].y), ss[u]);
            ss[u] = fma(double(xv[u].z), double(xv[u].z), ss[u]);
            ss[u] = fma(double(xv[u].w), double(xv[u].w), ss[u]);
        }
        __syncthreads();
        if (k0 + PD_K < flat) fetch(k0 + PD_K);
#pragma unroll
        for (int s = 0; s < PD_K / 4; s++) {
            const double a0 = x_s[(wm0 + g) * PD_P + 4 * s + t], a1 = x_s[(wm0 + 8 + g) * PD_P + 4 * s + t];
#pragma unroll
            for (int n = 0; n < 2; n++) dmma2(acc[0][n], acc[1][n], a0, a1, f_s[(wn0 + 8 * n + g) * PD_P + 4 * s + t]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < PD_U; u++) ss_s[row0 + PD_ROWS * u][quad] = ss[u];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = wm0 + 8 * h + g;
        if (s0 + r >= S) continue;
        double tot = 0;
        for (int q = 0; q < PD_QUADS; q++) tot += ss_s[r][q];
        // cpu::dot rounds the sum of squares to fp32 before the mean (engine hc_project).
        const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(float(double(float(tot)) / double(flat)), eps)));
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t j = wn0 + 8 * n + 2 * t + e;
                if (j < n_out) m[(s0 + r) * n_out + j] = __fmul_rn(float(acc[h][n][e]), rs);
            }
    }
}

// Tokens from which a fold_after projection takes project_dmma_kernel (DS41RT_MHC_DMMA_MIN_S
// overrides; a very large value keeps project_kernel, for comparing).
int64_t dmma_min_s() {
    const char *e = std::getenv("DS41RT_MHC_DMMA_MIN_S");
    return e && *e ? std::atoll(e) : 128;
}

__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x))); }
// A pre mix from its projection m: sigmoid(m * scale + base) + eps (engine hc_split_sinkhorn's).
__device__ __forceinline__ float pre_of(float m, float scale, float base, float eps) {
    return __fadd_rn(sigmoid_f(__fadd_rn(__fmul_rn(m, scale), base)), eps);
}

// hc_pre: one thread per (token, stream). Bytes: S * hc * 8.
__global__ void pre_kernel(const float *m, int64_t S, int hc, int64_t ld, const float *sc, const float *b, float eps,
                           float *pre) {
    pdl_enter();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= S * hc) return;
    const int64_t s = i / hc;
    const int j = int(i - s * hc);
    pre[i] = pre_of(m[s * ld + j], sc[0], b[j], eps);
}

// One thread per token; ~hc^2 * 2 * iters divisions. Bytes: S * (2 + hc) * hc * 8.
__global__ void split_kernel(const float *m, int64_t S, int hc, const float *sc, const float *b, float eps, int iters,
                             float *pre, float *post, float *comb) {
    pdl_enter();
    const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (s >= S) return;
    const int64_t n_mix = int64_t(2 + hc) * hc;
    const float *ms = m + s * n_mix;
    for (int j = 0; j < hc; j++) {
        if (pre) pre[s * hc + j] = pre_of(ms[j], sc[0], b[j], eps);
        if (post) post[s * hc + j] = __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(ms[hc + j], sc[1]), b[hc + j])));
    }
    if (!comb) return;
    float C[MAX_HC * MAX_HC];
    for (int j = 0; j < hc; j++) {
        float mx = -INFINITY;
        for (int k = 0; k < hc; k++) {
            C[j * hc + k] = __fadd_rn(__fmul_rn(ms[2 * hc + j * hc + k], sc[2]), b[2 * hc + j * hc + k]);
            mx = fmaxf(mx, C[j * hc + k]);
        }
        float sum = 0;
        for (int k = 0; k < hc; k++) {
            C[j * hc + k] = exp_f(__fsub_rn(C[j * hc + k], mx));
            sum = __fadd_rn(sum, C[j * hc + k]);
        }
        for (int k = 0; k < hc; k++) C[j * hc + k] = __fadd_rn(__fdiv_rn(C[j * hc + k], sum), eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {  // rows
                float sum = 0;
                for (int k = 0; k < hc; k++) sum = __fadd_rn(sum, C[j * hc + k]);
                const float den = __fadd_rn(sum, eps);
                for (int k = 0; k < hc; k++) C[j * hc + k] = __fdiv_rn(C[j * hc + k], den);
            }
        for (int k = 0; k < hc; k++) {  // columns
            float sum = 0;
            for (int j = 0; j < hc; j++) sum = __fadd_rn(sum, C[j * hc + k]);
            const float den = __fadd_rn(sum, eps);
            for (int j = 0; j < hc; j++) C[j * hc + k] = __fdiv_rn(C[j * hc + k], den);
        }
    }
    for (int i = 0; i < hc * hc; i++) comb[s * hc * hc + i] = C[i];
}

// The same arithmetic with one warp per token for hc <= 5 (hc^2 <= 32): lane j * HC + k holds
// C[j][k] in a register and every row / column sum gathers its HC terms by shuffles and adds them
// in the thread kernel's order (k ascending, j ascending), so the results are the same bits. The
// thread kernel keeps C in local memory (runtime hc) and runs ~2 * iters * hc^2 dependent
// divisions one after another: 73 us a call on the H200 at S = 1, hc = 4, iters = 20 (two calls a
// layer); here the divisions of a sweep run side by side.
template <int HC>
__global__ void split_warp_kernel(const float *m, int64_t S, const float *sc, const float *b, float eps, int iters,
                                  float *pre, float *post, float *comb) {
    pdl_enter();
    const int64_t s = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (s >= S) return;  // per warp: whole warps leave together
    const int lane = threadIdx.x & 31, j = lane / HC, k = lane % HC;
    const bool on = lane < HC * HC;
    const float *ms = m + s * (2 + HC) * HC;
    if (lane < HC) {
        if (pre) pre[s * HC + lane] = pre_of(ms[lane], sc[0], b[lane], eps);
        if (post) post[s * HC + lane] = __fmul_rn(2.0f, sigmoid_f(__fadd_rn(__fmul_rn(ms[HC + lane], sc[1]), b[HC + lane])));
    }
    if (!comb) return;  // per warp
    constexpr unsigned ALL = 0xffffffffu;
    float c = on ? __fadd_rn(__fmul_rn(ms[2 * HC + lane], sc[2]), b[2 * HC + lane]) : 0.0f;
    float mx = -INFINITY;
#pragma unroll
    for (int kk = 0; kk < HC; kk++) mx = fmaxf(mx, __shfl_sync(ALL, c, j * HC + kk));
    c = exp_f(__fsub_rn(c, mx));
    float sum = 0;
#pragma unroll
    for (int kk = 0; kk < HC; kk++) sum = __fadd_rn(sum, __shfl_sync(ALL, c, j * HC + kk));
    c = __fadd_rn(__fdiv_rn(c, sum), eps);
    for (int it = 0; it < iters; it++) {
        if (it > 0) {  // rows
            float r = 0;
#pragma unroll
            for (int kk = 0; kk < HC; kk++) r = __fadd_rn(r, __shfl_sync(ALL, c, j * HC + kk));
            c = __fdiv_rn(c, __fadd_rn(r, eps));
        }
        float col = 0;  // columns
#pragma unroll
        for (int jj = 0; jj < HC; jj++) col = __fadd_rn(col, __shfl_sync(ALL, c, jj * HC + k));
        c = __fdiv_rn(c, __fadd_rn(col, eps));
    }
    if (on) comb[s * HC * HC + lane] = c;
}

// One thread per (s, d). Bytes per call: S * D * (hc + 1) * 4.
__global__ void collapse_kernel(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool rb, float *x) {
    pdl_enter();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= S * D) return;
    const int64_t s = t / D, d = t % D;
    float acc = 0;
    for (int j = 0; j < hc; j++) acc = __fadd_rn(acc, __fmul_rn(pre[s * hc + j], X[(s * hc + j) * D + d]));
    x[t] = rb ? dev::round_bf16(acc) : acc;
}

// One thread per (s, d) reads the hc old stream values, then writes the hc new ones (so in
// place is safe). SUM: y is y + y_add first, rounded as add_rows rounds it. Bytes per call:
// S * D * (2 hc + 1 [+ 1]) * 4.
template <bool SUM>
__global__ void expand_kernel(float *X, const float *y, const float *y_add, const float *post, const float *comb,
                              int64_t S, int hc, int64_t D, bool rb) {
    pdl_enter();
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= S * D) return;
    const int64_t s = t / D, d = t % D;
    float res[MAX_HC];
    for (int j = 0; j < hc; j++) res[j] = X[(s * hc + j) * D + d];
    const float *C = comb + s * hc * hc;
    float yv = y[t];
    if constexpr (SUM) {
        yv = __fadd_rn(yv, y_add[t]);
        if (rb) yv = dev::round_bf16(yv);
    }
    for (int k = 0; k < hc; k++) {
        float acc = 0;
        for (int j = 0; j < hc; j++) acc = __fadd_rn(acc, __fmul_rn(C[j * hc + k], res[j]));
        const float v = __fadd_rn(__fmul_rn(post[s * hc + k], yv), acc);
        X[(s * hc + k) * D + d] = rb ? dev::round_bf16(v) : v;
    }
}

unsigned blocks_for(int64_t n) { return unsigned((n + THREADS - 1) / THREADS); }

Status bad(const char *op, const std::string &why) { return Status::invalid_argument(std::string(op) + ": " + why); }

}  // namespace

Status hc_project(const float *X, int64_t S, int64_t flat, const float *fn, int64_t n_out, float eps, bool fold_after,
                  float *m, cudaStream_t stream) {
    const int64_t tiles = (S + P_TOK - 1) / P_TOK;
    const int p_out = tiles == 1 ? P_OUT_NARROW : P_OUT_WIDE;  // the order does not depend on it
    const int64_t groups = (n_out + p_out - 1) / p_out;
    if (S < 0 || flat <= 0 || n_out <= 0 || tiles > 65535 || groups * P_CL > 0x7fffffff)
        return bad("hc_project", "S " + std::to_string(S) + " (<= " + std::to_string(65535 * P_TOK) + "), flat " +
                                     std::to_string(flat) + ", n_out " + std::to_string(n_out));
    if (S == 0) return Status::ok();
    if (!X || !fn || !m) return bad("hc_project", "null pointer");
    const bool vec = flat % 4 == 0 && (reinterpret_cast<uintptr_t>(X) & 15u) == 0 &&
                     (reinterpret_cast<uintptr_t>(fn) & 15u) == 0;
    if (fold_after && vec && n_out <= PD_OUT && S >= dmma_min_s()) {
        project_dmma_kernel<<<unsigned((S + PD_TOK - 1) / PD_TOK), PD_THREADS, 0, stream>>>(X, S, flat, fn, n_out, eps, m);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    const dim3 grid{unsigned(groups * P_CL), unsigned(tiles)};
    const auto kernel = vec ? (p_out == P_OUT_WIDE ? project_kernel<true, P_OUT_WIDE> : project_kernel<true, P_OUT_NARROW>)
                            : (p_out == P_OUT_WIDE ? project_kernel<false, P_OUT_WIDE> : project_kernel<false, P_OUT_NARROW>);
    kernel<<<grid, P_THREADS, 0, stream>>>(X, S, flat, fn, n_out, eps, fold_after, m);  // a cluster launch: no PDL
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_split_sinkhorn(const float *m, int64_t S, int hc, const float *scale, const float *base, float eps, int iters,
                         float *pre, float *post, float *comb, cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || iters < 1)
        return bad("hc_split_sinkhorn", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), iters " +
                                            std::to_string(iters) + " (>= 1)");
    if (S == 0) return Status::ok();
    if (!m || !scale || !base || (!pre && !post && !comb)) return bad("hc_split_sinkhorn", "null pointer");
    const unsigned warp_blocks = unsigned((S + 7) / 8);  // 8 tokens (warps) a block
    switch (hc) {
    case 4:
        (void)launch_pdl(split_warp_kernel<4>, warp_blocks, 256, 0, stream, m, S, scale, base, eps, iters, pre, post,
                         comb);
        break;
    case 2:
        (void)launch_pdl(split_warp_kernel<2>, warp_blocks, 256, 0, stream, m, S, scale, base, eps, iters, pre, post,
                         comb);
        break;
    default:
        (void)launch_pdl(split_kernel, unsigned((S + 63) / 64), 64, 0, stream, m, S, hc, scale, base, eps, iters, pre,
                         post, comb);
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_pre(const float *m, int64_t S, int hc, int64_t ld, const float *scale, const float *base, float eps, float *pre,
              cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || ld < hc)
        return bad("hc_pre", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), ld " + std::to_string(ld));
    if (S == 0) return Status::ok();
    if (!m || !scale || !base || !pre) return bad("hc_pre", "null pointer");
    (void)launch_pdl(pre_kernel, unsigned((S * hc + 255) / 256), 256, 0, stream, m, S, hc, ld, scale, base, eps, pre);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_collapse(const float *X, const float *pre, int64_t S, int hc, int64_t D, bool round_bf16, float *x,
                   cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || D <= 0)
        return bad("hc_collapse", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), D " + std::to_string(D));
    if (S == 0) return Status::ok();
    if (!X || !pre || !x) return bad("hc_collapse", "null pointer");
    (void)launch_pdl(collapse_kernel, blocks_for(S * D), THREADS, 0, stream, X, pre, S, hc, D, round_bf16, x);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_expand(float *X, const float *y, const float *post, const float *comb, int64_t S, int hc, int64_t D,
                 bool round_bf16, cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || D <= 0)
        return bad("hc_expand", "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), D " + std::to_string(D));
    if (S == 0) return Status::ok();
    if (!X || !y || !post || !comb) return bad("hc_expand", "null pointer");
    const float *none = nullptr;
    (void)launch_pdl(expand_kernel<false>, blocks_for(S * D), THREADS, 0, stream, X, y, none, post, comb, S, hc, D,
                     round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status hc_expand_sum(float *X, const float *a, const float *b, const float *post, const float *comb, int64_t S, int hc,
                     int64_t D, bool round_bf16, cudaStream_t stream) {
    if (S < 0 || hc <= 0 || hc > MAX_HC || D <= 0)
        return bad("hc_expand_sum",
                   "S " + std::to_string(S) + ", hc " + std::to_string(hc) + " (1..8), D " + std::to_string(D));
    if (S == 0) return Status::ok();
    if (!X || !a || !b || !post || !comb) return bad("hc_expand_sum", "null pointer");
    (void)launch_pdl(expand_kernel<true>, blocks_for(S * D), THREADS, 0, stream, X, a, b, post, comb, S, hc, D,
                     round_bf16);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
