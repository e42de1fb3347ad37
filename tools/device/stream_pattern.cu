// How fast can the decode GEMV's weight access pattern stream from HBM, with no arithmetic?
// Reads a [N, K]-byte matrix (copies rotated past L2) four ways and prints GB/s:
//  - seq: grid-stride 16-byte loads over the whole buffer (the read-only ceiling);
//  - tile: the GEMV's pattern (weight_ring.cuh), rows at stride K;
//  - tile-contig: the same ring, but each stage's 16 x CHUNK bytes contiguous (weights repacked
//    tile-major), so a stage is one 2 KB run of DRAM;
//  - tile-ldg: the GEMV pattern with plain 16-byte loads into registers, two stages in flight.
// Build and run on the device: nvcc -O3 -arch=sm_90a -o /tmp/sp tools/device/stream_pattern.cu && /tmp/sp
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "weight_ring.cuh"

__global__ void seq_kernel(const uint4 *p, size_t n, uint32_t *out) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

// CONTIG: stage s of tile t at w + (t * nstage + s) * 16 * CHUNK (row r at r * CHUNK in it).
template <bool CONTIG>
__global__ void __launch_bounds__(WARPS * 32) tile_kernel(const uint8_t *w, int N, int K, uint32_t *out) {
    const int tile = blockIdx.x * WARPS + (threadIdx.x >> 5), nstage = K / CHUNK;
    if (tile * 16 >= N) return;
    const uint32_t acc = stream_tile(
        nstage,
        [&](int r, int s, int col) {
            return CONTIG ? w + (size_t(tile) * nstage + s) * 16 * CHUNK + r * CHUNK + col
                          : w + size_t(tile * 16 + r) * K + size_t(s) * CHUNK + col;
        },
        [] {});
    if (acc == 0x12345678u) out[tile] = acc;
}

// Plain loads: lane covers 16 bytes of rows row0 + RPC * i; two stages held in registers.
__global__ void __launch_bounds__(WARPS * 32) tile_ldg_kernel(const uint8_t *w, int N, int K, uint32_t *out) {
    const int lane = threadIdx.x & 31, tile = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (tile * 16 >= N) return;
    constexpr int LPR = CHUNK / 16, RPC = 32 / LPR, COPIES = 16 / RPC;
    const int col = (lane % LPR) * 16, row0 = lane / LPR, nstage = K / CHUNK;
    uint4 buf[2][COPIES];
    auto load = [&](int s, uint4 (&b)[COPIES]) {
#pragma unroll
        for (int i = 0; i < COPIES; i++)
            b[i] = s < nstage ? __ldcs(reinterpret_cast<const uint4 *>(w + size_t(tile * 16 + row0 + RPC * i) * K + size_t(s) * CHUNK + col))
                              : make_uint4(0, 0, 0, 0);
    };
    load(0, buf[0]);
    load(1, buf[1]);
    uint32_t acc = 0;
    for (int s = 0; s < nstage; s += 2) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int i = 0; i < COPIES; i++) acc ^= buf[h][i].x ^ buf[h][i].y ^ buf[h][i].z ^ buf[h][i].w;
            load(s + 2 + h, buf[h]);
        }
    }
    if (acc == 0x12345678u) out[tile] = acc;
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    struct shape {
        const char *name;
        int N, K;
    } shapes[] = {{"wq_b 32768x1280", 32768, 1280}, {"6 experts w1+w3 27648x2560", 27648, 2560},
                  {"wo_b 5120x8192", 5120, 8192}, {"6 experts w2 30720x1152", 30720, 1152}};
    const size_t max_bytes = size_t(27648) * 2560;
    const int copies = 4;
    uint8_t *buf;
    uint32_t *out;
    CK(cudaMalloc(&buf, max_bytes * copies));
    CK(cudaMalloc(&out, 1 << 20));
    CK(cudaMemset(buf, 1, max_bytes * copies));
    const int smem = RING_SMEM;
    CK(cudaFuncSetAttribute(tile_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(tile_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    for (const shape &sh : shapes) {
        const size_t bytes = size_t(sh.N) * sh.K;
        for (int mode = 0; mode < 4; mode++) {
            auto launch = [&](int c) {
                const uint8_t *w = buf + size_t(c) * max_bytes;
                const int blocks = (sh.N / 16 + WARPS - 1) / WARPS;
                if (mode == 0) seq_kernel<<<prop.multiProcessorCount * 8, 512>>>(reinterpret_cast<const uint4 *>(w), bytes / 16, out);
                else if (mode == 1) tile_kernel<false><<<blocks, WARPS * 32, smem>>>(w, sh.N, sh.K, out);
                else if (mode == 2) tile_kernel<true><<<blocks, WARPS * 32, smem>>>(w, sh.N, sh.K, out);
                else tile_ldg_kernel<<<blocks, WARPS * 32>>>(w, sh.N, sh.K, out);
            };
            for (int c = 0; c < copies; c++) launch(c);
            CK(cudaDeviceSynchronize());
            std::vector<float> ts;
            for (int rep = 0; rep < 20; rep++) {
                cudaEventRecord(e0);
                launch(rep % copies);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                ts.push_back(ms);
            }
            CK(cudaGetLastError());
            std::sort(ts.begin(), ts.end());
            const double us = ts[ts.size() / 2] * 1e3;
            static const char *names[] = {"seq", "tile", "tile-contig", "tile-ldg"};
            std::printf("%-28s %-12s %8.2f us  %7.0f GB/s\n", sh.name, names[mode], us, bytes / us / 1e3);
        }
    }
    return 0;
}
