// ds41rt synth (model/synth.h): the synthesized checkpoint passes the catalog check in the
// official storage formats, runs through the engine with finite logits, and is byte-for-byte
// reproducible from its seed. A 512-id vocabulary keeps the test fast; the layout is the one
// scripts/run.sh serves with the real 129,280-id vocabulary.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include "engine/engine.h"
#include "model/catalog.h"
#include "model/synth.h"
#include "model/weights.h"

namespace ds41rt::model {
namespace {

namespace fs = std::filesystem;

struct temp_dir {
    fs::path path;
    temp_dir() {
        static std::atomic<int> n{0};
        path = fs::temp_directory_path() / ("ds41rt_synth_test_" + std::to_string(getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    std::string str() const { return path.string(); }
};

synth_options tiny(uint64_t seed) {
    synth_options o;
    o.seed = seed;
    o.vocab_size = 512;
    o.engram_vocab_size = 50;
    return o;
}

std::string slurp(const fs::path &p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(synth, checkpoint_passes_the_catalog_check_in_official_formats) {
    temp_dir d;
    ASSERT_TRUE(synthesize(d.str(), tiny(1)).is_ok());
    auto w = weights::open(d.str());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    Status st = w.value()->check();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(w.value()->report().unexpected.empty());
    EXPECT_TRUE(w.value()->has_part(model_part::MTP));
    EXPECT_FALSE(w.value()->has_part(model_part::VISION));

    const model_config &c = w.value()->config();
    EXPECT_EQ(c.model_arch, arch::V41);
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ(c.n_layers, 12);
    EXPECT_EQ(c.fp8_block_out, 32);
    EXPECT_EQ(c.fp8_block_in, 32);
    EXPECT_EQ(c.expert_dtype, "fp4");
    EXPECT_EQ(c.bos_token_id, 0);
    EXPECT_EQ(c.eos_token_id, 1);
    EXPECT_EQ(c.pad_token_id, 2);
    EXPECT_EQ(c.engram_compressed_vocab_size, 512);  // no token map: every id its own class
    // Stored exactly as the release stores each kind (spec 8.2).
    EXPECT_EQ(w.value()->format("layers.0.attn.wq_a.weight").value(), storage_format::FP8_BLOCK);
    EXPECT_EQ(w.value()->format("layers.0.ffn.experts.0.w1.weight").value(), storage_format::MXFP4);
    EXPECT_EQ(w.value()->format("layers.1.engram.embed.weight").value(), storage_format::ENGRAM_TABLE);
    EXPECT_EQ(w.value()->format("embed.weight").value(), storage_format::BF16);
    EXPECT_EQ(w.value()->format("layers.0.hc_attn_fn").value(), storage_format::F32);
    // Quantized values stay at their intended scale: wq_a ~ N(0, 1/64) dequantizes to RMS ~1/8.
    auto wq = w.value()->f32("layers.0.attn.wq_a.weight");
    ASSERT_TRUE(wq.is_ok());
    double ss = 0;
    for (int64_t i = 0; i < wq->numel(); i++) ss += double(wq->f()[i]) * wq->f()[i];
    EXPECT_NEAR(std::sqrt(ss / double(wq->numel())), 0.125, 0.01);
}

TEST(synth, engine_prefill_gives_finite_logits) {
    temp_dir d;
    ASSERT_TRUE(synthesize(d.str(), tiny(2)).is_ok());
    for (engine::numerics mode : {engine::numerics::TRANSFORMERS, engine::numerics::OFFICIAL}) {
        engine::engine_options opt;
        opt.mode = mode;
        auto e = engine::engine::open(d.str(), opt);
        ASSERT_TRUE(e.is_ok()) << e.status().to_string();
        engine::seq_id s = e.value()->create_sequence();
        std::vector<Tensor> logits;
        Status st = e.value()->step({{s, {0, 17, 300}}}, &logits);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        ASSERT_EQ(logits.size(), 1u);
        ASSERT_EQ(logits[0].shape(), (shape_t{3, 512}));
        double ss = 0;
        for (int64_t i = 0; i < logits[0].numel(); i++) {
            ASSERT_TRUE(std::isfinite(logits[0].f()[i])) << "logit " << i;
            ss += double(logits[0].f()[i]) * logits[0].f()[i];
        }
        EXPECT_GT(ss, 0.0);
    }
}

TEST(synth, same_seed_same_bytes) {
    temp_dir a, b, c;
    ASSERT_TRUE(synthesize(a.str(), tiny(7)).is_ok());
    ASSERT_TRUE(synthesize(b.str(), tiny(7)).is_ok());
    ASSERT_TRUE(synthesize(c.str(), tiny(8)).is_ok());
    for (const char *f : {"config.json", "model.safetensors", "engram_token_map.safetensors"}) {
        std::string x = slurp(a.path / f);
        ASSERT_FALSE(x.empty()) << f;
        EXPECT_TRUE(x == slurp(b.path / f)) << f << " differs between two runs with seed 7";
    }
    EXPECT_FALSE(slurp(a.path / "model.safetensors") == slurp(c.path / "model.safetensors"));
    EXPECT_TRUE(slurp(a.path / "config.json") == slurp(c.path / "config.json"));
}

TEST(synth, token_map_file_round_trips_and_sets_the_class_count) {
    temp_dir a, b;
    ASSERT_TRUE(synthesize(a.str(), tiny(3)).is_ok());
    // A map with fewer classes than ids, in the file layout tools/synth/engram_token_map.py writes.
    synth_options o = tiny(3);
    ASSERT_TRUE(load_synth_token_map((a.path / "engram_token_map.safetensors").string(), &o).is_ok());
    EXPECT_EQ(o.vocab_size, 512);
    ASSERT_EQ(o.token_map.size(), 512u);
    EXPECT_EQ(o.multipliers.size(), SYNTH_ENGRAM_LAYERS.size() * SYNTH_ENGRAM_MAX_NGRAM);
    for (auto &v : o.token_map) v /= 2;
    ASSERT_TRUE(synthesize(b.str(), o).is_ok());
    auto w = weights::open(b.str());
    ASSERT_TRUE(w.is_ok());
    EXPECT_EQ(w.value()->config().engram_compressed_vocab_size, 256);
    auto e = engine::engine::open(b.str());
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
}

TEST(synth, rejects_bad_options) {
    temp_dir d;
    synth_options o = tiny(0);
    o.dim = 48;
    EXPECT_EQ(synthesize(d.str(), o).code(), status_code::INVALID_ARGUMENT);
    o = tiny(0);
    o.token_map.assign(100, 0);
    EXPECT_EQ(synthesize(d.str(), o).code(), status_code::INVALID_ARGUMENT);
    EXPECT_FALSE(fs::exists(d.path / "config.json"));
}

}  // namespace
}  // namespace ds41rt::model
