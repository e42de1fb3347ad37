// Expert workers with their TP slices on the GPU (`ds41rt worker --device N`, dist/cuda/
// gpu_experts) against the same workers on the CPU backend, on a synthesized tiny V4.1 model
// (official storage: MXFP4 experts, intermediate 96, so TP2 cuts 64 + 32 and TP3 32 each):
//  - one request to every rank, GPU partial rows against CPU partial rows: TRANSFORMERS within
//    1e-5 of the largest |partial| (the GPU's GEMV takes x as fp16 hi + lo and sums in fp32, the
//    CPU sums in fp64: ~1e-6); OFFICIAL printed (bf16 rounding points amplify order effects);
//  - a coordinator with two GPU workers over TCP at TP2 (the CPU engine, then the GPU engine as
//    coordinator): logits within 1e-5 of the same engine alone, the same greedy tokens.
//  - NVFP4 (ModelOpt W4A4, quantized_model.h's tiny model: intermediate 96): TP3 slices (32 wide)
//    on the GPU against the CPU worker's, with nvfp4_moe_decode_test's end-to-end bounds (every
//    row within 2e-2 of its largest |partial|, the median row within 1e-3: a GEMV sum a last bit
//    apart can cross a bf16 rounding of gate / up and then an E2M1 code of h); TP2 (48-wide
//    slices) refused at load, since the W4A4 GEMV takes whole 32-channel inputs; a CPU coordinator
//    with three GPU workers against the same with three CPU workers: OFFICIAL greedy tokens equal,
//    distances printed.
//  - EXL3 (K = 2 MCG, dim 128, intermediate 384): TP2 (256 + 128) and TP3 slices on the GPU
//    against the CPU worker's, within gpu_exl3_test's routed-sum bounds (||gpu - cpu|| / ||cpu||
//    <= 1e-4 TRANSFORMERS: exl3_gemv's fp16 hi + lo x and tensor-core sums; <= 1e-2 OFFICIAL: a
//    bf16 / FP8 rounding crossed now and then); a CPU coordinator with two GPU workers against
//    two CPU workers on the tie-free prompt in TRANSFORMERS: every position within 5e-3, the same
//    greedy tokens.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "backend/cuda/device_info.h"
#include "dist/plan.h"
#include "dist/tcp_transport.h"
#include "dist/wire.h"
#include "dist/worker.h"
#include "engine/engine.h"
#include "experts/from_plan.h"
#include "model/synth.h"
#include "quantized_model.h"
#include "tie_free_prompt.h"
#include "tiny_synth.h"
#include "two_gpu_plan.h"
#include "worker_request.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

// Layers 2.. remote on `tp` ranks (workers on port list, GPU 0 each), the first two local.
dist::Plan make_plan(const std::vector<int> &ports, int tp, const std::string &format = "official") {
    dist::Plan p;
    p.model_type = "deepseek_v41";
    p.format = format;
    p.num_layers = 12;
    p.coordinator.push_back({"cpu", 0, {}});
    for (int port : ports) p.workers.push_back({"127.0.0.1:" + std::to_string(port), 0, {}});
    for (int l = 0; l < 12; l++) {
        dist::LayerPlacement lp;
        lp.layer = l;
        if (l >= 2) {
            lp.remote = true;
            for (int r = 0; r < tp; r++) lp.ranks.push_back(r);
        }
        p.layers.push_back(lp);
    }
    return p;
}

// Expert workers serving in this process over loopback TCP, one per rank of make_plan(their
// ports, TP = their count, format), until destroyed. Declared before the engine that uses them,
// so that the engine's connections close before the workers stop.
class served_workers {
public:
    static Result<std::unique_ptr<served_workers>> start(const std::string &dir, int n, const std::string &format,
                                                         int device, dist::Plan *plan) {
        std::unique_ptr<served_workers> s(new served_workers);
        std::vector<std::unique_ptr<dist::tcp_listener>> ls;
        std::vector<int> ports;
        for (int i = 0; i < n; i++) {
            auto l = dist::tcp_listener::listen("127.0.0.1:0");
            if (!l) return l.status();
            ports.push_back((*l)->port());
            ls.push_back(std::move(l.value()));
        }
        *plan = make_plan(ports, n, format);
        for (int r = 0; r < n; r++) {
            auto w = dist::expert_worker::load(dir, *plan, r, device);
            if (!w) return w.status();
            s->threads_.emplace_back(
                [w = std::move(w.value()), l = std::move(ls[size_t(r)]), &stop = s->stop_]() mutable {
                    Status st = w->serve(*l, stop);
                    EXPECT_TRUE(st) << st.to_string();
                });
        }
        return s;
    }
    ~served_workers() {
        stop_ = true;
        for (auto &t : threads_) t.join();
    }
    served_workers(const served_workers &) = delete;
    served_workers &operator=(const served_workers &) = delete;

private:
    served_workers() = default;
    std::atomic<bool> stop_{false};
    std::vector<std::thread> threads_;
};

class GpuWorker : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("ds41rt_gpu_worker_test_" + std::to_string(getpid()));
        fs::remove_all(dir_);
        model::synth_options o = tiny_synth();
        Status st = model::synthesize(dir_.string(), o);
        ASSERT_TRUE(st) << st.to_string();
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }
    void SetUp() override {
        auto d = backend::cuda::query_device(0);
        if (!d) GTEST_SKIP() << d.status().to_string();
    }

    static fs::path dir_;
};
fs::path GpuWorker::dir_;

TEST_F(GpuWorker, PartialsMatchTheCpuWorker) {
    for (int tp : {2, 3}) {
        dist::Plan plan = make_plan(std::vector<int>(size_t(tp), 1), tp);
        for (bool official : {false, true})
            for (int rows : {1, 6, 20}) {
                const int64_t D = 64;
                std::mt19937 rng(uint32_t(rows * 7 + tp));
                const worker_rows in = two_route_rows_of(rng, rows, D, 8);
                for (int rank = 0; rank < tp; rank++) {
                    std::vector<float> got[2];
                    for (int dev : {-1, 0}) {
                        auto wk = dist::expert_worker::load(dir_.string(), plan, rank, dev);
                        ASSERT_TRUE(wk) << wk.status().to_string();
                        auto r = worker_partial(**wk, plan, 3, official, in, D);
                        ASSERT_TRUE(r) << r.status().to_string();
                        got[dev + 1] = r.value();
                    }
                    const double e = rel_max(got[0], got[1]);
                    bool finite = true;
                    for (float v : got[1]) finite &= std::isfinite(v);
                    EXPECT_TRUE(finite);
                    std::printf("[ gpu worker ] TP%d rank %d %s rows %2d: max |gpu - cpu| / max |cpu| = %.3g\n", tp, rank,
                                official ? "official    " : "transformers", rows, e);
                    if (!official) {
                        EXPECT_LE(e, 1e-5) << "TP" << tp << " rank " << rank << " rows " << rows;
                    }
                }
            }
    }
}

TEST_F(GpuWorker, CoordinatorWithTwoGpuWorkersMatchesSingleProcess) {
    dist::Plan plan;
    auto workers = served_workers::start(dir_.string(), 2, "official", 0, &plan);
    ASSERT_TRUE(workers) << workers.status().to_string();
    auto run = [&](const dist::Plan *p, engine::backend_kind be, std::vector<float> *all, std::vector<int32_t> *greedy) {
        engine::engine_options o;
        o.backend = be;
        if (p) o.remote = experts::layout_from_plan(*p, 5000, 1000);
        auto e = engine::engine::open(dir_.string(), o);
        ASSERT_TRUE(e) << e.status().to_string();
        Status st = run_greedy(**e, 5, all, greedy);
        ASSERT_TRUE(st) << st.to_string();
    };
    // The CPU engine and the GPU engine as coordinators, each against its own single-process run.
    const engine::backend_kind kinds[] = {engine::backend_kind::CPU, engine::backend_kind::CUDA};
    std::vector<float> a[2], b[2];
    std::vector<int32_t> ga[2], gb[2];
    for (int k = 0; k < 2; k++) {
        run(nullptr, kinds[k], &a[k], &ga[k]);
        run(&plan, kinds[k], &b[k], &gb[k]);
    }
    for (int k = 0; k < 2; k++) {
        ASSERT_EQ(a[k].size(), b[k].size());
        const double e = rel_max(a[k], b[k]);
        std::printf("[ gpu worker ] %s coordinator + 2 GPU workers at TP2 vs the %s engine alone: max |dlogit| / max "
                    "|logit| = %.3g over %zu logits\n",
                    k ? "GPU" : "CPU", k ? "GPU" : "CPU", e, a[k].size());
        EXPECT_LE(e, 1e-5);
        EXPECT_EQ(ga[k], gb[k]);
    }
}

// The tiny model with its routed experts stored as Format::name (quantized_model.h), written once
// per suite; skipped without a GPU.
template <class Format>
class quantized_suite : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / (std::string("ds41rt_gpu_worker_") + Format::name + "_" + std::to_string(getpid()));
        make_quantized_model(dir_, Format::name);
    }
    static void TearDownTestSuite() {
        fs::remove_all(dir_);
        fs::remove_all(dir_.string() + "_src");
    }
    void SetUp() override {
        auto d = backend::cuda::query_device(0);
        if (!d) GTEST_SKIP() << d.status().to_string();
    }
    static fs::path dir_;
};
template <class Format>
fs::path quantized_suite<Format>::dir_;

struct nvfp4_format {
    static constexpr const char *name = "nvfp4";
};
using GpuWorkerNvfp4 = quantized_suite<nvfp4_format>;

TEST_F(GpuWorkerNvfp4, PartialsMatchTheCpuWorker) {
    const int tp = 3;
    dist::Plan plan = make_plan(std::vector<int>(size_t(tp), 1), tp, "nvfp4");
    for (bool official : {false, true})
        for (int rows : {1, 6, 20}) {
            const int64_t D = 64;
            std::mt19937 rng(uint32_t(rows * 7 + tp));
            const worker_rows in = two_route_rows_of(rng, rows, D, 8);
            for (int rank = 0; rank < tp; rank++) {
                std::vector<float> got[2];
                for (int dev : {-1, 0}) {
                    auto wk = dist::expert_worker::load(dir_.string(), plan, rank, dev);
                    ASSERT_TRUE(wk) << wk.status().to_string();
                    auto r = worker_partial(**wk, plan, 3, official, in, D);
                    ASSERT_TRUE(r) << r.status().to_string();
                    got[dev + 1] = r.value();
                }
                ASSERT_EQ(got[0].size(), size_t(rows * D));
                ASSERT_EQ(got[1].size(), got[0].size());
                std::vector<double> row_err;
                for (int r = 0; r < rows; r++) {
                    double num = 0, den = 0;
                    for (int64_t d = 0; d < D; d++) {
                        const float c = got[0][size_t(r * D + d)], g = got[1][size_t(r * D + d)];
                        ASSERT_TRUE(std::isfinite(g)) << "rank " << rank << " row " << r << " element " << d;
                        num = std::max(num, double(std::fabs(g - c)));
                        den = std::max(den, double(std::fabs(c)));
                    }
                    row_err.push_back(den > 0 ? num / den : num);
                }
                std::sort(row_err.begin(), row_err.end());
                const double worst = row_err.back(), median = row_err[row_err.size() / 2];
                std::printf("[ gpu worker ] NVFP4 TP%d rank %d %s rows %2d: per row max |gpu - cpu| / max |cpu|: worst %.3g, "
                            "median %.3g\n",
                            tp, rank, official ? "official    " : "transformers", rows, worst, median);
                EXPECT_LE(worst, 2e-2) << "rank " << rank << " rows " << rows;
                EXPECT_LE(median, 1e-3) << "rank " << rank << " rows " << rows;
            }
        }
}

TEST_F(GpuWorkerNvfp4, SlicesNotWhole32ChannelsAreRefusedAtLoad) {
    dist::Plan plan = make_plan({1, 2}, 2, "nvfp4");  // 96 / 2 = 48 channels a rank
    auto cpu = dist::expert_worker::load(dir_.string(), plan, 0, -1);
    ASSERT_TRUE(cpu) << cpu.status().to_string();  // the CPU worker serves any 16-channel cut
    auto gpu = dist::expert_worker::load(dir_.string(), plan, 0, 0);
    ASSERT_FALSE(gpu);
    EXPECT_EQ(gpu.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(gpu.status().message().find("whole 32-channel"), std::string::npos) << gpu.status().message();
    std::printf("[ gpu worker ] NVFP4 TP2: %s\n", gpu.status().message().c_str());
}

TEST_F(GpuWorkerNvfp4, CpuCoordinatorWithThreeGpuWorkersMatchesThreeCpuWorkers) {
    std::vector<float> logits[2];
    std::vector<int32_t> greedy[2];
    for (int dev : {-1, 0}) {
        dist::Plan plan;
        auto workers = served_workers::start(dir_.string(), 3, "nvfp4", dev, &plan);
        ASSERT_TRUE(workers) << workers.status().to_string();
        engine::engine_options o;
        o.mode = engine::numerics::OFFICIAL;
        o.backend = engine::backend_kind::CPU;
        o.remote = experts::layout_from_plan(plan, 5000, 1000);
        auto e = engine::engine::open(dir_.string(), o);
        ASSERT_TRUE(e) << e.status().to_string();
        const int steps = 8;
        std::vector<float> all;
        Status st = run_greedy(**e, steps, &all, &greedy[dev + 1]);
        ASSERT_TRUE(st) << st.to_string();
        // The rows the greedy tokens came from (the prompt's last, then one a decode step): the
        // run's last `steps`.
        const int64_t V = (*e)->config().vocab_size;
        logits[dev + 1].assign(all.end() - steps * V, all.end());
        for (float v : logits[dev + 1]) ASSERT_TRUE(std::isfinite(v));
    }
    int same = 0;
    while (same < int(greedy[0].size()) && greedy[0][size_t(same)] == greedy[1][size_t(same)]) same++;
    std::printf("[ gpu worker ] NVFP4, CPU coordinator (official) + 3 GPU workers vs + 3 CPU workers: max |dlogit| / max "
                "|logit| = %.3g; greedy identical for %d/%zu tokens\n",
                rel_max(logits[0], logits[1]), same, greedy[0].size());
    EXPECT_EQ(greedy[0], greedy[1]);
}

struct exl3_format {
    static constexpr const char *name = "exl3";
};
using GpuWorkerExl3 = quantized_suite<exl3_format>;

TEST_F(GpuWorkerExl3, PartialsMatchTheCpuWorker) {
    const int64_t D = 128;
    for (int tp : {2, 3}) {
        dist::Plan plan = make_plan(std::vector<int>(size_t(tp), 1), tp, "exl3");
        for (int rank = 0; rank < tp; rank++) {
            auto cpu = dist::expert_worker::load(dir_.string(), plan, rank, -1);
            ASSERT_TRUE(cpu) << cpu.status().to_string();
            auto gpu = dist::expert_worker::load(dir_.string(), plan, rank, 0);
            ASSERT_TRUE(gpu) << gpu.status().to_string();
            for (bool official : {false, true})
                for (int rows : {1, 6, 20}) {
                    std::mt19937 rng(uint32_t(rows * 7 + tp));
                    const worker_rows in = two_route_rows_of(rng, rows, D, 8);
                    std::vector<float> got[2];
                    for (int i = 0; i < 2; i++) {
                        auto r = worker_partial(i ? **gpu : **cpu, plan, 3, official, in, D);
                        ASSERT_TRUE(r) << r.status().to_string();
                        got[i] = r.value();
                    }
                    ASSERT_EQ(got[0].size(), size_t(rows * D));
                    ASSERT_EQ(got[1].size(), got[0].size());
                    double num = 0, den = 0;
                    for (size_t i = 0; i < got[0].size(); i++) {
                        ASSERT_TRUE(std::isfinite(got[1][i])) << "rank " << rank << " element " << i;
                        const double d = double(got[1][i]) - got[0][i];
                        num += d * d, den += double(got[0][i]) * got[0][i];
                    }
                    const double rel = std::sqrt(num / den);
                    std::printf("[ gpu worker ] EXL3 TP%d rank %d %s rows %2d: ||gpu - cpu|| / ||cpu|| = %.3g\n", tp, rank,
                                official ? "official    " : "transformers", rows, rel);
                    EXPECT_LE(rel, official ? 1e-2 : 1e-4) << "TP" << tp << " rank " << rank << " rows " << rows;
                }
        }
    }
}

TEST_F(GpuWorkerExl3, CpuCoordinatorWithTwoGpuWorkersMatchesTwoCpuWorkers) {
    std::vector<float> logits[2];
    std::vector<int32_t> greedy[2];
    int64_t V = 0;
    for (int dev : {-1, 0}) {
        dist::Plan plan;
        auto workers = served_workers::start(dir_.string(), 2, "exl3", dev, &plan);
        ASSERT_TRUE(workers) << workers.status().to_string();
        engine::engine_options o;
        o.mode = engine::numerics::TRANSFORMERS;
        o.backend = engine::backend_kind::CPU;
        o.remote = experts::layout_from_plan(plan, 10000, 1000);
        auto e = engine::engine::open(dir_.string(), o);
        ASSERT_TRUE(e) << e.status().to_string();
        V = (*e)->config().vocab_size;
        Status st = run_greedy(**e, 6, &logits[dev + 1], &greedy[dev + 1], TIE_FREE_PROMPT);
        ASSERT_TRUE(st) << st.to_string();
    }
    // Per position ||g - c|| / ||c|| (row t of the run is position t of the sequence).
    ASSERT_EQ(logits[0].size(), logits[1].size());
    double worst = 0;
    for (size_t t = 0; t < logits[0].size() / size_t(V); t++) {
        const float *c = logits[0].data() + t * size_t(V), *g = logits[1].data() + t * size_t(V);
        double num = 0, den = 0;
        for (int64_t i = 0; i < V; i++) {
            ASSERT_TRUE(std::isfinite(g[i])) << "position " << t;
            num += double(g[i] - c[i]) * double(g[i] - c[i]), den += double(c[i]) * c[i];
        }
        worst = std::max(worst, std::sqrt(num / den));
    }
    std::printf("[ gpu worker ] EXL3, CPU coordinator (transformers) + 2 GPU workers vs + 2 CPU workers: worst position "
                "||dlogit|| / ||logit|| = %.3g; greedy %s\n",
                worst, greedy[0] == greedy[1] ? "identical" : "DIFFERS");
    EXPECT_LE(worst, 5e-3);
    EXPECT_EQ(greedy[0], greedy[1]);
}

}  // namespace
}  // namespace ds41rt
