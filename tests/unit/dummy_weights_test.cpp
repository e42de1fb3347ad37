// The dummy-weight plan (model/dummy_weights) against the release: for the built-in full-size
// V4.1 and V4 Flash configs its bytes are the catalog's text part, which together with the MTP and
// vision parts is the released model.safetensors total (spec V4.1 section 8.1: 510,286,023,000 B;
// V4 section 5: 159,609,485,896 B); --layers N keeps the globals (whose bytes follow by hand from
// the released vocabulary and width) plus N layers of at least the per-layer routed experts and
// router the spec gives (V4.1 section 8.5); every tensor of every part has a fill rule.
#include "model/dummy_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "model/flash_configs.h"

namespace ds41rt::model {
namespace {

model_config flash(arch a) {
    Result<model_config> c = flash_config(a);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? c.value() : model_config{};
}

uint64_t part_bytes(const model_config &c, catalog_scope s) { return totals(build_catalog(c, s), c).bytes; }

dummy_plan plan_or_die(const model_config &c, int layers) {
    Result<dummy_plan> p = plan_dummy_weights(c, layers);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return p.is_ok() ? p.value() : dummy_plan{};
}

const dummy_tensor &find(const dummy_plan &p, const std::string &name) {
    for (const dummy_tensor &t : p.tensors)
        if (t.entry.name == name) return t;
    ADD_FAILURE() << "no " << name;
    static dummy_tensor none;
    return none;
}

TEST(dummy_weights, full_size_v41_is_the_text_part_of_the_release) {
    const model_config c = flash(arch::V41);
    const dummy_plan p = plan_or_die(c, -1);
    const catalog_totals text = totals(build_catalog(c, catalog_scope::TEXT), c);
    EXPECT_EQ(p.layers, 40);
    EXPECT_EQ(p.bytes, text.bytes);
    EXPECT_EQ(p.stored_tensors, text.tensors);
    EXPECT_EQ(p.bytes + part_bytes(c, catalog_scope::MTP) + part_bytes(c, catalog_scope::VISION), 510286023000ull);
    uint64_t sum = 0;
    for (const dummy_tensor &t : p.tensors) sum += t.bytes;
    EXPECT_EQ(sum, p.bytes);
    std::printf("[ info ] V4.1 Flash dummy text part: %zu entries, %llu stored tensors, %.2f GB\n", p.tensors.size(),
                (unsigned long long)p.stored_tensors, double(p.bytes) / 1e9);
}

TEST(dummy_weights, full_size_v4_is_the_text_part_of_the_release) {
    const model_config c = flash(arch::V4);
    const dummy_plan p = plan_or_die(c, -1);
    const catalog_totals text = totals(build_catalog(c, catalog_scope::TEXT), c);
    EXPECT_EQ(p.layers, 43);
    EXPECT_EQ(p.bytes, text.bytes);
    EXPECT_EQ(p.stored_tensors, text.tensors);
    EXPECT_EQ(p.bytes + part_bytes(c, catalog_scope::MTP), 159609485896ull);
}

TEST(dummy_weights, layers_keep_the_globals_and_the_first_n_blocks) {
    const model_config c = flash(arch::V41);
    // embed + head BF16 [129280, 5120] and the final norm BF16 [5120]; V4.1 has no hc_head.
    const uint64_t globals = 2ull * 129280 * 5120 * 2 + 5120 * 2;
    EXPECT_EQ(plan_or_die(c, 0).bytes, globals);
    // Bytes per layer from the whole plan; a cut at n holds the globals and layers 0..n-1 only.
    const dummy_plan all = plan_or_die(c, -1);
    std::vector<uint64_t> layer_bytes(size_t(c.n_layers), 0);
    for (const dummy_tensor &t : all.tensors)
        if (t.entry.layer >= 0) layer_bytes[size_t(t.entry.layer)] += t.bytes;
    for (int l = 0; l < c.n_layers; l++)  // section 8.5: routed experts 7,219,445,760 B, router 3,935,232 B, + attention
        EXPECT_GE(layer_bytes[size_t(l)], 7219445760ull + 3935232ull) << "layer " << l;
    for (int n : {1, 2, 15, 39, 40}) {
        const dummy_plan p = plan_or_die(c, n);
        uint64_t want = globals;
        for (int l = 0; l < n; l++) want += layer_bytes[size_t(l)];
        EXPECT_EQ(p.bytes, want) << "--layers " << n;
        EXPECT_EQ(p.layers, n);
        int max_layer = -1;
        for (const dummy_tensor &t : p.tensors) max_layer = std::max(max_layer, t.entry.layer);
        EXPECT_EQ(max_layer, n - 1);
    }
    EXPECT_EQ(plan_or_die(c, 40).bytes, all.bytes);

    const model_config c4 = flash(arch::V4);
    // V4 adds hc_head: fn F32 [4, 4 * 4096], base F32 [4], scale F32 [1].
    EXPECT_EQ(plan_or_die(c4, 0).bytes, 2ull * 129280 * 4096 * 2 + 4096 * 2 + (4ull * 16384 + 4 + 1) * 4);
    EXPECT_EQ(plan_or_die(c4, 43).bytes, plan_or_die(c4, -1).bytes);
}

TEST(dummy_weights, rejects_layer_counts_outside_the_model) {
    const model_config c = flash(arch::V41);
    for (int bad : {-2, 41}) {
        Result<dummy_plan> p = plan_dummy_weights(c, bad);
        ASSERT_FALSE(p.is_ok()) << bad;
        EXPECT_EQ(p.status().code(), status_code::INVALID_ARGUMENT);
        EXPECT_NE(p.status().message().find("--layers " + std::to_string(bad)), std::string::npos) << p.status().message();
    }
}

// The quantized publications' configs (flash_config(a, q): the publication's quantization_config
// read by the checkpoint parser) select their expert storage, and the plan stores the routed
// experts as the publications do: names, dtypes and shapes from spec quant-formats 1.3 (checked
// there against the real nvidia/DeepSeek-V4.1-Flash-NVFP4 headers) and 3 (diffbot EXL3), bytes per
// projection from its sections 1.14 (6,635,528 B) and 2.6 (2,963,972 B).
struct stored_want {
    std::string suffix;
    dtype type;
    shape_t shape;
};

void expect_stored(const dummy_tensor &t, const std::string &prefix, const std::vector<stored_want> &want) {
    ASSERT_EQ(t.stored.size(), want.size()) << t.entry.name;
    for (size_t i = 0; i < want.size(); i++) {
        EXPECT_EQ(t.stored[i].name, prefix + want[i].suffix);
        EXPECT_EQ(t.stored[i].type, want[i].type) << t.stored[i].name;
        EXPECT_EQ(t.stored[i].shape, want[i].shape) << t.stored[i].name;
    }
}

TEST(dummy_weights, nvfp4_publication_routed_experts) {
    Result<model_config> c = flash_config(arch::V41, expert_quant::NVFP4);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->routed_quant, expert_quant::NVFP4);
    EXPECT_EQ(routed_expert_format(c.value()), storage_format::NVFP4);
    EXPECT_EQ(c->fp8_block_out, 32);  // the backbone stays official
    const dummy_plan p = plan_or_die(c.value(), 1);
    const dummy_tensor &w1 = find(p, "layers.0.ffn.experts.5.w1.weight");
    const dummy_tensor &w3 = find(p, "layers.0.ffn.experts.5.w3.weight");
    const dummy_tensor &w2 = find(p, "layers.0.ffn.experts.5.w2.weight");
    expect_stored(w1, "layers.0.ffn.experts.5.w1.",
                  {{"weight", dtype::U8, {2304, 2560}}, {"weight_scale", dtype::F8_E4M3, {2304, 320}},
                   {"weight_scale_2", dtype::F32, {}}, {"input_scale", dtype::F32, {}}});
    expect_stored(w2, "layers.0.ffn.experts.5.w2.",
                  {{"weight", dtype::U8, {5120, 1152}}, {"weight_scale", dtype::F8_E4M3, {5120, 144}},
                   {"weight_scale_2", dtype::F32, {}}, {"input_scale", dtype::F32, {}}});
    for (const dummy_tensor *t : {&w1, &w3, &w2}) {
        EXPECT_EQ(t->entry.format, storage_format::NVFP4);
        EXPECT_EQ(t->bytes, 6635528u) << t->entry.name;
        EXPECT_EQ(t->block_out, 1);
        EXPECT_EQ(t->block_in, 16);
        EXPECT_EQ(t->input_amax, DUMMY_NVFP4_INPUT_AMAX);
        EXPECT_EQ(t->rule.init, dummy_init::NORMAL);
    }
    // The official dummy experts' std (1 / sqrt(fan_in)); gate and up alike, as the loader demands.
    EXPECT_DOUBLE_EQ(w1.rule.std, 1 / std::sqrt(5120.0));
    EXPECT_DOUBLE_EQ(w3.rule.std, w1.rule.std);
    EXPECT_DOUBLE_EQ(w2.rule.std, 1 / std::sqrt(2304.0));
    // Everything else keeps the official storage.
    EXPECT_EQ(find(p, "layers.0.ffn.shared_experts.w1.weight").entry.format, storage_format::FP8_BLOCK);
    EXPECT_EQ(find(p, "layers.0.attn.wq_a.weight").entry.format, storage_format::FP8_BLOCK);
    // Whole model: the text catalog of the NVFP4 config, routed experts at spec 1.14's 7.12 GiB per layer.
    const dummy_plan all = plan_or_die(c.value(), -1);
    const catalog_totals text = totals(build_catalog(c.value(), catalog_scope::TEXT), c.value());
    EXPECT_EQ(all.bytes, text.bytes);
    EXPECT_EQ(all.stored_tensors, text.tensors);
    EXPECT_EQ(expert_layer_bytes(c.value(), storage_format::NVFP4), 7644128256ull);
}

TEST(dummy_weights, exl3_publication_routed_experts) {
    Result<model_config> c = flash_config(arch::V41, expert_quant::EXL3);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->routed_quant, expert_quant::EXL3);
    EXPECT_EQ(c->exl3_bits, 2);
    EXPECT_EQ(c->exl3_cb, exl3_codebook::MCG);
    EXPECT_EQ(routed_expert_format(c.value()), storage_format::EXL3);
    const dummy_plan p = plan_or_die(c.value(), 2);
    const dummy_tensor &w1 = find(p, "layers.1.ffn.experts.383.w1.weight");
    const dummy_tensor &w2 = find(p, "layers.1.ffn.experts.383.w2.weight");
    expect_stored(w1, "layers.1.ffn.experts.383.w1.",
                  {{"trellis", dtype::I16, {320, 144, 32}}, {"suh", dtype::F16, {5120}}, {"svh", dtype::F16, {2304}},
                   {"mcg", dtype::I32, {}}});
    expect_stored(w2, "layers.1.ffn.experts.383.w2.",
                  {{"trellis", dtype::I16, {144, 320, 32}}, {"suh", dtype::F16, {2304}}, {"svh", dtype::F16, {5120}},
                   {"mcg", dtype::I32, {}}});
    for (const dummy_tensor *t : {&w1, &w2}) {
        EXPECT_EQ(t->entry.format, storage_format::EXL3);
        EXPECT_EQ(t->bytes, 2963972u) << t->entry.name;
        EXPECT_EQ(t->block_out, 128);
        EXPECT_EQ(t->block_in, 128);
        EXPECT_EQ(t->exl3_bits, 2);
        EXPECT_NEAR(t->exl3_code_rms, 1.2441, 2e-3);  // spec 2.4's MCG statistics
    }
    EXPECT_DOUBLE_EQ(w1.rule.std, 1 / std::sqrt(5120.0));
    EXPECT_DOUBLE_EQ(w2.rule.std, 1 / std::sqrt(2304.0));
    // Spec 2.6: 3,414,495,744 B of routed experts per layer.
    EXPECT_EQ(expert_layer_bytes(c.value(), storage_format::EXL3), 3414495744ull);
    const dummy_plan all = plan_or_die(c.value(), -1);
    EXPECT_EQ(all.bytes, totals(build_catalog(c.value(), catalog_scope::TEXT), c.value()).bytes);
}

TEST(dummy_weights, official_quant_is_the_plain_config) {
    Result<model_config> a = flash_config(arch::V41, expert_quant::OFFICIAL), b = flash_config(arch::V41);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(a->routed_quant, expert_quant::OFFICIAL);
    EXPECT_EQ(plan_or_die(a.value(), 1).bytes, plan_or_die(b.value(), 1).bytes);
    Result<model_config> v4 = flash_config(arch::V4, expert_quant::NVFP4);
    ASSERT_TRUE(v4.is_ok()) << v4.status().to_string();
    EXPECT_EQ(v4->routed_quant, expert_quant::NVFP4);
}

TEST(dummy_weights, every_tensor_of_every_part_has_a_rule) {
    for (arch a : {arch::V41, arch::V4}) {
        const model_config c = flash(a);
        std::set<uint64_t> ids;
        const auto all = build_catalog(c, catalog_scope::ALL);
        for (const catalog_entry &e : all) {
            Result<dummy_rule> r = dummy_rule_for(e, c);
            ASSERT_TRUE(r.is_ok()) << r.status().to_string();
            const dummy_rule &x = r.value();
            EXPECT_NE(std::string(x.why), "") << e.name;
            switch (x.init) {
            case dummy_init::NORMAL:
                EXPECT_TRUE(x.std > 0 && x.std <= 1) << e.name << " std " << x.std;
                break;
            case dummy_init::CONSTANT:
                EXPECT_TRUE(std::isfinite(x.value)) << e.name;
                EXPECT_NE(e.format, storage_format::FP8_BLOCK) << e.name;  // the filler's constants are BF16 / F32
                EXPECT_NE(e.format, storage_format::MXFP4) << e.name;
                break;
            case dummy_init::EXPERT_IDS:
                EXPECT_EQ(e.format, storage_format::I64) << e.name;
                EXPECT_EQ(x.id_range, c.n_routed_experts) << e.name;
                break;
            }
            ids.insert(dummy_tensor_id(e.name));
        }
        EXPECT_EQ(ids.size(), all.size()) << "tensor ids collide (" << arch_name(a) << ")";
    }
    // A rank-1 tensor the catalog does not know has no rule.
    const model_config c = flash(arch::V41);
    Result<dummy_rule> r = dummy_rule_for({"layers.0.attn.mystery", tensor_role::ATTN, storage_format::F32, {8}, 0,
                                           model_part::TEXT}, c);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("layers.0.attn.mystery"), std::string::npos);
}

TEST(dummy_weights, rules_and_scale_grids_by_role) {
    const model_config c = flash(arch::V41);
    const dummy_plan p = plan_or_die(c, 2);
    auto rule = [&](const std::string &n) { return find(p, n).rule; };
    EXPECT_EQ(rule("layers.0.attn_norm.weight").init, dummy_init::CONSTANT);
    EXPECT_EQ(rule("layers.0.attn_norm.weight").value, 1.0);
    EXPECT_EQ(rule("layers.1.engram.q_weight").value, 1.0);
    EXPECT_EQ(rule("layers.0.attn.attn_sink").value, 0.0);
    EXPECT_EQ(rule("layers.0.ffn.gate.bias").value, 0.0);
    EXPECT_EQ(rule("layers.0.hc_attn_base").value, 0.0);
    EXPECT_EQ(rule("layers.0.hc_ffn_scale").value, 0.5);
    EXPECT_DOUBLE_EQ(rule("layers.0.hc_attn_fn").std, 1 / std::sqrt(4.0 * 5120));
    EXPECT_DOUBLE_EQ(rule("layers.0.attn.wq_a.weight").std, 1 / std::sqrt(5120.0));
    EXPECT_DOUBLE_EQ(rule("layers.0.ffn.experts.7.w2.weight").std, 1 / std::sqrt(2304.0));
    EXPECT_DOUBLE_EQ(rule("head.weight").std, 1 / std::sqrt(5120.0));
    EXPECT_EQ(rule("embed.weight").std, 1.0);
    EXPECT_EQ(rule("layers.1.engram.embed.weight").std, 1.0);

    const dummy_tensor &wq = find(p, "layers.0.attn.wq_a.weight");
    EXPECT_EQ(wq.block_out, 32);
    EXPECT_EQ(wq.block_in, 32);
    EXPECT_EQ(wq.bytes, 1280ull * 5120 + 40 * 160);
    const dummy_tensor &w1 = find(p, "layers.1.ffn.experts.0.w1.weight");
    EXPECT_EQ(w1.block_out, 1);
    EXPECT_EQ(w1.block_in, 32);
    EXPECT_EQ(w1.stored.size(), 2u);
    const dummy_tensor &table = find(p, "layers.1.engram.embed.weight");
    EXPECT_EQ(table.block_in, 32);
    EXPECT_EQ(table.id, dummy_tensor_id("layers.1.engram.embed.weight"));

    const model_config c4 = flash(arch::V4);
    const dummy_plan p4 = plan_or_die(c4, 1);
    EXPECT_EQ(find(p4, "layers.0.attn.wq_a.weight").block_out, 128);
    EXPECT_EQ(find(p4, "layers.0.ffn.gate.tid2eid").rule.init, dummy_init::EXPERT_IDS);
    EXPECT_EQ(find(p4, "hc_head_scale").rule.value, 0.5);
}

}  // namespace
}  // namespace ds41rt::model
