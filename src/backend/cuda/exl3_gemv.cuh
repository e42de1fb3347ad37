// Decode GEMV over EXL3 (exllamav3 trellis) linears, decoded on the fly (no resident fp16 copy):
// y[m, :] = ((x[m, :] . diag(suh)) H) What H . diag(svh) for 1..16 rows, the layer exllamav3's
// LinearEXL3 computes (spec quant-formats 2.5), with What decoded from the trellis tiles inside
// the kernel. Several linears go into one launch (the selected experts' projections of a layer).
//
// Matches backend/cpu exl3_linear on the CPU-decoded What (model::exl3_decode) within 1e-4
// relative (Frobenius); the decoded tiles themselves are bit-exact (exl3_decode_what).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/device_info.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// exllamav3's codebook numbering (model::exl3_codebook has the same values; the backend does not
// see the model room).
enum class exl3_cb { INST3 = 0, MCG = 1, MUL1 = 2 };

struct exl3_matrix {
    const uint16_t *trellis = nullptr;  // [in/16, out/16, 16 k] int16 as stored; 4-byte aligned
    const uint16_t *suh = nullptr;      // [in] fp16 bits
    const uint16_t *svh = nullptr;      // [out] fp16 bits
    int in = 0, out = 0;                // multiples of 128 (the Hadamard block)
    int k = 2;                          // trellis bits per weight, 1..8
    exl3_cb cb = exl3_cb::MCG;
    const float *x = nullptr;           // [M, in]; |x . suh| H / sqrt(128) < 65504 (fp16 range)
    float *y = nullptr;                 // [M, out]; must not alias x
    int M = 1;                          // 1..16
};

// The launch shape of one batch, computed once per shape (graph replays reuse it): K slices per
// 128-output block and where each matrix's rotated x lives in the workspace (matrices with the
// same x and suh share one).
struct exl3_plan {
    std::vector<exl3_matrix> mats;
    std::vector<int> ksplit;        // K slices (in units of 16-row tiles) per 128-output block
    std::vector<size_t> x_offset;   // rotated x per matrix, in the workspace
    size_t workspace_bytes = 0;
};

Result<exl3_plan> plan_exl3_gemv(const device_info &dev, const std::vector<exl3_matrix> &mats);

// workspace: workspace_bytes of device memory, zeroed once when allocated (the block counters
// return to zero after every run, so replays need no memset). Graph-replayable.
Status run_exl3_gemv(const exl3_plan &plan, void *workspace, cudaStream_t stream);

// What[in, out] as fp16 bits, decoded by the GEMV's own tile decoder (no rotations): the
// bit-exact check of the decode, and the reconstruct step of a future prefill path.
Status exl3_decode_what(const uint16_t *trellis, int in, int out, int k, exl3_cb cb, uint16_t *what,
                        cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
