// Dummy weight fills (see dummy_fill.cuh): one tensor's stored bytes from (seed, id, position).
//
// Layout: FP8_BLOCK codes E4M3 [nrows, ncols] + E8M0 [scale rows, scale cols] of the window;
// MXFP4 codes [nrows, ncols / 2] + E8M0 [nrows, ceil(ncols / 32)]; BF16 / F32 / I64 [nrows, ncols].
//
// Cost (no reads; bytes written = dummy_bytes()): the V4.1 Flash text part is ~500 GB (the Engram
// tables ~400 GB of it, host-side), one layer's routed experts 7.2 GB, so at the ~4.8 TB/s write
// roof a GPU's worth (~130 GB) takes ~30 ms of writes. Quantized fills: a thread writes 16 bytes
// (16 FP8 or 32 FP4 codes) from two or four splitmix64 finalizers (~20 integer ops each) and one
// shared-memory lookup per code, ~4 integer ops per byte: at H200's ~17 T int32 ops/s that is
// ~4 TB/s, so the fill sits near the write roof. BF16 / F32 / I64 hash once per element (~20 ops
// per 2-8 bytes): ALU-bound at roughly 1-2 TB/s, on tensors that are ~1% of the bytes.
//
// Invariants: each output byte is written by exactly one thread; values depend only on (key,
// global row, global column) and, for FP8, the block's jitter hashed from (key, block), so a
// window equals the same range of a whole fill and the scale kernel agrees with the code kernel
// without talking to it. No NaN code: the tables hold finite codes only.
//
// Replay: graph-capturable (tables travel in kernel parameters; no device state).
// Test: tests/cuda/dummy_fill_test.cpp (determinism, windows, no NaN codes, dequantized mean and
// std against dummy_encoding_for within 0.5%, against the target within 3%).
#include "backend/cuda/dummy_fill.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"
#include "core/dtype.h"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 256;
constexpr unsigned MAX_BLOCKS = 1u << 20;  // grid-stride beyond this (Engram tables: 6e9 chunks)
constexpr int LEVELS = 256;                // quantile table size: one random byte per code
constexpr int JITTERS = 3;                 // FP8 block scale exponents e, e+1, e+2
constexpr uint64_t GOLDEN = 0x9e3779b97f4a7c15ull;
constexpr uint64_t SCALE_SALT = 0x5ca1ab1e0ddba11ull;

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tensor_key(uint64_t seed, uint64_t id) { return mix64(seed ^ mix64(id + GOLDEN)); }

// The block's scale exponent offset (0, 1, 2): shared by the code and scale kernels.
__host__ __device__ __forceinline__ int block_jitter(uint64_t key, int64_t block) {
    return int(mix64((key ^ SCALE_SALT) + uint64_t(block) * GOLDEN) % JITTERS);
}

// Random bits of element (r, c): byte c % 8 of group (r, c / 8).
__device__ __forceinline__ uint64_t group_bits(uint64_t key, int64_t r, int64_t groups_per_row, int64_t g) {
    return mix64(key + uint64_t(r * groups_per_row + g) * GOLDEN);
}

struct code_tables {
    uint8_t code[JITTERS][LEVELS];  // FP8: one table per jitter; MXFP4: table 0, nibbles
};

struct quant_params {
    uint8_t *w;
    int64_t nrows, ncols;       // window
    int64_t row0, col0;         // window origin in the tensor
    int64_t cols;               // tensor columns
    int bo, bi;                 // scale grid
    int64_t scale_cols;         // tensor scale-grid columns
    uint64_t key;
    bool jitter;
};

__device__ __forceinline__ void load_tables(const code_tables &t, uint8_t (*s)[LEVELS], int n_tables) {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(&t.code[0][0]);
    uint32_t *dst = reinterpret_cast<uint32_t *>(&s[0][0]);
    for (int i = threadIdx.x; i < n_tables * LEVELS / 4; i += blockDim.x) dst[i] = src[i];
    __syncthreads();
}

__device__ __forceinline__ void store16(uint8_t *dst, const uint32_t (&v)[4], int64_t n_bytes) {
    if (n_bytes >= 16 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
        return;
    }
    for (int64_t i = 0; i < n_bytes && i < 16; i++) dst[i] = uint8_t(v[i / 4] >> (8 * (i % 4)));
}

// One thread per 16 codes of a row (one scale block: block_in % 16 == 0, col0 % 16 == 0).
__global__ void fill_fp8_kernel(quant_params p, code_tables tabs) {
    __shared__ uint8_t tab[JITTERS][LEVELS];
    load_tables(tabs, tab, p.jitter ? JITTERS : 1);
    const int64_t cpr = (p.ncols + 15) / 16, n = p.nrows * cpr, gpr = (p.cols + 7) / 8;
    for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < n; ch += int64_t(gridDim.x) * blockDim.x) {
        const int64_t wr = ch / cpr, wc = (ch - wr * cpr) * 16;
        const int64_t r = p.row0 + wr, c = p.col0 + wc;
        const uint8_t *t = tab[p.jitter ? block_jitter(p.key, (r / p.bo) * p.scale_cols + c / p.bi) : 0];
        const uint64_t h[2] = {group_bits(p.key, r, gpr, c / 8), group_bits(p.key, r, gpr, c / 8 + 1)};
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t bits = uint32_t(h[i / 2] >> (32 * (i % 2)));
            v[i] = uint32_t(t[bits & 0xff]) | uint32_t(t[(bits >> 8) & 0xff]) << 8 |
                   uint32_t(t[(bits >> 16) & 0xff]) << 16 | uint32_t(t[bits >> 24]) << 24;
        }
        store16(p.w + wr * p.ncols + wc, v, p.ncols - wc);
    }
}

// One thread per 32 codes (16 bytes, one scale block) of a row; col0 % 32 == 0, ncols even.
__global__ void fill_mxfp4_kernel(quant_params p, code_tables tabs) {
    __shared__ uint8_t tab[1][LEVELS];
    load_tables(tabs, tab, 1);
    const int64_t cpr = (p.ncols + 31) / 32, n = p.nrows * cpr, gpr = (p.cols + 7) / 8, row_bytes = p.ncols / 2;
    for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < n; ch += int64_t(gridDim.x) * blockDim.x) {
        const int64_t wr = ch / cpr, wc = (ch - wr * cpr) * 32;
        const int64_t r = p.row0 + wr, c = p.col0 + wc;
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {  // word i: codes 8i .. 8i+7 = group c/8 + i
            const uint64_t h = group_bits(p.key, r, gpr, c / 8 + i);
            uint32_t word = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {  // byte b: codes 2b (low nibble), 2b + 1
                const uint32_t lo = tab[0][(h >> (16 * b)) & 0xff], hi = tab[0][(h >> (16 * b + 8)) & 0xff];
                word |= (lo | hi << 4) << (8 * b);
            }
            v[i] = word;
        }
        store16(p.w + wr * row_bytes + wc / 2, v, row_bytes - wc / 2);
    }
}

// One thread per scale byte of the window: 127 + e (+ the block's jitter for FP8).
__global__ void fill_scales_kernel(uint8_t *s, int64_t srows, int64_t scols, int64_t br0, int64_t bc0,
                                   int64_t scale_cols, int base, uint64_t key, bool jitter) {
    const int64_t n = srows * scols;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t br = br0 + i / scols, bc = bc0 + i % scols;
        s[i] = uint8_t(base + (jitter ? block_jitter(key, br * scale_cols + bc) : 0));
    }
}

struct plain_params {
    void *w;
    int64_t nrows, ncols, row0, col0, cols;
    uint64_t key;
    dummy_dist dist;
    float mean, std;
    int64_t range;
};

// Exact unit variance: four 16-bit uniforms on 0..M have variance M (M + 2) / 12 each.
__device__ __forceinline__ float bell(uint64_t h) {
    constexpr float M = 65535.0f;
    const float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
    return (s - 2.0f * M) * 2.6428997921e-05f;  // 1 / sqrt(M (M + 2) / 3)
}

template <typename T>
__global__ void fill_plain_kernel(plain_params p) {
    const int64_t n = p.nrows * p.ncols;
    T *w = static_cast<T *>(p.w);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = p.row0 + i / p.ncols, c = p.col0 + i % p.ncols;
        if constexpr (sizeof(T) == 8) {  // I64 ids: consecutive from a per-row start, so distinct in a row
            const uint64_t start = mix64(p.key + uint64_t(r) * GOLDEN) % uint64_t(p.range);
            w[i] = T((start + uint64_t(c)) % uint64_t(p.range));
            continue;
        } else {
            const uint64_t h = mix64(p.key + uint64_t(r * p.cols + c) * GOLDEN);
            float v = p.mean;
            if (p.dist == dummy_dist::NORMAL) v = p.mean + p.std * bell(h);
            if (p.dist == dummy_dist::UNIFORM)  // (h >> 40) / 2^24 in [0, 1)
                v = p.mean + p.std * 1.7320508f * (float(h >> 40) * 1.1920929e-07f - 1.0f);
            if constexpr (sizeof(T) == 2)
                w[i] = dev::bf16_bits(v);
            else
                w[i] = v;
        }
    }
}

unsigned grid_for(int64_t n) { return unsigned(std::clamp<int64_t>((n + THREADS - 1) / THREADS, 1, MAX_BLOCKS)); }

// ---- host: code tables and the encoding choice ----------------------------------------------------

// Quantiles of the unit distribution at (k + 0.5) / 256, mirrored so the table is exactly symmetric.
const std::array<double, LEVELS> &unit_quantiles(dummy_dist dist) {
    static const std::array<double, LEVELS> normal = [] {
        std::array<double, LEVELS> q{};
        for (int k = LEVELS / 2; k < LEVELS; k++) {
            const double p = (k + 0.5) / LEVELS;
            double lo = 0, hi = 10;  // Phi(x) = erfc(-x / sqrt 2) / 2, increasing: bisect
            for (int it = 0; it < 80; it++) {
                const double mid = 0.5 * (lo + hi);
                (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
            }
            q[size_t(k)] = 0.5 * (lo + hi);
            q[size_t(LEVELS - 1 - k)] = -q[size_t(k)];
        }
        return q;
    }();
    static const std::array<double, LEVELS> uniform = [] {
        std::array<double, LEVELS> q{};
        for (int k = LEVELS / 2; k < LEVELS; k++) {
            q[size_t(k)] = std::sqrt(3.0) * ((k + 0.5) / (LEVELS / 2) - 1.0);
            q[size_t(LEVELS - 1 - k)] = -q[size_t(k)];
        }
        return q;
    }();
    return dist == dummy_dist::UNIFORM ? uniform : normal;
}

bool is_fp4(dummy_format f) { return f == dummy_format::MXFP4; }

uint8_t encode(dummy_format f, double x) {
    return is_fp4(f) ? f32_to_e2m1(float(x)) : f32_to_e4m3(float(x), /*saturate=*/true);
}
double decode(dummy_format f, uint8_t code) { return is_fp4(f) ? e2m1_to_f32(code) : e4m3_to_f32(code); }

// Table for code std sigma, divided by 2^j.
void make_table(dummy_format f, const std::array<double, LEVELS> &q, double sigma, int j, uint8_t *out) {
    for (int k = 0; k < LEVELS; k++) out[k] = encode(f, std::ldexp(q[size_t(k)] * sigma, -j));
}

// Mean square of the dequantized table (scale 2^0, jitter j undone).
double table_ms(dummy_format f, const uint8_t *t, int j) {
    double ms = 0;
    for (int k = 0; k < LEVELS; k++) {
        const double v = std::ldexp(decode(f, t[k]), j);
        ms += v * v;
    }
    return ms / LEVELS;
}

std::string label(const dummy_tensor_desc &d) {
    return std::string("fill_dummy: ") + (d.name ? d.name : "<unnamed>") + ": ";
}

const char *format_name(dummy_format f) {
    switch (f) {
    case dummy_format::F32:       return "F32";
    case dummy_format::BF16:      return "BF16";
    case dummy_format::FP8_BLOCK: return "FP8_BLOCK";
    case dummy_format::MXFP4:     return "MXFP4";
    case dummy_format::I64:       return "I64";
    }
    return "?";
}

struct window {
    int64_t row0, nrows, col0, ncols;
};

// The window with -1 resolved, checked against the shape and (quantized) the scale blocks.
Result<window> resolve_window(const dummy_tensor_desc &d, int bo, int bi) {
    window w{d.row0, d.nrows < 0 ? d.rows - d.row0 : d.nrows, d.col0, d.ncols < 0 ? d.cols - d.col0 : d.ncols};
    const std::string where = "window rows [" + std::to_string(w.row0) + ", +" + std::to_string(w.nrows) + ") cols [" +
                              std::to_string(w.col0) + ", +" + std::to_string(w.ncols) + ") of [" +
                              std::to_string(d.rows) + ", " + std::to_string(d.cols) + "]";
    if (w.row0 < 0 || w.col0 < 0 || w.nrows < 0 || w.ncols < 0 || w.row0 + w.nrows > d.rows || w.col0 + w.ncols > d.cols)
        return Status::invalid_argument(label(d) + where + " is outside the tensor");
    auto aligned = [](int64_t start, int64_t len, int64_t end, int64_t blk) {
        return start % blk == 0 && ((start + len) % blk == 0 || start + len == end);
    };
    if (!aligned(w.row0, w.nrows, d.rows, bo) || !aligned(w.col0, w.ncols, d.cols, bi))
        return Status::invalid_argument(label(d) + where + " does not lie on " + std::to_string(bo) + " x " +
                                        std::to_string(bi) + " scale blocks");
    return w;
}

struct prepared {
    dummy_encoding enc;
    window win;
    int bo = 1, bi = 1;
    code_tables tabs{};
};

Result<prepared> prepare(const dummy_tensor_desc &d) {
    prepared p;
    if (d.rows < 0 || d.cols < 0)
        return Status::invalid_argument(label(d) + "negative shape [" + std::to_string(d.rows) + ", " +
                                        std::to_string(d.cols) + "]");
    const bool quant = d.format == dummy_format::FP8_BLOCK || d.format == dummy_format::MXFP4;
    if (d.format == dummy_format::FP8_BLOCK) {
        if (d.block_out < 1 || d.block_in < 16 || d.block_in % 16 != 0)
            return Status::invalid_argument(label(d) + "FP8 scale block " + std::to_string(d.block_out) + " x " +
                                            std::to_string(d.block_in) + " (block_in a multiple of 16)");
        p.bo = d.block_out;
        p.bi = d.block_in;
    } else if (d.format == dummy_format::MXFP4) {
        if (d.cols % 2 != 0) return Status::invalid_argument(label(d) + "MXFP4 needs an even column count, got " + std::to_string(d.cols));
        p.bo = 1;
        p.bi = 32;
    }
    auto w = resolve_window(d, p.bo, p.bi);
    if (!w) return w.status();
    p.win = w.value();
    if (d.format == dummy_format::MXFP4 && p.win.ncols % 2 != 0)
        return Status::invalid_argument(label(d) + "MXFP4 window needs an even column count");

    if (d.format == dummy_format::I64) {
        if (d.dist != dummy_dist::INDEX || d.index_range <= 0)
            return Status::invalid_argument(label(d) + "I64 takes the INDEX rule with index_range > 0");
        p.enc.expected_mean = double(d.index_range - 1) / 2;
        return p;
    }
    if (d.dist == dummy_dist::INDEX) return Status::invalid_argument(label(d) + "INDEX is for I64 tensors");
    if (d.dist == dummy_dist::CONSTANT) {
        if (quant) return Status::invalid_argument(label(d) + "CONSTANT is for BF16 / F32 tensors");
        if (!std::isfinite(d.mean)) return Status::invalid_argument(label(d) + "constant is not finite");
        p.enc.expected_mean = d.format == dummy_format::BF16 ? double(round_bf16(float(d.mean))) : double(float(d.mean));
        return p;
    }
    if (!(d.std > 0) || !std::isfinite(d.std) || !std::isfinite(d.mean))
        return Status::invalid_argument(label(d) + "std " + std::to_string(d.std) + ", mean " + std::to_string(d.mean) +
                                        " (std > 0, finite)");
    if (!quant) {
        if (std::fabs(d.mean) + 4 * d.std > 1e37)
            return Status::invalid_argument(label(d) + "values beyond the float range");
        p.enc.expected_mean = d.mean;
        p.enc.expected_std = d.std;
        return p;
    }
    if (d.mean != 0) return Status::invalid_argument(label(d) + "quantized dummy values are zero-mean, mean " + std::to_string(d.mean));

    // Largest code std whose top quantile still fits the top code (an amax-scaled block), then the
    // power of two that leaves the code std in (sigma_max / 2, sigma_max], then the code std whose
    // quantized table hits the target (bisection: the table's mean square grows with sigma).
    const auto &q = unit_quantiles(d.dist);
    const double top = is_fp4(d.format) ? 6.0 : 448.0;
    const double sigma_max = top / q[LEVELS - 1];
    const int e = int(std::ceil(std::log2(d.std / sigma_max)));
    const bool jitter = d.format == dummy_format::FP8_BLOCK;
    if (e < -127 || e + (jitter ? JITTERS - 1 : 0) > 127)
        return Status::invalid_argument(label(d) + "std " + std::to_string(d.std) + " is outside the E8M0 scale range");
    const double want_ms = std::ldexp(d.std, -e) * std::ldexp(d.std, -e);
    uint8_t t[LEVELS];
    double lo = sigma_max / 2, hi = sigma_max;
    for (int it = 0; it < 40; it++) {
        const double mid = 0.5 * (lo + hi);
        make_table(d.format, q, mid, 0, t);
        (table_ms(d.format, t, 0) < want_ms ? lo : hi) = mid;
    }
    // hi meets or exceeds the target, lo stays under it: take the closer.
    make_table(d.format, q, lo, 0, t);
    const double ms_lo = table_ms(d.format, t, 0);
    make_table(d.format, q, hi, 0, t);
    const double ms_hi = table_ms(d.format, t, 0);
    const double sigma = std::fabs(ms_hi - want_ms) <= std::fabs(ms_lo - want_ms) ? hi : lo;

    double ms = 0;
    const int n_tables = jitter ? JITTERS : 1;
    for (int j = 0; j < n_tables; j++) {
        make_table(d.format, q, sigma, j, p.tabs.code[j]);
        ms += table_ms(d.format, p.tabs.code[j], j) / n_tables;
    }
    p.enc.scale_exp = e;
    p.enc.code_std = sigma;
    p.enc.expected_mean = 0;
    p.enc.expected_std = std::ldexp(std::sqrt(ms), e);
    return p;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Result<dummy_encoding> dummy_encoding_for(const dummy_tensor_desc &d) {
    auto p = prepare(d);
    if (!p) return p.status();
    return p.value().enc;
}

Result<dummy_window_bytes> dummy_bytes(const dummy_tensor_desc &d) {
    auto pr = prepare(d);
    if (!pr) return pr.status();
    const prepared &p = pr.value();
    const uint64_t n = uint64_t(p.win.nrows) * uint64_t(p.win.ncols);
    dummy_window_bytes b;
    switch (d.format) {
    case dummy_format::F32:       b.weight = 4 * n; break;
    case dummy_format::BF16:      b.weight = 2 * n; break;
    case dummy_format::I64:       b.weight = 8 * n; break;
    case dummy_format::FP8_BLOCK: b.weight = n; break;
    case dummy_format::MXFP4:     b.weight = n / 2; break;
    }
    if (d.format == dummy_format::FP8_BLOCK || d.format == dummy_format::MXFP4)
        b.scale = uint64_t(ceil_div(p.win.nrows, p.bo)) * uint64_t(ceil_div(p.win.ncols, p.bi));
    return b;
}

Status fill_dummy(const dummy_tensor_desc &d, void *weight, void *scale, uint64_t seed, cudaStream_t stream) {
    auto pr = prepare(d);
    if (!pr) return pr.status();
    const prepared &p = pr.value();
    const window &w = p.win;
    const int64_t n = w.nrows * w.ncols;
    if (n == 0) return Status::ok();
    const bool quant = d.format == dummy_format::FP8_BLOCK || d.format == dummy_format::MXFP4;
    if (!weight || (quant && !scale))
        return Status::invalid_argument(label(d) + std::string("null ") + (weight ? "scale" : "weight") + " pointer (" +
                                        format_name(d.format) + ")");
    const uint64_t key = tensor_key(seed, d.id);
    if (quant) {
        const int64_t scale_cols = ceil_div(d.cols, p.bi);
        const bool jitter = d.format == dummy_format::FP8_BLOCK;
        quant_params qp{static_cast<uint8_t *>(weight), w.nrows, w.ncols, w.row0, w.col0, d.cols, p.bo, p.bi,
                        scale_cols, key, jitter};
        if (jitter)
            fill_fp8_kernel<<<grid_for(w.nrows * ceil_div(w.ncols, 16)), THREADS, 0, stream>>>(qp, p.tabs);
        else
            fill_mxfp4_kernel<<<grid_for(w.nrows * ceil_div(w.ncols, 32)), THREADS, 0, stream>>>(qp, p.tabs);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        const int64_t srows = ceil_div(w.nrows, p.bo), scols = ceil_div(w.ncols, p.bi);
        fill_scales_kernel<<<grid_for(srows * scols), THREADS, 0, stream>>>(static_cast<uint8_t *>(scale), srows, scols,
                                                                           w.row0 / p.bo, w.col0 / p.bi, scale_cols,
                                                                           127 + p.enc.scale_exp, key, jitter);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        return Status::ok();
    }
    plain_params pp{weight, w.nrows, w.ncols, w.row0, w.col0, d.cols, key, d.dist, float(d.mean), float(d.std),
                    d.index_range};
    switch (d.format) {
    case dummy_format::F32:  fill_plain_kernel<float><<<grid_for(n), THREADS, 0, stream>>>(pp); break;
    case dummy_format::BF16: fill_plain_kernel<uint16_t><<<grid_for(n), THREADS, 0, stream>>>(pp); break;
    case dummy_format::I64:  fill_plain_kernel<int64_t><<<grid_for(n), THREADS, 0, stream>>>(pp); break;
    default:                 return Status::not_supported(label(d) + "format " + format_name(d.format));
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
