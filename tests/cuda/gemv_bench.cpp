// GPU decode GEMV benchmark: achieved weight-streaming bandwidth at V4.1 / V4 decode shapes, as
// a fraction of the device-to-device copy rate measured in the same run.
//
// Usage: ds41rt_cuda_bench OUT_DIR   (writes OUT_DIR/gemv.json and OUT_DIR/gemv.md)
// Method: several copies of each weight rotate so a repeat never finds its weight in L2 (decode
// streams every weight once per token); the launches over all copies are captured in one CUDA
// graph (as the decode step will be) and its replays timed with CUDA events, warm-up first,
// median of the repeats, divided by the number of launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/gemv.cuh"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));             \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

namespace {

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double copy_bandwidth() {
    const size_t n = size_t(2) << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    CHECK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    for (int i = 0; i < 12; i++) {
        cudaEventRecord(e0);
        CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
        cudaEventRecord(e1);
        CHECK(cudaEventSynchronize(e1));
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 2) ms.push_back(t);
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(n) / (median(ms) * 1e-3);
}

struct result {
    std::string name, format;
    int M, N, K;
    double bytes, us, gbps, frac;
};

result bench(const cuda::device_info &dev, const std::string &name, bool fp4, int M, int N, int K, int block,
             double copy_bw) {
    auto q = fp4 ? testing_util::random_mxfp4(N, K, 1) : testing_util::random_fp8_block(N, K, block, block, 1);
    const size_t wbytes = q.w.size(), sbytes = q.scale.size();
    // Enough copies that the rotation exceeds L2 several times over.
    const int copies = int(std::max<size_t>(2, size_t(4 * dev.l2_bytes) / (wbytes + sbytes) + 1));
    std::vector<uint8_t *> w(static_cast<size_t>(copies)), s(static_cast<size_t>(copies));
    for (int i = 0; i < copies; i++) {
        CHECK(cudaMalloc(&w[size_t(i)], wbytes));
        CHECK(cudaMalloc(&s[size_t(i)], sbytes));
        CHECK(cudaMemcpy(w[size_t(i)], q.w.data(), wbytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(s[size_t(i)], q.scale.data(), sbytes, cudaMemcpyHostToDevice));
    }
    auto x = testing_util::random_normal(size_t(M) * K, 2);
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, x.size() * 4));
    CHECK(cudaMalloc(&dy, size_t(M) * N * 4));
    CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    // The decode step runs as a CUDA graph, so time graph replays: host launch cost stays out.
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < copies; i++) {
        cuda::gemv_params p;
        p.w = w[size_t(i)], p.scale = s[size_t(i)], p.x = dx, p.y = dy;
        p.M = M, p.N = N, p.K = K, p.block_out = block, p.block_in = block;
        Status st = fp4 ? cuda::gemv_mxfp4(dev, p, stream) : cuda::gemv_fp8_block(dev, p, stream);
        if (!st.is_ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), st.to_string().c_str());
            std::exit(1);
        }
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    const int reps = 40;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, stream);
        CHECK(cudaGraphLaunch(exec, stream));
        cudaEventRecord(e1, stream);
        CHECK(cudaEventSynchronize(e1));
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (r >= 5) ms.push_back(t / float(copies));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    for (int i = 0; i < copies; i++) {
        cudaFree(w[size_t(i)]);
        cudaFree(s[size_t(i)]);
    }
    cudaFree(dx);
    cudaFree(dy);
    result res;
    res.name = name, res.format = fp4 ? "MXFP4" : ("FP8 " + std::to_string(block) + "x" + std::to_string(block));
    res.M = M, res.N = N, res.K = K;
    res.bytes = double(wbytes + sbytes) + 4.0 * M * K + 4.0 * M * N;
    res.us = median(ms) * 1e3;
    res.gbps = res.bytes / (res.us * 1e-6) / 1e9;
    res.frac = res.bytes / (res.us * 1e-6) / copy_bw;
    return res;
}

}  // namespace

int main(int argc, char **argv) {
    const std::string out = argc > 1 ? argv[1] : ".";
    auto d = cuda::query_device();
    if (!d) {
        std::fprintf(stderr, "%s\n", d.status().to_string().c_str());
        return 1;
    }
    const cuda::device_info dev = d.value();
    const double copy_bw = copy_bandwidth();
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    std::vector<result> rs;
    for (int M : {1, 4}) {
        rs.push_back(bench(dev, "v41 attn.wq_a", false, M, 1280, 5120, 32, copy_bw));
        rs.push_back(bench(dev, "v41 attn.wq_b", false, M, 32768, 1280, 32, copy_bw));
        rs.push_back(bench(dev, "v41 attn.wkv", false, M, 512, 5120, 32, copy_bw));
        rs.push_back(bench(dev, "v41 attn.wo_b", false, M, 5120, 8192, 32, copy_bw));
        rs.push_back(bench(dev, "v41 shared w1", false, M, 2304, 5120, 32, copy_bw));
        rs.push_back(bench(dev, "v41 shared w2", false, M, 5120, 2304, 32, copy_bw));
        rs.push_back(bench(dev, "v41 expert w1", true, M, 2304, 5120, 32, copy_bw));
        rs.push_back(bench(dev, "v41 expert w2", true, M, 5120, 2304, 32, copy_bw));
        rs.push_back(bench(dev, "v4 attn.wq_b", false, M, 32768, 1024, 128, copy_bw));
        rs.push_back(bench(dev, "v4 expert w1", true, M, 2048, 4096, 32, copy_bw));
    }
    FILE *js = std::fopen((out + "/gemv.json").c_str(), "w");
    FILE *md = std::fopen((out + "/gemv.md").c_str(), "w");
    std::fprintf(js, "{\"device\": \"%s\", \"sm_count\": %d, \"l2_bytes\": %lld, \"driver\": %d, \"runtime\": %d,\n"
                     " \"copy_bandwidth_bytes_per_s\": %.4g, \"results\": [\n",
                 dev.name.c_str(), dev.sm_count, (long long)dev.l2_bytes, driver, runtime, copy_bw);
    std::fprintf(md, "device %s (%d SMs), driver %d, runtime %d; measured D2D copy %.0f GB/s (read+write)\n\n"
                     "| kernel | format | M | N | K | bytes | us | GB/s | of copy bw |\n|---|---|---|---|---|---|---|---|---|\n",
                 dev.name.c_str(), dev.sm_count, driver, runtime, copy_bw / 1e9);
    for (size_t i = 0; i < rs.size(); i++) {
        const result &r = rs[i];
        std::fprintf(js, "  {\"name\": \"%s\", \"format\": \"%s\", \"M\": %d, \"N\": %d, \"K\": %d, \"bytes\": %.0f, "
                         "\"us\": %.3f, \"gbps\": %.1f, \"fraction_of_copy\": %.3f}%s\n",
                     r.name.c_str(), r.format.c_str(), r.M, r.N, r.K, r.bytes, r.us, r.gbps, r.frac,
                     i + 1 < rs.size() ? "," : "");
        std::fprintf(md, "| %s | %s | %d | %d | %d | %.0f | %.2f | %.0f | %.0f%% |\n", r.name.c_str(), r.format.c_str(),
                     r.M, r.N, r.K, r.bytes, r.us, r.gbps, 100 * r.frac);
        std::printf("%-16s %-12s M%d %6dx%-6d %8.2f us %6.0f GB/s %4.0f%%\n", r.name.c_str(), r.format.c_str(), r.M, r.N,
                    r.K, r.us, r.gbps, 100 * r.frac);
    }
    std::fprintf(js, "]}\n");
    std::fclose(js);
    std::fclose(md);
    std::printf("copy bandwidth %.0f GB/s\n", copy_bw / 1e9);
    return 0;
}
