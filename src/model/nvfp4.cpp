// NVFP4 decoding (nvfp4.h).
#include "model/nvfp4.h"

#include <cmath>

#include <fmt/format.h>

#include "core/dtype.h"

namespace ds41rt::model {

Status nvfp4_check(const std::string &name, const nvfp4_linear &l) {
    if (l.in % 16 != 0)
        return Status::corruption(fmt::format("{}: in_features {} is not a multiple of 16", name, l.in));
    if (!std::isfinite(l.weight_scale_2) || l.weight_scale_2 <= 0)
        return Status::corruption(fmt::format("{}.weight_scale_2: {} is not a positive finite scale", name, l.weight_scale_2));
    if (!std::isfinite(l.input_scale) || l.input_scale <= 0)
        return Status::corruption(fmt::format("{}.input_scale: {} is not a positive finite scale", name, l.input_scale));
    const int64_t n = l.out * (l.in / 16);
    for (int64_t i = 0; i < n; i++)
        if ((l.scales[i] & 0x7f) == 0x7f)
            return Status::corruption(fmt::format("{}.weight_scale: NaN byte 0x{:02x} at row {} block {}", name,
                                                  l.scales[i], i / (l.in / 16), i % (l.in / 16)));
    return Status::ok();
}

void nvfp4_dequantize(const nvfp4_linear &l, float *w) {
    float lut[16];
    for (int i = 0; i < 16; i++) lut[i] = e2m1_to_f32(uint8_t(i));
    lut[8] = 0.0f;  // ModelOpt's table decodes the -0 code as +0 (fixture quant-nvfp4: bit-identical)
    const int64_t blocks = l.in / 16;
    for (int64_t r = 0; r < l.out; r++) {
        const uint8_t *row = l.codes + r * (l.in / 2);
        for (int64_t b = 0; b < blocks; b++) {
            const float s = e4m3_to_f32(l.scales[r * blocks + b]) * l.weight_scale_2;
            for (int64_t i = b * 16; i < b * 16 + 16; i++) w[r * l.in + i] = lut[e2m1_unpack(row, size_t(i))] * s;
        }
    }
}

}  // namespace ds41rt::model
