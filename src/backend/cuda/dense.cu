#include "backend/cuda/dense.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/pdl.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int PARTS = 8;            // lanes that share one output's K (the order's parts)
constexpr int GROUPS = 32 / PARTS;  // output groups per warp
constexpr int CHUNK = 8;            // consecutive k per load: 16 bytes of bf16, 32 of fp32
constexpr int WARPS = 4;
constexpr int MAX_MT = 16;          // activation rows per pass over the weights

// One chunk of one weight row as loaded: bf16 pairs or fp32 values.
template <bool BF16>
struct raw_chunk;
template <>
struct raw_chunk<true> {
    uint32_t u[CHUNK / 2];
};
template <>
struct raw_chunk<false> {
    float f[CHUNK];
};

// Chunk c of the row starting at w + off. VEC: K % 8 == 0 and 16-byte aligned rows; otherwise
// element loads, k >= K left 0 (their products are never added).
template <bool BF16, bool VEC>
__device__ __forceinline__ raw_chunk<BF16> load_w(const void *w, int64_t off, int64_t k0, int64_t K) {
    raw_chunk<BF16> r;
    if constexpr (BF16) {
        const uint16_t *p = static_cast<const uint16_t *>(w) + off + k0;
        if constexpr (VEC) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
            r.u[0] = v.x, r.u[1] = v.y, r.u[2] = v.z, r.u[3] = v.w;
        } else {
#pragma unroll
            for (int i = 0; i < CHUNK / 2; i++) {
                const uint32_t lo = k0 + 2 * i < K ? __ldg(p + 2 * i) : 0u;
                const uint32_t hi = k0 + 2 * i + 1 < K ? __ldg(p + 2 * i + 1) : 0u;
                r.u[i] = lo | (hi << 16);
            }
        }
    } else {
        const float *p = static_cast<const float *>(w) + off + k0;
        if constexpr (VEC) {
            const float4 *q = reinterpret_cast<const float4 *>(p);
            const float4 a = __ldg(q), b = __ldg(q + 1);
            r.f[0] = a.x, r.f[1] = a.y, r.f[2] = a.z, r.f[3] = a.w;
            r.f[4] = b.x, r.f[5] = b.y, r.f[6] = b.z, r.f[7] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < CHUNK; e++) r.f[e] = k0 + e < K ? __ldg(p + e) : 0.0f;
        }
    }
    return r;
}

template <bool BF16>
__device__ __forceinline__ void to_float(const raw_chunk<BF16> &r, float (&f)[CHUNK]) {
    if constexpr (BF16) {
#pragma unroll
        for (int i = 0; i < CHUNK / 2; i++) {  // the lower address is the low half
            f[2 * i] = __uint_as_float(r.u[i] << 16);
            f[2 * i + 1] = __uint_as_float(r.u[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int e = 0; e < CHUNK; e++) f[e] = r.f[e];
    }
}

template <bool VEC>
__device__ __forceinline__ void load_x(const float *p, int64_t k0, int64_t K, float (&f)[CHUNK]) {
    if constexpr (VEC) {
        const float4 *q = reinterpret_cast<const float4 *>(p + k0);
        const float4 a = __ldg(q), b = __ldg(q + 1);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < CHUNK; e++) f[e] = k0 + e < K ? __ldg(p + k0 + e) : 0.0f;
    }
}

// A warp owns GROUPS * R output columns; lane = group * PARTS + part, and part p sums chunks
// p, p + 8, ... of each of its group's R columns for MT activation rows at once (weights read
// once per MT rows, x once per R columns), then the 8 parts of a group combine by butterfly.
// The order (dense.cuh) depends on K only: MT, R and the row slice change which lane does the
// work, never which products one accumulator adds in which sequence.
//
// Roofline: bytes N*K*sizeof(w) + M*K*4 (x, from L1/L2 per warp) + M*N*4; FLOPs 2*M*N*K as fp32
// FMA. For bf16 weights an FMA pass at M rows costs M FMAs per 2 bytes, so the ridge where the
// fp32 FMA rate (128 lanes per SM per clock, ~67 TFLOP/s on an H200) meets ~4.2 TB/s of weight
// bytes is M ~ 16: M = 1..8 is bandwidth-bound, M = 16 needs every FMA slot to stay there.
// Per lane and chunk at MT = 16, R = 4: 512 FMAs against 32 bf16 converts and 36 16-byte loads.
// Large M: the warp walks its row slice in tiles of MT, re-reading its R weight rows per tile
// (from L2 after the first), and grid.y splits the rows when N alone gives too few blocks.
template <bool BF16, bool VEC, int MT, int R>
__global__ void __launch_bounds__(WARPS * 32) dense_kernel(const float *__restrict__ x, const void *__restrict__ w,
                                                             float *__restrict__ y, int64_t M, int64_t N, int64_t K,
                                                             int64_t rows_per_slice) {
    pdl_enter();
    const int lane = threadIdx.x & 31, part = lane & (PARTS - 1), group = lane / PARTS;
    const int64_t warp_n0 = (int64_t(blockIdx.x) * WARPS + (threadIdx.x >> 5)) * GROUPS * R;
    if (warp_n0 >= N) return;  // warp-uniform: the butterflies below need all 32 lanes
    int64_t n[R], woff[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        n[r] = warp_n0 + int64_t(group) * R + r;
        woff[r] = (n[r] < N ? n[r] : N - 1) * K;  // columns past N load a real row, store nothing
    }
    const int64_t m_begin = int64_t(blockIdx.y) * rows_per_slice;
    const int64_t m_end = m_begin + rows_per_slice < M ? m_begin + rows_per_slice : M;
    const int64_t nchunks = (K + CHUNK - 1) / CHUNK;
    // Chunks per stage: one column and few rows per lane leave the registers to keep 4 chunks
    // in flight (a narrow N at decode is latency-bound: K / 64 dependent loads per lane otherwise),
    // one row 16: V4.1's router gate (384 x 5120 bf16, 24 blocks) took 30 us at U = 4, a memory
    // latency per stage of 4. The chains (and so the bits) do not depend on U.
    constexpr int U = R == 1 && MT == 1 ? 16 : R == 1 && MT <= 4 ? 4 : 1;
    for (int64_t m0 = m_begin; m0 < m_end; m0 += MT) {
        const float *xr[MT];
#pragma unroll
        for (int i = 0; i < MT; i++) xr[i] = x + (m0 + i < m_end ? m0 + i : m_end - 1) * K;  // pad rows: repeats
        float acc[MT][R];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[i][r] = 0.0f;
        // A stage is U of this part's chunks (c, c + 8, ...); the next stage's weights are in
        // flight while this one is used.
        raw_chunk<BF16> cur[U][R], nxt[U][R];
        const auto load_stage = [&](raw_chunk<BF16>(&dst)[U][R], int64_t c) {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (c + u * PARTS < nchunks)
#pragma unroll
                    for (int r = 0; r < R; r++) dst[u][r] = load_w<BF16, VEC>(w, woff[r], (c + u * PARTS) * CHUNK, K);
        };
        load_stage(cur, part);
        for (int64_t c = part; c < nchunks; c += PARTS * U) {
            if (c + PARTS * U < nchunks) load_stage(nxt, c + PARTS * U);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t k0 = (c + u * PARTS) * CHUNK;
                if (k0 >= K) break;
                float wf[R][CHUNK];
#pragma unroll
                for (int r = 0; r < R; r++) to_float<BF16>(cur[u][r], wf[r]);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    float xv[CHUNK];
                    load_x<VEC>(xr[i], k0, K, xv);
#pragma unroll
                    for (int e = 0; e < CHUNK; e++)
                        if (VEC || k0 + e < K)
#pragma unroll
                            for (int r = 0; r < R; r++) acc[i][r] = fmaf(xv[e], wf[r][e], acc[i][r]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) cur[u][r] = nxt[u][r];
        }
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                float v = acc[i][r];
                v += __shfl_xor_sync(0xffffffffu, v, 4);  // commutative: every lane of a pair gets the same bits
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                if (part == i % PARTS && m0 + i < m_end && n[r] < N) y[(m0 + i) * N + n[r]] = v;
            }
    }
}

// Narrow N at decode (the router gate 384 x 5120, the compressors' and the indexer's projections,
// M <= 16): dense_kernel gives such a product N / 16 blocks, too few for the bandwidth, and each
// part's K / 64 loads are one dependent stage after another. Here a block first copies the whole
// weight rows of its RB columns into shared memory, every thread with all its 16-byte pieces in
// flight at once (cp.async), then 8 lanes per (row, column) add them in dense_kernel's order
// (part c % 8, ascending chunks, ascending k, fmaf from +0, the same butterfly), so the bits equal
// dense_kernel's for every M. H200, router gate at M = 1, back-to-back calls: 19.1 us through
// dense_kernel, 10.7 us here with x read from L2 chunk by chunk, 8.75 us with NARROW_G chunks' x
// loads in flight together, 7.55 us with x in shared memory too (tests/cuda/dense_test.cpp; each
// chunk's FMAs had waited for its own L2 round trip, K / 64 of them per lane). Roofline: bytes
// N * K * sizeof(w) (once; x's M * K * 4, y's M * N * 4): 3.9 MB for the gate, ~1 us at the copy
// rate; FLOPs 2 * M * N * K as fp32 FMA, a chain of K / 8 dependent FMAs per lane (~1.3 us at
// K = 5120).
// XS: x's M rows are copied into shared memory behind the weight rows as well (when they fit in
// NARROW_SMEM_X), so the sums read only shared memory.
constexpr int NARROW_THREADS = 256, NARROW_MAX_M = 16, NARROW_G = 8;
constexpr size_t NARROW_SMEM = 48 * 1024;     // weight rows per block
constexpr size_t NARROW_SMEM_X = 100 * 1024;  // weight rows and x (an opt-in above 48 KB)

__device__ __forceinline__ void copy_to_shared(uint8_t *dst, const uint8_t *src, size_t bytes) {
    for (size_t i = threadIdx.x; i < bytes / 16; i += NARROW_THREADS) {
        const unsigned d = unsigned(__cvta_generic_to_shared(dst + i * 16));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + i * 16));
    }
}

// Blocks from nb1 on compute a second product of the same x (w2 -> y2, N2 columns; dense_linear_pair).
template <bool BF16, bool XS>
__global__ void __launch_bounds__(NARROW_THREADS) dense_narrow_kernel(const float *__restrict__ x, const void *__restrict__ w1,
                                                                       float *__restrict__ y1, int N1, const void *w2, float *y2,
                                                                       int N2, int nb1, int M, int K, int RB) {
    extern __shared__ __align__(16) uint8_t sw[];
    const bool second = int(blockIdx.x) >= nb1;  // uniform across the block
    const void *w = second ? w2 : w1;
    float *y = second ? y2 : y1;
    const int N = second ? N2 : N1;
    const int n0 = (second ? int(blockIdx.x) - nb1 : int(blockIdx.x)) * RB, rows = min(RB, N - n0);
    const size_t row_bytes = size_t(K) * (BF16 ? 2 : 4);
    // The weight rows are no kernel's output: their copies go out before the launch waits for its
    // predecessor (pdl.cuh), so their latency hides behind its tail; x is read from here on.
    copy_to_shared(sw, static_cast<const uint8_t *>(w) + size_t(n0) * row_bytes, size_t(rows) * row_bytes);
    pdl_enter();
    float *xsh = reinterpret_cast<float *>(sw + size_t(RB) * row_bytes);
    if constexpr (XS) copy_to_shared(reinterpret_cast<uint8_t *>(xsh), reinterpret_cast<const uint8_t *>(x), size_t(M) * K * 4);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();

    const int part = threadIdx.x & (PARTS - 1), nchunks = K / CHUNK, outputs = M * rows;
    // Whole warps go round the loop together (the butterfly needs all 32 lanes).
    for (int base = 0; base < outputs; base += NARROW_THREADS / PARTS) {
        const int o = base + int(threadIdx.x / PARTS);
        const bool live = o < outputs;
        const int m = live ? o / rows : 0, r = live ? o % rows : 0;
        float acc = 0.0f;
        if (live) {
            const float *xr = (XS ? xsh : x) + size_t(m) * K;
            const uint8_t *wr = sw + size_t(r) * row_bytes;
            // Without XS x comes from L2: NARROW_G chunks' loads go out together, then their FMAs
            // in order (one L2 round trip per NARROW_G chunks instead of per chunk).
            for (int c0 = part; c0 < nchunks; c0 += PARTS * NARROW_G) {
                float xv[NARROW_G][CHUNK];
#pragma unroll
                for (int j = 0; j < NARROW_G; j++) {
                    const int c = c0 + j * PARTS;
                    if (c >= nchunks) break;
                    if constexpr (XS) {
                        const float4 *q = reinterpret_cast<const float4 *>(xr + size_t(c) * CHUNK);
                        const float4 a = q[0], b = q[1];
                        xv[j][0] = a.x, xv[j][1] = a.y, xv[j][2] = a.z, xv[j][3] = a.w;
                        xv[j][4] = b.x, xv[j][5] = b.y, xv[j][6] = b.z, xv[j][7] = b.w;
                    } else {
                        load_x<true>(xr, int64_t(c) * CHUNK, K, xv[j]);
                    }
                }
#pragma unroll
                for (int j = 0; j < NARROW_G; j++) {
                    const int c = c0 + j * PARTS;
                    if (c >= nchunks) break;
                    raw_chunk<BF16> raw;
                    if constexpr (BF16) {
                        const uint4 v = *reinterpret_cast<const uint4 *>(wr + size_t(c) * CHUNK * 2);
                        raw.u[0] = v.x, raw.u[1] = v.y, raw.u[2] = v.z, raw.u[3] = v.w;
                    } else {
                        const float4 *q = reinterpret_cast<const float4 *>(wr + size_t(c) * CHUNK * 4);
                        const float4 a = q[0], b = q[1];
                        raw.f[0] = a.x, raw.f[1] = a.y, raw.f[2] = a.z, raw.f[3] = a.w;
                        raw.f[4] = b.x, raw.f[5] = b.y, raw.f[6] = b.z, raw.f[7] = b.w;
                    }
                    float wf[CHUNK];
                    to_float<BF16>(raw, wf);
#pragma unroll
                    for (int e = 0; e < CHUNK; e++) acc = fmaf(xv[j][e], wf[e], acc);
                }
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (live && part == 0) y[size_t(m) * N + n0 + r] = acc;
    }
}

int sm_count() {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return n > 0 ? n : 1;
}

template <bool BF16, bool VEC, int R>
void launch_mt(int mt, dim3 grid, const float *x, const void *w, float *y, int64_t M, int64_t N, int64_t K, int64_t rps,
               cudaStream_t stream) {
    const dim3 block(WARPS * 32);
    switch (mt) {
    case 1: (void)launch_pdl(dense_kernel<BF16, VEC, 1, R>, grid, block, 0, stream, x, w, y, M, N, K, rps); break;
    case 2: (void)launch_pdl(dense_kernel<BF16, VEC, 2, R>, grid, block, 0, stream, x, w, y, M, N, K, rps); break;
    case 4: (void)launch_pdl(dense_kernel<BF16, VEC, 4, R>, grid, block, 0, stream, x, w, y, M, N, K, rps); break;
    case 8: (void)launch_pdl(dense_kernel<BF16, VEC, 8, R>, grid, block, 0, stream, x, w, y, M, N, K, rps); break;
    default: (void)launch_pdl(dense_kernel<BF16, VEC, MAX_MT, R>, grid, block, 0, stream, x, w, y, M, N, K, rps); break;
    }
}

template <bool BF16, bool VEC>
void launch_r(int r, int mt, dim3 grid, const float *x, const void *w, float *y, int64_t M, int64_t N, int64_t K,
              int64_t rps, cudaStream_t stream) {
    if (r == 4) launch_mt<BF16, VEC, 4>(mt, grid, x, w, y, M, N, K, rps, stream);
    else launch_mt<BF16, VEC, 1>(mt, grid, x, w, y, M, N, K, rps, stream);
}

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool narrow_fits(int64_t M, int64_t N, int64_t K, bool w_bf16) {
    return M <= NARROW_MAX_M && size_t(K) * (w_bf16 ? 2 : 4) <= NARROW_SMEM && N < int64_t(2) * sm_count() * WARPS * GROUPS;
}

// dense_narrow_kernel over N1 columns of w1, then (w2 non-null) N2 of w2; block rows sized by
// N1 + N2 as for one product of that width.
Status launch_narrow(const float *x, const void *w1, float *y1, int64_t N1, const void *w2, float *y2, int64_t N2,
                     bool w_bf16, int64_t M, int64_t K, cudaStream_t stream) {
    const size_t row_bytes = size_t(K) * (w_bf16 ? 2 : 4);
    const int sms = sm_count();
    const int64_t fit = int64_t(NARROW_SMEM / row_bytes), N = N1 + N2;
    const int rb = int(std::max<int64_t>(1, std::min<int64_t>(fit, (N + sms - 1) / sms)));
    const int nb1 = int((N1 + rb - 1) / rb);
    const unsigned blocks = unsigned(nb1 + (N2 + rb - 1) / rb);
    const size_t smem = size_t(rb) * row_bytes, with_x = smem + size_t(M) * K * 4;
    static const bool opted = [] {  // once per process: the XS instances may use NARROW_SMEM_X
        for (auto *k : {dense_narrow_kernel<true, true>, dense_narrow_kernel<false, true>})
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(NARROW_SMEM_X));
        return true;
    }();
    const bool xs = opted && with_x <= NARROW_SMEM_X;
    auto *kernel = w_bf16 ? (xs ? dense_narrow_kernel<true, true> : dense_narrow_kernel<true, false>)
                          : (xs ? dense_narrow_kernel<false, true> : dense_narrow_kernel<false, false>);
    (void)launch_pdl(kernel, blocks, NARROW_THREADS, xs ? with_x : smem, stream, x, w1, y1, int(N1), w2, y2, int(N2),
                     nb1, int(M), int(K), rb);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace

Status dense_linear(const float *x, const void *w, bool w_bf16, float *y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t stream) {
    if (M < 1 || N < 1 || K < 1 || !x || !w || !y)
        return Status::invalid_argument("dense_linear: bad shape or null (M " + std::to_string(M) + ", N " +
                                        std::to_string(N) + ", K " + std::to_string(K) + ")");
    const bool vec = K % CHUNK == 0 && aligned16(x) && aligned16(w);
    // Narrow products (fewer than two of dense_kernel's blocks per SM) whose weight row fits in
    // shared memory: dense_narrow_kernel, the same bits.
    if (vec && narrow_fits(M, N, K, w_bf16)) return launch_narrow(x, w, y, N, nullptr, nullptr, 0, w_bf16, M, K, stream);
    // Four columns per lane amortize x loads; one keeps enough warps in flight for narrow N.
    const int R = (M > MAX_MT || N >= 32768) ? 4 : 1;
    int mt = 1;
    while (mt < M && mt < MAX_MT) mt *= 2;
    const int64_t col_blocks = (N + int64_t(WARPS) * GROUPS * R - 1) / (int64_t(WARPS) * GROUPS * R);
    if (col_blocks > 0x7fffffff) return Status::invalid_argument("dense_linear: N " + std::to_string(N) + " too large");
    // Row slices over grid.y only when the columns alone give fewer than ~1024 blocks.
    const int64_t tiles = (M + mt - 1) / mt;
    int64_t slices = (1024 + col_blocks - 1) / col_blocks;
    if (slices > tiles) slices = tiles;
    if (slices > 65535) slices = 65535;
    const int64_t rps = (tiles + slices - 1) / slices * mt;
    slices = (M + rps - 1) / rps;
    const dim3 grid{unsigned(col_blocks), unsigned(slices)};
    if (w_bf16) {
        if (vec) launch_r<true, true>(R, mt, grid, x, w, y, M, N, K, rps, stream);
        else launch_r<true, false>(R, mt, grid, x, w, y, M, N, K, rps, stream);
    } else {
        if (vec) launch_r<false, true>(R, mt, grid, x, w, y, M, N, K, rps, stream);
        else launch_r<false, false>(R, mt, grid, x, w, y, M, N, K, rps, stream);
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

Status dense_linear_pair(const float *x, const void *w1, float *y1, int64_t N1, const void *w2, float *y2, int64_t N2,
                         bool w_bf16, int64_t M, int64_t K, cudaStream_t stream) {
    if (M < 1 || N1 < 1 || N2 < 1 || K < 1 || !x || !w1 || !w2 || !y1 || !y2)
        return Status::invalid_argument("dense_linear_pair: bad shape or null (M " + std::to_string(M) + ", N " +
                                        std::to_string(N1) + " + " + std::to_string(N2) + ", K " + std::to_string(K) + ")");
    if (K % CHUNK == 0 && aligned16(x) && aligned16(w1) && aligned16(w2) && narrow_fits(M, N1 + N2, K, w_bf16))
        return launch_narrow(x, w1, y1, N1, w2, y2, N2, w_bf16, M, K, stream);
    DS41RT_RETURN_IF_ERROR(dense_linear(x, w1, w_bf16, y1, M, N1, K, stream));
    return dense_linear(x, w2, w_bf16, y2, M, N2, K, stream);
}

}  // namespace ds41rt::backend::cuda
