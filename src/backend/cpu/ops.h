// CPU reference ops: plain functions over fp32 host arrays, computed in fp32 (fp64 where a sum
// is long enough to matter), threaded with core/threads.
//
// These are the reference every other backend is judged against (docs/design.md section 4).
// Shapes are given in comments as [rows, cols], row-major and contiguous. Nothing here knows
// the model: the engine composes these into the V4 / V4.1 forward pass.
#pragma once

#include <cstdint>

namespace ds41rt::backend::cpu {

// y[m, n] = sum_k x[m, k] * w[n, k]   (x: [m, k], w: [n, k] as stored in checkpoints, y: [m, n])
void matmul_nt(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k);

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
//  - fp4_e2m1 with ue8m0 scales: amax floored at 6*2^-126, s = 2^ceil(log2(amax/6)). Indexer q/k.
void fake_quant_fp4_ue8m0(float *x, int64_t rows, int64_t dim, int64_t block);
//  - fp4_e2m1 with e4m3 scales: s = e4m3_rne(max(amax, 6*2^-9) / 6) (saturating). Compressed KV.
void fake_quant_fp4_e4m3(float *x, int64_t rows, int64_t dim, int64_t block);

// 2^ceil(log2(v)) for v > 0, from the float's bits as the reference kernels do it.
float pow2_ceil(float v);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

}  // namespace ds41rt::backend::cpu
