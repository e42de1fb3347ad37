// CPU reference ops: plain functions over fp32 host arrays, computed in fp32 (fp64 where a sum
// is long enough to matter), threaded with core/threads.
//
// These are the reference every other backend is judged against (docs/design.md section 4).
// Shapes are given in comments as [rows, cols], row-major and contiguous. Nothing here knows
// the model: the engine composes these into the V4 / V4.1 forward pass.
#pragma once

#include <cstdint>

namespace ds41rt::backend::cpu {

// y[m, n] = sum_k x[m, k] * w[n, k]   (x: [m, k], w: [n, k] as stored in checkpoints, y: [m, n]);
// fp64 accumulation, one rounding to fp32.
void matmul_nt(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k);

// sum_i a[i] * b[i], accumulated in fp64, rounded once (as matmul_nt).
inline float dot(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += double(a[i]) * b[i];
    return float(s);
}

// y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps). w may be null (unweighted). In place ok.
void rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps);

// Interleaved-pair rotary embedding on the last 2*n_pairs channels of each row: pair i of the
// tail, (x[2i], x[2i+1]), is multiplied by the complex number (cos[i], sin[i]) (inverse: its
// conjugate). x: [rows, dim]; cos/sin: [rows, n_pairs] (one table row per x row).
void rope_tail(float *x, int64_t rows, int64_t dim, const float *cos, const float *sin, int64_t n_pairs,
               bool inverse);

// Block fake-quantizations (quantize onto the grid, dequantize back), each along the last
// dimension in blocks of `block` channels; rows of length dim (dim % block == 0).
//  - fp8_e4m3 with power-of-two (ue8m0) scales: amax floored at 1e-4, s = 2^ceil(log2(amax/448)),
//    q = e4m3_rne(clamp(x/s, +-448)). The window-KV cache and act_quant.
void fake_quant_fp8_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block);
//    Same on only the first `cols` channels of rows `stride` channels apart (cols % block == 0);
//    the rest of each row is left alone. V4's window KV / compressed entries: the nope dims.
void fake_quant_fp8_ue8m0_cols(float *x, int64_t rows, int64_t stride, int64_t cols, int64_t block);
//  - fp4_e2m1 with ue8m0 scales: amax floored at 6*2^-126, s = 2^ceil(log2(amax/6)). Indexer q/k.
void fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block);
//  - fp4_e2m1 with e4m3 scales: s = e4m3_rne(max(amax, 6*2^-9) / 6) (saturating). Compressed KV.
void fake_quant_fp4_e4m3(float *x, int64_t rows, int64_t dim, int64_t block);

// Walsh-Hadamard transform of each row, Sylvester (natural) order, times scale: y = scale * H x
// with H[i][j] = (-1)^popcount(i & j), computed in fp32 by in-place butterflies. dim must be a
// power of two. V4's indexer rotation uses scale = dim^-0.5 (H orthogonal). In place.
void hadamard_transform(float *x, int64_t rows, int64_t dim, float scale);

// V4's indexer q / key quantization point (spec 2.1, 3.5, 3.8): rotate_activation, i.e.
// bf16(hadamard_transform(x, dim^-0.5)) with the transform in fp32, then the FP4 (ue8m0) fake
// quant in blocks of `block` (32). In place; dim a power of two.
void rotate_fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block);

// Unweighted RMS norm computed in bf16 as a bf16 torch expression evaluates it (V4 spec 2.1,
// the per-head q norm): y = bf16(x * bf16(rsqrt(bf16(bf16(mean(bf16(x^2))) + eps)))), the mean
// accumulated in fp32. x must already hold bf16 values. In place.
void rms_norm_unweighted_bf16(float *x, int64_t rows, int64_t dim, float eps);

// 2^ceil(log2(v)) for v > 0, from the float's bits as the reference kernels do it.
float pow2_ceil(float v);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

}  // namespace ds41rt::backend::cpu
