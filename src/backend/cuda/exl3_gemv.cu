// Decode GEMV over EXL3 trellis weights (spec quant-formats 2.3-2.5, 2.8), decoded in the kernel.
// Reference: backend/cpu exl3_linear on model::exl3_decode's What.
//
// Three steps, as exllamav3 factors the layer:
//  1. rotate_x_kernel: xr = (x . suh) H / sqrt(128) per 128-block of each row (fp32 butterflies:
//     2 in-thread stages, 5 warp-shuffle stages), split into fp16 hi + lo (22 significant bits)
//     and stored in the B-fragment order of mma.m16n8k16 (one 16-byte load per thread and tile).
//     Matrices with the same x and suh (none in V4.1: w1 and w3 have their own suh) share it.
//  2. exl3_gemv_kernel: one CTA per (matrix, 128-output block, K slice); warp w owns the 16-column
//     tile 8 nb + w and walks the slice's 16-row tiles. Each lane decodes its 8 weights of a tile
//     from the trellis words it loads itself: the tile's element order is already the A fragment of
//     What^T (swap-AB: output features are the MMA's rows, tokens its columns; spec 2.8), so the 8
//     decoded fp16 values are 4 A registers with no shuffle. Two mma.m16n8k16 per 8 tokens (x hi,
//     x lo), fp32 accumulation.
//  3. Epilogue in the same CTA: the 16 x 128 fp32 block goes through shared memory; with split K
//     each slice writes its partial to the workspace and the last to arrive (atomic counter per
//     block) sums them in slice order (deterministic) and resets the counter. Then the output
//     Hadamard per token row (the same butterfly) times svh / sqrt(128), stored as fp32.
//
// Roofline (H200, V4.1 expert w1: in 5120, out 2304, K = 2, M = 1): 2.95 MB of trellis + 15 KB of
// suh/svh, 23.6 MFLOP of MMA (2 x 2 per weight per 8-token tile; the tensor cores are far from
// binding). The decode is integer work and binds. Counted in the SASS (cuobjdump -sass, sm_90a,
// nvcc 13.0; the main loop of exl3_gemv_kernel<1> built for K = 2 MCG alone, 4 tiles a trip), per
// warp and 16x16 tile (256 weights, 64 bytes at K = 2):
//   before: 110.5 instructions (NT = 2: 134.8): 27.5 LOP3 (mask and xor as two immediates, so two
//           LOP3 per state), 21 IMAD, 14 SHF, 8 PRMT, 4 HADD2, 2 HMMA, and ~34 of per-tile address
//           arithmetic, predicated x loads with their branches (BSSY / BSYNC) and re-read thread ids;
//   after:  52.5 (NT = 2: 57.0; K = 2 3INST 52.5, MUL1 52.3): per lane 12 ops for its 8 states
//           (decode8's K = 2 path: four funnel shifts, each window pair cut by one shift and one
//           PRMT, no masks), per weight 1 IMAD and 1 LOP3 ((x & mask) ^ xr with xr a register),
//           per pair 2 PRMT + 1 HADD2 (= 40 a tile), 2 HMMA, and ~10 of loads: one pointer per
//           trellis word advanced by the tile-row stride, x fragments at immediate offsets, whole
//           groups of U tiles (no tail predicates). Other K keep the generic cut (shift + mask a
//           state): K = 3 59.5, K = 4 57.8.
// At one warp instruction per scheduler per clock (132 SMs x 4 x ~1.8 GHz = 0.95e12/s): before
// ~0.55 TB/s of K = 2 trellis (measured on the H200: ~7% of copy, ~0.3 TB/s), after ~1.16 TB/s,
// so an expected ~0.6-0.65 TB/s (~15% of copy) at the same issue efficiency. The floor of this
// decode is ~5 thread instructions per weight (~40 a tile): K = 2 stays ALU-bound below ~1.5 TB/s,
// far from the HBM's ~4.3 TB/s; the bytes per weight grow with K and the count barely does, so
// K >= 6 approaches balance. M does not change the decode: M = 1 and M = 16 cost about the same.
//
// Invariants: in, out % 128 == 0; K 1..8; M <= 16; |(x . suh) H| / sqrt(128) < 65504 (fp16 hi);
// y does not alias x. Graph-replayable: yes (counters return to zero).
// Test: tests/cuda/exl3_gemv_test.cpp: decoded tiles bit-exact vs model::exl3_decode; layer output
// within 1e-4 relative (Frobenius) and 1e-3 of max|ref| per element vs backend/cpu exl3_linear;
// NaN-poisoned y; two runs per plan.
#include "backend/cuda/exl3_gemv.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/splitk_plan.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int WARPS = 8;  // one per 16-column tile of a 128-output block
constexpr int THREADS = WARPS * 32;
constexpr int MAX_JOBS = 24;    // matrices per launch (kernel parameter space)
constexpr int MIN_KT = 8;       // thinnest K slice, in 16-row tiles
constexpr int MAX_KSPLIT = 24;  // bounds the partial sum of the last CTA ...
constexpr int MAX_SLICE_ROWS = 128;  // ... as does slices x tokens (64 KB of partials per block)
constexpr int U = 4;            // tiles per pipeline group (loads of the next group overlap the decode)
constexpr int SPITCH = 128 + 4;
constexpr float HNORM = 0.08838834764831845f;  // 1 / sqrt(128)

struct job {
    const uint32_t *trellis;  // tiles as little-endian uint32 words (spec 2.3)
    const uint16_t *svh;
    const uint4 *xs;          // rotated x: [in / 16][16 tokens][4 q] {hi k 2q.., hi 2q+8.., lo.., lo..}
    float *y, *partials;
    unsigned *counters;
    int in, out, k, cb, M;
    int ksplit, kt_per_split, item_begin;
};

struct batch {
    job jobs[MAX_JOBS];
    int njobs, items;
    uint32_t cb_xor;  // 0x3B603B60 (cb_pair: a register operand, not a literal)
};

struct rot_job {
    const float *x;
    const uint16_t *suh;
    uint32_t *xs;
    int M, in;
};

struct rot_batch {
    rot_job jobs[MAX_JOBS];
    int njobs;
};

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Natural-order (Sylvester) Walsh-Hadamard of 128 values, unnormalized: lane holds 4 * lane + e.
__device__ __forceinline__ void fwht128(float (&v)[4], int lane) {
    float t;
    t = v[0], v[0] = t + v[1], v[1] = t - v[1];
    t = v[2], v[2] = t + v[3], v[3] = t - v[3];
    t = v[0], v[0] = t + v[2], v[2] = t - v[2];
    t = v[1], v[1] = t + v[3], v[3] = t - v[3];
#pragma unroll
    for (int s = 1; s < 32; s <<= 1)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = __shfl_xor_sync(0xffffffffu, v[e], s);
            v[e] = (lane & s) ? p - v[e] : v[e] + p;
        }
}

// A lane's share of a tile: elements t = 8 lane .. 8 lane + 7, whose states are the 16-bit windows
// ending at stream bits (t + 1) K: together the span [8 lane K + K - 16, 8 lane K + 8 K), cyclic
// (tail-biting: lane 0's first window starts in the tile's last word).
template <int K>
struct geom {
    static constexpr int WORDS = 8 * K;             // uint32 words per tile
    static constexpr int A = (7 * K + 16 + 31) / 32;  // words of the lane's span once aligned
    static constexpr int NW = A + 1;                // words loaded (the span may straddle one more)
};

template <int K>
__device__ __forceinline__ int span_start(int lane) {
    const int b = 8 * lane * K + K - 16;
    return b < 0 ? b + 256 * K : b;
}

template <int K>
__device__ __forceinline__ void load_words(const uint32_t *tile, int start, uint32_t (&w)[geom<K>::NW]) {
    const int w0 = start >> 5;
#pragma unroll
    for (int i = 0; i < geom<K>::NW; i++) {
        int idx = w0 + i;
        if (idx >= geom<K>::WORDS) idx -= geom<K>::WORDS;
        w[i] = __ldg(tile + idx);
    }
}

template <int CB>
__device__ __forceinline__ uint32_t cb_hash(uint32_t s) {
    if constexpr (CB == 0) return s * 89226354u + 64248484u;
    else if constexpr (CB == 1) return s * 0xCBAC1FEDu;
    else return s * 0x83DCD12Du;
}

// Two states -> their codebook values as one fp16 pair (first state in the low half), with the
// rounding of exllamav3's decode_3inst<cb> (spec 2.4): one HADD2 (3INST, MCG) or one HFMA2 (MUL1).
// xr = 0x3B603B60 arrives as a register (a kernel parameter): LOP3 takes one immediate, so with
// both the mask and the xor as literals ptxas spends two LOP3 per state; this way (x & mask) ^ xr
// is one.
template <int CB>
__device__ __forceinline__ uint32_t cb_pair(uint32_t s0, uint32_t s1, uint32_t xr) {
    uint32_t x0 = cb_hash<CB>(s0), x1 = cb_hash<CB>(s1);
    if constexpr (CB == 2) {
        const uint32_t t0 = __dp4a(x0, 0x01010101u, 0u), t1 = __dp4a(x1, 0x01010101u, 0u);  // byte sums <= 1020
        const uint32_t h = __byte_perm(t0, t1, 0x5410) + 0x64006400u;                       // fp16 1024 + s
        return h2_bits(__hfma2(bits_h2(h), bits_h2(0x1EEE1EEEu), bits_h2(0xC931C931u)));
    } else {
        x0 = (x0 & 0x8FFF8FFFu) ^ xr;
        x1 = (x1 & 0x8FFF8FFFu) ^ xr;
        return h2_bits(__hadd2(bits_h2(__byte_perm(x0, x1, 0x5410)), bits_h2(__byte_perm(x0, x1, 0x7632))));
    }
}

// The lane's 8 weights as the A fragment of What^T: a[0] = (j0, j1), a[1] = (j4, j5), a[2] =
// (j2, j3), a[3] = (j6, j7) (spec 2.8). o: bit offset of the span start within its first word.
template <int K, int CB>
__device__ __forceinline__ void decode8(const uint32_t (&w)[geom<K>::NW], int o, uint32_t xr, uint32_t (&a)[4]) {
    constexpr int A = geom<K>::A;
    uint32_t u[A];  // the span, MSB-first from its first bit
#pragma unroll
    for (int i = 0; i < A; i++) u[i] = __funnelshift_l(w[i + 1], w[i], o);
    uint32_t st[8];
    if constexpr (K == 2) {
        // The 8 windows start at bits o, o + 2, .., o + 14 of the two words, and o is 2 or 18
        // (span_start = 16 lane - 14 mod 512), so v = the 32 bits from o + 2j (one funnel shift,
        // never past the second word) holds window j at its top (one shift down, no mask) and
        // window j + 4 in bytes 1-2 (one PRMT, zero-filled): 12 instructions for the 8 states
        // instead of 16 (a funnel shift, then a shift and a mask each).
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t v = __funnelshift_l(w[1], w[0], o + 2 * j);
            st[j] = v >> 16;
            st[j + 4] = __byte_perm(v, 0u, 0x4421);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = (j * K) >> 5, s = (j * K) & 31;
            if (s <= 16) st[j] = (u[i] >> (16 - s)) & 0xffffu;
            else st[j] = __funnelshift_l(u[i + 1 < A ? i + 1 : A - 1], u[i], s) >> 16;
        }
    }
    a[0] = cb_pair<CB>(st[0], st[1], xr);
    a[1] = cb_pair<CB>(st[4], st[5], xr);
    a[2] = cb_pair<CB>(st[2], st[3], xr);
    a[3] = cb_pair<CB>(st[6], st[7], xr);
}

__global__ void rotate_x_kernel(const __grid_constant__ rot_batch b) {
    const rot_job &J = b.jobs[blockIdx.y];
    const int lane = threadIdx.x & 31, nblk = J.in / 128, total = J.M * nblk;
    for (int i = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < total; i += (gridDim.x * blockDim.x) >> 5) {
        const int m = i / nblk, blk = i - m * nblk;
        const int k0 = blk * 128 + 4 * lane;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = J.x[size_t(m) * J.in + k0 + e] * __half2float(__ushort_as_half(J.suh[k0 + e]));
        fwht128(v, lane);
        uint32_t hi[2], lo[2];
#pragma unroll
        for (int p = 0; p < 2; p++) {
            const float f0 = v[2 * p] * HNORM, f1 = v[2 * p + 1] * HNORM;
            const __half2 h = __floats2half2_rn(f0, f1);
            hi[p] = h2_bits(h);
            lo[p] = h2_bits(__floats2half2_rn(f0 - __low2float(h), f1 - __high2float(h)));
        }
        // k0 .. k0 + 3 are rows r0 .. r0 + 3 of tile k0 / 16: pairs (r0, r0+1) and (r0+2, r0+3),
        // fragment slots q = (r % 8) / 2, half r / 8.
        const int r0 = k0 & 15, half = r0 >> 3, q0 = (r0 & 7) >> 1;
        uint32_t *base = J.xs + (size_t(k0 >> 4) * 16 + m) * 16;
        base[q0 * 4 + half] = hi[0], base[q0 * 4 + 2 + half] = lo[0];
        base[(q0 + 1) * 4 + half] = hi[1], base[(q0 + 1) * 4 + 2 + half] = lo[1];
    }
}

// The slice [a0, a1) of 16-row tiles, a1 - a0 a multiple of U (slice_tiles). Addressing is hoisted
// out of the loop: a lane reads its words at fixed offsets within every tile (one pointer per word,
// advanced by the stride between tile rows), and its x fragments at immediate offsets from one
// pointer. The next group's words load while this group decodes.
template <int K, int CB, int NT>
__device__ __forceinline__ void mainloop(const job &J, int bcol, int a0, int a1, int lane, uint32_t xr,
                                         float (&acc)[NT][4]) {
    using G = geom<K>;
    const int g = lane >> 2, q = lane & 3;
    const int start = span_start<K>(lane), o = start & 31;
    const size_t stride = size_t(J.out / 16) * G::WORDS;  // words from tile (a, b) to (a + 1, b)
    const uint32_t *wp[G::NW];
#pragma unroll
    for (int i = 0; i < G::NW; i++) {
        int idx = (start >> 5) + i;
        if (idx >= G::WORDS) idx -= G::WORDS;
        wp[i] = J.trellis + (size_t(a0) * (J.out / 16) + bcol) * G::WORDS + idx;
    }
    // xs: [in / 16][16 tokens][4 q] uint4; token nt 8 + g of tile a + u is 64 u + 32 nt past xp.
    // Tokens >= M are loaded too (the workspace's zeros, or stale rows of an earlier plan): an MMA
    // column depends only on its own token, and the epilogue never reads columns >= M.
    const uint4 *xp = J.xs + (size_t(a0) * 16 + g) * 4 + q;
    auto load = [&](uint32_t (&w)[U][G::NW]) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < G::NW; i++) w[u][i] = __ldg(wp[i] + u * stride);
    };
    uint32_t cur[U][G::NW], nxt[U][G::NW];
    load(cur);
    for (int a = a0; a < a1; a += U) {
        if (a + U < a1) {
#pragma unroll
            for (int i = 0; i < G::NW; i++) wp[i] += U * stride;
            load(nxt);
        }
        uint4 xv[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) xv[u][nt] = __ldg(xp + u * 64 + nt * 32);
        xp += U * 64;
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t af[4];
            decode8<K, CB>(cur[u], o, xr, af);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mma_f16(acc[nt], af, xv[u][nt].x, xv[u][nt].y);
                mma_f16(acc[nt], af, xv[u][nt].z, xv[u][nt].w);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < G::NW; i++) cur[u][i] = nxt[u][i];
    }
}

// Every (K, codebook) pair as one switch: a launch may mix them (K can differ per tensor).
#define DS41RT_EXL3_CASES(X) \
    X(1, 0) X(1, 1) X(1, 2) X(2, 0) X(2, 1) X(2, 2) X(3, 0) X(3, 1) X(3, 2) X(4, 0) X(4, 1) X(4, 2) \
    X(5, 0) X(5, 1) X(5, 2) X(6, 0) X(6, 1) X(6, 2) X(7, 0) X(7, 1) X(7, 2) X(8, 0) X(8, 1) X(8, 2)

template <int NT>  // token tiles of 8 (M <= 8 NT)
__global__ void __launch_bounds__(THREADS) exl3_gemv_kernel(const __grid_constant__ batch b) {
    __shared__ float sacc[16][SPITCH];
    __shared__ unsigned s_last;
    const int item = blockIdx.x;
    int j = 0;
    while (j + 1 < b.njobs && item >= b.jobs[j + 1].item_begin) ++j;
    const job &J = b.jobs[j];
    const int local = item - J.item_begin, nb = local / J.ksplit, ks = local - nb * J.ksplit;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int a0 = ks * J.kt_per_split, a1 = min(J.in / 16, a0 + J.kt_per_split);
    const int bcol = nb * 8 + warp;

    float acc[NT][4] = {};
    if (a0 < a1) switch (J.k * 3 + J.cb) {
#define DS41RT_EXL3_CASE(K, CB) \
    case K * 3 + CB: mainloop<K, CB, NT>(J, bcol, a0, a1, lane, b.cb_xor, acc); break;
        DS41RT_EXL3_CASES(DS41RT_EXL3_CASE)
#undef DS41RT_EXL3_CASE
    default: break;
    }

    // acc[nt][i]: output column 16 warp + g + 8 (i / 2) of the block, token nt 8 + 2q + (i % 2).
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) sacc[nt * 8 + 2 * q + (i & 1)][16 * warp + g + 8 * (i >> 1)] = acc[nt][i];
    __syncthreads();
    const int M = J.M;
    if (J.ksplit > 1) {
        float *mine = J.partials + (size_t(nb) * J.ksplit + ks) * M * 128;
        for (int e = threadIdx.x; e < M * 128; e += THREADS) mine[e] = sacc[e >> 7][e & 127];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) s_last = atomicAdd(J.counters + nb, 1u) == unsigned(J.ksplit - 1) ? 1u : 0u;
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        // Sum in slice order (deterministic); 4 slices x 8 elements of loads in flight per thread.
        const int n = M * 128;
        const float *first = J.partials + size_t(nb) * J.ksplit * n;
        constexpr int E = 16 * 128 / THREADS;
        float sum[E] = {};
        for (int t0 = 0; t0 < J.ksplit; t0 += 4) {
            float v[4][E];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int i = 0; i < E; i++) {
                    const int e = threadIdx.x + i * THREADS;
                    v[u][i] = t0 + u < J.ksplit && e < n ? __ldcg(first + size_t(t0 + u) * n + e) : 0.0f;
                }
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int i = 0; i < E; i++)
                    if (t0 + u < J.ksplit) sum[i] += v[u][i];
        }
#pragma unroll
        for (int i = 0; i < E; i++) {
            const int e = threadIdx.x + i * THREADS;
            if (e < n) sacc[e >> 7][e & 127] = sum[i];
        }
        if (threadIdx.x == 0) J.counters[nb] = 0;
        __syncthreads();
    }
    for (int m = warp; m < M; m += WARPS) {  // whole warps: the butterfly shuffles
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = sacc[m][4 * lane + e];
        fwht128(v, lane);
        const int c0 = nb * 128 + 4 * lane;
#pragma unroll
        for (int e = 0; e < 4; e++)
            J.y[size_t(m) * J.out + c0 + e] = v[e] * HNORM * __half2float(__ushort_as_half(J.svh[c0 + e]));
    }
}

// One warp per tile: the lane's 8 decoded values to their (row, column) of What (spec 2.3's map).
__global__ void decode_what_kernel(const uint32_t *trellis, int in, int out, int k, int cb, uint16_t *what) {
    const int lane = threadIdx.x & 31, tb = out / 16, tiles = (in / 16) * tb;
    for (int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < tiles; t += (gridDim.x * blockDim.x) >> 5) {
        const int a = t / tb, bcol = t - a * tb;
        uint32_t af[4] = {};
        switch (k * 3 + cb) {
#define DS41RT_EXL3_CASE(K, CB)                                                   \
    case K * 3 + CB: {                                                            \
        uint32_t w[geom<K>::NW];                                                  \
        const int start = span_start<K>(lane);                                    \
        load_words<K>(trellis + size_t(t) * geom<K>::WORDS, start, w);            \
        decode8<K, CB>(w, start & 31, 0x3B603B60u, af);                           \
        break;                                                                    \
    }
            DS41RT_EXL3_CASES(DS41RT_EXL3_CASE)
#undef DS41RT_EXL3_CASE
        default: break;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int jp = j >> 1, reg = ((jp & 1) << 1) | (jp >> 1);
            const uint16_t v = uint16_t(af[reg] >> (16 * (j & 1)));
            const int r = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1), c = lane / 4 + 8 * (j >> 2);
            what[size_t(16 * a + r) * out + 16 * bcol + c] = v;
        }
    }
}

using splitk::align256;
using splitk::token_tiles;

// Tiles per K slice: whole pipeline groups of U (in % 128 == 0 makes every tile count a multiple
// of 8, so every slice, the last included, is whole groups and the main loop needs no tail).
int slice_tiles(int kt, int ks) { return splitk::slice_len(kt, ks, U); }

template <int NT>
int blocks_per_sm() {
    static const int blocks = splitk::resident_blocks(exl3_gemv_kernel<NT>, THREADS);
    return blocks;
}

size_t xs_bytes(const exl3_matrix &m) { return align256(size_t(m.in) * 64); }  // in / 16 tiles x 16 tokens x 64 B

bool same_x(const exl3_matrix &a, const exl3_matrix &b) {
    return a.x == b.x && a.suh == b.suh && a.M == b.M && a.in == b.in;
}

}  // namespace

// Workspace layout: [block counters][split-K partials][rotated x, one per distinct (x, suh)].
Result<exl3_plan> plan_exl3_gemv(const device_info &dev, const std::vector<exl3_matrix> &mats) {
    exl3_plan plan;
    long total_blocks = 0;
    for (size_t i = 0; i < mats.size(); i++) {
        const exl3_matrix &m = mats[i];
        const std::string what = "exl3 matrix " + std::to_string(i) + " (in " + std::to_string(m.in) + ", out " +
                                 std::to_string(m.out) + ", K " + std::to_string(m.k) + ", M " + std::to_string(m.M) + ")";
        if (m.M < 1 || m.in < 1 || m.out < 1) return Status::invalid_argument(what + ": empty shape");
        if (m.M > 16) return Status::not_supported(what + ": at most 16 activation rows per launch");
        if (m.in % 128 != 0 || m.out % 128 != 0)
            return Status::invalid_argument(what + ": in and out must be multiples of the 128 Hadamard block");
        if (m.k < 1 || m.k > 8) return Status::invalid_argument(what + ": trellis bits per weight outside 1..8");
        if (int(m.cb) < 0 || int(m.cb) > 2) return Status::invalid_argument(what + ": unknown codebook");
        if (!m.trellis || !m.suh || !m.svh || !m.x || !m.y) return Status::invalid_argument(what + ": null pointer");
        if (reinterpret_cast<uintptr_t>(m.trellis) % 4 != 0)
            return Status::invalid_argument(what + ": trellis must be 4-byte aligned (read as uint32 words)");
        if (static_cast<const void *>(m.y) == static_cast<const void *>(m.x))
            return Status::invalid_argument(what + ": y aliases x");
        total_blocks += m.out / 128;
    }
    plan.mats = mats;
    // One wave of CTAs when K slicing can provide it; the decode is ALU-bound, so every SM must
    // have work. Slices no thinner than MIN_KT tiles.
    const int nt = token_tiles(mats);
    const int want = splitk::slices_wanted(
        long(dev.sm_count) * (nt == 1 ? blocks_per_sm<1>() : blocks_per_sm<2>()), total_blocks);
    splitk::workspace_layout ws;
    for (const exl3_matrix &m : plan.mats) {
        const int ks = splitk::slice_count(m.in / 16, want, MIN_KT, U, std::min(MAX_KSPLIT, MAX_SLICE_ROWS / m.M));
        plan.ksplit.push_back(ks);
        ws.add(size_t(m.out / 128), ks, size_t(m.M) * 128);
    }
    plan.workspace_bytes = splitk::place_x(plan.mats, ws.x_begin(), same_x, xs_bytes, &plan.x_offset);
    return plan;
}

Status run_exl3_gemv(const exl3_plan &plan, void *workspace, cudaStream_t stream) {
    char *ws = static_cast<char *>(workspace);
    const int nt = token_tiles(plan.mats);
    splitk::workspace_layout layout;
    for (size_t i = 0; i < plan.mats.size(); i++) layout.add(size_t(plan.mats[i].out / 128), plan.ksplit[i], 0);
    unsigned *counters = reinterpret_cast<unsigned *>(ws);
    float *partials = reinterpret_cast<float *>(ws + layout.counters_bytes());

    rot_batch rb{};
    int max_warps = 0;
    auto flush_rot = [&]() -> Status {
        if (rb.njobs == 0) return Status::ok();
        const dim3 grid(unsigned(std::min(1024, (max_warps * 32 + THREADS - 1) / THREADS)), unsigned(rb.njobs));
        rotate_x_kernel<<<grid, THREADS, 0, stream>>>(rb);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        rb.njobs = 0, max_warps = 0;
        return Status::ok();
    };
    for (size_t i = 0; i < plan.mats.size(); i++) {
        if (!splitk::first_use(plan.x_offset, i)) continue;
        const exl3_matrix &m = plan.mats[i];
        rot_job &R = rb.jobs[rb.njobs++];
        R.x = m.x, R.suh = m.suh, R.xs = reinterpret_cast<uint32_t *>(ws + plan.x_offset[i]), R.M = m.M, R.in = m.in;
        max_warps = std::max(max_warps, m.M * (m.in / 128));
        if (rb.njobs == MAX_JOBS) DS41RT_RETURN_IF_ERROR(flush_rot());
    }
    DS41RT_RETURN_IF_ERROR(flush_rot());

    size_t first = 0;
    while (first < plan.mats.size()) {
        batch b{};
        int items = 0;
        size_t i = first;
        for (; i < plan.mats.size() && b.njobs < MAX_JOBS; i++) {
            const exl3_matrix &m = plan.mats[i];
            const int ks = plan.ksplit[i];
            job &J = b.jobs[b.njobs++];
            J.trellis = reinterpret_cast<const uint32_t *>(m.trellis);
            J.svh = m.svh;
            J.xs = reinterpret_cast<const uint4 *>(ws + plan.x_offset[i]);
            J.y = m.y;
            J.in = m.in, J.out = m.out, J.k = m.k, J.cb = int(m.cb), J.M = m.M;
            J.ksplit = ks;
            J.kt_per_split = slice_tiles(m.in / 16, ks);
            J.item_begin = items;
            J.partials = partials, J.counters = counters;
            if (ks > 1) {
                counters += m.out / 128;
                partials += size_t(m.out / 128) * ks * m.M * 128;
            }
            items += (m.out / 128) * ks;
        }
        b.items = items;
        b.cb_xor = 0x3B603B60u;
        if (nt == 1) exl3_gemv_kernel<1><<<items, THREADS, 0, stream>>>(b);
        else exl3_gemv_kernel<2><<<items, THREADS, 0, stream>>>(b);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        first = i;
    }
    return Status::ok();
}

Status exl3_decode_what(const uint16_t *trellis, int in, int out, int k, exl3_cb cb, uint16_t *what,
                        cudaStream_t stream) {
    if (in < 128 || out < 128 || in % 128 != 0 || out % 128 != 0 || k < 1 || k > 8 || int(cb) < 0 || int(cb) > 2)
        return Status::invalid_argument("exl3_decode_what: in " + std::to_string(in) + ", out " + std::to_string(out) +
                                        ", K " + std::to_string(k) + ": need multiples of 128 and K in 1..8");
    const long tiles = long(in / 16) * (out / 16);
    const int grid = int(std::min<long>(4096, (tiles * 32 + THREADS - 1) / THREADS));
    decode_what_kernel<<<grid, THREADS, 0, stream>>>(reinterpret_cast<const uint32_t *>(trellis), in, out, k, int(cb), what);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
