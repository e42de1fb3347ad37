// What one more kernel in a decode graph costs when it does (almost) nothing: a chain of N
// dependent launches captured in a CUDA graph, replayed, time per launch. Variants: plain
// stream order, and programmatic dependent launch (each kernel waits with griddepcontrol.wait
// at its top and releases its dependent at once), for 1 block and for a full wave of blocks.
// The decode step has ~45 launches a layer, so this per-launch floor bounds what fusing kernels
// (or PDL) can save. Build and run on the device machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/launch_gap tools/device/launch_gap.cu && /tmp/launch_gap
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "launch_ex.cuh"

#define CHECK(x)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                           \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

// Each launch reads and writes one word per block, so a launch depends on the last one's data.
template <bool PDL>
__global__ void step_kernel(float *buf) {
    if constexpr (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) buf[blockIdx.x] = buf[blockIdx.x] * 0.5f + 1.0f;
    if constexpr (PDL) asm volatile("griddepcontrol.launch_dependents;");
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    float *buf;
    CHECK(cudaMalloc(&buf, 1 << 20));
    CHECK(cudaMemset(buf, 0, 1 << 20));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int N = 1000;
    for (int blocks : {1, prop.multiProcessorCount, 4 * prop.multiProcessorCount})
        for (int pdl = 0; pdl < 2; pdl++) {
            cudaGraph_t g;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < N; i++) {
                CHECK(launch_ex(pdl, pdl ? step_kernel<true> : step_kernel<false>, dim3(blocks), dim3(128), 0, s, buf));
            }
            CHECK(cudaStreamEndCapture(s, &g));
            cudaGraphExec_t ge;
            CHECK(cudaGraphInstantiate(&ge, g, 0));
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            std::vector<float> t;
            for (int r = 0; r < 12; r++) {
                cudaEventRecord(e0, s);
                CHECK(cudaGraphLaunch(ge, s));
                cudaEventRecord(e1, s);
                CHECK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r >= 2) t.push_back(ms);
            }
            std::sort(t.begin(), t.end());
            std::printf("%s, %4d blocks of 128 threads: %.2f us per launch (median of %zu replays of %d)\n",
                        pdl ? "PDL  " : "plain", blocks, t[t.size() / 2] * 1e3 / N, t.size(), N);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
    return 0;
}
