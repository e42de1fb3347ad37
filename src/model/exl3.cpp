// EXL3 decoding (exl3.h). Facts from spec quant-formats 2.3-2.5, which were checked bit-exactly
// against exllamav3's pack / reconstruct kernels on an H200 (turboderp-org/exllamav3 @ 4f8ad01:
// exllamav3_ext/quant/codebook.cuh, exl3_dq.cuh, reconstruct.cu).
#include "model/exl3.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"

namespace ds41rt::model {

uint16_t exl3_codebook_value(uint16_t state, exl3_codebook cb) {
    if (cb == exl3_codebook::MUL1) {
        const uint32_t x = uint32_t(state) * 0x83DCD12Du;
        const uint32_t s = (x & 0xff) + ((x >> 8) & 0xff) + ((x >> 16) & 0xff) + (x >> 24);
        // fma_fp16(1024 + s, 0x1EEE, 0xC931): the product has at most 22 significant bits and the
        // sum stays within fp32's 24, so the fp32 expression is exact and the single fp16 rounding
        // below is the fma's.
        const float h = f16_to_f32(uint16_t(0x6400 + s));
        return f32_to_f16(h * f16_to_f32(0x1EEE) + f16_to_f32(0xC931));
    }
    uint32_t x = cb == exl3_codebook::MCG ? uint32_t(state) * 0xCBAC1FEDu : uint32_t(state) * 89226354u + 64248484u;
    x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
    // Both halves have exponents 12..15 (magnitudes in [0.125, 2)): their fp32 sum is exact, and
    // the one rounding to fp16 is hadd's.
    return f32_to_f16(f16_to_f32(uint16_t(x & 0xffff)) + f16_to_f32(uint16_t(x >> 16)));
}

void exl3_decode_tile(const uint16_t *words, int k, exl3_codebook cb, uint16_t out[256]) {
    // The packer swaps the int16 halves of each uint32 and the stream is MSB-first in each uint32.
    const int nbits = 256 * k;
    uint32_t w32[64];
    for (int i = 0; i < 8 * k; i++) w32[i] = uint32_t(words[2 * i]) | uint32_t(words[2 * i + 1]) << 16;
    auto bit = [&](int p) -> uint32_t {
        p = ((p % nbits) + nbits) % nbits;
        return (w32[p >> 5] >> (31 - (p & 31))) & 1u;
    };
    for (int t = 0; t < 256; t++) {
        // state_t: the 16-bit window ending at stream bit (t+1)k, taken cyclically (tail-biting).
        uint32_t state = 0;
        const int end = (t + 1) * k;
        for (int p = end - 16; p < end; p++) state = (state << 1) | bit(p);
        // Element t sits where mma.sync m16n8k16 wants its B fragment.
        const int lane = t / 8, j = t % 8;
        const int r = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1);
        const int c = lane / 4 + 8 * (j >> 2);
        out[r * 16 + c] = exl3_codebook_value(uint16_t(state), cb);
    }
}

Status exl3_check(const std::string &name, const exl3_linear &l) {
    if (l.in % exl3_block != 0 || l.out % exl3_block != 0)
        return Status::corruption(fmt::format("{}: [in {}, out {}] are not multiples of {}", name, l.in, l.out, exl3_block));
    if (l.k < 1 || l.k > 8) return Status::corruption(fmt::format("{}.trellis: K = {} outside 1..8", name, l.k));
    for (int64_t i = 0; i < l.in; i++)
        if (!std::isfinite(f16_to_f32(l.suh[i])))
            return Status::corruption(fmt::format("{}.suh[{}]: not finite (0x{:04x})", name, i, l.suh[i]));
    for (int64_t i = 0; i < l.out; i++)
        if (!std::isfinite(f16_to_f32(l.svh[i])))
            return Status::corruption(fmt::format("{}.svh[{}]: not finite (0x{:04x})", name, i, l.svh[i]));
    return Status::ok();
}

void exl3_decode(const exl3_linear &l, uint16_t *what) {
    const int64_t ta = l.in / 16, tb = l.out / 16;
    uint16_t tile[256];
    for (int64_t a = 0; a < ta; a++)
        for (int64_t b = 0; b < tb; b++) {
            exl3_decode_tile(l.trellis + (a * tb + b) * 16 * l.k, l.k, l.cb, tile);
            for (int r = 0; r < 16; r++)
                for (int c = 0; c < 16; c++) what[(16 * a + r) * l.out + 16 * b + c] = tile[r * 16 + c];
        }
}

namespace {

// Unnormalized Sylvester Walsh-Hadamard of n values spaced `stride` apart (natural order).
void fwht(double *v, int64_t n, int64_t stride) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const double a = v[j * stride], b = v[(j + h) * stride];
                v[j * stride] = a + b;
                v[(j + h) * stride] = a - b;
            }
}

}  // namespace

void exl3_dequantize(const exl3_linear &l, float *w) {
    std::vector<uint16_t> what(size_t(l.in * l.out));
    exl3_decode(l, what.data());
    std::vector<double> m(what.size());
    for (size_t i = 0; i < what.size(); i++) m[i] = f16_to_f32(what[i]);
    // H What H with both H normalized by 1/sqrt(128): one exact factor of 1/128 at the end.
    for (int64_t c = 0; c < l.out; c++)
        for (int64_t b = 0; b < l.in; b += exl3_block) fwht(&m[size_t(b * l.out + c)], exl3_block, l.out);
    for (int64_t r = 0; r < l.in; r++)
        for (int64_t b = 0; b < l.out; b += exl3_block) fwht(&m[size_t(r * l.out + b)], exl3_block, 1);
    for (int64_t r = 0; r < l.in; r++) {
        const double su = f16_to_f32(l.suh[r]) / double(exl3_block);
        for (int64_t c = 0; c < l.out; c++)
            w[r * l.out + c] = float(su * m[size_t(r * l.out + c)] * f16_to_f32(l.svh[c]));
    }
}

}  // namespace ds41rt::model
