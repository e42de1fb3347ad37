// CPU reference layers of the quantized routed-expert publications: NVFP4 W4A4 (ModelOpt) and
// EXL3 (exllamav3). Plain functions over fp32 host arrays; the weights arrive already decoded
// (model/nvfp4, model/exl3), so nothing here knows a file format. Shapes [rows, cols], row-major.
#pragma once

#include <cstdint>

namespace ds41rt::backend::cpu {

// NVFP4 activation fake quantization along each row in blocks of 16, with the per-tensor
// input_scale, exactly as the producer (nvidia-modelopt 0.47) defines it for its calibrated
// W4A4 model, whose activations are bf16 (fp32 inputs are cast to bf16 first). In place;
// dim % 16 == 0. out_bf16: round the result to bf16, as ModelOpt's kernel
// writes its output in the input's dtype (bf16 rows in, bf16 out).
void nvfp4_fake_quant_act(float *x, int64_t rows, int64_t dim, float input_scale, bool out_bf16);

// y[m, n] = fq(x)[m, :] . w[n, :], fq = nvfp4_fake_quant_act(out_bf16 = true); x holds bf16 values,
// w is the dequantized weight [n, k] (model::nvfp4_dequantize). fp64 accumulation, one rounding.
void nvfp4_w4a4_linear(const float *x, int64_t m, const float *w, int64_t n, int64_t k, float input_scale, float *y);

// One routed expert in W4A4 (spec quant-formats 1.7): g = x W1^T and u = x W3^T from one
// quantization of x (gate and up share input_scale13), h = bf16(silu(min(g, L)) * clamp(u, -L, L))
// (no clamp when L == 0; the engine's convention, engine/expert.h), then y = fq(h) W2^T with
// input_scale2. x: [m, dim] bf16 values; w1, w3: [inter, dim]; w2: [dim, inter]; y: [m, dim].
void nvfp4_w4a4_swiglu(const float *x, int64_t m, int64_t dim, int64_t inter, const float *w1, const float *w3,
                       const float *w2, float input_scale13, float input_scale2, float swiglu_limit, float *y);

// nvfp4_w4a4_swiglu as a routed expert of the engine: the same steps with the route weight of
// each row (before w2: h = bf16(weight * silu(..) * u), as V4.1 and DeepSeek's reference scale
// the SwiGLU output, and the GPU's moe_decode; after w2 when nm.weight_after_w2), fp32 output
// (the routed sum adds it unrounded). Only nm.weight_after_w2 and nm.swiglu_limit are read: the
// publication's numerics hold in either engine numerics. row_weight may be null.
struct expert_numerics;
void nvfp4_w4a4_expert(const expert_numerics &nm, const float *w1, const float *w2, const float *w3, int64_t inter,
                       float input_scale13, float input_scale2, const float *x, int64_t m, int64_t dim,
                       const float *row_weight, float *y);

// EXL3 layer forward as exllamav3 factors it (modules/quant/exl3.py):
// y = ((x . diag(suh)) H) What H . diag(svh), H the normalized Hadamard on 128-blocks of each row.
// x: [m, in]; what: decoded trellis values [in, out] (model::exl3_decode, as fp32); suh: [in];
// svh: [out]; y: [m, out]. Rotations in fp64, the product accumulated in fp64. in, out % 128 == 0.
void exl3_linear(const float *x, int64_t m, const float *what, int64_t in, int64_t out, const float *suh,
                 const float *svh, float *y);

}  // namespace ds41rt::backend::cpu
