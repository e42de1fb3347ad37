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

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <cuda_runtime.h>

#include "backend/cpu/routed.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/moe_decode.cuh"
#include "engine/cuda/device_model.h"
#include "engine/cuda/routed_prefill.h"
#include "engine/engine.h"
#include "model/weights.h"
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

// The prefill path for NVFP4 layers (engine/cuda routed_prefill: every expert's rows at once,
// 16 a matrix) on layer 1 of the quantized model: 40 rows of 2 routes, expert 3 on every row (three
// 16-row matrices of it), against backend/cpu routed_expert_sum (the CPU engine's NVFP4 experts,
// the publication's numerics) with nvfp4_moe_decode_test's end-to-end bounds (every row within
// 2e-2, the median row within 1e-3: a bf16 rounding of gate / up crossed by fp32 summation order
// moves h by 2^-8 of an element, now and then an E2M1 code of h), the route weight before and
// after w2; the output is NaN-poisoned first.
TEST(GpuNvfp4, PrefillRoutedSumMatchesTheCpu) {
    if (auto d = backend::cuda::query_device(0); !d) GTEST_SKIP() << d.status().to_string();
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_gpu_nvfp4_prefill_" + std::to_string(getpid()));
    make_quantized_model(dir, "nvfp4");
    if (HasFatalFailure()) return;
    auto wr = model::weights::open(dir.string());
    ASSERT_TRUE(wr) << wr.status().to_string();
    std::shared_ptr<model::weights> w(std::move(wr.value()));
    const model::model_config &c = w->config();
    const int64_t D = c.dim, E = c.n_routed_experts, S = 40;
    ASSERT_GE(E, 8);
    auto mr = engine::gpu::device_model::make(w, true);
    ASSERT_TRUE(mr) << mr.status().to_string();
    engine::gpu::device_model &m = *mr.value();
    backend::cuda::moe_layer L;
    L.D = int(D);
    L.swiglu_limit = c.swiglu_limit;
    L.nvfp4_experts.resize(size_t(E));
    std::vector<backend::cpu::expert_weights> cx(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; e++) {
        const std::string p = "layers.1.ffn.experts." + std::to_string(e) + ".";
        engine::gpu::device_model::nvfp4_dev d[3];
        const char *names[] = {"w1.weight", "w2.weight", "w3.weight"};
        Tensor *cpu[] = {&cx[size_t(e)].w1, &cx[size_t(e)].w2, &cx[size_t(e)].w3};
        for (int i = 0; i < 3; i++) {
            auto g = m.nvfp4(p + names[i]);
            ASSERT_TRUE(g) << g.status().to_string();
            d[i] = g.value();
            auto t = w->f32(p + names[i]);
            ASSERT_TRUE(t) << t.status().to_string();
            *cpu[i] = std::move(t.value());
        }
        cx[size_t(e)].w13_input_scale = d[0].input_scale, cx[size_t(e)].w2_input_scale = d[1].input_scale;
        L.nvfp4_experts[size_t(e)] = {d[0].codes, d[0].scales, d[2].codes, d[2].scales, d[1].codes, d[1].scales,
                                      d[0].weight_scale_2, d[0].input_scale, d[1].weight_scale_2, d[1].input_scale};
        L.I = int(cx[size_t(e)].w1.dim(0));
    }
    const two_route_rows in = expert3_rows(S, D, 5);
    const std::vector<float> &x = in.x;
    const backend::cpu::route_table &rt = in.rt;
    auto xd = m.upload(x.data(), x.size() * sizeof(float));
    ASSERT_TRUE(xd) << xd.status().to_string();
    for (bool after : {false, true}) {
        L.weight_after_w2 = after;
        backend::cpu::expert_numerics nm;
        nm.swiglu_limit = c.swiglu_limit;
        nm.weight_after_w2 = after;
        std::vector<float> ref(static_cast<size_t>(S * D));
        ASSERT_TRUE(backend::cpu::routed_expert_sum(nm, cx, x.data(), D, rt, ref.data()));
        engine::gpu::dtemp acc = m.temp_f32(S * D);
        ASSERT_EQ(cudaMemsetAsync(acc.as<void>(), 0xff, acc.bytes(), m.stream()), cudaSuccess);  // NaN
        Status st = engine::gpu::routed_prefill(m, L, static_cast<const float *>(xd.value()), S, rt, 2, acc.f());
        ASSERT_TRUE(st) << st.to_string();
        std::vector<float> got = m.download_f32(acc.f(), S * D, &st);
        ASSERT_TRUE(st) << st.to_string();
        std::vector<double> rows;
        for (int64_t r = 0; r < S; r++) {
            double num = 0, den = 0;
            for (int64_t i = 0; i < D; i++) {
                const size_t k = size_t(r * D + i);
                ASSERT_TRUE(std::isfinite(got[k])) << "row " << r << " element " << i;
                num += (double(got[k]) - ref[k]) * (double(got[k]) - ref[k]), den += double(ref[k]) * ref[k];
            }
            rows.push_back(std::sqrt(num / den));
        }
        std::vector<double> sorted = rows;
        std::sort(sorted.begin(), sorted.end());
        std::printf("[ gpu nvfp4 ] prefill routed sum, 40 rows, weight %s w2: rows ||gpu - cpu|| / ||cpu|| max %.3g, "
                    "median %.3g\n", after ? "after" : "before", sorted.back(), sorted[sorted.size() / 2]);
        EXPECT_LE(sorted.back(), 2e-2);
        EXPECT_LE(sorted[sorted.size() / 2], 1e-3);
    }
    fs::remove_all(dir);
}

}  // namespace
}  // namespace ds41rt
