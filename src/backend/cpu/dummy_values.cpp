// Dummy weights (see dummy_values.h): descriptor checks, the encoding choice (quantile tables,
// scale exponent, exact expected moments), and the element-by-element reference fill.
#include "backend/cpu/dummy_values.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/dtype.h"

namespace ds41rt::backend::cpu {

namespace {

// Quantiles of the unit distribution at (k + 0.5) / 256, mirrored so the table is exactly symmetric
// (zero mean after any symmetric rounding).
const std::array<double, DUMMY_LEVELS> &unit_quantiles(dummy_dist dist) {
    static const std::array<double, DUMMY_LEVELS> normal = [] {
        std::array<double, DUMMY_LEVELS> q{};
        for (int k = DUMMY_LEVELS / 2; k < DUMMY_LEVELS; k++) {
            const double p = (k + 0.5) / DUMMY_LEVELS;
            double lo = 0, hi = 10;  // Phi(x) = erfc(-x / sqrt 2) / 2 is increasing: bisect
            for (int it = 0; it < 80; it++) {
                const double mid = 0.5 * (lo + hi);
                (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
            }
            q[size_t(k)] = 0.5 * (lo + hi);
            q[size_t(DUMMY_LEVELS - 1 - k)] = -q[size_t(k)];
        }
        return q;
    }();
    static const std::array<double, DUMMY_LEVELS> uniform = [] {
        std::array<double, DUMMY_LEVELS> q{};
        for (int k = DUMMY_LEVELS / 2; k < DUMMY_LEVELS; k++) {
            q[size_t(k)] = std::sqrt(3.0) * ((k + 0.5) / (DUMMY_LEVELS / 2) - 1.0);
            q[size_t(DUMMY_LEVELS - 1 - k)] = -q[size_t(k)];
        }
        return q;
    }();
    return dist == dummy_dist::UNIFORM ? uniform : normal;
}

bool is_fp4(dummy_format f) { return f == dummy_format::MXFP4 || f == dummy_format::NVFP4; }

uint8_t encode(dummy_format f, double x) {
    return is_fp4(f) ? f32_to_e2m1(float(x)) : f32_to_e4m3(float(x), /*saturate=*/true);
}
double decode(dummy_format f, uint8_t code) { return is_fp4(f) ? e2m1_to_f32(code) : e4m3_to_f32(code); }

// The table for code std sigma, divided by 2^j (the block's scale carries the 2^j back).
void make_table(dummy_format f, const std::array<double, DUMMY_LEVELS> &q, double sigma, int j, uint8_t *out) {
    for (int k = 0; k < DUMMY_LEVELS; k++) out[k] = encode(f, std::ldexp(q[size_t(k)] * sigma, -j));
}

// Mean square of the dequantized table at scale 2^0, with the 2^j undone.
double table_ms(dummy_format f, const uint8_t *t, int j) {
    double ms = 0;
    for (int k = 0; k < DUMMY_LEVELS; k++) {
        const double v = std::ldexp(decode(f, t[k]), j);
        ms += v * v;
    }
    return ms / DUMMY_LEVELS;
}

std::string label(const dummy_tensor_desc &d) {
    return std::string("dummy weights: ") + (d.name ? d.name : "<unnamed>") + ": ";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The window with -1 resolved, checked against the shape and the scale blocks.
Status resolve_window(const dummy_tensor_desc &d, dummy_layout *L) {
    L->row0 = d.row0;
    L->col0 = d.col0;
    L->nrows = d.nrows < 0 ? d.rows - d.row0 : d.nrows;
    L->ncols = d.ncols < 0 ? d.cols - d.col0 : d.ncols;
    const std::string where = "window rows [" + std::to_string(L->row0) + ", +" + std::to_string(L->nrows) +
                              ") cols [" + std::to_string(L->col0) + ", +" + std::to_string(L->ncols) + ") of [" +
                              std::to_string(d.rows) + ", " + std::to_string(d.cols) + "]";
    if (L->row0 < 0 || L->col0 < 0 || L->nrows < 0 || L->ncols < 0 || L->row0 + L->nrows > d.rows ||
        L->col0 + L->ncols > d.cols)
        return Status::invalid_argument(label(d) + where + " is outside the tensor");
    auto aligned = [](int64_t start, int64_t len, int64_t end, int64_t blk) {
        return start % blk == 0 && ((start + len) % blk == 0 || start + len == end);
    };
    if (!aligned(L->row0, L->nrows, d.rows, L->bo) || !aligned(L->col0, L->ncols, d.cols, L->bi))
        return Status::invalid_argument(label(d) + where + " does not lie on " + std::to_string(L->bo) + " x " +
                                        std::to_string(L->bi) + " scale blocks");
    return Status::ok();
}

// Quantized encoding: the largest code std whose top quantile still fits the top code (an
// amax-scaled block), the power of two that leaves the code std in (sigma_max / 2, sigma_max],
// then the code std whose quantized table meets the target (bisection: the table's mean square
// grows with sigma), and the exact expected std over the jitter tables. ~0.2-0.6 ms, so results
// are kept per (format, distribution, std): a model has a handful, and ~47K quantized tensors.
struct quant_choice {
    dummy_encoding enc;
    dummy_code_tables tables{};
};

quant_choice compute_quantized(dummy_format f, dummy_dist dist, double std, int e, int n_tables) {
    const auto &q = unit_quantiles(dist);
    const double top = is_fp4(f) ? 6.0 : 448.0;
    const double sigma_max = top / q[DUMMY_LEVELS - 1];
    const double want_ms = std::ldexp(std, -e) * std::ldexp(std, -e);
    uint8_t t[DUMMY_LEVELS];
    double lo = sigma_max / 2, hi = sigma_max;
    for (int it = 0; it < 40; it++) {
        const double mid = 0.5 * (lo + hi);
        make_table(f, q, mid, 0, t);
        (table_ms(f, t, 0) < want_ms ? lo : hi) = mid;
    }
    make_table(f, q, lo, 0, t);
    const double ms_lo = table_ms(f, t, 0);
    make_table(f, q, hi, 0, t);
    const double ms_hi = table_ms(f, t, 0);
    quant_choice r;
    const double sigma = std::fabs(ms_hi - want_ms) <= std::fabs(ms_lo - want_ms) ? hi : lo;
    double ms = 0;
    for (int j = 0; j < n_tables; j++) {
        make_table(f, q, sigma, j, r.tables.code[j]);
        ms += table_ms(f, r.tables.code[j], j) / n_tables;
    }
    r.enc.scale_exp = e;
    r.enc.code_std = sigma;
    r.enc.expected_mean = 0;
    r.enc.expected_std = std::ldexp(std::sqrt(ms), e);
    return r;
}

// NVFP4: the table spans the E2M1 range (its top quantile on code 6); weight_scale_2 (fp32) is
// whatever brings table RMS x block-scale RMS to the target, and the expected std follows from
// the rounded fp32 exactly.
Status choose_nvfp4(const dummy_tensor_desc &d, dummy_layout *L) {
    const auto &q = unit_quantiles(d.dist);
    const double sigma = 6.0 / q[DUMMY_LEVELS - 1];
    make_table(d.format, q, sigma, 0, L->tables.code[0]);
    const double code_ms = table_ms(d.format, L->tables.code[0], 0);
    double scale_ms = 0;
    for (int i = 0; i < DUMMY_NVFP4_SCALES; i++) {
        const double s = e4m3_to_f32(uint8_t(DUMMY_NVFP4_SCALE0 + i));
        scale_ms += s * s / DUMMY_NVFP4_SCALES;
    }
    const float ws2 = float(d.std / std::sqrt(code_ms * scale_ms));
    if (!(ws2 > 0) || !std::isfinite(ws2))
        return Status::invalid_argument(label(d) + "std " + std::to_string(d.std) + " gives no finite fp32 weight_scale_2");
    const float input_scale = float(d.input_amax / (6.0 * 448.0));  // ModelOpt: amax / (E2M1 max x E4M3 max)
    if (!(input_scale > 0) || !std::isfinite(input_scale))
        return Status::invalid_argument(label(d) + "input_amax " + std::to_string(d.input_amax) + " (> 0, finite)");
    L->enc.code_std = sigma;
    L->enc.expected_mean = 0;
    L->enc.expected_std = double(ws2) * std::sqrt(code_ms * scale_ms);
    L->enc.weight_scale_2 = ws2;
    L->enc.input_scale = input_scale;
    return Status::ok();
}

// EXL3: |suh| = a (fp16) with a |svh|_rms code_rms = std; H is orthonormal, so a 128 x 128 block's
// Frobenius norm is |suh| times the svh-weighted norm of What, whose squares average code_rms^2
// over uniform random states.
Status choose_exl3(const dummy_tensor_desc &d, dummy_layout *L) {
    if (d.exl3_bits < 1 || d.exl3_bits > 8)
        return Status::invalid_argument(label(d) + "EXL3 K " + std::to_string(d.exl3_bits) + " (1..8)");
    if (!(d.exl3_code_rms > 0) || !std::isfinite(d.exl3_code_rms))
        return Status::invalid_argument(label(d) + "EXL3 needs the codebook's RMS (exl3_code_rms > 0)");
    if (d.rows % DUMMY_EXL3_BLOCK != 0 || d.cols % DUMMY_EXL3_BLOCK != 0)
        return Status::invalid_argument(label(d) + "EXL3 dims [" + std::to_string(d.rows) + ", " + std::to_string(d.cols) +
                                        "] are not multiples of 128");
    const double rms_v = std::sqrt(DUMMY_EXL3_SVH_MS);
    const uint16_t a = f32_to_f16(float(d.std / (d.exl3_code_rms * rms_v)));
    const double av = f16_to_f32(a);
    if (!(av >= 6.103515625e-05) || !std::isfinite(av))  // a normal fp16
        return Status::invalid_argument(label(d) + "std " + std::to_string(d.std) + " puts |suh| outside the normal fp16 range");
    L->enc.expected_mean = 0;
    L->enc.expected_std = av * rms_v * d.exl3_code_rms;
    L->enc.code_std = d.exl3_code_rms;
    L->enc.suh_bits = a;
    return Status::ok();
}

Status choose_quantized(const dummy_tensor_desc &d, dummy_layout *L) {
    const double sigma_max = (is_fp4(d.format) ? 6.0 : 448.0) / unit_quantiles(d.dist)[DUMMY_LEVELS - 1];
    const int e = int(std::ceil(std::log2(d.std / sigma_max)));
    if (e < -127 || e + (L->jitter ? DUMMY_JITTERS - 1 : 0) > 127)
        return Status::invalid_argument(label(d) + "std " + std::to_string(d.std) + " is outside the E8M0 scale range");
    uint64_t std_bits;
    std::memcpy(&std_bits, &d.std, sizeof std_bits);
    const auto key = std::make_tuple(int(d.format), int(d.dist), std_bits);
    static std::mutex mu;
    static std::map<std::tuple<int, int, uint64_t>, quant_choice> cache;
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = cache.find(key);
        if (it != cache.end()) {
            L->enc = it->second.enc;
            L->tables = it->second.tables;
            return Status::ok();
        }
    }
    const quant_choice c = compute_quantized(d.format, d.dist, d.std, e, L->jitter ? DUMMY_JITTERS : 1);
    L->enc = c.enc;
    L->tables = c.tables;
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() >= 4096) cache.clear();  // bounded: a model needs a handful
    cache.emplace(key, c);
    return Status::ok();
}

// The window's tiles [ncols/16][nrows/16][16 K] words, then suh [ncols] and svh [nrows].
void fill_exl3_host(const dummy_tensor_desc &d, const dummy_layout &L, uint16_t *trellis, uint16_t *sv) {
    const int k = d.exl3_bits, words = 16 * k;
    const int64_t ta = L.ncols / 16, tb = L.nrows / 16;
    for (int64_t la = 0; la < ta; la++)
        for (int64_t lb = 0; lb < tb; lb++) {
            const int64_t tile = (L.col0 / 16 + la) * (d.rows / 16) + L.row0 / 16 + lb;
            for (int w = 0; w < words; w++) trellis[(la * tb + lb) * words + w] = dummy_exl3_word(L.key, tile, k, w);
        }
    for (int64_t i = 0; i < L.ncols; i++) sv[i] = dummy_exl3_suh(L.key, L.col0 + i, L.enc.suh_bits);
    for (int64_t j = 0; j < L.nrows; j++) sv[L.ncols + j] = dummy_exl3_svh(L.key, L.row0 + j);
}

}  // namespace

Result<dummy_layout> dummy_prepare(const dummy_tensor_desc &d, uint64_t seed) {
    dummy_layout L;
    L.key = dummy_tensor_key(seed, d.id);
    if (d.rows < 0 || d.cols < 0)
        return Status::invalid_argument(label(d) + "negative shape [" + std::to_string(d.rows) + ", " +
                                        std::to_string(d.cols) + "]");
    L.quantized = d.format == dummy_format::FP8_BLOCK || d.format == dummy_format::MXFP4 ||
                  d.format == dummy_format::NVFP4 || d.format == dummy_format::EXL3;
    L.jitter = d.format == dummy_format::FP8_BLOCK;
    if (d.format == dummy_format::FP8_BLOCK) {
        if (d.block_out < 1 || d.block_in < 16 || d.block_in % 16 != 0)
            return Status::invalid_argument(label(d) + "FP8 scale block " + std::to_string(d.block_out) + " x " +
                                            std::to_string(d.block_in) + " (block_in a multiple of 16)");
        L.bo = d.block_out;
        L.bi = d.block_in;
    } else if (d.format == dummy_format::MXFP4) {
        if (d.cols % 2 != 0)
            return Status::invalid_argument(label(d) + "MXFP4 needs an even column count, got " + std::to_string(d.cols));
        L.bo = 1;
        L.bi = 32;
    } else if (d.format == dummy_format::NVFP4) {
        if (d.cols % 16 != 0)
            return Status::invalid_argument(label(d) + "NVFP4 needs columns in whole 16-blocks, got " + std::to_string(d.cols));
        L.bo = 1;
        L.bi = 16;
    } else if (d.format == dummy_format::EXL3) {
        L.bo = L.bi = DUMMY_EXL3_BLOCK;
    }
    L.scale_cols = ceil_div(d.cols, L.bi);
    DS41RT_RETURN_IF_ERROR(resolve_window(d, &L));

    if (d.format == dummy_format::I64) {
        if (d.dist != dummy_dist::INDEX || d.index_range <= 0)
            return Status::invalid_argument(label(d) + "I64 takes the INDEX rule with index_range > 0");
        L.enc.expected_mean = double(d.index_range - 1) / 2;
        return L;
    }
    if (d.dist == dummy_dist::INDEX) return Status::invalid_argument(label(d) + "INDEX is for I64 tensors");
    if (d.dist == dummy_dist::CONSTANT) {
        if (L.quantized) return Status::invalid_argument(label(d) + "CONSTANT is for BF16 / F32 tensors");
        if (!std::isfinite(float(d.mean))) return Status::invalid_argument(label(d) + "the constant is not a finite float");
        L.enc.expected_mean = d.format == dummy_format::BF16 ? double(round_bf16(float(d.mean))) : double(float(d.mean));
        return L;
    }
    if (!(d.std > 0) || !std::isfinite(d.std) || !std::isfinite(d.mean))
        return Status::invalid_argument(label(d) + "std " + std::to_string(d.std) + ", mean " + std::to_string(d.mean) +
                                        " (std > 0, both finite)");
    if (!L.quantized) {
        if (std::fabs(d.mean) + 4 * d.std > 1e37) return Status::invalid_argument(label(d) + "values beyond the float range");
        L.enc.expected_mean = d.mean;
        L.enc.expected_std = d.std;
        return L;
    }
    if (d.mean != 0)
        return Status::invalid_argument(label(d) + "quantized dummy values are zero-mean, got mean " + std::to_string(d.mean));
    if (d.format == dummy_format::NVFP4) {
        DS41RT_RETURN_IF_ERROR(choose_nvfp4(d, &L));
    } else if (d.format == dummy_format::EXL3) {
        DS41RT_RETURN_IF_ERROR(choose_exl3(d, &L));
    } else {
        DS41RT_RETURN_IF_ERROR(choose_quantized(d, &L));
    }
    return L;
}

Result<dummy_encoding> dummy_encoding_for(const dummy_tensor_desc &d) {
    auto L = dummy_prepare(d, 0);
    if (!L) return L.status();
    return L.value().enc;
}

Result<dummy_window_bytes> dummy_bytes(const dummy_tensor_desc &d) {
    auto Lr = dummy_prepare(d, 0);
    if (!Lr) return Lr.status();
    const dummy_layout &L = Lr.value();
    const uint64_t n = uint64_t(L.nrows) * uint64_t(L.ncols);
    dummy_window_bytes b;
    switch (d.format) {
    case dummy_format::F32:       b.weight = 4 * n; break;
    case dummy_format::BF16:      b.weight = 2 * n; break;
    case dummy_format::I64:       b.weight = 8 * n; break;
    case dummy_format::FP8_BLOCK: b.weight = n; break;
    case dummy_format::MXFP4:
    case dummy_format::NVFP4:     b.weight = n / 2; break;
    case dummy_format::EXL3:      b.weight = n * uint64_t(d.exl3_bits) / 8; break;
    }
    if (d.format == dummy_format::EXL3) b.scale = 2 * uint64_t(L.nrows + L.ncols);  // suh, svh
    else if (L.quantized) b.scale = uint64_t(ceil_div(L.nrows, L.bo)) * uint64_t(ceil_div(L.ncols, L.bi));
    return b;
}

Status fill_dummy_host(const dummy_tensor_desc &d, void *weight, void *scale, uint64_t seed) {
    auto Lr = dummy_prepare(d, seed);
    if (!Lr) return Lr.status();
    const dummy_layout &L = Lr.value();
    if (L.nrows * L.ncols == 0) return Status::ok();
    if (!weight || (L.quantized && !scale))
        return Status::invalid_argument(label(d) + (weight ? "null scale pointer" : "null weight pointer"));
    if (d.format == dummy_format::EXL3) {
        fill_exl3_host(d, L, static_cast<uint16_t *>(weight), static_cast<uint16_t *>(scale));
        return Status::ok();
    }
    const int64_t gpr = (d.cols + 7) / 8;
    for (int64_t wr = 0; wr < L.nrows; wr++)
        for (int64_t wc = 0; wc < L.ncols; wc++) {
            const int64_t r = L.row0 + wr, c = L.col0 + wc, i = wr * L.ncols + wc;
            switch (d.format) {
            case dummy_format::FP8_BLOCK:
            case dummy_format::MXFP4:
            case dummy_format::NVFP4: {
                const int j = L.jitter ? dummy_block_jitter(L.key, (r / L.bo) * L.scale_cols + c / L.bi) : 0;
                const uint8_t byte = uint8_t(dummy_group_bits(L.key, r, gpr, c / 8) >> (8 * (c % 8)));
                const uint8_t code = L.tables.code[j][byte];
                if (d.format == dummy_format::FP8_BLOCK) {
                    static_cast<uint8_t *>(weight)[i] = code;
                } else {
                    uint8_t &b = static_cast<uint8_t *>(weight)[i / 2];
                    b = (wc % 2) ? uint8_t((b & 0x0f) | (code << 4)) : uint8_t((b & 0xf0) | code);
                }
                break;
            }
            case dummy_format::BF16:
                static_cast<uint16_t *>(weight)[i] =
                    f32_to_bf16(dummy_plain_value(L.key, r, c, d.cols, d.dist, float(d.mean), float(d.std)));
                break;
            case dummy_format::F32:
                static_cast<float *>(weight)[i] = dummy_plain_value(L.key, r, c, d.cols, d.dist, float(d.mean), float(d.std));
                break;
            case dummy_format::I64:
                static_cast<int64_t *>(weight)[i] = dummy_index_value(L.key, r, c, d.index_range);
                break;
            case dummy_format::EXL3: break;  // above
            }
        }
    if (L.quantized) {
        const int64_t srows = ceil_div(L.nrows, L.bo), scols = ceil_div(L.ncols, L.bi);
        for (int64_t i = 0; i < srows; i++)
            for (int64_t j = 0; j < scols; j++) {
                const int64_t block = (L.row0 / L.bo + i) * L.scale_cols + L.col0 / L.bi + j;
                static_cast<uint8_t *>(scale)[i * scols + j] =
                    d.format == dummy_format::NVFP4
                        ? dummy_nvfp4_scale(L.key, block)
                        : uint8_t(127 + L.enc.scale_exp + (L.jitter ? dummy_block_jitter(L.key, block) : 0));
            }
    }
    return Status::ok();
}

}  // namespace ds41rt::backend::cpu
