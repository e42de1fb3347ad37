// The tile geometry of gemm_fp8.cu and where each lane's ldmatrix rows and accumulator elements
// sit, as plain functions shared by the kernel and a host emulation of the mma fragment layouts
// (tests/unit/gemm_fp8_layout_test.cpp), so the mapping is checked on a machine without a GPU.
#pragma once

#if defined(__CUDACC__)
#define DS41RT_HD __host__ __device__ __forceinline__
#else
#define DS41RT_HD inline
#endif

namespace ds41rt::backend::cuda::gemm_fp8_layout {

// Block tile BM x BN outputs over BK k per pipeline stage; 8 warps of WM x WN outputs each.
constexpr int BM = 128, BN = 256, BK = 128;
constexpr int WM = 64, WN = 64, WARPS_M = BM / WM, WARPS_N = BN / WN, THREADS = 32 * WARPS_M * WARPS_N;
constexpr int MT = WM / 16, NT = WN / 8;  // m16n8k32 tiles per warp
constexpr int KB = BK / 32;                // 32-k scale blocks per stage
// Shared-memory row pitch of both operand tiles: 144 bytes = 36 words, so the 8 rows of one
// ldmatrix phase start 4 words apart and their 16-byte reads hit 8 disjoint bank quads.
constexpr int PITCH = BK + 16;

// Byte offset in the A (activation) tile of the 16-byte row that `lane` addresses for
// ldmatrix.x4 of m tile mt, k block kb: matrices 0..3 = (rows 0-7, k 0-15), (rows 8-15, k 0-15),
// (rows 0-7, k 16-31), (rows 8-15, k 16-31), which land in a0..a3 of m16n8k32's A fragment.
DS41RT_HD int a_ldsm_offset(int wm, int mt, int kb, int lane) {
    return (wm * WM + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PITCH + kb * 32 + (lane >> 4) * 16;
}
// Byte offset in the B (weight, [n][k]) tile for ldmatrix.x4 of n tiles 2p, 2p + 1: matrices
// (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31) = b0, b1 of n tile 2p,
// then b0, b1 of n tile 2p + 1.
DS41RT_HD int b_ldsm_offset(int wn, int p, int kb, int lane) {
    return (wn * WN + p * 16 + (lane & 7) + (lane >> 4) * 8) * PITCH + kb * 32 + ((lane >> 3) & 1) * 16;
}
// Tile row (m) and column (n) of accumulator element e (0..3) of m tile mt, n tile nt in `lane`.
DS41RT_HD int c_row(int wm, int mt, int lane, int e) { return wm * WM + mt * 16 + (lane >> 2) + (e >> 1) * 8; }
DS41RT_HD int c_col(int wn, int nt, int lane, int e) { return wn * WN + nt * 8 + 2 * (lane & 3) + (e & 1); }

}  // namespace ds41rt::backend::cuda::gemm_fp8_layout

#undef DS41RT_HD
