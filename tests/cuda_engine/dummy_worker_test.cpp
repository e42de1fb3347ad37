// `ds41rt worker --load-format dummy` (expert_worker::load_dummy): a worker's slices filled on the
// GPU as windows of the coordinator's dummy tensors (rows of w1 / w3, columns of w2). On the tiny
// V4.1 config (moe_intermediate 96: TP2 cuts 64 + 32, TP3 32 each), the TP2 and TP3 ranks'
// partials, added in rank order, must give the TP1 worker's whole-expert answer within 1e-5 of
// its largest |value| (TRANSFORMERS numerics): only the summation order of the intermediate
// channels differs (each slice's w2 dot is summed apart, then the slices added). A window taken at
// the wrong rows or columns breaks that by O(1). Outputs are checked finite and non-zero. The
// same for NVFP4 experts (the ModelOpt publication's config on the same tiny model: codes, E4M3
// scale planes and each window's scalars filled as the coordinator's dummy engine fills them):
// their W4A4 activation blocks (16) lie inside every slice, so the ranks' partials add up the
// same way. NVFP4 slices are cut on 16-channel blocks (TP2: 48 + 48), and the GPU's W4A4 GEMV
// takes whole 32-channel inputs: TP3 (32 each) is checked, and TP2 must be refused at load with a
// message naming the slice width. Skips without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/cuda/device_info.h"
#include "dist/plan.h"
#include "dist/wire.h"
#include "dist/worker.h"
#include "model/config.h"
#include "model/synth.h"
#include "quantized_model.h"
#include "tiny_synth.h"
#include "worker_request.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

// format: "official" (the tiny synthesized model) or "nvfp4" (its NVFP4 publication).
void slices_add_up(const std::string &format, const std::vector<int> &tps) {
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_dummy_worker_test_" + format + std::to_string(getpid()));
    fs::remove_all(dir);
    if (format == "nvfp4") {
        make_quantized_model(dir, "nvfp4");
        if (::testing::Test::HasFatalFailure()) return;
    } else {
        ASSERT_TRUE(model::synthesize(dir.string(), tiny_synth()));
    }
    auto cfg = model::load_config(dir.string());
    ASSERT_TRUE(cfg) << cfg.status().to_string();
    const int64_t D = cfg->dim;
    const int rows = 5;
    std::mt19937 rng(11);
    const worker_rows in = two_route_rows_of(rng, rows, D, 8);
    auto plan_of = [&](int tp) {
        dist::Plan p;
        p.model_type = "deepseek_v41";
        p.format = format;
        p.num_layers = int(cfg->n_layers);
        p.coordinator.push_back({"gpu0", 0, {}});
        for (int r = 0; r < tp; r++) p.workers.push_back({"127.0.0.1:" + std::to_string(19000 + r), 0, {}});
        for (int l = 0; l < p.num_layers; l++) {
            dist::LayerPlacement lp;
            lp.layer = l;
            if (l == 3) {
                lp.remote = true;
                for (int r = 0; r < tp; r++) lp.ranks.push_back(r);
            }
            p.layers.push_back(lp);
        }
        return p;
    };
    auto answer = [&](int tp, int rank, std::vector<float> *out) {
        const dist::Plan p = plan_of(tp);
        auto w = dist::expert_worker::load_dummy(*cfg, p, rank, 0, 7);
        ASSERT_TRUE(w) << w.status().to_string();
        auto r = worker_partial(**w, p, 3, false, in, D);
        ASSERT_TRUE(r) << r.status().to_string();
        *out = r.value();
    };
    std::vector<float> whole;
    answer(1, 0, &whole);
    double maxabs = 0;
    for (float v : whole) {
        ASSERT_TRUE(std::isfinite(v));
        maxabs = std::max(maxabs, double(std::fabs(v)));
    }
    ASSERT_GT(maxabs, 0.0);
    for (int tp : tps) {
        std::vector<float> sum;
        for (int rank = 0; rank < tp; rank++) {
            std::vector<float> part;
            answer(tp, rank, &part);
            ASSERT_EQ(part.size(), whole.size());
            if (rank == 0) sum = part;
            else
                for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
        }
        double err = 0;
        for (size_t i = 0; i < sum.size(); i++) err = std::max(err, double(std::fabs(sum[i] - whole[i])));
        std::printf("[ dummy worker ] %s TP%d ranks summed vs TP1: max |diff| / max |TP1| = %.3g\n", format.c_str(), tp,
                    err / maxabs);
        EXPECT_LE(err / maxabs, 1e-5) << format << " TP" << tp;
    }
    if (format == "nvfp4") {
        auto refused = dist::expert_worker::load_dummy(*cfg, plan_of(2), 0, 0, 7);
        ASSERT_FALSE(refused) << "NVFP4 TP2 slices of 48 channels must be refused on the GPU";
        EXPECT_EQ(refused.status().code(), status_code::INVALID_ARGUMENT);
        EXPECT_NE(refused.status().to_string().find("48 channels wide"), std::string::npos) << refused.status().to_string();
    }
    fs::remove_all(dir);
}

TEST(DummyWorker, SlicesAddUpToTheWholeExperts) {
    if (auto dev = backend::cuda::query_device(0); !dev) GTEST_SKIP() << dev.status().to_string();
    slices_add_up("official", {2, 3});
}

TEST(DummyWorker, Nvfp4SlicesAddUpToTheWholeExperts) {
    if (auto dev = backend::cuda::query_device(0); !dev) GTEST_SKIP() << dev.status().to_string();
    slices_add_up("nvfp4", {3});
}

}  // namespace
}  // namespace ds41rt
