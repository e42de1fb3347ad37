// EXL3 linears as exllamav3 stores them (spec quant-formats 2.1-2.5): the weight W[in, out]
// (y = x W, transposed relative to HF) is diag(suh) H What H diag(svh), where H is the normalized
// block-diagonal Hadamard of block 128 and What is decoded from a tail-biting bitshift trellis in
// 16x16 tiles of K bits per weight through one of three codebooks. This file decodes the stored
// tensors; it owns no file access.
//
// TP: the rotations are local to 128-channel blocks, so a tensor-parallel cut must fall on a
// multiple of exl3_block on the split axis (w1/w3: output axis, slicing trellis dim 1 and svh;
// w2: input axis, slicing trellis dim 0 and suh). The placement planner (dist) owns the cut;
// model/expert_slice decodes one rank's slice from the stored tiles.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/config.h"

namespace ds41rt::model {

constexpr int64_t exl3_block = 128;  // Hadamard block, and the TP alignment of both axes

// One codebook lookup: the fp16 bits of the value of a 16-bit trellis state, computed with the
// exact fp16 rounding of exllamav3's decode_3inst<cb> (codebook.cuh).
uint16_t exl3_codebook_value(uint16_t state, exl3_codebook cb);

// Decodes one tile: words = 16*K int16 as stored; out[r * 16 + c] = fp16 bits of What at tile row
// r (input) and column c (output).
void exl3_decode_tile(const uint16_t *words, int k, exl3_codebook cb, uint16_t out[256]);

// Views into one stored EXL3 linear.
struct exl3_linear {
    int64_t in = 0, out = 0;
    int k = 0;                          // trellis bits per weight, 1..8
    exl3_codebook cb = exl3_codebook::MCG;
    const uint16_t *trellis = nullptr;  // [in/16, out/16, 16k] int16 bits
    const uint16_t *suh = nullptr;      // [in] fp16 bits
    const uint16_t *svh = nullptr;      // [out] fp16 bits
};

// Dims multiples of 128, k in 1..8, finite suh / svh. Messages start with `name`.
Status exl3_check(const std::string &name, const exl3_linear &l);

// What[in, out] as fp16 bits (exllamav3's reconstruct without the rotations: bit-exact).
void exl3_decode(const exl3_linear &l, uint16_t *what);

// W[in, out] = diag(suh) H What H diag(svh) computed in fp64, rounded once to fp32.
void exl3_dequantize(const exl3_linear &l, float *w);

}  // namespace ds41rt::model
