// The OFFICIAL numerics' shared building blocks (engine/engine.h, numerics::OFFICIAL), used the
// same way by the V4 and V4.1 forward passes and by the routed experts wherever they run (the
// coordinator's local layers, an expert worker's slices): bf16 rounding of activations where DeepSeek's reference
// holds them in bf16 (its default dtype), and the linear classes of the reference's matmuls.
// In TRANSFORMERS numerics (official = false) all of these are plain fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"

namespace ds41rt::backend::cpu {

// What kind of matmul the reference runs for a weight (V4 spec 2.1, V4.1 spec section 3):
//  FP8 / FP4: the activation is FP8-quantized per `act_block` channels (ue8m0 scales) first, the
//             output is bf16;
//  BF16:      bf16 inputs, fp32 accumulation, bf16 output;
//  F32:       fp32 throughout (compressor projections, gate, head, mHC mixes).
enum class lin { FP8, FP4, BF16, F32 };

// Rounds n values to bf16 when official.
inline void round_bf16_if(bool official, float *p, int64_t n) {
    if (official)
        for (int64_t i = 0; i < n; i++) p[i] = round_bf16(p[i]);
}

// y[m, n] = x[m, k] . w[n, k]^T with the numerics of the weight's class. The CPU reference
// simulates the FP8 activation quantization as a fake-quant followed by an fp32 matmul on the
// dequantized weight.
inline void linear_numerics(bool official, int64_t act_block, const float *x, const float *w, float *y, int64_t m,
                            int64_t n, int64_t k, lin kind) {
    if (official && (kind == lin::FP8 || kind == lin::FP4)) {
        std::vector<float> xq(x, x + m * k);
        fake_quant_fp8_ue8m0(xq.data(), m, k, act_block);
        matmul_nt(xq.data(), w, y, m, n, k);
    } else {
        matmul_nt(x, w, y, m, n, k);
    }
    if (kind != lin::F32) round_bf16_if(official, y, m * n);
}

}  // namespace ds41rt::backend::cpu
