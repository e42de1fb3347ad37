// Host-side reading of dummy weights (backend/cpu/dummy_values): dequantization of the stored
// bytes with core/dtype's decoders (independent of the fill's tables) and the moments of the
// result. Shared by the CPU test of the reference fill and the GPU test of the device fill.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/dummy_values.h"
#include "core/dtype.h"
#include "model/exl3.h"

namespace ds41rt::testing_util {

struct dummy_bytes_host {
    std::vector<uint8_t> w, s;
};

struct moments {
    double mean = 0, std = 0;
    size_t non_finite = 0;
};

inline moments stats(const std::vector<float> &v) {
    moments m;
    double s = 0, ss = 0;
    size_t n = 0;
    for (float x : v) {
        if (!std::isfinite(x)) {
            m.non_finite++;
            continue;
        }
        s += x;
        ss += double(x) * x;
        n++;
    }
    m.mean = s / double(std::max<size_t>(1, n));
    m.std = std::sqrt(std::max(0.0, ss / double(std::max<size_t>(1, n)) - m.mean * m.mean));
    return m;
}

// The [rows, cols] values of a whole-tensor fill: FP8 codes on the descriptor's scale grid, MXFP4
// (1 x 32), NVFP4 (E4M3 per 16, times weight_scale_2 from the encoding), BF16 or F32. EXL3: the
// [cols = in, rows = out] weight W (y = x W) through model/exl3's decoder with the Hadamard
// rotations (codebook cb).
inline std::vector<float> dummy_dequant(const backend::cpu::dummy_tensor_desc &d, const dummy_bytes_host &f,
                                        model::exl3_codebook cb = model::exl3_codebook::MCG) {
    using backend::cpu::dummy_format;
    const int64_t rows = d.rows, cols = d.cols;
    std::vector<float> v(size_t(rows * cols));
    if (d.format == dummy_format::EXL3) {
        model::exl3_linear l;
        l.in = cols;
        l.out = rows;
        l.k = d.exl3_bits;
        l.cb = cb;
        l.trellis = reinterpret_cast<const uint16_t *>(f.w.data());
        l.suh = reinterpret_cast<const uint16_t *>(f.s.data());
        l.svh = l.suh + cols;
        model::exl3_dequantize(l, v.data());
        return v;
    }
    if (d.format == dummy_format::NVFP4) {
        auto enc = backend::cpu::dummy_encoding_for(d);
        const float ws2 = enc.is_ok() ? enc.value().weight_scale_2 : NAN;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                v[size_t(r * cols + c)] = e2m1_to_f32(e2m1_unpack(f.w.data() + r * cols / 2, size_t(c))) *
                                          (e4m3_to_f32(f.s[size_t(r * (cols / 16) + c / 16)]) * ws2);
        return v;
    }
    if (d.format == dummy_format::BF16) {
        for (size_t i = 0; i < v.size(); i++) v[i] = bf16_to_f32(uint16_t(f.w[2 * i] | f.w[2 * i + 1] << 8));
        return v;
    }
    if (d.format == dummy_format::F32) {
        std::memcpy(v.data(), f.w.data(), v.size() * 4);
        return v;
    }
    const bool fp4 = d.format == dummy_format::MXFP4;
    const int64_t bo = fp4 ? 1 : d.block_out, bi = fp4 ? 32 : d.block_in, sc = (cols + bi - 1) / bi;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float code = fp4 ? e2m1_to_f32(e2m1_unpack(f.w.data() + r * cols / 2, size_t(c)))
                                   : e4m3_to_f32(f.w[size_t(r * cols + c)]);
            v[size_t(r * cols + c)] = code * e8m0_to_f32(f.s[size_t((r / bo) * sc + c / bi)]);
        }
    return v;
}

inline size_t equal_bytes(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b) {
    size_t n = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) n += a[i] == b[i];
    return n;
}

inline backend::cpu::dummy_tensor_desc dummy_desc(backend::cpu::dummy_format f, int64_t rows, int64_t cols, int block,
                                                  double std, uint64_t id) {
    backend::cpu::dummy_tensor_desc d;
    d.name = "test";
    d.format = f;
    d.rows = rows;
    d.cols = cols;
    d.block_out = d.block_in = block;
    d.std = std;
    d.id = id;
    return d;
}

}  // namespace ds41rt::testing_util
