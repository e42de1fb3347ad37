// The per-element arithmetic of the routed-expert decode around its GEMVs, shared by
// moe_decode.cu (routing as kernel parameters) and moe_routed.cu (routing in device memory) so
// both round at the same points, in the same order (backend/cpu swiglu_expert /
// nvfp4_w4a4_swiglu). Internal to backend/cuda: include only from .cu files.
#pragma once

#include <cuda_bf16.h>

namespace ds41rt::backend::cuda::moe_detail {

// Rounding points: REFERENCE none; OFFICIAL bf16 gate / up and h; NVFP4 (backend/cpu
// nvfp4_w4a4_swiglu) bf16 gate / up, bf16 silu and bf16 h.
enum numerics_mode { REFERENCE = 0, OFFICIAL = 1, NVFP4 = 2 };

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// h = silu(min(gate, L)) * clamp(up, -L, L) [* route weight], from the GEMVs' fp32 outputs.
template <int MODE>
__device__ __forceinline__ float swiglu_h(float g, float u, float limit, bool weight_before, float weight) {
    if (MODE != REFERENCE) g = round_bf16(g), u = round_bf16(u);
    if (limit > 0) {
        u = fminf(fmaxf(u, -limit), limit);
        g = fminf(g, limit);
    }
    float sg = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    if (MODE == NVFP4) sg = round_bf16(sg);
    float v = __fmul_rn(sg, u);
    if (weight_before) v = __fmul_rn(weight, v);
    return MODE != REFERENCE ? round_bf16(v) : v;
}

// One expert output's term of a row's sum: bf16 in official numerics, then [* route weight].
// Added with a separate __fadd_rn in increasing expert id (no FMA contraction).
template <bool OFFICIAL_OUT>
__device__ __forceinline__ float combine_term(float v, bool weight_after, float weight) {
    if (OFFICIAL_OUT) v = round_bf16(v);
    if (weight_after) v = __fmul_rn(v, weight);
    return v;
}

}  // namespace ds41rt::backend::cuda::moe_detail
