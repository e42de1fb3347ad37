// A tiny V4.1 model with NVFP4 (ModelOpt W4A4) routed experts on the GPU engine against the CPU
// engine (issue 6: the same greedy continuation on CPU and GPU). Both run the publication's
// numerics for those experts (activations quantized per 16 with each expert's input_scale, bf16
// gate / up / silu / h, backend/cpu nvfp4_w4a4_expert and backend/cuda moe_decode's NVFP4 mode).
// Asserted in OFFICIAL numerics (bf16 activations, the numerics the publication was made for):
// the same 12 greedy tokens (measured on the H200: 12/12, last-position logits 6.2e-8 apart).
// TRANSFORMERS numerics is printed only: its fp32 residual streams differ between the engines by
// fp32 summation order (~1e-7), which now and then moves an activation across a bf16 or E2M1
// rounding boundary, and on this untrained random model W4A4 amplifies each such flip (its
// activation quantization alone moves the logits by ~70%, quant_engine_test): the continuations
// part after a token or two (H200: 1/12). Finite logits are asserted in both; the kernel tests
// hold the per-layer bounds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "backend/cuda/device_info.h"
#include "engine/engine.h"
#include "quantized_model.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

TEST(GpuNvfp4, GreedyContinuationEqualsTheCpuEngine) {
    if (auto d = backend::cuda::query_device(0); !d) GTEST_SKIP() << d.status().to_string();
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_gpu_nvfp4_" + std::to_string(getpid()));
    make_quantized_model(dir, "nvfp4");
    if (HasFatalFailure()) return;
    for (auto mode : {engine::numerics::TRANSFORMERS, engine::numerics::OFFICIAL}) {
        std::vector<float> logits[2];
        std::vector<int32_t> greedy[2];
        for (int k = 0; k < 2; k++) {
            engine::engine_options o;
            o.mode = mode;
            o.backend = k ? engine::backend_kind::CUDA : engine::backend_kind::CPU;
            auto e = engine::engine::open(dir.string(), o);
            ASSERT_TRUE(e) << e.status().to_string();
            engine::seq_id s = (*e)->create_sequence();
            std::vector<int32_t> tokens = {0, 17, 300, 42, 5, 511, 77, 9, 123, 64};
            for (int step = 0; step < 12; step++) {
                std::vector<Tensor> out;
                Status st = (*e)->step({{s, tokens}}, &out);
                ASSERT_TRUE(st) << st.to_string();
                const Tensor &l = out[0];
                const int64_t V = l.dim(1);
                const float *last = l.f() + (l.dim(0) - 1) * V;
                logits[k].insert(logits[k].end(), last, last + V);
                tokens = {int32_t(std::max_element(last, last + V) - last)};
                greedy[k].push_back(tokens[0]);
            }
        }
        double num = 0, den = 0;
        for (size_t i = 0; i < logits[0].size(); i++) {
            ASSERT_TRUE(std::isfinite(logits[1][i]));
            num = std::max(num, double(std::fabs(logits[0][i] - logits[1][i])));
            den = std::max(den, double(std::fabs(logits[0][i])));
        }
        size_t same = 0;
        while (same < greedy[0].size() && greedy[0][same] == greedy[1][same]) same++;
        std::printf("[ gpu nvfp4 ] %s: last-position logits max |gpu - cpu| / max |cpu| = %.3g; greedy identical for "
                    "%zu/%zu tokens\n",
                    mode == engine::numerics::OFFICIAL ? "official" : "transformers", num / den, same, greedy[0].size());
        if (mode == engine::numerics::OFFICIAL) {
            EXPECT_EQ(greedy[0], greedy[1]);
        }
    }
    fs::remove_all(dir);
}

}  // namespace
}  // namespace ds41rt
