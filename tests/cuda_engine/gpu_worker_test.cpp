// Expert workers with their TP slices on the GPU (`ds41rt worker --device N`, dist/cuda/
// gpu_experts) against the same workers on the CPU backend, on a synthesized tiny V4.1 model
// (official storage: MXFP4 experts, intermediate 96, so TP2 cuts 64 + 32 and TP3 32 each):
//  - one request to every rank, GPU partial rows against CPU partial rows: TRANSFORMERS within
//    1e-5 of the largest |partial| (the GPU's GEMV takes x as fp16 hi + lo and sums in fp32, the
//    CPU sums in fp64: ~1e-6); OFFICIAL printed (bf16 rounding points amplify order effects);
//  - a coordinator with two GPU workers over TCP at TP2 (the CPU engine, then the GPU engine as
//    coordinator): logits within 1e-5 of the same engine alone, the same greedy tokens.
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
#include "tiny_synth.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

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

    static dist::Plan make_plan(const std::vector<int> &ports, int tp) {
        dist::Plan p;
        p.model_type = "deepseek_v41";
        p.format = "official";
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

    static fs::path dir_;
};
fs::path GpuWorker::dir_;

double rel_max(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(a[i])));
    }
    return num / den;
}

TEST_F(GpuWorker, PartialsMatchTheCpuWorker) {
    for (int tp : {2, 3}) {
        dist::Plan plan = make_plan(std::vector<int>(size_t(tp), 1), tp);
        for (bool official : {false, true})
            for (int rows : {1, 6, 20}) {
                const int64_t D = 64;
                std::mt19937 rng(uint32_t(rows * 7 + tp));
                std::normal_distribution<float> nd(0.0f, 1.0f);
                std::vector<float> x(size_t(rows * D));
                for (float &v : x) v = nd(rng);
                backend::cpu::route_table rt;
                rt.offsets.push_back(0);
                for (int s = 0; s < rows; s++) {
                    for (int k = 0; k < 2; k++) rt.routes.push_back({uint32_t((s * 3 + k * 5) % 8), 0.3f + 0.1f * k});
                    rt.offsets.push_back(uint32_t(rt.routes.size()));
                }
                for (int rank = 0; rank < tp; rank++) {
                    std::vector<float> got[2];
                    for (int dev : {-1, 0}) {
                        auto wk = dist::expert_worker::load(dir_.string(), plan, rank, dev);
                        ASSERT_TRUE(wk) << wk.status().to_string();
                        dist::frame_header h;
                        h.placement_version = plan.version();
                        h.layer = 3;
                        if (official) h.flags |= dist::FLAG_OFFICIAL;
                        bool close_after = false;
                        auto r = dist::decode_response(
                            (*wk)->handle(dist::encode_request(h, rt, x.data(), uint32_t(D)), &close_after));
                        ASSERT_TRUE(r) << r.status().to_string();
                        got[dev + 1] = r->partial;
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
    std::vector<std::unique_ptr<dist::tcp_listener>> ls;
    std::vector<int> ports;
    for (int i = 0; i < 2; i++) {
        auto l = dist::tcp_listener::listen("127.0.0.1:0");
        ASSERT_TRUE(l) << l.status().to_string();
        ports.push_back((*l)->port());
        ls.push_back(std::move(l.value()));
    }
    dist::Plan plan = make_plan(ports, 2);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; r++) {
        auto w = dist::expert_worker::load(dir_.string(), plan, r, 0);
        ASSERT_TRUE(w) << w.status().to_string();
        threads.emplace_back([w = std::move(w.value()), l = std::move(ls[size_t(r)]), &stop]() mutable {
            Status st = w->serve(*l, stop);
            EXPECT_TRUE(st) << st.to_string();
        });
    }
    auto run = [&](const dist::Plan *p, engine::backend_kind be, std::vector<float> *all, std::vector<int32_t> *greedy) {
        engine::engine_options o;
        o.backend = be;
        if (p) o.remote = experts::layout_from_plan(*p, 5000, 1000);
        auto e = engine::engine::open(dir_.string(), o);
        ASSERT_TRUE(e) << e.status().to_string();
        engine::seq_id s = (*e)->create_sequence();
        std::vector<int32_t> tokens = {0, 17, 300, 42, 5, 511, 77, 9, 123, 64};
        for (int step = 0; step <= 4; step++) {
            std::vector<Tensor> logits;
            Status st = (*e)->step({{s, tokens}}, &logits);
            ASSERT_TRUE(st) << st.to_string();
            const Tensor &l = logits[0];
            all->insert(all->end(), l.f(), l.f() + l.numel());
            const int64_t V = l.dim(1);
            const float *last = l.f() + (l.dim(0) - 1) * V;
            tokens = {int32_t(std::max_element(last, last + V) - last)};
            greedy->push_back(tokens[0]);
        }
    };
    // The CPU engine and the GPU engine as coordinators, each against its own single-process run.
    const engine::backend_kind kinds[] = {engine::backend_kind::CPU, engine::backend_kind::CUDA};
    std::vector<float> a[2], b[2];
    std::vector<int32_t> ga[2], gb[2];
    for (int k = 0; k < 2; k++) {
        run(nullptr, kinds[k], &a[k], &ga[k]);
        run(&plan, kinds[k], &b[k], &gb[k]);
    }
    stop = true;
    for (auto &t : threads) t.join();
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

}  // namespace
}  // namespace ds41rt
