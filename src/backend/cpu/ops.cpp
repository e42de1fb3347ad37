#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/threads.h"

namespace ds41rt::backend::cpu {

void matmul_nt(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k) {
    // Threads split the output columns (weight rows): at decode m is tiny and n is large.
    // Sums are accumulated in fp64 and rounded once: the reference then sits within an fp32
    // rounding of the exact product, closer to any oracle than a second fp32 summation order
    // would be. That matters where a later quantizer (FP8/FP4 cache QAT, top-k) turns a tiny
    // difference into a different code.
    parallel_for(n, [&](int64_t n0, int64_t n1) {
        for (int64_t j = n0; j < n1; j++) {
            const float *wr = w + j * k;
            for (int64_t i = 0; i < m; i++) {
                const float *xr = x + i * k;
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                int64_t t = 0;
                for (; t + 4 <= k; t += 4) {
                    s0 += double(xr[t]) * wr[t];
                    s1 += double(xr[t + 1]) * wr[t + 1];
                    s2 += double(xr[t + 2]) * wr[t + 2];
                    s3 += double(xr[t + 3]) * wr[t + 3];
                }
                for (; t < k; t++) s0 += double(xr[t]) * wr[t];
                y[i * n + j] = float((s0 + s1) + (s2 + s3));
            }
        }
    }, std::max<int64_t>(16, (int64_t(1) << 17) / std::max<int64_t>(1, m * k)));  // >= ~128K MACs per thread
}

void rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += double(xr[i]) * xr[i];
        float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
        for (int64_t i = 0; i < dim; i++) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * inv);
    }
}

void rope_tail(float *x, int64_t rows, int64_t dim, const float *cos, const float *sin, int64_t n_pairs,
               bool inverse) {
    int64_t off = dim - 2 * n_pairs;
    for (int64_t r = 0; r < rows; r++) {
        float *t = x + r * dim + off;
        const float *c = cos + r * n_pairs;
        const float *s = sin + r * n_pairs;
        for (int64_t i = 0; i < n_pairs; i++) {
            float a = t[2 * i], b = t[2 * i + 1];
            float sn = inverse ? -s[i] : s[i];
            t[2 * i] = a * c[i] - b * sn;
            t[2 * i + 1] = a * sn + b * c[i];
        }
    }
}

float pow2_ceil(float v) {
    uint32_t bits = f32_bits(v);
    int e = int((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
    return std::ldexp(1.0f, e);
}

namespace {

// Blocks of `block` channels over the first `cols` channels of rows `stride` apart.
template <typename F>
void for_blocks(float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block, F &&fn) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b + block <= cols; b += block) {
            float *p = x + r * stride + b;
            float amax = 0;
            for (int64_t i = 0; i < block; i++) amax = std::max(amax, std::fabs(p[i]));
            fn(p, amax);
        }
}

}  // namespace

void fake_quant_fp8_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block) {
    fake_quant_fp8_ue8m0_cols(x, rows, dim, dim, block);
}

void fake_quant_fp8_ue8m0_cols(float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block) {
    for_blocks(x, rows, stride, cols, block, [block](float *p, float amax) {
        float s = pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f));
        for (int64_t i = 0; i < block; i++) {
            float q = std::clamp(p[i] / s, -448.0f, 448.0f);
            p[i] = round_e4m3(q) * s;
        }
    });
}

void fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block) {
    for_blocks(x, rows, dim, dim, block, [block](float *p, float amax) {
        float s = pow2_ceil(std::max(amax, 6.0f * std::ldexp(1.0f, -126)) * (1.0f / 6.0f));
        for (int64_t i = 0; i < block; i++) p[i] = round_e2m1(std::clamp(p[i] / s, -6.0f, 6.0f)) * s;
    });
}

void fake_quant_fp4_e4m3(float *x, int64_t rows, int64_t dim, int64_t block) {
    for_blocks(x, rows, dim, dim, block, [block](float *p, float amax) {
        float s = round_e4m3(std::max(amax, 6.0f * std::ldexp(1.0f, -9)) / 6.0f, /*saturate=*/true);
        for (int64_t i = 0; i < block; i++) p[i] = round_e2m1(std::clamp(p[i] / s, -6.0f, 6.0f)) * s;
    });
}

void hadamard_transform(float *x, int64_t rows, int64_t dim, float scale) {
    for (int64_t r = 0; r < rows; r++) {
        float *p = x + r * dim;
        // Butterfly stages h = 1, 2, 4, ...: (a, b) -> (a + b, a - b) on channels h apart. Stage h
        // multiplies by I (x) H2 (x) I at bit log2(h); their product is the Sylvester H.
        for (int64_t h = 1; h < dim; h *= 2)
            for (int64_t i = 0; i < dim; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const float a = p[j], b = p[j + h];
                    p[j] = a + b;
                    p[j + h] = a - b;
                }
        for (int64_t i = 0; i < dim; i++) p[i] *= scale;
    }
}

void rotate_fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block) {
    hadamard_transform(x, rows, dim, 1.0f / std::sqrt(float(dim)));
    for (int64_t i = 0; i < rows * dim; i++) x[i] = round_bf16(x[i]);
    fake_quant_fp4_ue8m0(x, rows, dim, block);
}

void rms_norm_unweighted_bf16(float *x, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *p = x + r * dim;
        float ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += round_bf16(p[i] * p[i]);
        const float mean = round_bf16(ss / float(dim));
        const float inv = round_bf16(1.0f / std::sqrt(round_bf16(mean + eps)));
        for (int64_t i = 0; i < dim; i++) p[i] = round_bf16(p[i] * inv);
    }
}

}  // namespace ds41rt::backend::cpu
