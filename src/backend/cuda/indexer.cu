// Lightning-indexer scores (engine v41_model.cpp indexer(), the score loop), bit for bit.
//
// Shapes: q [S, ih, ihd] fp32, keys [T, ihd] fp32 or packed FP4 (index_keys), w [S, ih] fp32,
// scores [S, T] fp32.
// Cost (V4.1: ih 32, ihd 128): reads T * 512 B of fp32 keys (33.5 MB at T = 65536; packed: 68 B a
// key, 4.5 MB) plus 16 KB of q per row, writes 4 S T; 2 S T ih ihd FLOPs, done in fp64: 0.54
// GFLOP per query row at T = 65536.
// Bound: the fp64 pipe (~34 TFLOP/s on the H200, non-tensor): ~16 us per query row at
// T = 65536 against ~8 us of key bytes at ~4.3 TB/s, so compute-bound from S = 1 (S = 16: ~0.26 ms;
// keys are re-read from L2 by each row's blocks). fp64 is the price of cpu::dot's fp64 sum
// in channel order: the products of two floats are exact in fp64, so fma(q, k, acc) rounds
// exactly as the host's acc + double(q) * k does, and the sum order is the host's. (Both
// numerics FP4-quantize q and the keys before this: twice their E2M1 codes are integers in
// [-12, 12], so each 32-channel block's dot is an exact int8 tensor-core product (|sum| <= 4608)
// times the two blocks' power-of-two scales, and the four block terms add exactly in fp64 while
// the scales of one vector span fewer than ~40 binades; that path would be ~30x faster and equal
// to the host's, but needs the grid checked or guaranteed by the caller. Not done yet.)
// Layout: one block per (128 keys, query row); the row's q (as fp64) and the keys' tile
// (transposed, pitch 129: conflict-free) sit in shared memory; a thread owns one key and
// keeps HT heads' fp64 sums in flight (independent FMA chains), each q pair a 16-byte
// broadcast read. Heads are added to the fp32 score in ascending order, as the host does.
// Short lists (n_out <= SHORT_T, decode at a modest context) take another layout, since one
// thread a key left a row of 8 keys to one block doing 8 threads' serial work: index_rows_kernel
// 23 us at C1 (ncu, H200, 2026-12-02: ~80 us of the ~110 us a compressed V4.1 layer adds to a C1
// step). There a thread owns one (key, head) dot, BT / ih keys a block; each dot is the same fp64
// FMA chain in channel order, and the key's terms are added in ascending head order by one
// thread afterwards, so the bits are the long layout's.
// Graph-replayable: yes. Test: tests/cuda/indexer_test.cpp, bit-exact against the host loop.
#include "backend/cuda/indexer.cuh"

#include <string>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"

namespace ds41rt::backend::cuda {

namespace {

constexpr int BT = 128;  // keys per block = threads per block
constexpr int PITCH = BT + 1;

size_t smem_bytes(const index_score_params &p) {
    return size_t(p.ih) * p.ihd * 8 + size_t(p.ihd) * PITCH * 4 + size_t(p.ih) * 4;
}

__device__ __forceinline__ float relu_host(float d) { return d < 0.0f ? 0.0f : d; }  // std::max(d, 0.0f)

// Head h's weight as the numerics branch uses it, from w[s, h].
__device__ __forceinline__ float head_weight(float wv, const index_score_params &p) {
    return p.official ? dev::round_bf16(__fmul_rn(wv, __fmul_rn(p.qk_scale, p.head_scale))) : __fmul_rn(wv, p.head_scale);
}

// Head h's term of a key's score, from its dot and head_weight; the terms add in ascending h.
__device__ __forceinline__ float head_term(float dot, float wh, const index_score_params &p) {
    return p.official ? dev::round_bf16(__fmul_rn(relu_host(dev::round_bf16(dot)), wh))
                      : __fmul_rn(__fmul_rn(relu_host(dot), p.qk_scale), wh);
}

// Keys t0 .. t0 + n - 1 (zeros from T on) into shared memory by `put(r, c, value)`, the block's
// threads together: fp32 rows a value a thread, packed rows a word of 8 codes a thread under its
// scale (cache_pack's layout: low nibble first, so channel 8w + j is nibble j of word w), each the
// exact value unpack_fp4_ue8m0 gives. A packed key is ihd / 2 + ihd / 32 bytes (68 at V4.1's 128)
// against 512. Paged keys: the block's n <= BT key addresses are looked up once, into shared
// memory (a division per key, not per value: per value, paged fp32 keys read 2.2x slower).
template <class Put>
__device__ __forceinline__ void stage_keys(const index_keys &k, int64_t t0, int n, int64_t T, int ihd, Put put) {
    __shared__ const uint8_t *paged_row[BT];
    if (k.pages) {
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            const int64_t t = t0 + r;
            paged_row[r] = t < T ? k.pages[t / k.page_rows] + (t % k.page_rows) * k.pitch : nullptr;
        }
        __syncthreads();
    }
    if (!k.packed()) {
        for (int e = threadIdx.x; e < n * ihd; e += blockDim.x) {
            const int r = e / ihd, c = e % ihd;
            const int64_t t = t0 + r;
            float v = 0.0f;
            if (t < T) v = k.f32 ? k.f32[t * ihd + c] : reinterpret_cast<const float *>(paged_row[r])[c];
            put(r, c, v);
        }
        return;
    }
    using dev::qkind;
    const int words = ihd / 8;
    for (int e = threadIdx.x; e < n * words; e += blockDim.x) {
        const int r = e / words, w = e % words;
        const int64_t t = t0 + r;
        uint32_t code = 0;
        float s = 0.0f;
        if (t < T) {
            const uint8_t *cb = k.pages ? paged_row[r] : k.codes + t * (ihd / 2);
            const uint8_t *sb = k.pages ? cb + ihd / 2 : k.scales + t * (ihd / 32);
            code = *reinterpret_cast<const uint32_t *>(cb + w * 4);
            s = dev::scale_value(qkind::FP4_UE8M0, sb[w / 4]);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            put(r, 8 * w + j, t < T ? dev::value_of<qkind::FP4_UE8M0>(uint8_t((code >> (4 * j)) & 0xfu), s) : 0.0f);
    }
}

// One block's 128 keys of one query row: qs [ih, ihd], wrow [ih], keys [T, ihd]; out[t] for
// t < n_out (n_out >= T: columns from T on are padding, -inf like the masked keys).
template <int HT>
__device__ __forceinline__ void score_block(const float *qs, const float *wrow, const index_keys &keys, int64_t T,
                                            int64_t visible, int64_t n_out, const index_score_params &p, float *out) {
    extern __shared__ __align__(16) double smem[];
    const int ih = p.ih, ihd = p.ihd, tid = threadIdx.x;
    double *qd = smem;                                         // [ih, ihd]
    float *ks = reinterpret_cast<float *>(qd + size_t(ih) * ihd);  // [ihd, PITCH]
    float *ws = ks + size_t(ihd) * PITCH;                      // [ih], the head weights as the branch uses them
    const int64_t t0 = int64_t(blockIdx.x) * BT, t = t0 + tid, lim = visible < T ? visible : T;
    const float NEG_INF = -__int_as_float(0x7f800000);
    if (t0 >= lim) {  // the whole tile is masked (uniform over the block)
        if (t < n_out) out[t] = NEG_INF;
        return;
    }
    for (int i = tid; i < ih * ihd; i += BT) qd[i] = double(qs[i]);
    for (int h = tid; h < ih; h += BT) ws[h] = head_weight(wrow[h], p);
    stage_keys(keys, t0, BT, T, ihd, [&](int r, int c, float v) { ks[c * PITCH + r] = v; });
    __syncthreads();
    if (t >= n_out) return;
    if (t >= lim) {
        out[t] = NEG_INF;
        return;
    }
    float acc = 0.0f;
    for (int h0 = 0; h0 < ih; h0 += HT) {
        double d[HT];
#pragma unroll
        for (int hh = 0; hh < HT; hh++) d[hh] = 0.0;
        for (int i = 0; i < ihd; i += 2) {
            const double k0 = ks[i * PITCH + tid], k1 = ks[(i + 1) * PITCH + tid];
#pragma unroll
            for (int hh = 0; hh < HT; hh++) {
                const double2 qq = *reinterpret_cast<const double2 *>(qd + (h0 + hh) * ihd + i);
                d[hh] = fma(qq.x, k0, d[hh]);
                d[hh] = fma(qq.y, k1, d[hh]);
            }
        }
#pragma unroll
        for (int hh = 0; hh < HT; hh++) acc = __fadd_rn(acc, head_term(float(d[hh]), ws[h0 + hh], p));
    }
    out[t] = p.official ? dev::round_bf16(acc) : acc;
}

// The short layout: thread (kk, h) = (tid / ih, tid % ih) computes key t0 + kk's dot with head h
// (BT % ih == 0, KT = BT / ih keys a block); q [ih, ihd] and the keys as fp32 at pitch ihd + 1
// (a warp's heads read distinct banks, its keys' broadcast words likewise).
constexpr int64_t SHORT_T = 2048;  // not tuned: the long layout wins once its blocks fill the GPU

bool short_layout(const index_score_params &p, int64_t n_out) { return BT % p.ih == 0 && n_out <= SHORT_T; }

size_t smem_short(const index_score_params &p) {
    const size_t kt = BT / p.ih;
    return (size_t(p.ih) + kt) * (p.ihd + 1) * 4 + kt * p.ih * 4 + size_t(p.ih) * 4;
}

__device__ __forceinline__ void score_keys_short(const float *qs, const float *wrow, const index_keys &keys, int64_t T,
                                                 int64_t visible, int64_t n_out, const index_score_params &p,
                                                 float *out) {
    extern __shared__ __align__(16) double smem[];
    const int ih = p.ih, ihd = p.ihd, tid = threadIdx.x, KT = BT / ih, QP = ihd + 1;
    float *qsm = reinterpret_cast<float *>(smem);  // [ih, QP]
    float *ks = qsm + size_t(ih) * QP;             // [KT, QP]
    float *terms = ks + size_t(KT) * QP;           // [KT, ih]
    float *ws = terms + size_t(KT) * ih;           // [ih]
    const int64_t t0 = int64_t(blockIdx.x) * KT, lim = visible < T ? visible : T;
    const float NEG_INF = -__int_as_float(0x7f800000);
    if (t0 >= lim) {  // the whole tile is masked (uniform over the block)
        if (tid < KT && t0 + tid < n_out) out[t0 + tid] = NEG_INF;
        return;
    }
    for (int i = tid; i < ih * ihd; i += BT) qsm[(i / ihd) * QP + i % ihd] = qs[i];
    for (int h = tid; h < ih; h += BT) ws[h] = head_weight(wrow[h], p);
    stage_keys(keys, t0, KT, T, ihd, [&](int r, int c, float v) { ks[r * QP + c] = v; });
    __syncthreads();
    const int kk = tid / ih, h = tid % ih;
    if (t0 + kk < lim) {
        const float *qh = qsm + size_t(h) * QP, *kt = ks + size_t(kk) * QP;
        double d = 0.0;
        for (int i = 0; i < ihd; i++) d = fma(double(qh[i]), double(kt[i]), d);
        terms[kk * ih + h] = head_term(float(d), ws[h], p);
    }
    __syncthreads();
    const int64_t t = t0 + tid;
    if (tid >= KT || t >= n_out) return;
    if (t >= lim) {
        out[t] = NEG_INF;
        return;
    }
    float acc = 0.0f;
    for (int hh = 0; hh < ih; hh++) acc = __fadd_rn(acc, terms[tid * ih + hh]);
    out[t] = p.official ? dev::round_bf16(acc) : acc;
}

__global__ void __launch_bounds__(BT) index_scores_short_kernel(const float *q, const index_keys keys, const float *w,
                                                                index_score_params p, float *scores) {
    const int64_t s = blockIdx.y;
    score_keys_short(q + s * p.ih * p.ihd, w + s * p.ih, keys, p.T, (p.p0 + s + 1) / p.ratio, p.T, p, scores + s * p.T);
}

template <int HT>
__global__ void __launch_bounds__(BT) index_scores_kernel(const float *q, const index_keys keys, const float *w,
                                                          index_score_params p, float *scores) {
    const int64_t s = blockIdx.y;
    score_block<HT>(q + s * p.ih * p.ihd, w + s * p.ih, keys, p.T, (p.p0 + s + 1) / p.ratio, p.T, p, scores + s * p.T);
}

// index_scores_rows: row blockIdx.y from the table, into [rows, ld].
struct row_table {
    index_row r[INDEX_ROWS_MAX];
};
template <int HT>
__global__ void __launch_bounds__(BT) index_rows_kernel(const __grid_constant__ row_table tab, index_score_params p, int64_t ld,
                                                        float *scores) {
    const index_row &r = tab.r[blockIdx.y];
    score_block<HT>(r.q, r.w, r.keys, r.T, r.visible, ld, p, scores + int64_t(blockIdx.y) * ld);
}

__global__ void __launch_bounds__(BT) index_rows_short_kernel(const __grid_constant__ row_table tab, index_score_params p,
                                                              int64_t ld, float *scores) {
    const index_row &r = tab.r[blockIdx.y];
    score_keys_short(r.q, r.w, r.keys, r.T, r.visible, ld, p, scores + int64_t(blockIdx.y) * ld);
}

// The shared-memory opt-in of a kernel instance, raised to the device's limit on first use.
template <class K>
int optin_for(K *kernel) {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaFuncAttributes a{};
    cudaFuncGetAttributes(&a, kernel);
    v -= int(a.sharedSizeBytes);  // stage_keys' paged-row table
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v);
    return v;
}

Status smem_fits(const index_score_params &p, int optin, size_t smem) {
    if (smem > size_t(optin))
        return Status::not_supported("index_scores: ih " + std::to_string(p.ih) + " x ihd " + std::to_string(p.ihd) +
                                     " needs " + std::to_string(smem) + " bytes of shared memory, the device allows " +
                                     std::to_string(optin));
    return Status::ok();
}

template <int HT>
Status launch(const float *q, const index_keys &keys, const float *w, const index_score_params &p, float *scores,
              cudaStream_t stream) {
    static const int optin = optin_for(index_scores_kernel<HT>);
    DS41RT_RETURN_IF_ERROR(smem_fits(p, optin, smem_bytes(p)));
    const dim3 grid(unsigned((p.T + BT - 1) / BT), unsigned(p.S));
    index_scores_kernel<HT><<<grid, BT, smem_bytes(p), stream>>>(q, keys, w, p, scores);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

template <int HT>
Status launch_rows(const row_table &tab, int rows, const index_score_params &p, int64_t ld, float *scores,
                   cudaStream_t stream) {
    static const int optin = optin_for(index_rows_kernel<HT>);
    DS41RT_RETURN_IF_ERROR(smem_fits(p, optin, smem_bytes(p)));
    const dim3 grid(unsigned((ld + BT - 1) / BT), unsigned(rows));
    index_rows_kernel<HT><<<grid, BT, smem_bytes(p), stream>>>(tab, p, ld, scores);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

// Packed keys are whole blocks of 32; a paged key holds its row (4-byte aligned: read by words).
Status check_keys(const char *op, const index_keys &k, int ihd) {
    if (k.packed() && ihd % 32 != 0)
        return Status::invalid_argument(std::string(op) + ": packed FP4 keys need ihd a multiple of 32, not " +
                                        std::to_string(ihd));
    const int64_t need = k.fp4 ? ihd / 2 + ihd / 32 : 4 * int64_t(ihd);
    if (k.pages && (k.pitch < need || k.pitch % 4 != 0))
        return Status::invalid_argument(std::string(op) + ": paged key pitch " + std::to_string(k.pitch) +
                                        " does not hold a key of " + std::to_string(need) + " bytes (4-byte aligned)");
    return Status::ok();
}

}  // namespace

Status index_scores(const float *q, index_keys keys, const float *w, const index_score_params &p, float *scores,
                    cudaStream_t stream) {
    if (p.S < 0 || p.S > 65535 || p.T < 0 || p.ih < 1 || p.ihd < 2 || p.ihd % 2 != 0 || p.p0 < 0 || p.ratio < 1)
        return Status::invalid_argument("index_scores: S " + std::to_string(p.S) + " (<= 65535), T " +
                                        std::to_string(p.T) + ", ih " + std::to_string(p.ih) + ", ihd " +
                                        std::to_string(p.ihd) + " (even), p0 " + std::to_string(p.p0) + ", ratio " +
                                        std::to_string(p.ratio));
    if (p.S == 0 || p.T == 0) return Status::ok();
    if (!q || !keys.set() || !w || !scores) return Status::invalid_argument("index_scores: null q, keys, w or scores");
    DS41RT_RETURN_IF_ERROR(check_keys("index_scores", keys, p.ihd));
    if (short_layout(p, p.T)) {
        static const int optin = optin_for(index_scores_short_kernel);
        DS41RT_RETURN_IF_ERROR(smem_fits(p, optin, smem_short(p)));
        const dim3 grid(unsigned((p.T + BT / p.ih - 1) / (BT / p.ih)), unsigned(p.S));
        index_scores_short_kernel<<<grid, BT, smem_short(p), stream>>>(q, keys, w, p, scores);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    // Heads in flight per thread: as many as divide ih, up to 8.
    if (p.ih % 8 == 0) return launch<8>(q, keys, w, p, scores, stream);
    if (p.ih % 4 == 0) return launch<4>(q, keys, w, p, scores, stream);
    if (p.ih % 2 == 0) return launch<2>(q, keys, w, p, scores, stream);
    return launch<1>(q, keys, w, p, scores, stream);
}

Status index_scores_rows(const index_row *rows, int n, const index_score_params &p, int64_t ld, float *scores,
                         cudaStream_t stream) {
    if (n < 0 || n > INDEX_ROWS_MAX || p.ih < 1 || p.ihd < 2 || p.ihd % 2 != 0 || ld < 0)
        return Status::invalid_argument("index_scores_rows: " + std::to_string(n) + " rows (<= " +
                                        std::to_string(INDEX_ROWS_MAX) + "), ih " + std::to_string(p.ih) + ", ihd " +
                                        std::to_string(p.ihd) + " (even), ld " + std::to_string(ld));
    if (n == 0 || ld == 0) return Status::ok();
    if (!scores || !rows) return Status::invalid_argument("index_scores_rows: null rows or scores");
    row_table tab{};
    for (int i = 0; i < n; i++) {
        const index_row &r = rows[i];
        if (r.T < 0 || r.T > ld || r.visible < 0 || (r.T > 0 && (!r.q || !r.w || !r.keys.set())))
            return Status::invalid_argument("index_scores_rows: row " + std::to_string(i) + " has T " + std::to_string(r.T) +
                                            " (0..ld " + std::to_string(ld) + "), visible " + std::to_string(r.visible) +
                                            ", or a null q, w or keys");
        DS41RT_RETURN_IF_ERROR(check_keys("index_scores_rows", r.keys, p.ihd));
        tab.r[i] = r;
    }
    if (short_layout(p, ld)) {
        static const int optin = optin_for(index_rows_short_kernel);
        DS41RT_RETURN_IF_ERROR(smem_fits(p, optin, smem_short(p)));
        const dim3 grid(unsigned((ld + BT / p.ih - 1) / (BT / p.ih)), unsigned(n));
        index_rows_short_kernel<<<grid, BT, smem_short(p), stream>>>(tab, p, ld, scores);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    if (p.ih % 8 == 0) return launch_rows<8>(tab, n, p, ld, scores, stream);
    if (p.ih % 4 == 0) return launch_rows<4>(tab, n, p, ld, scores, stream);
    if (p.ih % 2 == 0) return launch_rows<2>(tab, n, p, ld, scores, stream);
    return launch_rows<1>(tab, n, p, ld, scores, stream);
}

}  // namespace ds41rt::backend::cuda
