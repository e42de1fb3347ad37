// The EXL3 decode GEMV's device pieces (exl3_gemv.cu says what they compute and why, with the
// roofline and the SASS counts): the trellis tile decoder, the x rotation and the work-item body.
// Shared by exl3_gemv.cu, whose kernels take their jobs as kernel parameters, and
// exl3_routed.cu, whose kernels read them from device memory: one body, the same bits for the
// same job and K slicing. Internal to backend/cuda: include only from .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace ds41rt::backend::cuda::exl3_detail {

constexpr int WARPS = 8;  // one per 16-column tile of a 128-output block
constexpr int THREADS = WARPS * 32;
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

// One 128-block blk of row m of x [M, in]: xr = (x . suh) H / sqrt(128), as fp16 hi + lo in the
// B-fragment order the main loop reads (xs: [in / 16][16 tokens][4 q] uint4). A whole warp.
__device__ __forceinline__ void rotate_block(const float *x, const uint16_t *suh, uint32_t *xs, int in, int m, int blk,
                                             int lane) {
    const int k0 = blk * 128 + 4 * lane;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = x[size_t(m) * in + k0 + e] * __half2float(__ushort_as_half(suh[k0 + e]));
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
    uint32_t *base = xs + (size_t(k0 >> 4) * 16 + m) * 16;
    base[q0 * 4 + half] = hi[0], base[q0 * 4 + 2 + half] = lo[0];
    base[(q0 + 1) * 4 + half] = hi[1], base[(q0 + 1) * 4 + 2 + half] = lo[1];
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

// One CTA's work item of job J: (128-output block, K slice) number `local`; the epilogue (split-K
// sum in slice order by the last slice to arrive, output Hadamard, svh) included. xr: 0x3B603B60
// from a kernel parameter (see cb_pair). Every thread of the CTA calls it.
template <int NT>  // token tiles of 8 (M <= 8 NT)
__device__ __forceinline__ void exl3_item(const job &J, int local, uint32_t xr) {
    __shared__ float sacc[16][SPITCH];
    __shared__ unsigned s_last;
    const int nb = local / J.ksplit, ks = local - nb * J.ksplit;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int a0 = ks * J.kt_per_split, a1 = min(J.in / 16, a0 + J.kt_per_split);
    const int bcol = nb * 8 + warp;

    float acc[NT][4] = {};
    if (a0 < a1) switch (J.k * 3 + J.cb) {
#define DS41RT_EXL3_CASE(K, CB) \
    case K * 3 + CB: mainloop<K, CB, NT>(J, bcol, a0, a1, lane, xr, acc); break;
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

}  // namespace ds41rt::backend::cuda::exl3_detail
