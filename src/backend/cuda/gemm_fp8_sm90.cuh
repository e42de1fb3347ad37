// The prefill GEMM's Hopper path (sm_90a): the same contract and numerics as run_gemm_fp8's
// mma.sync kernel (gemm_fp8.cuh), on warpgroup MMA. Chosen by run_gemm_fp8 when this build has
// sm_90a code and the device is compute capability 9.0.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/device_info.h"
#include "backend/cuda/gemm_fp8.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda::gemm_fp8_sm90 {

// True when the kernel can run here: sm_90a code in this build and a cc 9.0 device with the
// shared memory it needs; with `by_default`, also DS41RT_GEMM_WGMMA not set to 0 (the switch an
// A/B run uses to give AUTO the mma.sync kernel).
bool usable(const device_info &dev, bool by_default);

// True when the kernel takes this shape: FP8 scale blocks powers of two, every weight under 2^31
// bytes (its offsets are 32-bit).
bool fits(const gemm_fp8_grouped_args &a);

// Workspace bytes run() needs for `a` (a checked shape).
size_t workspace_bytes(const gemm_fp8_grouped_args &a);

// `a` already checked; workspace 256-byte aligned, workspace_bytes(a) long.
Status run(const gemm_fp8_grouped_args &a, void *workspace, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda::gemm_fp8_sm90
