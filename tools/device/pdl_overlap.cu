// What programmatic dependent launch could buy a decode step: a CUDA graph of pairs (a small
// dependent kernel, then a weight-streaming kernel with the decode GEMV's access pattern), timed
// per pair three ways:
//  - plain: stream order;
//  - pdl: each kernel launched with programmatic stream serialization; it triggers its dependents
//    at once and waits (griddepcontrol.wait) before touching its predecessor's output;
//  - pdl-prefetch: as pdl, and the streaming kernel issues its first ring stages (weights, which
//    no kernel writes) before the wait, so the weight stream's ramp overlaps the small kernel.
// Build and run on the device: nvcc -O3 -arch=sm_90a -o /tmp/pdl tools/device/pdl_overlap.cu && /tmp/pdl
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "launch_ex.cuh"
#include "weight_ring.cuh"

// ~`iters` dependent FMAs on one block: a norm- or rope-sized kernel.
template <bool PDL>
__global__ void small_kernel(float *buf, int iters) {
    if constexpr (PDL) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;");
    }
    float v = buf[threadIdx.x];
    for (int i = 0; i < iters; i++) v = v * 0.999f + 0.5f;
    buf[threadIdx.x] = v;
}

// MODE 0 plain, 1 pdl (wait first), 2 pdl with the first stages issued before the wait.
template <int MODE>
__global__ void __launch_bounds__(WARPS * 32) stream_kernel(const uint8_t *w, int N, int K, float *buf) {
    if constexpr (MODE > 0) asm volatile("griddepcontrol.launch_dependents;");
    if constexpr (MODE == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
    const int lane = threadIdx.x & 31, tile = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (tile * 16 >= N) {
        if constexpr (MODE == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
        return;
    }
    const uint32_t acc = stream_tile(
        K / CHUNK, [&](int r, int s, int col) { return w + size_t(tile * 16 + r) * K + size_t(s) * CHUNK + col; },
        [] {
            if constexpr (MODE == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
        });
    const float x = buf[lane];  // the predecessor's output
    if (acc == 0x12345678u) buf[256 + tile % 256] = x;
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    struct shape {
        const char *name;
        int N, K;
    } shapes[] = {{"wq_b 32768x1280", 32768, 1280}, {"shared w2 5120x2304", 5120, 2304}, {"wq_a+wkv 1792x5120", 1792, 5120}};
    const size_t max_bytes = size_t(32768) * 1280;
    const int copies = 4, pairs = 40;
    uint8_t *wbuf;
    float *buf;
    CK(cudaMalloc(&wbuf, max_bytes * copies));
    CK(cudaMalloc(&buf, 4096 * sizeof(float)));
    CK(cudaMemset(wbuf, 1, max_bytes * copies));
    CK(cudaMemset(buf, 0, 4096 * sizeof(float)));
    const int smem = RING_SMEM;
    CK(cudaFuncSetAttribute(stream_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(stream_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(stream_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::printf("device %s, %d SMs; per pair: small kernel (1 block) then the weight stream\n", prop.name,
                prop.multiProcessorCount);
    for (const shape &sh : shapes)
        for (int iters : {0, 2000}) {
            for (int mode = 0; mode < 4; mode++) {  // 3: the stream kernel alone (plain), for reference
                cudaGraph_t g;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int p = 0; p < pairs; p++) {
                    const uint8_t *w = wbuf + size_t(p % copies) * max_bytes;
                    const bool pdl = mode == 1 || mode == 2;
                    if (mode != 3)
                        CK(launch_ex(pdl, pdl ? small_kernel<true> : small_kernel<false>, dim3(1), dim3(256), 0, st, buf, iters));
                    const dim3 grid(unsigned((sh.N / 16 + WARPS - 1) / WARPS));
                    CK(launch_ex(pdl, mode == 1 ? stream_kernel<1> : mode == 2 ? stream_kernel<2> : stream_kernel<0>, grid,
                                 dim3(WARPS * 32), smem, st, w, sh.N, sh.K, buf));
                }
                CK(cudaStreamEndCapture(st, &g));
                cudaGraphExec_t ge;
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaStreamSynchronize(st));
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0), cudaEventCreate(&e1);
                std::vector<float> ts;
                for (int rep = 0; rep < 9; rep++) {
                    cudaEventRecord(e0, st);
                    CK(cudaGraphLaunch(ge, st));
                    cudaEventRecord(e1, st);
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    cudaEventElapsedTime(&ms, e0, e1);
                    ts.push_back(ms);
                }
                std::sort(ts.begin(), ts.end());
                static const char *names[] = {"plain", "pdl", "pdl-prefetch", "stream alone"};
                std::printf("%-22s small %4d iters  %-13s %7.2f us per pair\n", sh.name, iters, names[mode],
                            ts[ts.size() / 2] * 1e3 / pairs);
                cudaGraphExecDestroy(ge);
                cudaGraphDestroy(g);
            }
        }
    return 0;
}
