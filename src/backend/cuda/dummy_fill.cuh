// Dummy weights on the GPU (`--load-format dummy`): the stored bytes of one tensor in a checkpoint
// storage format, filled deterministically from (seed, tensor id, element position), so full-size
// models of the real shapes and formats appear in seconds without a checkpoint.
//
// What crosses this boundary: a plain descriptor (format, logical shape, scale grid, value rule,
// id, optional window) and raw device pointers; nothing about the model. The model room's plan
// (model/dummy_weights) says which rule each named tensor gets; the engine maps it to this
// descriptor. Values are a pure function of (seed, id, global row, global column): any window of a
// tensor (a row or column range aligned to its scale blocks: a TP slice, a chunk of an Engram
// table filled on the device and copied to host memory) holds exactly the bytes the same range of
// a whole-tensor fill holds. No generator state lives on the device; a call is graph-capturable.
//
// The formats are the byte layouts the kernels read (gemv.cuh, moe_decode.cuh, embedding.cuh):
//   FP8_BLOCK  codes E4M3 [rows, cols], scale E8M0 [ceil(rows/block_out), ceil(cols/block_in)]
//              (V4.1 32x32, V4 128x128, Engram rows 1x32). No NaN code (0x7f / 0xff) is written.
//   MXFP4      codes E2M1 [rows, cols/2] (low nibble = even column), scale E8M0 [rows, ceil(cols/32)]
//   BF16, F32  [rows, cols]
//   I64        [rows, cols] expert ids (V4's tid2eid): (h(row) + col) mod index_range, so the ids
//              of a row are distinct when cols <= index_range
// Quantized values: codes follow a 256-level quantile table of the chosen distribution (normal or
// uniform), scaled so that the table's largest code is at most the format's top code (448 / 6,
// as an amax-scaled block would be); the E8M0 scale is the power of two that brings the
// dequantized standard deviation to the target. FP8 blocks draw one of three scale exponents per
// block (e, e+1, e+2) with codes divided to match, so scale bytes vary as in a real checkpoint
// while the dequantized distribution stays the same. Quantized values are zero-mean.
//
// Thread safety: free functions; the fill is ordered on `stream` like any kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

enum class dummy_format : uint8_t { F32 = 0, BF16, FP8_BLOCK, MXFP4, I64 };
// NORMAL: bell-shaped (quantized formats: the normal's 256 quantiles; BF16 / F32: a sum of four
// uniforms, bounded at 3.46 std). UNIFORM: flat over mean +- sqrt(3) std. CONSTANT: every value
// `mean` (BF16 / F32 only). INDEX: I64 ids in [0, index_range).
enum class dummy_dist : uint8_t { NORMAL = 0, UNIFORM, CONSTANT, INDEX };

struct dummy_tensor_desc {
    const char *name = nullptr;       // for error messages only (may be null)
    dummy_format format = dummy_format::BF16;
    int64_t rows = 1, cols = 1;       // logical shape of the whole tensor: [n] is 1 x n, a scalar 1 x 1
    int block_out = 1, block_in = 32; // FP8_BLOCK scale grid; block_in a multiple of 16. MXFP4: 1 x 32 always
    dummy_dist dist = dummy_dist::NORMAL;
    double mean = 0;                  // NORMAL / UNIFORM (BF16 / F32 only; quantized values are zero-mean) and CONSTANT
    double std = 0;                   // NORMAL / UNIFORM: standard deviation of the dequantized values (> 0)
    int64_t index_range = 0;          // INDEX: ids in [0, index_range)
    uint64_t id = 0;                  // the tensor's identity (the model side hashes the name)
    // The window the buffers hold: rows [row0, row0 + nrows) x cols [col0, col0 + ncols), stored
    // contiguously ([nrows, ncols] codes, the scale blocks it covers); -1: to the end. Quantized
    // formats: row0 / col0 on scale-block boundaries, and each window end on one or at the
    // tensor's end.
    int64_t row0 = 0, nrows = -1, col0 = 0, ncols = -1;
};

// How a descriptor's values are encoded, and what they dequantize to in expectation (exact for the
// quantized formats: the mean and std of the code table times the scales; the requested ones for
// BF16 / F32 up to their rounding).
struct dummy_encoding {
    int scale_exp = 0;        // quantized: block scales are 2^scale_exp (FP8: .. 2^(scale_exp + 2))
    double code_std = 0;      // quantized: std of the code table before rounding to codes (jitter 0)
    double expected_mean = 0;
    double expected_std = 0;
};

// Checks the descriptor and chooses the encoding; INVALID_ARGUMENT naming the tensor and the rule.
Result<dummy_encoding> dummy_encoding_for(const dummy_tensor_desc &d);

// Bytes of the window's codes / values and of its scale blocks (0 for unquantized formats): what
// the caller allocates.
struct dummy_window_bytes {
    uint64_t weight = 0, scale = 0;
};
Result<dummy_window_bytes> dummy_bytes(const dummy_tensor_desc &d);

// Fills the window of d: weight (dummy_bytes().weight bytes, 16-byte alignment makes the stores
// vector-wide) and, for quantized formats, scale (null otherwise). Device or host-mapped pointers.
//
// Cost: writes exactly dummy_bytes() and reads nothing; one 64-bit hash per 8 quantized elements
// (per element for BF16 / F32 / I64) plus a shared-memory table lookup per element, so on H200 the
// quantized fills are near the write-bandwidth roof (~4.8 TB/s), BF16 / F32 at a fraction of it
// (the hash per element); the test prints the measured GB/s.
Status fill_dummy(const dummy_tensor_desc &d, void *weight, void *scale, uint64_t seed, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
