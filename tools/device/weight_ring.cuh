// The decode GEMV's weight access pattern (src/backend/cuda/gemv_kernel.cuh) with no arithmetic,
// and the error check, for the device probes (stream_pattern.cu, pdl_overlap.cu): a warp per 16-row
// tile, each stage 16 rows x CHUNK bytes through a STAGES-deep cp.async ring in shared memory, each
// lane then reading its 8 bytes per row pair from shared memory as the MMA fragments do.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

// A probe's main() returns 1 with the failing call's file, line and error.
#define CK(x)                                                                      \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                              \
        }                                                                          \
    } while (0)

constexpr int WARPS = 4, CHUNK = 128, STAGES = 3, PITCH = CHUNK + 32;
constexpr int RING_SMEM = WARPS * STAGES * 16 * PITCH;  // dynamic shared bytes of a 4-warp block

__device__ __forceinline__ void cp16(void *dst, const void *src) {
    const unsigned d = unsigned(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}

// Streams nstage stages of this warp's tile: src(r, s, col) is the address of row r's 16 bytes at
// column col of stage s. mid() runs once the first STAGES - 1 stages are on their way (a PDL
// wait). Returns an XOR of every byte word read, so nothing is optimized away.
template <class Src, class Mid>
__device__ __forceinline__ uint32_t stream_tile(int nstage, Src src, Mid mid) {
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31;
    uint8_t *ring = smem + (threadIdx.x >> 5) * STAGES * 16 * PITCH;
    constexpr int LPR = CHUNK / 16, RPC = 32 / LPR, COPIES = 16 / RPC;
    const int col = (lane % LPR) * 16, row0 = lane / LPR;
    auto issue = [&](int s) {
        if (s < nstage) {
            uint8_t *dst = ring + (s % STAGES) * 16 * PITCH + row0 * PITCH + col;
#pragma unroll
            for (int i = 0; i < COPIES; i++) cp16(dst + RPC * i * PITCH, src(row0 + RPC * i, s, col));
        }
        asm volatile("cp.async.commit_group;");
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) issue(s);
    mid();
    uint32_t acc = 0;
    const int g = lane >> 2, q = lane & 3;
    for (int s = 0; s < nstage; s++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncwarp();
        const uint8_t *st = ring + (s % STAGES) * 16 * PITCH;
#pragma unroll
        for (int u = 0; u < CHUNK / 32; u++) {
            const uint2 a = *reinterpret_cast<const uint2 *>(st + g * PITCH + u * 32 + 8 * q);
            const uint2 b = *reinterpret_cast<const uint2 *>(st + (g + 8) * PITCH + u * 32 + 8 * q);
            acc ^= a.x ^ a.y ^ b.x ^ b.y;
        }
        __syncwarp();
        issue(s + STAGES - 1);
    }
    asm volatile("cp.async.wait_group 0;");
    return acc;
}
