// Does a side branch in a decode step pay off the same in a CUDA graph as in eager streams? The
// engine forks small latency-bound kernels (mHC mixes, the KV row, the shared expert) onto a second
// stream beside the main chain; on the H200 (session 13) the eager step gained ~0.25 ms of 5.5 and
// the graphed step only ~0.08. This times a synthetic layer four ways, 32 layers a step:
//   main: A (1 block, 6 us) -> G (four blocks an SM, 30 us) -> C (1 block, 6 us) -> D (1 block, 6 us)
//   side: P, Q (1 block, 10 us each), forked after A and joined before D (or run on main: serial)
// (twice the engine's sizes, so that eager issue, ~2-3 us a launch, stays ahead of the GPU)
// each kernel launched with programmatic stream serialization (griddepcontrol.wait, then
// launch_dependents, at its top, as the engine's pdl_enter), eager and as a captured graph.
// Build and run on the device machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/graph_fork tools/device/graph_fork.cu && /tmp/graph_fork
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "launch_ex.cuh"

#define CHECK(x)                                                                 \
    do {                                                                         \
        cudaError_t e_ = (x);                                                    \
        if (e_ != cudaSuccess) {                                                 \
            std::printf("%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
            std::exit(1);                                                        \
        }                                                                        \
    } while (0)

// Waits for its predecessor, releases its dependent, then spins `ns` nanoseconds in every block.
__global__ void spin(long long ns, int *sink) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    if (threadIdx.x == 0) {
        long long t0 = 0, t = 0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        while (t - t0 < ns);
        if (t == 42) sink[blockIdx.x] = 1;  // never: keeps the loop
    }
    __syncthreads();
}

struct ctx {
    cudaStream_t main, side;
    cudaEvent_t fork_ev, join_ev;
    int *sink;
    int wave;
};

void launch(const ctx &c, cudaStream_t s, int blocks, long long ns, bool pdl) {
    CHECK(launch_ex(pdl, spin, dim3(blocks), dim3(128), 0, s, ns, c.sink));
}

void layer(const ctx &c, bool fork, bool pdl) {
    launch(c, c.main, 1, 6000, pdl);  // A
    cudaStream_t s = c.main;
    if (fork) {
        CHECK(cudaEventRecord(c.fork_ev, c.main));
        CHECK(cudaStreamWaitEvent(c.side, c.fork_ev, 0));
        s = c.side;
    }
    launch(c, s, 1, 10000, pdl);  // P
    launch(c, s, 1, 10000, pdl);  // Q
    launch(c, c.main, c.wave, 30000, pdl);  // G
    launch(c, c.main, 1, 6000, pdl);       // C
    if (fork) {
        CHECK(cudaEventRecord(c.join_ev, c.side));
        CHECK(cudaStreamWaitEvent(c.main, c.join_ev, 0));
    }
    launch(c, c.main, 1, 6000, pdl);  // D
}

double time_us(const ctx &c, bool fork, bool pdl, bool graph, int layers) {
    cudaGraphExec_t ge = nullptr;
    if (graph) {
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(c.main, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < layers; l++) layer(c, fork, pdl);
        CHECK(cudaStreamEndCapture(c.main, &g));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        CHECK(cudaGraphDestroy(g));
    }
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < 15; r++) {
        CHECK(cudaEventRecord(e0, c.main));
        if (graph) CHECK(cudaGraphLaunch(ge, c.main));
        else for (int l = 0; l < layers; l++) layer(c, fork, pdl);
        CHECK(cudaEventRecord(e1, c.main));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    if (ge) CHECK(cudaGraphExecDestroy(ge));
    return t[t.size() / 2] * 1e3 / layers;
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    ctx c;
    c.wave = 4 * prop.multiProcessorCount;
    CHECK(cudaMalloc(&c.sink, 1 << 16));
    CHECK(cudaStreamCreateWithFlags(&c.main, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&c.side, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&c.fork_ev, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&c.join_ev, cudaEventDisableTiming));
    const int L = 32;
    std::printf("kernels' own time a layer: serial 6 + 10 + 10 + 30 + 6 + 6 = 68 us; forked ideal 6 + 30 + 6 + 6 = 48 us\n");
    for (int pdl = 1; pdl >= 0; pdl--)
        for (int fork = 0; fork < 2; fork++)
            for (int graph = 0; graph < 2; graph++)
                std::printf("%-5s %-6s %-6s: %6.2f us a layer (median of 12 steps of %d layers)\n", pdl ? "PDL" : "plain",
                            fork ? "fork" : "serial", graph ? "graph" : "eager", time_us(c, fork, pdl, graph, L), L);
    return 0;
}
