// GPU decode GEMV benchmark: achieved weight-streaming bandwidth at V4.1 / V4 decode shapes, as
// a fraction of the device-to-device copy rate measured in the same run.
//
// Usage: ds41rt_cuda_bench OUT_DIR [quick]   (writes OUT_DIR/gemv.json and OUT_DIR/gemv.md;
// quick: official numerics at M = 1 and 16 only, for comparing kernel variants)
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

struct mat_spec {
    bool fp4;
    int N, K, block;
    int act_block = 0;  // official numerics when non-zero
};

struct result {
    std::string name, format;
    int M, N, K, mats;
    double bytes, us, gbps, frac;
};

// Times one launch over `specs` (matrices sharing nothing but the launch), M tokens each.
result bench(const cuda::device_info &dev, const std::string &name, const std::vector<mat_spec> &specs, int M,
             double copy_bw) {
    std::vector<testing_util::quant_weight> qs;
    size_t set_bytes = 0;
    for (const mat_spec &m : specs) {
        qs.push_back(m.fp4 ? testing_util::random_mxfp4(m.N, m.K, 1) : testing_util::random_fp8_block(m.N, m.K, m.block, m.block, 1));
        set_bytes += qs.back().w.size() + qs.back().scale.size();
    }
    // Enough copies of the whole set that the rotation exceeds L2 several times over.
    const int copies = int(std::max<size_t>(2, size_t(4 * dev.l2_bytes) / set_bytes + 1));
    int maxK = 0, sumN = 0;
    for (const mat_spec &m : specs) maxK = std::max(maxK, m.K), sumN += m.N;
    auto x = testing_util::random_normal(size_t(M) * maxK, 2);
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, x.size() * 4));
    CHECK(cudaMalloc(&dy, size_t(M) * sumN * 4));
    CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    std::vector<void *> allocs;
    std::vector<cuda::gemv_plan> plans;
    size_t ws_bytes = 1;
    for (int c = 0; c < copies; c++) {
        std::vector<cuda::gemv_matrix> mats;
        int ycol = 0;
        for (size_t i = 0; i < specs.size(); i++) {
            uint8_t *w, *s;
            CHECK(cudaMalloc(&w, qs[i].w.size()));
            CHECK(cudaMalloc(&s, qs[i].scale.size()));
            CHECK(cudaMemcpy(w, qs[i].w.data(), qs[i].w.size(), cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(s, qs[i].scale.data(), qs[i].scale.size(), cudaMemcpyHostToDevice));
            allocs.push_back(w), allocs.push_back(s);
            cuda::gemv_matrix m;
            m.w = w, m.scale = s, m.fp4 = specs[i].fp4, m.block_out = m.block_in = specs[i].block;
            m.N = specs[i].N, m.K = specs[i].K, m.M = M, m.x = dx, m.y = dy + size_t(M) * ycol;
            m.act_block = specs[i].act_block;
            ycol += specs[i].N;
            mats.push_back(m);
        }
        auto plan = cuda::plan_gemv(dev, mats);
        if (!plan.is_ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), plan.status().to_string().c_str());
            std::exit(1);
        }
        ws_bytes = std::max(ws_bytes, plan->workspace_bytes);
        plans.push_back(std::move(plan.value()));
    }
    // Each copy gets its own workspace: the graph's launches may not share split-K counters.
    std::vector<void *> ws(static_cast<size_t>(copies));
    for (auto &p : ws) {
        CHECK(cudaMalloc(&p, ws_bytes));
        CHECK(cudaMemset(p, 0, ws_bytes));
    }
    // The decode step runs as a CUDA graph, so time graph replays: host launch cost stays out.
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < copies; c++) {
        Status st = cuda::run_gemv(plans[size_t(c)], ws[size_t(c)], stream);
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
    for (void *p : allocs) cudaFree(p);
    for (void *p : ws) cudaFree(p);
    cudaFree(dx);
    cudaFree(dy);
    result res;
    res.name = name;
    res.format = specs[0].fp4 ? "MXFP4" : ("FP8 " + std::to_string(specs[0].block) + "x" + std::to_string(specs[0].block));
    res.format += specs[0].act_block ? " xFP8" : " xF32";
    res.M = M, res.N = sumN, res.K = maxK, res.mats = int(specs.size());
    res.bytes = double(set_bytes) + 4.0 * M * maxK + 4.0 * M * sumN;
    res.us = median(ms) * 1e3;
    res.gbps = res.bytes / (res.us * 1e-6) / 1e9;
    res.frac = res.bytes / (res.us * 1e-6) / copy_bw;
    return res;
}

std::vector<mat_spec> repeat(const mat_spec &m, int n) { return std::vector<mat_spec>(static_cast<size_t>(n), m); }

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
    // xF32: reference numerics (fp32 x through fp16 hi + lo). xFP8: official numerics (x quantized
    // to E4M3 per 32 / 128 channels, the production path).
    const bool quick = argc > 2 && std::string(argv[2]) == "quick";
    for (int act : {32, 0}) {
        if (quick && act == 0) continue;
        const int act4 = act ? 128 : 0;  // V4's activation blocks
        const mat_spec wq_a{false, 1280, 5120, 32, act}, wq_b{false, 32768, 1280, 32, act}, wkv{false, 512, 5120, 32, act},
            wo_b{false, 5120, 8192, 32, act}, sh_w1{false, 2304, 5120, 32, act}, sh_w2{false, 5120, 2304, 32, act},
            ex_w1{true, 2304, 5120, 32, act}, ex_w2{true, 5120, 2304, 32, act}, v4_wq_b{false, 32768, 1024, 128, act4},
            v4_ex_w1{true, 2048, 4096, 32, act4};
        for (int M : {1, 4, 16}) {
            if ((act == 0 || quick) && M == 4) continue;
            rs.push_back(bench(dev, "v41 attn.wq_a", {wq_a}, M, copy_bw));
            rs.push_back(bench(dev, "v41 attn.wq_b", {wq_b}, M, copy_bw));
            rs.push_back(bench(dev, "v41 attn.wkv", {wkv}, M, copy_bw));
            rs.push_back(bench(dev, "v41 attn.wo_b", {wo_b}, M, copy_bw));
            rs.push_back(bench(dev, "v41 shared w2", {sh_w2}, M, copy_bw));
            rs.push_back(bench(dev, "v41 expert w1", {ex_w1}, M, copy_bw));
            rs.push_back(bench(dev, "v4 attn.wq_b", {v4_wq_b}, M, copy_bw));
            rs.push_back(bench(dev, "v4 expert w1", {v4_ex_w1}, M, copy_bw));
            // Fused launches as the decode step issues them.
            rs.push_back(bench(dev, "v41 wq_a+wkv", {wq_a, wkv}, M, copy_bw));
            rs.push_back(bench(dev, "v41 shared w1+w3", {sh_w1, sh_w1}, M, copy_bw));
            rs.push_back(bench(dev, "v41 6 experts w1+w3", repeat(ex_w1, 12), M, copy_bw));
            rs.push_back(bench(dev, "v41 6 experts w2", repeat(ex_w2, 6), M, copy_bw));
        }
    }
    FILE *js = std::fopen((out + "/gemv.json").c_str(), "w");
    FILE *md = std::fopen((out + "/gemv.md").c_str(), "w");
    std::fprintf(js, "{\"device\": \"%s\", \"sm_count\": %d, \"l2_bytes\": %lld, \"driver\": %d, \"runtime\": %d,\n"
                     " \"copy_bandwidth_bytes_per_s\": %.4g, \"results\": [\n",
                 dev.name.c_str(), dev.sm_count, (long long)dev.l2_bytes, driver, runtime, copy_bw);
    std::fprintf(md, "device %s (%d SMs), driver %d, runtime %d; measured D2D copy %.0f GB/s (read+write)\n\n"
                     "| kernel | format | matrices | M | N (sum) | K | bytes | us | GB/s | of copy bw |\n|---|---|---|---|---|---|---|---|---|---|\n",
                 dev.name.c_str(), dev.sm_count, driver, runtime, copy_bw / 1e9);
    for (size_t i = 0; i < rs.size(); i++) {
        const result &r = rs[i];
        std::fprintf(js, "  {\"name\": \"%s\", \"format\": \"%s\", \"matrices\": %d, \"M\": %d, \"N\": %d, \"K\": %d, \"bytes\": %.0f, "
                         "\"us\": %.3f, \"gbps\": %.1f, \"fraction_of_copy\": %.3f}%s\n",
                     r.name.c_str(), r.format.c_str(), r.mats, r.M, r.N, r.K, r.bytes, r.us, r.gbps, r.frac,
                     i + 1 < rs.size() ? "," : "");
        std::fprintf(md, "| %s | %s | %d | %d | %d | %d | %.0f | %.2f | %.0f | %.0f%% |\n", r.name.c_str(), r.format.c_str(),
                     r.mats, r.M, r.N, r.K, r.bytes, r.us, r.gbps, 100 * r.frac);
        std::printf("%-20s %-12s M%-2d %6dx%-6d %8.2f us %6.0f GB/s %4.0f%%\n", r.name.c_str(), r.format.c_str(), r.M, r.N,
                    r.K, r.us, r.gbps, 100 * r.frac);
    }
    std::fprintf(js, "]}\n");
    std::fclose(js);
    std::fclose(md);
    std::printf("copy bandwidth %.0f GB/s\n", copy_bw / 1e9);
    return 0;
}
