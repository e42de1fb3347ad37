// NVFP4 linears as NVIDIA ModelOpt exports them (spec quant-formats 1.3-1.5): E2M1 codes packed two
// per byte along the input axis (low nibble = even input), one E4M3 scale per 16 inputs, and two
// FP32 per-tensor scalars. This file decodes the stored bytes; it owns no file access.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace ds41rt::model {

// Views into one quantized linear W[out, in] (y = x W^T), as stored.
struct nvfp4_linear {
    int64_t out = 0, in = 0;
    const uint8_t *codes = nullptr;   // [out, in/2]
    const uint8_t *scales = nullptr;  // [out, in/16] float8_e4m3fn, plain row-major (not swizzled)
    float weight_scale_2 = 0;         // per-tensor dequant multiplier
    float input_scale = 0;            // per-tensor activation dequant multiplier (W4A4)
};

// Rejects what ModelOpt never writes and the kernels cannot survive: NaN scale bytes (0x7F, 0xFF),
// non-finite or non-positive scalars, in % 16 != 0. Messages start with `name`.
Status nvfp4_check(const std::string &name, const nvfp4_linear &l);

// w[out, in] = e2m1(code) * (float(weight_scale) * weight_scale_2), both products in fp32 and in
// that order: NVFP4QTensor.dequantize (modelopt 0.47, qtensor/nvfp4_tensor.py) forms the per-block
// scale first and then multiplies the unpacked codes, so this is bit-identical to its fp32 output.
void nvfp4_dequantize(const nvfp4_linear &l, float *w);

}  // namespace ds41rt::model
