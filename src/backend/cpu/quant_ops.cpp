// CPU reference layers of NVFP4 W4A4 and EXL3 (quant_ops.h).
#include "backend/cpu/quant_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/swiglu.h"
#include "core/dtype.h"

namespace ds41rt::backend::cpu {

namespace {

// ModelOpt's fp4_round_magnitude (kernels/quantization/common/nvfp4_quant.py): the E2M1 magnitude
// nearest to |x|/s, ties to the even code, saturating at 6. Spelled as its comparison chain so the
// ties read against the source.
float fp4_round_magnitude(float a) {
    if (a <= 0.25f) return 0.0f;
    if (a < 0.75f) return 0.5f;
    if (a <= 1.25f) return 1.0f;
    if (a < 1.75f) return 1.5f;
    if (a <= 2.5f) return 2.0f;
    if (a < 3.5f) return 3.0f;
    if (a <= 5.0f) return 4.0f;
    return 6.0f;
}

}  // namespace

// The producer's definition, nvidia-modelopt 0.47 (the version that wrote the V4.1 publication,
// producer "0.47.0rc0"):
//  - export: input_scale = amax / (6 * 448)          (qtensor/nvfp4_tensor.py,
//                                                      NVFP4QTensor.get_activation_scaling_factor)
//  - calibrated forward on Hopper+ (tensor_quant.py _dynamic_block_quantize_impl ->
//    kernels/quantization/gemm/fp4_kernel_hopper.py fp4_fake_quant_block, with global_scale =
//    amax / (6 * 448) = input_scale; common/nvfp4_quant.py fp8_quantize_scale), per 16-block:
//        s = float(e4m3_rn(min(block_amax / (6 * global_scale), 448))) * global_scale   (fp32 ops)
//        s = s >= 1e-5 ? s : 1
//        x^ = sign(x) * fp4_round_magnitude(|x| / s) * s, written in x's dtype.
// This differs from vLLM's kernel form (sf = e4m3(gs * amax / 6), gs = 1 / input_scale; spec 1.6)
// only at rounding ties; Triton's fp32 '/' may also be the approximate div.full.f32, so compare
// with the GPU producer within tolerance, never bitwise.
void nvfp4_fake_quant_act(float *x, int64_t rows, int64_t dim, float input_scale, bool out_bf16) {
    const float gs = input_scale > 0.0f ? input_scale : 1e-12f;
    const float six_gs = 6.0f * gs;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < dim; b += 16) {
            float *p = x + r * dim + b;
            // The producer quantizes bf16 rows: fp32 activations (TRANSFORMERS numerics) are cast
            // first, a no-op for the bf16 values of OFFICIAL numerics.
            for (int i = 0; i < 16; i++) p[i] = round_bf16(p[i]);
            float amax = 0;
            for (int i = 0; i < 16; i++) amax = std::max(amax, std::fabs(p[i]));
            float s = round_e4m3(std::min(amax / six_gs, 448.0f), /*saturate=*/true) * gs;
            if (!(s >= 1e-5f)) s = 1.0f;
            for (int i = 0; i < 16; i++) {
                float v = fp4_round_magnitude(std::fabs(p[i]) / s) * s;
                v = p[i] >= 0 ? v : -v;
                p[i] = out_bf16 ? round_bf16(v) : v;
            }
        }
}

void nvfp4_w4a4_linear(const float *x, int64_t m, const float *w, int64_t n, int64_t k, float input_scale, float *y) {
    std::vector<float> xq(x, x + m * k);
    nvfp4_fake_quant_act(xq.data(), m, k, input_scale, /*out_bf16=*/true);
    matmul_nt(xq.data(), w, y, m, n, k);
}

void nvfp4_w4a4_swiglu(const float *x, int64_t m, int64_t dim, int64_t inter, const float *w1, const float *w3,
                       const float *w2, float input_scale13, float input_scale2, float swiglu_limit, float *y) {
    std::vector<float> xq(x, x + m * dim), g(size_t(m * inter)), u(size_t(m * inter));
    nvfp4_fake_quant_act(xq.data(), m, dim, input_scale13, /*out_bf16=*/true);
    matmul_nt(xq.data(), w1, g.data(), m, inter, dim);
    matmul_nt(xq.data(), w3, u.data(), m, inter, dim);
    const float L = swiglu_limit;
    // A bf16 model's rounding points (as the producer's fake-quant forward runs it): the gate and
    // up GEMMs write bf16, silu writes bf16, the product writes bf16 before the down projection.
    for (size_t i = 0; i < g.size(); i++) {
        const float gb = round_bf16(g[i]), ub = round_bf16(u[i]);
        const float gi = L > 0 ? std::min(gb, L) : gb;
        const float ui = L > 0 ? std::clamp(ub, -L, L) : ub;
        g[i] = round_bf16(round_bf16(silu(gi)) * ui);
    }
    nvfp4_w4a4_linear(g.data(), m, w2, dim, inter, input_scale2, y);
}

void nvfp4_w4a4_expert(const expert_numerics &nm, const float *w1, const float *w2, const float *w3, int64_t inter,
                       float input_scale13, float input_scale2, const float *x, int64_t m, int64_t dim,
                       const float *row_weight, float *y) {
    std::vector<float> xq(x, x + m * dim), g(size_t(m * inter)), u(size_t(m * inter));
    nvfp4_fake_quant_act(xq.data(), m, dim, input_scale13, /*out_bf16=*/true);
    matmul_nt(xq.data(), w1, g.data(), m, inter, dim);
    matmul_nt(xq.data(), w3, u.data(), m, inter, dim);
    const float L = nm.swiglu_limit;
    const bool before = row_weight && !nm.weight_after_w2;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < inter; i++) {
            const size_t k = size_t(r * inter + i);
            const float gb = round_bf16(g[k]), ub = round_bf16(u[k]);
            const float gi = L > 0 ? std::min(gb, L) : gb;
            const float ui = L > 0 ? std::clamp(ub, -L, L) : ub;
            float v = round_bf16(silu(gi)) * ui;
            if (before) v = row_weight[r] * v;
            g[k] = round_bf16(v);
        }
    nvfp4_w4a4_linear(g.data(), m, w2, dim, inter, input_scale2, y);
    if (row_weight && nm.weight_after_w2)
        for (int64_t r = 0; r < m; r++)
            for (int64_t d = 0; d < dim; d++) y[r * dim + d] *= row_weight[r];
}

namespace {

void fwht128(double *v) {
    for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const double a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

}  // namespace

void exl3_linear(const float *x, int64_t m, const float *what, int64_t in, int64_t out, const float *suh,
                 const float *svh, float *y) {
    const double norm = 1.0 / std::sqrt(128.0);
    std::vector<double> a(static_cast<size_t>(in)), z(static_cast<size_t>(out));
    for (int64_t r = 0; r < m; r++) {
        for (int64_t i = 0; i < in; i++) a[size_t(i)] = double(x[r * in + i]) * suh[i];
        for (int64_t b = 0; b < in; b += 128) fwht128(&a[size_t(b)]);
        std::fill(z.begin(), z.end(), 0.0);
        for (int64_t i = 0; i < in; i++) {
            const double ai = a[size_t(i)] * norm;
            const float *wr = what + i * out;
            for (int64_t o = 0; o < out; o++) z[size_t(o)] += ai * wr[o];
        }
        for (int64_t b = 0; b < out; b += 128) fwht128(&z[size_t(b)]);
        for (int64_t o = 0; o < out; o++) y[r * out + o] = float(z[size_t(o)] * norm * svh[o]);
    }
}

}  // namespace ds41rt::backend::cpu
