// The fp64 tensor-core step (mma.sync f64, sm_80+) the exact-in-fp64 products of attention and
// the mHC projection use. Internal to backend/cuda: include only from .cu files.
#pragma once

namespace ds41rt::backend::cuda {

// One fp64 tensor-core step (sm_80+): d += a x b for an 8 x 8 x 4 tile. Per thread (g = lane / 4,
// t = lane % 4): a = A[g][t], b = B[t][g], d = D[g][2t], D[g][2t + 1]. The four products of a
// step are exact in fp64 (fp32 x fp32 needs 48 bits), so a step differs from the host's four
// sequential fmas only where their partial sums themselves round (never when the operands carry
// few significant bits, as the official numerics' quantized keys; a last-bit fp64 difference for
// arbitrary fp32).
__device__ __forceinline__ void dmma(double (&d)[2], double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(d[0]), "+d"(d[1])
                 : "d"(a), "d"(b));
}

// Two such steps sharing b (rows g of tile 0 and g + 8 of tile 1): one m16n8k4 on sm_90, whose
// rows are the same four-product steps, so the bits match the pair of m8n8k4.
__device__ __forceinline__ void dmma2(double (&d0)[2], double (&d1)[2], double a0, double a1, double b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+d"(d0[0]), "+d"(d0[1]), "+d"(d1[0]), "+d"(d1[1])
                 : "d"(a0), "d"(a1), "d"(b));
#else
    dmma(d0, a0, b);
    dmma(d1, a1, b);
#endif
}

}  // namespace ds41rt::backend::cuda
