// dist/local_gpus on the CPU: a plan with layers 6-11's experts on coordinator GPU 1 is rewritten
// so that an in-process worker holds them (one worker slot, TCP, TP1, the other layers untouched),
// and the CPU engine driving that worker gives the logits of the CPU engine alone (within 1e-6 of
// the largest logit: the worker's partial is added to the shared expert's output in another
// order), with the same greedy tokens. Here the loader puts the worker on the CPU backend; the
// GPU run (worker on GPU 1, NCCL from the GPU engine) is tests/cuda_engine/local_gpus_test.cpp.
// A loader's error comes back naming the GPU, and nothing is left serving; a GPU 0 budget that
// cannot also take GPU 1's dense weights and KV (the planner charged them to GPU 1) is refused.
#include "dist/local_gpus.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "engine/engine.h"
#include "experts/from_plan.h"
#include "model/synth.h"
#include "tiny_synth.h"
#include "two_gpu_plan.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

TEST(local_gpus, second_gpu_layers_go_to_an_in_process_worker_and_match) {
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_local_gpus_cpu_" + std::to_string(getpid()));
    fs::remove_all(dir);
    ASSERT_TRUE(model::synthesize(dir.string(), tiny_synth()));
    std::vector<float> ref, got;
    std::vector<int32_t> gref, ggot;
    {
        auto e = engine::engine::open(dir.string(), {});
        ASSERT_TRUE(e) << e.status().to_string();
        Status st = run_greedy(**e, 4, &ref, &gref);
        ASSERT_TRUE(st) << st.to_string();
    }
    dist::Plan rewritten;
    std::vector<int> asked;  // the devices the loader was asked for
    auto workers = dist::local_gpu_workers::start(
        two_gpu_plan(), false,
        [&](const dist::Plan &p, int rank, int device) {
            asked.push_back(device);
            return dist::expert_worker::load(dir.string(), p, rank, -1);  // the CPU stands in for GPU 1
        },
        &rewritten);
    ASSERT_TRUE(workers) << workers.status().to_string();
    EXPECT_EQ((*workers)->count(), 1);
    EXPECT_EQ(asked, std::vector<int>{1});
    ASSERT_EQ(rewritten.workers.size(), 1u);
    EXPECT_EQ(rewritten.workers[0].transport, "tcp");
    EXPECT_EQ(rewritten.workers[0].device, 1);
    EXPECT_EQ(rewritten.workers[0].budget.name, "gpu1");
    for (int l = 0; l < 12; l++) {
        const dist::LayerPlacement &lp = rewritten.layers[size_t(l)];
        EXPECT_EQ(lp.remote, l >= 6) << "layer " << l;
        EXPECT_EQ(lp.ranks, l >= 6 ? std::vector<int>{0} : std::vector<int>{}) << "layer " << l;
        EXPECT_EQ(lp.local_device, 0) << "layer " << l;
    }
    EXPECT_NE(rewritten.version(), two_gpu_plan().version());
    {
        engine::engine_options o;
        o.remote = experts::layout_from_plan(rewritten, 10000, 1000);
        auto e = engine::engine::open(dir.string(), o);
        ASSERT_TRUE(e) << e.status().to_string();
        Status st = run_greedy(**e, 4, &got, &ggot);
        ASSERT_TRUE(st) << st.to_string();
    }
    ASSERT_EQ(got.size(), ref.size());
    const double err = rel_max(ref, got);
    std::printf("[ local gpus ] CPU engine + in-process worker for GPU 1's layers vs alone: max |dlogit| / max |logit| = "
                "%.3g\n",
                err);
    EXPECT_LE(err, 1e-6);
    EXPECT_EQ(ggot, gref);
    workers->reset();  // stops and joins the worker

    // A plan without such layers starts nothing and is returned as it is.
    dist::Plan one = two_gpu_plan();
    for (auto &lp : one.layers) lp.local_device = 0;
    auto none = dist::local_gpu_workers::start(one, false, [&](const dist::Plan &, int, int) {
        ADD_FAILURE() << "nothing to load";
        return Result<std::unique_ptr<dist::expert_worker>>(Status::internal("unreachable"));
    }, &rewritten);
    ASSERT_TRUE(none);
    EXPECT_EQ((*none)->count(), 0);
    EXPECT_EQ(rewritten.version(), one.version());

    // GPU 0 must take GPU 1's dense weights and KV as well: a budget too small for both is refused
    // before anything loads, with the sizes.
    dist::Plan tight = two_gpu_plan();
    tight.coordinator[0].budget_bytes = 10ull << 30;
    tight.coordinator[0].charges = {{"weights.dense", 6ull << 30}};
    tight.coordinator[1].budget_bytes = 10ull << 30;
    tight.coordinator[1].charges = {{"weights.dense", 3ull << 30}, {"kv.compressed", 2ull << 30}, {"weights.experts", 4ull << 30}};
    auto refused = dist::local_gpu_workers::start(tight, false, [&](const dist::Plan &, int, int) {
        ADD_FAILURE() << "nothing may load";
        return Result<std::unique_ptr<dist::expert_worker>>(Status::internal("unreachable"));
    }, &rewritten);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(refused.status().message().find("gpu0 would hold 11.00 GiB of its 10.00 GiB"), std::string::npos)
        << refused.status().message();

    // A loader that fails: the error names the GPU.
    auto bad = dist::local_gpu_workers::start(two_gpu_plan(), false, [&](const dist::Plan &, int, int) {
        return Result<std::unique_ptr<dist::expert_worker>>(Status::resource_exhausted("out of device memory"));
    }, &rewritten);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.status().code(), status_code::RESOURCE_EXHAUSTED);
    EXPECT_NE(bad.status().message().find("coordinator GPU 1: out of device memory"), std::string::npos)
        << bad.status().message();
    fs::remove_all(dir);
}

}  // namespace
}  // namespace ds41rt
