// Dummy weights (`--load-format dummy`): the stored bytes of one tensor in a checkpoint storage
// format, a pure function of (seed, tensor id, global row, global column). This header is what the
// CPU reference fill and the GPU fill (backend/cuda/dummy_fill) share, in C++17 so the CUDA
// sources include it: the descriptor, the encoding choice, and the counter hash and value
// arithmetic (integer, or fp32 steps written so host and device round alike).
//
// What crosses this boundary: a plain descriptor (format, logical shape, scale grid, value rule,
// id, optional window) and raw pointers; nothing about the model. The model room's plan
// (model/dummy_weights) says which rule each named tensor gets; the engine maps it here.
//
// Formats, as the kernels read them (gemv.cuh, moe_decode.cuh, embedding.cuh):
//   FP8_BLOCK  codes E4M3 [rows, cols], scale E8M0 [ceil(rows/block_out), ceil(cols/block_in)]
//              (V4.1 32x32, V4 128x128, Engram rows 1x32). No NaN code (0x7f / 0xff) is written.
//   MXFP4      codes E2M1 [rows, cols/2] (low nibble = even column), scale E8M0 [rows, ceil(cols/32)]
//   NVFP4      codes E2M1 [rows, cols/2] as MXFP4, scale E4M3 [rows, cols/16] (ModelOpt's weight_scale,
//              plain row-major), and two F32 scalars returned by dummy_encoding_for: weight_scale_2
//              and input_scale (= input_amax / (6 * 448), the producer's rule, spec quant-formats 1.4)
//   EXL3       logical [rows = out, cols = in]; trellis I16 [cols/16, rows/16, 16 K] (tile (a, b)
//              covers inputs 16a.. and outputs 16b..), then, in the scale buffer, suh F16 [cols] and
//              svh F16 [rows]. Both dims multiples of 128 (the Hadamard block, and the window unit)
//   BF16, F32  [rows, cols]
//   I64        [rows, cols] expert ids (V4's tid2eid): (h(row) + col) mod index_range, so the ids
//              of a row are distinct when cols <= index_range
// Quantized values: each code is a 256-level quantile table of the distribution (normal or
// uniform) looked up with one random byte, the table scaled so its largest code is at most the
// format's top code (448 / 6, as an amax-scaled block would be); the E8M0 scale is the power of two
// that brings the dequantized std to the target. FP8 blocks draw one of three scale exponents
// (e, e+1, e+2) per block with codes divided to match, so scale bytes vary as in a real checkpoint
// while the dequantized values stay the same. NVFP4: the code table spans the E2M1 range, block
// scales are one of eight E4M3 values in [0.75, 1.375] (bytes 0x34..0x3b, varying like a real
// checkpoint's), and weight_scale_2 brings the dequantized std to the target. EXL3: random trellis
// bits (every bitstream decodes; a uniform state has the codebook's RMS), svh = +-{0.75, 1, 1.25}
// and suh = +-a with random signs, a the fp16 that gives the target std through
// ||diag(suh) H What H diag(svh)|| (H orthonormal). Quantized values are zero-mean. Windows: any
// block-aligned row / column range of a tensor holds exactly that range of the whole fill.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>

#include "core/status.h"

#if defined(__CUDACC__)
#define DS41RT_HOST_DEVICE __host__ __device__
#else
#define DS41RT_HOST_DEVICE
#endif

namespace ds41rt::backend::cpu {

enum class dummy_format : uint8_t { F32 = 0, BF16, FP8_BLOCK, MXFP4, I64, NVFP4, EXL3 };
// NORMAL: bell-shaped (quantized formats: the normal's 256 quantiles; BF16 / F32: a sum of four
// uniforms, exact std, bounded at 2 sqrt 3 std). UNIFORM: flat over mean +- sqrt(3) std.
// CONSTANT: every value `mean` (BF16 / F32 only). INDEX: I64 ids in [0, index_range).
enum class dummy_dist : uint8_t { NORMAL = 0, UNIFORM, CONSTANT, INDEX };

struct dummy_tensor_desc {
    const char *name = nullptr;       // for error messages only (may be null)
    dummy_format format = dummy_format::BF16;
    int64_t rows = 1, cols = 1;       // logical shape of the whole tensor: [n] is 1 x n
    int block_out = 1, block_in = 32; // FP8_BLOCK scale grid, block_in a multiple of 16. MXFP4: 1 x 32 always
    dummy_dist dist = dummy_dist::NORMAL;
    double mean = 0;                  // NORMAL / UNIFORM (BF16 / F32 only: quantized values are zero-mean); CONSTANT
    double std = 0;                   // NORMAL / UNIFORM: std of the dequantized values (> 0)
    int64_t index_range = 0;          // INDEX: ids in [0, index_range)
    double input_amax = 16;           // NVFP4: the calibrated activation amax input_scale stands for
    int exl3_bits = 2;                // EXL3: trellis bits per weight K, 1..8
    double exl3_code_rms = 0;         // EXL3: RMS of the codebook over all 2^16 states (model/exl3)
    uint64_t id = 0;                  // the tensor's identity (the model side hashes the name)
    // The window the buffers hold: rows [row0, row0 + nrows) x cols [col0, col0 + ncols), stored
    // contiguously ([nrows, ncols] values, then the scale blocks it covers); -1: to the end.
    // Quantized formats: row0 / col0 on scale-block boundaries, each end on one or at the tensor's end.
    int64_t row0 = 0, nrows = -1, col0 = 0, ncols = -1;
};

// How a descriptor's values are encoded, and what they dequantize to in expectation: exact for
// the quantized formats (the code tables' moments times the scales), the requested moments for
// BF16 / F32 (up to their rounding).
struct dummy_encoding {
    int scale_exp = 0;      // quantized: block scales 2^scale_exp (FP8 blocks: up to 2^(scale_exp + 2))
    double code_std = 0;    // quantized: std of the code table before rounding to codes
    double expected_mean = 0;
    double expected_std = 0;
    float weight_scale_2 = 0, input_scale = 0;  // NVFP4: the two per-tensor scalars
    uint16_t suh_bits = 0;                      // EXL3: |suh| as fp16 bits
};

// Bytes of the window's values and of its scale blocks (0 unquantized): what a caller allocates.
struct dummy_window_bytes {
    uint64_t weight = 0, scale = 0;
};

constexpr int DUMMY_LEVELS = 256;  // code table size: one random byte per code
constexpr int DUMMY_JITTERS = 3;   // FP8 block scale exponents e, e+1, e+2
constexpr int DUMMY_NVFP4_SCALE0 = 0x34, DUMMY_NVFP4_SCALES = 8;  // E4M3 0.75 .. 1.375
constexpr int DUMMY_EXL3_BLOCK = 128;

struct dummy_code_tables {
    uint8_t code[DUMMY_JITTERS][DUMMY_LEVELS];  // FP8: one table per jitter; MXFP4: table 0 (nibbles)
};

// Everything a fill needs, resolved and checked once on the host.
struct dummy_layout {
    int64_t row0 = 0, nrows = 0, col0 = 0, ncols = 0;  // the window, -1s resolved
    int bo = 1, bi = 1;                                // scale grid (1 x 1 unquantized)
    int64_t scale_cols = 0;                            // scale-grid columns of the whole tensor
    bool quantized = false, jitter = false;
    uint64_t key = 0;                                  // dummy_tensor_key(seed, id)
    dummy_encoding enc;
    dummy_code_tables tables{};
};

// Checks d (INVALID_ARGUMENT naming the tensor and the rule broken) and resolves it.
Result<dummy_layout> dummy_prepare(const dummy_tensor_desc &d, uint64_t seed);
Result<dummy_encoding> dummy_encoding_for(const dummy_tensor_desc &d);
Result<dummy_window_bytes> dummy_bytes(const dummy_tensor_desc &d);

// The reference fill on the CPU (one thread, element by element): the bytes the GPU fill must
// equal. weight: dummy_bytes().weight bytes; scale: dummy_bytes().scale (null unquantized).
Status fill_dummy_host(const dummy_tensor_desc &d, void *weight, void *scale, uint64_t seed);

// ---- shared arithmetic (host and device) ---------------------------------------------------------

constexpr uint64_t DUMMY_GOLDEN = 0x9e3779b97f4a7c15ull;

DS41RT_HOST_DEVICE inline uint64_t dummy_mix64(uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

DS41RT_HOST_DEVICE inline uint64_t dummy_tensor_key(uint64_t seed, uint64_t id) {
    return dummy_mix64(seed ^ dummy_mix64(id + DUMMY_GOLDEN));
}

// The FP8 block's scale exponent offset (0, 1, 2); block = block_row * scale_cols + block_col.
DS41RT_HOST_DEVICE inline int dummy_block_jitter(uint64_t key, int64_t block) {
    return int(dummy_mix64((key ^ 0x5ca1ab1e0ddba11ull) + uint64_t(block) * DUMMY_GOLDEN) % DUMMY_JITTERS);
}

// NVFP4: the E4M3 scale byte of block = row * scale_cols + col / 16.
DS41RT_HOST_DEVICE inline uint8_t dummy_nvfp4_scale(uint64_t key, int64_t block) {
    return uint8_t(DUMMY_NVFP4_SCALE0 +
                   dummy_mix64((key ^ 0x4e5646503473ull) + uint64_t(block) * DUMMY_GOLDEN) % DUMMY_NVFP4_SCALES);
}

// EXL3: u16 word w of global tile t = a * (rows / 16) + b, 16 K words a tile: 16 bits of one hash
// per 4 words.
DS41RT_HOST_DEVICE inline uint16_t dummy_exl3_word(uint64_t key, int64_t tile, int k, int w) {
    return uint16_t(dummy_mix64(key + uint64_t(tile * 4 * k + w / 4) * DUMMY_GOLDEN) >> (16 * (w % 4)));
}
// EXL3 suh[i]: +-|suh| with a random sign; svh[j]: +-0.75, 1 or 1.25 (fp16 bits).
DS41RT_HOST_DEVICE inline uint16_t dummy_exl3_suh(uint64_t key, int64_t i, uint16_t mag) {
    return uint16_t(mag | (dummy_mix64((key ^ 0x5375685375680ull) + uint64_t(i) * DUMMY_GOLDEN) >> 63) << 15);
}
DS41RT_HOST_DEVICE inline uint16_t dummy_exl3_svh(uint64_t key, int64_t j) {
    const uint64_t h = dummy_mix64((key ^ 0x5376685376680ull) + uint64_t(j) * DUMMY_GOLDEN);
    const uint32_t m = uint32_t(h % 3);
    return uint16_t((m == 0 ? 0x3a00u : m == 1 ? 0x3c00u : 0x3d00u) | uint32_t(h >> 63) << 15);
}
constexpr double DUMMY_EXL3_SVH_MS = (0.5625 + 1.0 + 1.5625) / 3;  // mean square of |svh|

// Quantized formats: the random byte of element (r, c) is byte c % 8 of group (r, c / 8), with
// groups_per_row = ceil(cols / 8).
DS41RT_HOST_DEVICE inline uint64_t dummy_group_bits(uint64_t key, int64_t r, int64_t groups_per_row, int64_t g) {
    return dummy_mix64(key + uint64_t(r * groups_per_row + g) * DUMMY_GOLDEN);
}

// fp32 steps rounded one at a time on both sides (no FMA contraction on the device).
DS41RT_HOST_DEVICE inline float dummy_fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
DS41RT_HOST_DEVICE inline float dummy_fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// BF16 / F32 value of element (r, c) before any storage rounding. NORMAL: four 16-bit uniforms on
// 0..M summed (exact in fp32), centred and divided by their std sqrt(M (M + 2) / 3). UNIFORM:
// 24 bits mapped to [-1, 1) (exact), times sqrt 3.
DS41RT_HOST_DEVICE inline float dummy_plain_value(uint64_t key, int64_t r, int64_t c, int64_t cols, dummy_dist dist,
                                                  float mean, float std) {
    if (dist == dummy_dist::CONSTANT) return mean;
    const uint64_t h = dummy_mix64(key + uint64_t(r * cols + c) * DUMMY_GOLDEN);
    float z;
    if (dist == dummy_dist::UNIFORM) {
        z = dummy_fmul(dummy_fadd(dummy_fmul(float(h >> 40), 1.1920928955078125e-07f), -1.0f), 1.7320508075688772f);
    } else {
        const float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
        z = dummy_fmul(s - 131070.0f, 2.6428997921e-05f);
    }
    return dummy_fadd(mean, dummy_fmul(std, z));
}

// I64 expert id of element (r, c): consecutive from a per-row start, so distinct within a row.
DS41RT_HOST_DEVICE inline int64_t dummy_index_value(uint64_t key, int64_t r, int64_t c, int64_t range) {
    const uint64_t start = dummy_mix64(key + uint64_t(r) * DUMMY_GOLDEN) % uint64_t(range);
    return int64_t((start + uint64_t(c)) % uint64_t(range));
}

}  // namespace ds41rt::backend::cpu
