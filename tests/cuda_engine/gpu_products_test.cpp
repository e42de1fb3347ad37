// engine::product_times on the GPU engine (the per-kernel table of `ds41rt bench`): a profiled
// decode step of the V4.1 fixture stored as the official checkpoint times every weight product
// under its label, with the bytes its weights occupy and 2 M N K FLOPs. The bytes are checked
// against the checkpoint's own tensor sizes (the safetensors entries' byte lengths: codes and
// scales), not against the engine's count from the shapes, so a wrong count of either fails.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "engine/engine.h"
#include "model/weights.h"

using namespace ds41rt;
namespace fs = std::filesystem;

namespace {

std::map<std::string, engine::op_time> by_name(const std::vector<engine::op_time> &v) {
    std::map<std::string, engine::op_time> m;
    for (const engine::op_time &t : v) m[t.name] = t;
    return m;
}

TEST(GpuProducts, DecodeStepTimesEachWeightProductWithItsStoredBytes) {
    const fs::path dir = fs::path(DS41RT_FIXTURES_DIR) / "deepseek-v41-flash-quant";
    engine::engine_options o;
    o.backend = engine::backend_kind::CUDA;
    o.mode = engine::numerics::OFFICIAL;
    auto opened = engine::engine::open(dir.string(), o);
    if (!opened) GTEST_SKIP() << opened.status().to_string();  // no GPU here
    engine::engine &eng = *opened.value();
    auto w = model::weights::open(dir.string());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    const model::model_config &c = eng.config();
    auto stored = [&](const std::string &name) {
        auto t = w.value()->raw(name);
        EXPECT_TRUE(t.is_ok()) << name;
        return t ? double(t->nbytes()) : 0.0;
    };

    const engine::seq_id s = eng.create_sequence();
    std::vector<Tensor> out;
    ASSERT_TRUE(eng.step({{s, {5, 6, 7, 8, 9, 10}}}, &out).is_ok());
    EXPECT_TRUE(eng.product_times().empty()) << "nothing is timed unless profiling";
    eng.set_profile(true);
    eng.reset_op_times();
    ASSERT_TRUE(eng.step({{s, {11}}}, &out).is_ok());
    const auto p = by_name(eng.product_times());
    for (const auto &[name, t] : p) {
        EXPECT_GT(t.ms, 0) << name;
        EXPECT_GT(t.calls, 0) << name;
    }

    // wq_a and wkv share x and one GEMV launch a layer: both weights once, x twice, two outputs.
    const auto qkv = p.find("attn.wq_a + attn.wkv [fp8 gemv, M 1]");
    ASSERT_NE(qkv, p.end());
    double bytes = 0, flops = 0;
    for (int l = 0; l < c.n_layers; l++) {
        const std::string pre = "layers." + std::to_string(l) + ".attn.";
        for (const char *n : {"wq_a", "wkv"}) {
            auto t = w.value()->raw(pre + n + ".weight");  // E4M3 codes: the logical [N, K]
            ASSERT_TRUE(t.is_ok());
            const double N = double(t->dim(0)), K = double(t->dim(1));
            bytes += stored(pre + n + ".weight") + stored(pre + n + ".scale") + (K + N) * 4;
            flops += 2 * N * K;
        }
    }
    EXPECT_EQ(qkv->second.calls, c.n_layers);
    EXPECT_DOUBLE_EQ(qkv->second.bytes, bytes);
    EXPECT_DOUBLE_EQ(qkv->second.flops, flops);

    // The routed experts of one row: the K experts it picks (distinct), each expert's three
    // MXFP4 matrices once, plus the row in and its sum out.
    const auto routed = p.find("ffn.experts [mxfp4 routed, B 1]");
    ASSERT_NE(routed, p.end());
    double expert = 0;
    for (const char *m : {"w1", "w2", "w3"}) {
        const std::string n = "layers.0.ffn.experts.0." + std::string(m);
        expert += stored(n + ".weight") + stored(n + ".scale");
    }
    EXPECT_EQ(routed->second.calls, c.n_layers);
    EXPECT_DOUBLE_EQ(routed->second.bytes, c.n_layers * (c.n_activated_experts * expert + 2.0 * c.dim * 4));
    EXPECT_DOUBLE_EQ(routed->second.flops, c.n_layers * 2.0 * c.n_activated_experts * 3 * c.dim * c.moe_inter_dim);

    // The head: one row through the stored F32 / BF16 matrix.
    bool head = false;
    for (const auto &[name, t] : p)
        if (name.rfind("head [", 0) == 0) {
            head = true;
            EXPECT_EQ(t.calls, 1);
            EXPECT_DOUBLE_EQ(t.flops, 2.0 * double(c.vocab_size) * c.dim);
        }
    EXPECT_TRUE(head);
    eng.free_sequence(s);
}

}  // namespace
