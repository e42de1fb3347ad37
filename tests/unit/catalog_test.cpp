// Tensor catalog: the full-size catalogs must reproduce the release totals exactly (tensor count
// and byte total of model.safetensors.index.json), per dtype where the spec gives a breakdown, and
// the conditional tensors must appear exactly where the schedule says.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "model/catalog.h"
#include "model/config.h"

namespace ds41rt::model {
namespace {

model_config load_fixture(const std::string &name) {
    std::ifstream f(std::string(DS41RT_FIXTURES_DIR) + "/configs/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    Result<model_config> c = parse_config(ss.str());
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? c.value() : model_config{};
}

std::map<std::string, catalog_entry> by_name(const std::vector<catalog_entry> &v) {
    std::map<std::string, catalog_entry> m;
    for (const auto &e : v) {
        EXPECT_TRUE(m.emplace(e.name, e).second) << "duplicate " << e.name;
    }
    return m;
}

TEST(catalog, v41_full_size_totals_match_release) {
    model_config c = load_fixture("deepseek-v41-flash.json");
    auto all = build_catalog(c, catalog_scope::ALL);
    catalog_totals t = totals(all, c);
    // Spec V4.1 section 8.1: index total_size and tensor count of the 48 shards.
    EXPECT_EQ(t.tensors, 96085u);
    EXPECT_EQ(t.bytes, 510286023000ull);

    // Per-dtype breakdown (section 8.1): I8 47,232; F8_E4M3 357; F8_E8M0 47,589; BF16 520; F32 387.
    std::map<dtype, uint64_t> count;
    std::map<dtype, uint64_t> bytes;
    for (const auto &e : all)
        for (const auto &s : stored_tensors(e, c)) {
            count[s.type]++;
            bytes[s.type] += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
        }
    EXPECT_EQ(count[dtype::I8], 47232u);
    EXPECT_EQ(count[dtype::F8_E4M3], 357u);
    EXPECT_EQ(count[dtype::F8_E8M0], 47589u);
    EXPECT_EQ(count[dtype::BF16], 520u);
    EXPECT_EQ(count[dtype::F32], 387u);
    EXPECT_EQ(bytes[dtype::I8] / 10000000, 27858u);       // 278.59 GB
    EXPECT_EQ(bytes[dtype::F8_E4M3] / 10000000, 20401u);  // 204.02 GB
    EXPECT_EQ(bytes[dtype::BF16] / 10000000, 395u);       // 3.95 GB

    // Section 8.5: routed experts per layer 7,219,445,760 B; router per layer 3,935,232 B.
    uint64_t experts = 0, router = 0;
    for (const auto &e : all) {
        if (e.layer != 5 || e.part != model_part::TEXT) continue;
        uint64_t b = 0;
        for (const auto &s : stored_tensors(e, c)) b += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
        if (e.role == tensor_role::ROUTED_EXPERT) experts += b;
        if (e.role == tensor_role::ROUTER) router += b;
    }
    EXPECT_EQ(experts, 7219445760ull);
    EXPECT_EQ(router, 3935232ull);

    // The scopes partition the whole.
    uint64_t n = build_catalog(c, catalog_scope::TEXT).size() + build_catalog(c, catalog_scope::MTP).size() +
                 build_catalog(c, catalog_scope::VISION).size();
    EXPECT_EQ(n, all.size());
    by_name(all);  // names unique
}

TEST(catalog, v4_full_size_totals_match_release) {
    model_config c = load_fixture("deepseek-v4-flash.json");
    auto all = build_catalog(c, catalog_scope::ALL);
    catalog_totals t = totals(all, c);
    // Spec V4 section 5.
    EXPECT_EQ(t.tensors, 69187u);
    EXPECT_EQ(t.bytes, 159609485896ull);
    EXPECT_TRUE(build_catalog(c, catalog_scope::VISION).empty());
    by_name(all);
}

TEST(catalog, v41_conditional_tensors) {
    model_config c = load_fixture("deepseek-v41-flash.json");
    auto m = by_name(build_catalog(c, catalog_scope::ALL));
    auto has = [&](const std::string &n) { return m.count(n) != 0; };

    // Spec table rows with their storage and shapes.
    const auto &wq_a = m.at("layers.0.attn.wq_a.weight");
    EXPECT_EQ(wq_a.format, storage_format::FP8_BLOCK);
    EXPECT_EQ(wq_a.shape, (shape_t{1280, 5120}));
    EXPECT_EQ(stored_scale_shape(wq_a.format, wq_a.shape, c), (shape_t{40, 160}));
    EXPECT_EQ(stored_scale_shape(storage_format::FP8_BLOCK, m.at("layers.0.attn.wq_b.weight").shape, c),
              (shape_t{1024, 40}));
    EXPECT_EQ(m.at("layers.9.attn.wo_a.weight").shape, (shape_t{8192, 4096}));
    const auto &w2 = m.at("layers.3.ffn.experts.383.w2.weight");
    EXPECT_EQ(w2.format, storage_format::MXFP4);
    auto st = stored_tensors(w2, c);
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[0].type, dtype::I8);
    EXPECT_EQ(st[0].shape, (shape_t{5120, 1152}));
    EXPECT_EQ(st[1].name, "layers.3.ffn.experts.383.w2.scale");
    EXPECT_EQ(st[1].shape, (shape_t{5120, 72}));
    EXPECT_EQ(m.at("layers.3.ffn.experts.0.w1.weight").role, tensor_role::ROUTED_EXPERT);

    // KV sources: compressor (+gate only at ratio 2) and index keys.
    for (int l : {2, 8, 14}) EXPECT_TRUE(has("layers." + std::to_string(l) + ".attn.compressor.wgate.weight"));
    EXPECT_TRUE(has("layers.20.attn.compressor.wkv.weight"));
    EXPECT_FALSE(has("layers.20.attn.compressor.wgate.weight"));
    EXPECT_TRUE(has("layers.20.attn.indexer.wk.weight"));
    EXPECT_FALSE(has("layers.3.attn.compressor.wkv.weight"));
    EXPECT_FALSE(has("layers.24.attn.indexer.wk.weight"));
    // Index sources: query side only.
    EXPECT_TRUE(has("layers.24.attn.indexer.wq_b.weight"));
    EXPECT_TRUE(has("layers.36.attn.indexer.weights_proj.weight"));
    EXPECT_FALSE(has("layers.25.attn.indexer.wq_b.weight"));
    EXPECT_FALSE(has("layers.0.attn.indexer.wq_b.weight"));
    // Engram.
    const auto &table = m.at("layers.14.engram.embed.weight");
    EXPECT_EQ(table.format, storage_format::ENGRAM_TABLE);
    EXPECT_EQ(table.shape, (shape_t{384016682, 256}));
    EXPECT_EQ(stored_tensors(table, c)[1].name, "layers.14.engram.embed.scale");
    EXPECT_EQ(stored_tensors(table, c)[1].shape, (shape_t{384016682, 8}));
    EXPECT_EQ(m.at("layers.1.engram.wkv.weight").shape, (shape_t{25600, 6144}));
    EXPECT_EQ(stored_scale_shape(storage_format::FP8_BLOCK, m.at("layers.1.engram.wkv.weight").shape, c),
              (shape_t{800, 192}));
    EXPECT_FALSE(has("layers.2.engram.embed.weight"));
    // No V4 leftovers.
    EXPECT_FALSE(has("hc_head_fn"));
    EXPECT_FALSE(has("layers.0.ffn.gate.tid2eid"));
    EXPECT_FALSE(has("layers.2.attn.compressor.ape"));
    EXPECT_TRUE(has("layers.0.ffn.gate.bias_vl"));

    // DSpark stages: window-only blocks with 128 experts, heads on the last stage.
    EXPECT_TRUE(has("mtp.2.ffn.experts.127.w3.weight"));
    EXPECT_FALSE(has("mtp.2.ffn.experts.128.w3.weight"));
    EXPECT_EQ(m.at("mtp.1.ffn.gate.weight").shape, (shape_t{128, 5120}));
    EXPECT_EQ(m.at("mtp.0.main_proj.weight").shape, (shape_t{5120, 15360}));
    EXPECT_EQ(m.at("mtp.2.confidence_head.proj.weight").shape, (shape_t{1, 5376}));
    EXPECT_EQ(m.at("mtp.2.markov_head.head.weight").shape, (shape_t{129280, 256}));
    EXPECT_EQ(m.at("mtp.0.attn.wq_a.weight").part, model_part::MTP);
    EXPECT_EQ(m.at("mtp.0.attn.wq_a.weight").layer, 40);
    EXPECT_FALSE(has("mtp.0.attn.compressor.wkv.weight"));
    EXPECT_FALSE(has("mtp.0.e_proj.weight"));

    // Vision.
    EXPECT_EQ(m.at("vision.blocks.31.mlp.w1.weight").shape, (shape_t{5632, 1024}));
    EXPECT_EQ(m.at("aligner.w1.weight").shape, (shape_t{5120, 9216}));
    EXPECT_EQ(m.at("vision.patch_embed.proj.weight").shape, (shape_t{1024, 588}));
    EXPECT_EQ(m.at("image_newline").part, model_part::VISION);
}

TEST(catalog, v4_conditional_tensors) {
    model_config c = load_fixture("deepseek-v4-flash.json");
    auto m = by_name(build_catalog(c, catalog_scope::ALL));
    auto has = [&](const std::string &n) { return m.count(n) != 0; };
    EXPECT_TRUE(has("layers.2.ffn.gate.tid2eid"));
    EXPECT_FALSE(has("layers.2.ffn.gate.bias"));
    EXPECT_EQ(m.at("layers.0.ffn.gate.tid2eid").format, storage_format::I64);
    EXPECT_EQ(m.at("layers.0.ffn.gate.tid2eid").shape, (shape_t{129280, 6}));
    EXPECT_TRUE(has("layers.3.ffn.gate.bias"));
    EXPECT_FALSE(has("layers.3.ffn.gate.tid2eid"));
    EXPECT_TRUE(has("mtp.0.ffn.gate.bias"));  // MTP routes by score, never by hash
    EXPECT_EQ(m.at("layers.2.attn.compressor.wkv.weight").shape, (shape_t{1024, 4096}));  // CSA overlap
    EXPECT_EQ(m.at("layers.3.attn.compressor.wkv.weight").shape, (shape_t{512, 4096}));   // HCA
    EXPECT_EQ(m.at("layers.3.attn.compressor.ape").shape, (shape_t{128, 512}));
    EXPECT_EQ(m.at("layers.2.attn.indexer.compressor.ape").shape, (shape_t{4, 256}));
    EXPECT_FALSE(has("layers.3.attn.indexer.wq_b.weight"));
    EXPECT_FALSE(has("layers.1.attn.compressor.wkv.weight"));
    const auto &wq_b = m.at("layers.7.attn.wq_b.weight");
    EXPECT_EQ(stored_scale_shape(wq_b.format, wq_b.shape, c), (shape_t{256, 8}));
    EXPECT_EQ(stored_tensors(m.at("layers.7.ffn.experts.0.w1.weight"), c)[1].shape, (shape_t{2048, 128}));
    for (const char *n : {"mtp.0.e_proj.weight", "mtp.0.h_proj.weight", "mtp.0.enorm.weight", "mtp.0.hnorm.weight",
                          "mtp.0.norm.weight", "mtp.0.hc_head_fn", "hc_head_scale"})
        EXPECT_TRUE(has(n)) << n;
    EXPECT_EQ(m.at("mtp.0.e_proj.weight").part, model_part::MTP);
    EXPECT_EQ(m.at("hc_head_fn").shape, (shape_t{4, 16384}));
}

TEST(catalog, unquantized_config_is_all_bf16) {
    model_config c = load_fixture("deepseek-v4-flash.json");
    c.quant_method.clear();
    c.expert_dtype.clear();
    for (const auto &e : build_catalog(c, catalog_scope::ALL))
        EXPECT_TRUE(e.format == storage_format::BF16 || e.format == storage_format::F32 ||
                    e.format == storage_format::I64)
            << e.name;
}

TEST(catalog, scale_names) {
    EXPECT_EQ(scale_name("layers.0.attn.wq_a.weight"), "layers.0.attn.wq_a.scale");
    EXPECT_EQ(scale_name("x"), "x.scale");
}

}  // namespace
}  // namespace ds41rt::model
