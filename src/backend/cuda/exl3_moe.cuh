// The routed experts of one EXL3 layer (exllamav3 trellis, issue 6) on the GPU for S rows, from
// a route table on the host (EXL3 layers plan on the host at every size, so they are not part of
// the decode CUDA graphs).
//
// The numerics are the CPU engine's for EXL3 experts: it dequantizes them to fp32 (model/weights)
// and runs backend/cpu swiglu_expert with the routed class (lin::FP4), so here, per expert:
// OFFICIAL fake-quantizes x to FP8 per act_block, w1 / w3, gate and up rounded to bf16 (OFFICIAL),
// the clamped SwiGLU with the route weight before the bf16 rounding of h, h fake-quantized,
// w2, its output rounded to bf16 and, with weight_after_w2, scaled; each row's outputs added in
// increasing expert id into an fp32 accumulator (backend/cpu routed_expert_sum's order).
// Every step but the products is the same op as the CPU's, bit for bit.
//
// The products are backend/cuda exl3_gemv (the trellis decoded in the kernel, no fp32 copy of
// W), the CPU's a fp32 matmul on W dequantized in fp64. Expected distance per product: the
// kernel's x in fp16 hi + lo (22 significant bits) and the fp32 tensor-core accumulation, so
// ~1e-6 relative (Frobenius), within the kernel test's 1e-4 bound (tests/cuda/exl3_gemv_test);
// in OFFICIAL numerics a bf16 or FP8 rounding boundary crossed now and then turns that into one
// bf16 ulp of an element. These steps emulated on the CPU with backend/cpu exl3_linear (fp64) for
// the products, on tests/unit/quantized_model.h's layer 1 (40 rows): 8.8e-8 relative to
// routed_expert_sum in TRANSFORMERS, bit-identical in OFFICIAL (a one-off check, 2026-11-30).
//
// Used by the GPU engine's EXL3 layers (engine/cuda v41_gpu) and by GPU expert workers holding
// EXL3 TP slices (dist/cuda gpu_experts), each with its own scratch memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cpu/routed.h"
#include "backend/cpu/swiglu.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/exl3_gemv.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// One EXL3 linear on the device as stored: trellis [in/16, out/16, 16 k] int16, suh [in] and
// svh [out] fp16 bits (exl3_matrix's operands, without x and y).
struct exl3_linear_dev {
    int64_t in = 0, out = 0;
    int k = 0;
    exl3_cb cb = exl3_cb::MCG;
    const uint16_t *trellis = nullptr, *suh = nullptr, *svh = nullptr;
};

// One expert's three linears; w1.trellis == nullptr: not held.
struct exl3_expert_dev {
    exl3_linear_dev w1, w2, w3;
};

// Device memory of `bytes` for the work one call enqueues on its stream: it must stay valid
// until that work has run (a stream-ordered allocator, or memory freed after a synchronisation).
using exl3_scratch = std::function<Result<void *>(size_t bytes)>;

// acc[S, D] (device, fp32, unrounded) = for each row of rt, the sum over its routes of the
// expert's output on x[row] (device [S, D]), in increasing expert id. nm: the CPU engine's
// numerics for routed experts (kind is not read: EXL3 experts are the routed class).
// INVALID_ARGUMENT when a route names an expert not held (or one expert twice for a row) or the
// shapes do not fit D.
// Synchronises nothing itself (the route table is already on the host; the uploads of its ids
// and weights are from pageable memory, copied before the call returns).
Status exl3_routed_sum(const device_info &dev, const std::vector<exl3_expert_dev> &experts,
                       const cpu::expert_numerics &nm, const float *x, int64_t D, const cpu::route_table &rt,
                       float *acc, const exl3_scratch &scratch, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
