// GPU decode GEMV benchmark: achieved weight-streaming bandwidth at V4.1 / V4 decode shapes, as
// a fraction of the device-to-device copy rate measured in the same run.
//
// Usage: ds41rt_cuda_bench OUT_DIR [quick]   (writes OUT_DIR/gemv.json and OUT_DIR/gemv.md;
// quick: official numerics at M = 1 and 16 only, for comparing kernel variants; quick-l2: the
// same with one copy of each weight set launched over and over, so the timed launches find their
// weights in L2: what a launch would take had they been prefetched there while earlier kernels
// ran)
//        ds41rt_cuda_bench OUT_DIR gemv-sweep  (writes OUT_DIR/gemv-sweep.md / .json: every
// gemv_tuning of a grid over the V4.1 decode launches, official numerics, M = 1 and 16; prints
// the tunings ranked by the summed M = 1 time of one layer's launches)
//        ds41rt_cuda_bench OUT_DIR grouped  (the routed experts' grouped MXFP4 GEMM of a V4.1
// prefill: grouped_gemm_bench.cpp)
// Method: several copies of each weight rotate so a repeat never finds its weight in L2 (decode
// streams every weight once per token); the launches over all copies are captured in one CUDA
// graph (as the decode step will be) and its replays timed with CUDA events, warm-up first,
// median of the repeats, divided by the number of launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cuda/gemv.cuh"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
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

// One set of matrices uploaded several times over: enough copies of the whole set that a
// rotation exceeds L2 several times, so a timed launch never finds its weights there (one copy
// under quick-l2).
bool g_l2_hot = false;
struct weight_set {
    std::vector<mat_spec> specs;
    std::vector<std::vector<cuda::gemv_matrix>> copies;  // per copy, x / y / M left to the timing
    size_t set_bytes = 0;
    int maxK = 0, sumN = 0;
    std::vector<void *> allocs;
    weight_set(const weight_set &) = delete;
    weight_set &operator=(const weight_set &) = delete;
    weight_set(const cuda::device_info &dev, const std::vector<mat_spec> &s) : specs(s) {
        std::vector<testing_util::quant_weight> qs;
        for (const mat_spec &m : specs) {
            qs.push_back(m.fp4 ? testing_util::random_mxfp4(m.N, m.K, 1) : testing_util::random_fp8_block(m.N, m.K, m.block, m.block, 1));
            set_bytes += qs.back().w.size() + qs.back().scale.size();
            maxK = std::max(maxK, m.K), sumN += m.N;
        }
        const int n = g_l2_hot ? 1 : int(std::max<size_t>(2, size_t(4 * dev.l2_bytes) / set_bytes + 1));
        for (int c = 0; c < n; c++) {
            std::vector<cuda::gemv_matrix> mats;
            for (size_t i = 0; i < specs.size(); i++) {
                uint8_t *w, *sc;
                CHECK_CUDA(cudaMalloc(&w, qs[i].w.size()));
                CHECK_CUDA(cudaMalloc(&sc, qs[i].scale.size()));
                CHECK_CUDA(cudaMemcpy(w, qs[i].w.data(), qs[i].w.size(), cudaMemcpyHostToDevice));
                CHECK_CUDA(cudaMemcpy(sc, qs[i].scale.data(), qs[i].scale.size(), cudaMemcpyHostToDevice));
                allocs.push_back(w), allocs.push_back(sc);
                cuda::gemv_matrix m;
                m.w = w, m.scale = sc, m.fp4 = specs[i].fp4, m.block_out = m.block_in = specs[i].block;
                m.N = specs[i].N, m.K = specs[i].K, m.act_block = specs[i].act_block;
                mats.push_back(m);
            }
            copies.push_back(std::move(mats));
        }
        // quick-l2: the one copy eight times over, so a replayed graph still holds several
        // launches (a graph of one launch would time the graph launch, not the kernel).
        while (g_l2_hot && copies.size() < 8) copies.push_back(copies.front());
    }
    ~weight_set() {
        for (void *p : allocs) cudaFree(p);
    }
};

// Times one launch over the set's matrices (sharing nothing but the launch), M tokens each,
// under `tuning`.
result time_set(const cuda::device_info &dev, const std::string &name, const weight_set &set, int M, double copy_bw,
                const cuda::gemv_tuning &tuning = {}) {
    const std::vector<mat_spec> &specs = set.specs;
    const int copies = int(set.copies.size());
    const int maxK = set.maxK, sumN = set.sumN;
    auto x = testing_util::random_normal(size_t(M) * maxK, 2);
    float *dx, *dy;
    CHECK_CUDA(cudaMalloc(&dx, x.size() * 4));
    CHECK_CUDA(cudaMalloc(&dy, size_t(M) * sumN * 4));
    CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    std::vector<cuda::gemv_plan> plans;
    size_t ws_bytes = 1;
    for (int c = 0; c < copies; c++) {
        std::vector<cuda::gemv_matrix> mats = set.copies[size_t(c)];
        int ycol = 0;
        for (cuda::gemv_matrix &m : mats) {
            m.M = M, m.x = dx, m.y = dy + size_t(M) * ycol;
            ycol += m.N;
        }
        auto plan = cuda::plan_gemv(dev, mats, tuning);
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
        CHECK_CUDA(cudaMalloc(&p, ws_bytes));
        CHECK_CUDA(cudaMemset(p, 0, ws_bytes));
    }
    // The decode step runs as a CUDA graph, so time graph replays: host launch cost stays out.
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < copies; c++) {
        Status st = cuda::run_gemv(plans[size_t(c)], ws[size_t(c)], stream);
        if (!st.is_ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), st.to_string().c_str());
            std::exit(1);
        }
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    const int reps = 40;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, stream);
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        cudaEventRecord(e1, stream);
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (r >= 5) ms.push_back(t / float(copies));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    for (void *p : ws) cudaFree(p);
    cudaFree(dx);
    cudaFree(dy);
    result res;
    res.name = name;
    res.format = specs[0].fp4 ? "MXFP4" : ("FP8 " + std::to_string(specs[0].block) + "x" + std::to_string(specs[0].block));
    res.format += specs[0].act_block ? " xFP8" : " xF32";
    res.M = M, res.N = sumN, res.K = maxK, res.mats = int(specs.size());
    res.bytes = double(set.set_bytes) + 4.0 * M * maxK + 4.0 * M * sumN;
    res.us = median(ms) * 1e3;
    res.gbps = res.bytes / (res.us * 1e-6) / 1e9;
    res.frac = res.bytes / (res.us * 1e-6) / copy_bw;
    return res;
}

result bench(const cuda::device_info &dev, const std::string &name, const std::vector<mat_spec> &specs, int M,
             double copy_bw) {
    const weight_set set(dev, specs);
    return time_set(dev, name, set, M, copy_bw);
}

std::vector<mat_spec> repeat(const mat_spec &m, int n) { return std::vector<mat_spec>(static_cast<size_t>(n), m); }

std::string tuning_name(const cuda::gemv_tuning &t) {
    char b[96];
    std::snprintf(b, sizeof b, "waves %.2g min_kb %d blocks/SM %s%s", double(t.waves), t.min_kb,
                  t.blocks_per_sm ? std::to_string(t.blocks_per_sm).c_str() : "all", t.l2_hint ? " L2hint" : "");
    return b;
}

// The decode step's GEMV launches of one V4.1 layer (official numerics, the production path)
// under every tuning of a small grid. The ranking is by the layer's summed M = 1 time (decode at
// C1); M = 16 is printed beside it so a win at C1 that costs C16 shows.
int sweep(const cuda::device_info &dev, const std::string &out, double copy_bw) {
    const int act = 32;
    const mat_spec wq_a{false, 1280, 5120, 32, act}, wq_b{false, 32768, 1280, 32, act}, wkv{false, 512, 5120, 32, act},
        wo_b{false, 5120, 8192, 32, act}, sh_w1{false, 2304, 5120, 32, act}, sh_w2{false, 5120, 2304, 32, act},
        ex_w1{true, 2304, 5120, 32, act}, ex_w2{true, 5120, 2304, 32, act};
    const std::vector<std::pair<std::string, std::vector<mat_spec>>> sets = {
        {"wq_a+wkv", {wq_a, wkv}},           {"wq_b", {wq_b}},           {"wo_b", {wo_b}},
        {"shared w1+w3", {sh_w1, sh_w1}},    {"shared w2", {sh_w2}},    {"6 experts w1+w3", repeat(ex_w1, 12)},
        {"6 experts w2", repeat(ex_w2, 6)},
    };
    std::vector<cuda::gemv_tuning> tunings;
    for (bool hint : {false, true})
        for (int bps : {0, 1, 2, 4})
            for (float waves : {0.5f, 1.0f, 2.0f, 4.0f})
                for (int min_kb : {4, 8, 16}) {
                    cuda::gemv_tuning t;
                    t.waves = waves, t.min_kb = min_kb, t.blocks_per_sm = bps, t.l2_hint = hint;
                    tunings.push_back(t);
                }
    const int Ms[2] = {1, 16};
    // us[set][M][tuning]
    std::vector<std::vector<std::vector<result>>> res(sets.size(), std::vector<std::vector<result>>(2));
    for (size_t si = 0; si < sets.size(); si++) {
        const weight_set set(dev, sets[si].second);
        for (int mi = 0; mi < 2; mi++)
            for (const cuda::gemv_tuning &t : tunings)
                res[si][size_t(mi)].push_back(time_set(dev, sets[si].first, set, Ms[mi], copy_bw, t));
        std::printf("%-16s done\n", sets[si].first.c_str());
        std::fflush(stdout);
    }
    FILE *md = std::fopen((out + "/gemv-sweep.md").c_str(), "w");
    FILE *js = std::fopen((out + "/gemv-sweep.json").c_str(), "w");
    std::fprintf(md, "device %s (%d SMs); measured D2D copy %.0f GB/s (read+write); official numerics\n\n",
                 dev.name.c_str(), dev.sm_count, copy_bw / 1e9);
    std::fprintf(js, "{\"device\": \"%s\", \"sm_count\": %d, \"copy_bandwidth_bytes_per_s\": %.4g, \"results\": [\n",
                 dev.name.c_str(), dev.sm_count, copy_bw);
    std::fprintf(md, "| tuning | layer us M1 | layer us M16 |");
    for (const auto &st : sets) std::fprintf(md, " %s M1 | M16 |", st.first.c_str());
    std::fprintf(md, "\n|---|---|---|");
    for (size_t si = 0; si < sets.size(); si++) std::fprintf(md, "---|---|");
    std::fprintf(md, "\n");
    std::vector<std::pair<double, size_t>> order;
    bool first_js = true;
    for (size_t ti = 0; ti < tunings.size(); ti++) {
        double tot[2] = {0, 0};
        for (size_t si = 0; si < sets.size(); si++)
            for (int mi = 0; mi < 2; mi++) {
                const result &r = res[si][size_t(mi)][ti];
                tot[mi] += r.us;
                std::fprintf(js, "%s  {\"tuning\": \"%s\", \"waves\": %.3g, \"min_kb\": %d, \"blocks_per_sm\": %d, \"l2_hint\": %d, \"set\": \"%s\", "
                                 "\"M\": %d, \"bytes\": %.0f, \"us\": %.3f, \"gbps\": %.1f, \"fraction_of_copy\": %.3f}",
                             first_js ? "" : ",\n", tuning_name(tunings[ti]).c_str(), double(tunings[ti].waves),
                             tunings[ti].min_kb, tunings[ti].blocks_per_sm, int(tunings[ti].l2_hint), r.name.c_str(), r.M, r.bytes, r.us, r.gbps, r.frac);
                first_js = false;
            }
        order.push_back({tot[0], ti});
        std::fprintf(md, "| %s | %.1f | %.1f |", tuning_name(tunings[ti]).c_str(), tot[0], tot[1]);
        for (size_t si = 0; si < sets.size(); si++)
            std::fprintf(md, " %.0f%% | %.0f%% |", 100 * res[si][0][ti].frac, 100 * res[si][1][ti].frac);
        std::fprintf(md, "\n");
    }
    std::fprintf(js, "\n]}\n");
    std::fclose(js);
    std::sort(order.begin(), order.end());
    // The default tuning, for the comparison line.
    size_t def = 0;
    const cuda::gemv_tuning d0;
    for (size_t ti = 0; ti < tunings.size(); ti++)
        if (tunings[ti].waves == d0.waves && tunings[ti].min_kb == d0.min_kb && tunings[ti].blocks_per_sm == d0.blocks_per_sm &&
            tunings[ti].l2_hint == d0.l2_hint)
            def = ti;
    auto line = [&](FILE *f, const char *tag, size_t ti) {
        double t16 = 0;
        for (size_t si = 0; si < sets.size(); si++) t16 += res[si][1][ti].us;
        double t1 = 0;
        for (size_t si = 0; si < sets.size(); si++) t1 += res[si][0][ti].us;
        std::fprintf(f, "%-8s %-41s layer M1 %7.1f us  M16 %7.1f us |", tag, tuning_name(tunings[ti]).c_str(), t1, t16);
        for (size_t si = 0; si < sets.size(); si++) std::fprintf(f, " %s %.0f%%", sets[si].first.c_str(), 100 * res[si][0][ti].frac);
        std::fprintf(f, "\n");
    };
    std::fprintf(md, "\nRanked by the layer's M = 1 time (per set: %% of copy at M = 1):\n\n```\n");
    line(stdout, "default", def);
    line(md, "default", def);
    for (size_t k = 0; k < std::min<size_t>(8, order.size()); k++) {
        char tag[32];
        std::snprintf(tag, sizeof tag, "#%zu", k + 1);
        line(stdout, tag, order[k].second);
        line(md, tag, order[k].second);
    }
    // Per set, its own best (a per-launch choice would need the plan to pick per matrix group).
    for (size_t si = 0; si < sets.size(); si++)
        for (int mi = 0; mi < 2; mi++) {
            size_t best = 0;
            for (size_t ti = 0; ti < tunings.size(); ti++)
                if (res[si][size_t(mi)][ti].us < res[si][size_t(mi)][best].us) best = ti;
            const result &b = res[si][size_t(mi)][best], &d = res[si][size_t(mi)][def];
            std::fprintf(stdout, "best for %-16s M%-2d %-41s %7.2f us %3.0f%% (default %7.2f us %3.0f%%)\n", sets[si].first.c_str(),
                         Ms[mi], tuning_name(tunings[best]).c_str(), b.us, 100 * b.frac, d.us, 100 * d.frac);
            std::fprintf(md, "best for %-16s M%-2d %-41s %7.2f us %3.0f%% (default %7.2f us %3.0f%%)\n", sets[si].first.c_str(),
                         Ms[mi], tuning_name(tunings[best]).c_str(), b.us, 100 * b.frac, d.us, 100 * d.frac);
        }
    std::fprintf(md, "```\n");
    std::fclose(md);
    std::printf("copy bandwidth %.0f GB/s\n", copy_bw / 1e9);
    return 0;
}

}  // namespace

int grouped_bench(const cuda::device_info &dev, const std::string &out);  // grouped_gemm_bench.cpp

int main(int argc, char **argv) {
    const std::string out = argc > 1 ? argv[1] : ".";
    std::error_code ec;
    std::filesystem::create_directories(out, ec);  // the report files go there
    if (ec) {
        std::fprintf(stderr, "ds41rt_cuda_bench: cannot create %s: %s\n", out.c_str(), ec.message().c_str());
        return 1;
    }
    auto d = cuda::query_device();
    if (!d) {
        std::fprintf(stderr, "%s\n", d.status().to_string().c_str());
        return 1;
    }
    const cuda::device_info dev = d.value();
    const double copy_bw = testing_util::copy_bandwidth(size_t(2) << 30);  // 2 GiB copies
    if (argc > 2 && std::string(argv[2]) == "gemv-sweep") return sweep(dev, out, copy_bw);
    if (argc > 2 && std::string(argv[2]) == "grouped") return grouped_bench(dev, out);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    std::vector<result> rs;
    // xF32: reference numerics (fp32 x through fp16 hi + lo). xFP8: official numerics (x quantized
    // to E4M3 per 32 / 128 channels, the production path).
    g_l2_hot = argc > 2 && std::string(argv[2]) == "quick-l2";
    const bool quick = argc > 2 && (std::string(argv[2]) == "quick" || g_l2_hot);
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
