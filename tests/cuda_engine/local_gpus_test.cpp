// Local expert layers on a second coordinator GPU (dist/local_gpus): the tiny V4.1 model with
// layers 0-5's experts on GPU 0 and 6-11's on GPU 1 (a `ds41rt plan --gpus 2` placement), the
// GPU 1 layers served by an in-process worker on GPU 1:
//  - the GPU engine as coordinator (NCCL to the in-process worker): logits within 1e-5 of the GPU
//    engine alone (the worker runs the same moe_routed kernels at full width; the partial is
//    added to the shared expert in another order), the same greedy tokens;
//  - the CPU engine as coordinator (TCP to it): logits within 1e-5 of the CPU engine alone (the
//    GPU's GEMV against the CPU's fp64 sums: ~1e-6, as gpu_worker_test), the same greedy tokens.
// Skips without two GPUs.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "dist/local_gpus.h"
#include "engine/engine.h"
#include "experts/from_plan.h"
#include "model/synth.h"
#include "tiny_synth.h"
#include "two_gpu_plan.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

TEST(LocalGpus, SecondGpuLayersMatchTheSingleGpuRun) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs 2 GPUs; found " << n;
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_local_gpus_" + std::to_string(getpid()));
    fs::remove_all(dir);
    ASSERT_TRUE(model::synthesize(dir.string(), tiny_synth()));
    for (auto backend : {engine::backend_kind::CUDA, engine::backend_kind::CPU}) {
        const bool gpu = backend == engine::backend_kind::CUDA;
        std::vector<float> ref, got;
        std::vector<int32_t> gref, ggot;
        {
            engine::engine_options o;
            o.backend = backend;
            auto e = engine::engine::open(dir.string(), o);
            ASSERT_TRUE(e) << e.status().to_string();
            Status st = run_greedy(**e, 5, &ref, &gref);
            ASSERT_TRUE(st) << st.to_string();
        }
        dist::Plan rewritten;
        auto workers = dist::local_gpu_workers::start(dir.string(), two_gpu_plan(), gpu, &rewritten);
        ASSERT_TRUE(workers) << workers.status().to_string();
        ASSERT_EQ((*workers)->count(), 1);
        ASSERT_EQ(rewritten.workers.size(), 1u);
        EXPECT_EQ(rewritten.workers[0].device, 1);
        EXPECT_EQ(rewritten.workers[0].transport, gpu ? "nccl" : "tcp");
        for (int l = 0; l < 12; l++) {
            EXPECT_EQ(rewritten.layers[size_t(l)].remote, l >= 6) << "layer " << l;
            EXPECT_EQ(rewritten.layers[size_t(l)].local_device, 0) << "layer " << l;
        }
        {
            engine::engine_options o;
            o.backend = backend;
            o.remote = experts::layout_from_plan(rewritten, 10000, 1000);
            auto e = engine::engine::open(dir.string(), o);
            ASSERT_TRUE(e) << e.status().to_string();
            Status st = run_greedy(**e, 5, &got, &ggot);
            ASSERT_TRUE(st) << st.to_string();
        }
        ASSERT_EQ(got.size(), ref.size());
        const double err = rel_max(ref, got);
        std::printf("[ local gpus ] %s coordinator, layers 6-11 on GPU 1 in-process (%s): max |dlogit| / max |logit| = "
                    "%.3g over %zu logits\n",
                    gpu ? "GPU" : "CPU", gpu ? "NCCL" : "TCP", err, ref.size());
        EXPECT_LE(err, 1e-5);
        EXPECT_EQ(ggot, gref);
    }
    fs::remove_all(dir);
}

}  // namespace
}  // namespace ds41rt
