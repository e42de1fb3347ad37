// config.json parsing and validation: the full V4.1 and V4 files from the specs
// (tests/fixtures/configs), the transformers 5.x spellings, and one case per error path, each of
// which must name the key.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace ds41rt::model {
namespace {

using json = nlohmann::json;

json fixture(const std::string &name) {
    std::ifstream f(std::string(DS41RT_FIXTURES_DIR) + "/configs/" + name);
    EXPECT_TRUE(f.good()) << name;
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
}
json v41_json() { return fixture("deepseek-v41-flash.json"); }
json v4_json() { return fixture("deepseek-v4-flash.json"); }

model_config parse_ok(const json &j) {
    Result<model_config> c = parse_config(j.dump());
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? c.value() : model_config{};
}

// Parse must fail with INVALID_ARGUMENT and a message containing `needle`.
void expect_parse_error(const json &j, const std::string &needle) {
    Result<model_config> c = parse_config(j.dump());
    ASSERT_FALSE(c.is_ok()) << "expected an error mentioning " << needle;
    EXPECT_EQ(c.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
}

// Parse succeeds, validate fails naming `needle`.
void expect_invalid(const json &j, const std::string &needle) {
    model_config c = parse_ok(j);
    Status st = validate(c);
    ASSERT_FALSE(st.is_ok()) << "expected validate() to mention " << needle;
    EXPECT_EQ(st.code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

// ---- the released configs ----------------------------------------------------------------------

TEST(config, v41_full_parses_every_key) {
    model_config c = parse_ok(v41_json());
    EXPECT_EQ(c.model_arch, arch::V41);
    EXPECT_STREQ(arch_name(c.model_arch), "deepseek_v41");
    EXPECT_EQ(c.vocab_size, 129280);
    EXPECT_EQ(c.dim, 5120);
    EXPECT_EQ(c.n_layers, 40);
    EXPECT_EQ(c.n_mtp_layers, 3);
    EXPECT_EQ(c.n_heads, 64);
    EXPECT_EQ(c.head_dim, 512);
    EXPECT_EQ(c.rope_head_dim, 64);
    EXPECT_EQ(c.nope_head_dim(), 448);
    EXPECT_EQ(c.q_lora_rank, 1280);
    EXPECT_EQ(c.o_groups, 8);
    EXPECT_EQ(c.o_lora_rank, 1024);
    EXPECT_EQ(c.window, 128);
    EXPECT_FLOAT_EQ(c.norm_eps, 1e-20f);
    EXPECT_EQ(c.rope_theta, 10000.0f);
    EXPECT_EQ(c.compress_rope_theta, 160000.0f);
    EXPECT_EQ(c.rope_factor, 16.0f);
    EXPECT_EQ(c.beta_fast, 32.0f);
    EXPECT_EQ(c.beta_slow, 1.0f);
    EXPECT_EQ(c.original_seq_len, 65536);
    EXPECT_EQ(c.max_position_embeddings, 1048576);
    ASSERT_EQ(c.compress_ratios.size(), 43u);
    EXPECT_EQ(c.ratio(1), 0);
    EXPECT_EQ(c.ratio(2), 2);
    EXPECT_EQ(c.ratio(19), 2);
    EXPECT_EQ(c.ratio(20), 1);
    EXPECT_EQ(c.ratio(39), 1);
    EXPECT_EQ(c.ratio(42), 0);
    EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
    EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
    EXPECT_EQ(c.candidate_source_layer, 20);
    EXPECT_EQ(c.candidate_topk_blocks, 2048);
    EXPECT_EQ(c.candidate_block_size, 8);
    EXPECT_EQ(c.index_n_heads, 32);
    EXPECT_EQ(c.index_head_dim, 128);
    EXPECT_EQ(c.index_topk, 512);
    EXPECT_EQ(c.n_routed_experts, 384);
    EXPECT_EQ(c.n_activated_experts, 6);
    EXPECT_EQ(c.n_shared_experts, 1);
    EXPECT_EQ(c.moe_inter_dim, 2304);
    EXPECT_EQ(c.route_scale, 1.5f);
    EXPECT_EQ(c.swiglu_limit, 10.0f);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.n_hash_layers, 0);
    EXPECT_EQ(c.hc_mult, 4);
    EXPECT_EQ(c.hc_sinkhorn_iters, 20);
    EXPECT_FLOAT_EQ(c.hc_eps, 1e-6f);
    EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 14}));
    EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
    EXPECT_EQ(c.engram_max_ngram, 4);
    EXPECT_EQ(c.engram_n_heads, 8);
    EXPECT_EQ(c.engram_head_dim, 256);
    EXPECT_EQ(c.engram_vocab_size, 16000000);
    EXPECT_EQ(c.engram_pad_id, 2);
    EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
    EXPECT_EQ(c.dspark_block_size, 5);
    EXPECT_EQ(c.dspark_noise_token_id, 128799);
    EXPECT_EQ(c.dspark_target_layers, (std::vector<int>{37, 38, 39}));
    EXPECT_EQ(c.dspark_markov_rank, 256);
    EXPECT_EQ(c.dspark_n_routed_experts, 128);
    EXPECT_EQ(c.dspark_n_activated_experts, 3);
    EXPECT_EQ(c.fp8_block_out, 32);
    EXPECT_EQ(c.fp8_block_in, 32);
    EXPECT_EQ(c.quant_method, "fp8");
    EXPECT_EQ(c.expert_dtype, "fp4");
    EXPECT_EQ(c.bos_token_id, 0);
    EXPECT_EQ(c.eos_token_id, 1);
    EXPECT_EQ(c.pad_token_id, 2);
    EXPECT_EQ(c.image_token_id, 129264);
    EXPECT_EQ(c.vision_n_layers, 32);
    EXPECT_EQ(c.vision_dim, 1024);
    EXPECT_EQ(c.vision_n_heads, 16);
    EXPECT_EQ(c.vision_inter_dim, 2816);
    EXPECT_EQ(c.vision_patch_size, 14);
    EXPECT_EQ(c.vision_downsample_ratio, 3);
    EXPECT_TRUE(validate(c).is_ok()) << validate(c).to_string();
}

TEST(config, v41_schedule_helpers) {
    model_config c = parse_ok(v41_json());
    // Spec V4.1 section 2: a layer reads the latest KV / index source at or before it.
    EXPECT_EQ(c.kv_source_for(0), -1);
    EXPECT_EQ(c.kv_source_for(1), -1);
    EXPECT_EQ(c.kv_source_for(2), 2);
    EXPECT_EQ(c.kv_source_for(7), 2);
    EXPECT_EQ(c.kv_source_for(13), 8);
    EXPECT_EQ(c.kv_source_for(19), 14);
    EXPECT_EQ(c.kv_source_for(39), 20);
    EXPECT_EQ(c.index_source_for(23), 20);
    EXPECT_EQ(c.index_source_for(24), 24);
    EXPECT_EQ(c.index_source_for(27), 24);
    EXPECT_EQ(c.index_source_for(39), 36);
    EXPECT_TRUE(c.is_kv_source(14));
    EXPECT_FALSE(c.is_kv_source(24));
    EXPECT_TRUE(c.is_index_source(24));
    EXPECT_FALSE(c.is_index_source(25));
    EXPECT_TRUE(c.has_engram(1));
    EXPECT_TRUE(c.has_engram(14));
    EXPECT_FALSE(c.has_engram(2));
}

TEST(config, v4_full_parses_every_key) {
    model_config c = parse_ok(v4_json());
    EXPECT_EQ(c.model_arch, arch::V4);
    EXPECT_EQ(c.dim, 4096);
    EXPECT_EQ(c.n_layers, 43);
    EXPECT_EQ(c.n_mtp_layers, 1);
    EXPECT_EQ(c.q_lora_rank, 1024);
    EXPECT_EQ(c.index_n_heads, 64);
    EXPECT_EQ(c.n_routed_experts, 256);
    EXPECT_EQ(c.moe_inter_dim, 2048);
    EXPECT_EQ(c.n_hash_layers, 3);
    EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
    ASSERT_EQ(c.compress_ratios.size(), 44u);
    EXPECT_EQ(c.ratio(2), 4);
    EXPECT_EQ(c.ratio(3), 128);
    EXPECT_EQ(c.ratio(42), 4);
    EXPECT_EQ(c.ratio(43), 0);
    EXPECT_EQ(c.rope_factor, 16.0f);  // "type": "yarn", the V4 spelling
    EXPECT_EQ(c.original_seq_len, 65536);
    EXPECT_EQ(c.fp8_block_out, 128);
    EXPECT_EQ(c.fp8_block_in, 128);
    EXPECT_EQ(c.expert_dtype, "fp4");  // defaulted from quant_method fp8
    EXPECT_FALSE(c.has_vision());
    EXPECT_TRUE(c.engram_layer_ids.empty());
    // V4 has no sharing: every compressing layer is its own source.
    EXPECT_EQ(c.kv_source_for(3), 3);
    EXPECT_EQ(c.kv_source_for(1), -1);
    EXPECT_EQ(c.index_source_for(2), 2);
    EXPECT_EQ(c.index_source_for(3), -1);
    EXPECT_TRUE(validate(c).is_ok()) << validate(c).to_string();
}

TEST(config, v41_flat_text_config) {
    json j = v41_json();
    json t = j["text_config"];
    t["quantization_config"] = j["quantization_config"];
    model_config c = parse_ok(t);
    EXPECT_EQ(c.model_arch, arch::V41);
    EXPECT_EQ(c.dim, 5120);
    EXPECT_EQ(c.fp8_block_in, 32);
    EXPECT_FALSE(c.has_vision());
    EXPECT_TRUE(validate(c).is_ok());
}

TEST(config, transformers_rope_parameters_nested) {
    json j = v41_json();
    auto &t = j["text_config"];
    t.erase("rope_scaling");
    t.erase("rope_theta");
    t["rope_parameters"] = {
        {"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.125}}},
        {"compress",
         {{"rope_type", "yarn"}, {"factor", 8.0}, {"beta_fast", 16}, {"beta_slow", 2},
          {"original_max_position_embeddings", 4096}, {"rope_theta", 150000.0}, {"attention_factor", 1.0}}}};
    model_config c = parse_ok(j);
    EXPECT_EQ(c.rope_theta, 10000.0f);
    EXPECT_EQ(c.compress_rope_theta, 150000.0f);
    EXPECT_EQ(c.rope_factor, 8.0f);
    EXPECT_EQ(c.beta_fast, 16.0f);
    EXPECT_EQ(c.beta_slow, 2.0f);
    EXPECT_EQ(c.original_seq_len, 4096);
}

TEST(config, transformers_rope_parameters_flat_and_default) {
    json j = v41_json();
    auto &t = j["text_config"];
    t.erase("rope_scaling");
    t["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 1024}};
    model_config c = parse_ok(j);
    EXPECT_EQ(c.rope_factor, 4.0f);
    EXPECT_EQ(c.original_seq_len, 1024);

    t["rope_parameters"] = {{"rope_type", "default"}};
    c = parse_ok(j);
    EXPECT_EQ(c.original_seq_len, 0);  // no YaRN
    EXPECT_EQ(c.rope_factor, 1.0f);
}

TEST(config, transformers_v4_spellings) {
    // transformers 5.x re-saves V4 with layer_types / mlp_layer_types / partial_rotary_factor.
    json j = v4_json();
    std::vector<std::string> types;
    for (int r : j["compress_ratios"]) {
        if (types.size() == 43) break;
        types.push_back(r == 0 ? "sliding_attention" : r == 4 ? "compressed_sparse_attention"
                                                              : "heavily_compressed_attention");
    }
    j.erase("compress_ratios");
    j["layer_types"] = types;
    j.erase("num_hash_layers");
    j["mlp_layer_types"] = {"hash_moe", "hash_moe", "hash_moe"};
    for (int i = 3; i < 43; i++) j["mlp_layer_types"].push_back("moe");
    j.erase("qk_rope_head_dim");
    j["partial_rotary_factor"] = 0.125;
    model_config c = parse_ok(j);
    ASSERT_EQ(c.compress_ratios.size(), 44u);  // MTP entry appended as 0
    EXPECT_EQ(c.ratio(2), 4);
    EXPECT_EQ(c.ratio(3), 128);
    EXPECT_EQ(c.ratio(43), 0);
    EXPECT_EQ(c.n_hash_layers, 3);
    EXPECT_EQ(c.rope_head_dim, 64);
    EXPECT_TRUE(validate(c).is_ok()) << validate(c).to_string();
}

TEST(config, ratios_without_mtp_entries_are_padded) {
    json j = v41_json();
    auto &r = j["text_config"]["compress_ratios"];
    r.erase(r.size() - 1);
    r.erase(r.size() - 1);
    r.erase(r.size() - 1);
    model_config c = parse_ok(j);
    EXPECT_EQ(c.compress_ratios.size(), 43u);
    EXPECT_TRUE(validate(c).is_ok());
}

TEST(config, null_token_ids_keep_defaults_and_eos_list) {
    json j = v4_json();
    j["pad_token_id"] = nullptr;
    j["eos_token_id"] = {1, 7};
    model_config c = parse_ok(j);
    EXPECT_EQ(c.pad_token_id, 2);
    EXPECT_EQ(c.eos_token_id, 1);
}

TEST(config, load_config_reads_directory) {
    Result<model_config> c = load_config(std::string(DS41RT_FIXTURES_DIR) + "/no-such-dir");
    ASSERT_FALSE(c.is_ok());
    EXPECT_EQ(c.status().code(), status_code::NOT_FOUND);
    EXPECT_NE(c.status().message().find("config.json"), std::string::npos);
}

// ---- parse errors name the key ------------------------------------------------------------------

TEST(config_errors, not_json_and_unknown_model_type) {
    Result<model_config> c = parse_config("{not json");
    ASSERT_FALSE(c.is_ok());
    EXPECT_EQ(c.status().code(), status_code::INVALID_ARGUMENT);
    json j = v4_json();
    j["model_type"] = "llama";
    expect_parse_error(j, "model_type");
    j.erase("model_type");
    expect_parse_error(j, "model_type");
}

TEST(config_errors, missing_required_keys) {
    for (const char *key : {"hidden_size", "num_hidden_layers", "head_dim", "rms_norm_eps", "index_topk",
                            "moe_intermediate_size", "kv_source_layer_ids", "index_source_layer_ids",
                            "compress_ratios", "qk_rope_head_dim", "dspark_markov_rank",
                            "engram_num_embeddings"}) {
        json j = v41_json();
        j["text_config"].erase(key);
        expect_parse_error(j, std::string("text_config.") + key);
    }
    json j = v41_json();
    j.erase("text_config");
    expect_parse_error(j, "text_config");
    j = v4_json();
    j.erase("num_hash_layers");
    expect_parse_error(j, "num_hash_layers");
    j = v4_json();
    j["rope_scaling"].erase("factor");
    expect_parse_error(j, "rope_scaling.factor");
}

TEST(config_errors, wrong_types) {
    struct tc {
        const char *key;
        json value;
    };
    for (const auto &t : std::vector<tc>{{"hidden_size", "5120"},
                                         {"num_hidden_layers", 40.5},
                                         {"head_dim", true},
                                         {"rms_norm_eps", "1e-20"},
                                         {"compress_ratios", 2},
                                         {"kv_source_layer_ids", {2, "8"}},
                                         {"norm_topk_prob", 1},
                                         {"rope_scaling", "yarn"},
                                         {"scoring_func", 3}}) {
        json j = v41_json();
        j["text_config"][t.key] = t.value;
        expect_parse_error(j, std::string("text_config.") + t.key);
    }
    json j = v41_json();
    j["quantization_config"]["weight_block_size"] = {32};
    expect_parse_error(j, "quantization_config.weight_block_size");
    j = v41_json();
    j["quantization_config"]["weight_block_size"] = "32x32";
    expect_parse_error(j, "quantization_config.weight_block_size");
    j = v41_json();
    j["vision_config"]["hidden_size"] = "big";
    expect_parse_error(j, "vision_config.hidden_size");
    j = v4_json();
    j["num_key_value_heads"] = 8;
    expect_parse_error(j, "num_key_value_heads");
    j = v4_json();
    j["scoring_func"] = "softmax";
    expect_parse_error(j, "scoring_func");
    j = v4_json();
    j["rope_scaling"]["type"] = "longrope";
    expect_parse_error(j, "rope_scaling.rope_type");
}

// ---- broken invariants name the key -------------------------------------------------------------

using edit = std::function<void(json &)>;

void expect_v41_invalid(const edit &e, const std::string &needle) {
    json j = v41_json();
    e(j["text_config"]);
    expect_invalid(j, needle);
}

TEST(config_invariants, v41_sharing_rules) {
    // Every KV source is an index source.
    expect_v41_invalid([](json &t) { t["index_source_layer_ids"] = {2, 14, 20, 24, 28, 32, 36}; },
                       "not in index_source_layer_ids");
    // A source's ratio equals its readers' ratio: layer 20 (ratio 1) reading layer 14 (ratio 2).
    expect_v41_invalid([](json &t) {
        t["kv_source_layer_ids"] = {2, 8, 14};
        t["index_source_layer_ids"] = {2, 8, 14, 24, 28, 32, 36};
        t["candidate_source_layer_id"] = 24;
    }, "differs from its KV source");
    // Index sources have ratio > 0.
    expect_v41_invalid([](json &t) { t["index_source_layer_ids"] = {1, 2, 8, 14, 20, 24, 28, 32, 36}; },
                       "index_source_layer_ids: layer 1 has compress ratio 0");
    // KV sources have ratio > 0.
    expect_v41_invalid([](json &t) {
        t["kv_source_layer_ids"] = {0, 2, 8, 14, 20};
        t["index_source_layer_ids"] = {0, 2, 8, 14, 20, 24, 28, 32, 36};
    }, "kv_source_layer_ids: layer 0 has compress ratio 0");
    // The candidate source is an index source.
    expect_v41_invalid([](json &t) { t["candidate_source_layer_id"] = 21; }, "candidate_source_layer_id");
    // A layer with ratio > 0 needs a KV source at or before it.
    expect_v41_invalid([](json &t) {
        t["kv_source_layer_ids"] = {8, 14, 20};
        t["index_source_layer_ids"] = {8, 14, 20, 24, 28, 32, 36};
    }, "no KV source at or before it");
    // Reindex layers come after a KV source (here: an index source before every KV source).
    expect_v41_invalid([](json &t) {
        t["kv_source_layer_ids"] = {8, 14, 20};
        t["index_source_layer_ids"] = {3, 8, 14, 20, 24, 28, 32, 36};
        t["compress_ratios"][2] = 0;
        for (int i = 3; i < 8; i++) t["compress_ratios"][size_t(i)] = 2;
    }, "Reindex layer 3");
    expect_v41_invalid([](json &t) { t["kv_source_layer_ids"] = {2, 14, 8, 20}; }, "strictly increasing");
    expect_v41_invalid([](json &t) { t["kv_source_layer_ids"] = {2, 8, 14, 20, 40}; }, "out of range");
}

TEST(config_invariants, v41_shapes) {
    expect_v41_invalid([](json &t) { t["compress_ratios"].push_back(0); }, "compress_ratios: has 44 entries");
    expect_v41_invalid([](json &t) { t["compress_ratios"][41] = 2; }, "compress_ratios[41]");
    expect_v41_invalid([](json &t) { t["compress_ratios"][30] = 4; }, "compress_ratios[30]");
    expect_v41_invalid([](json &t) { t["o_groups"] = 6; }, "o_groups");
    expect_v41_invalid([](json &t) { t["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim: must be even");
    expect_v41_invalid([](json &t) {
        t["qk_rope_head_dim"] = 512;
        t["index_head_dim"] = 1024;
    }, "must be < head_dim");
    expect_v41_invalid([](json &t) { t["head_dim"] = 524; }, "head_dim");  // not a multiple of 8
    expect_v41_invalid([](json &t) { t["index_head_dim"] = 84; }, "index_head_dim");
    expect_v41_invalid([](json &t) { t["hidden_size"] = 5136; }, "hidden_size");
    expect_v41_invalid([](json &t) { t["moe_intermediate_size"] = 2300; }, "moe_intermediate_size");
    expect_v41_invalid([](json &t) { t["hidden_size"] = 0; }, "hidden_size: must be > 0");
    expect_v41_invalid([](json &t) { t["num_experts_per_tok"] = 500; }, "num_experts_per_tok");
    expect_v41_invalid([](json &t) { t["rms_norm_eps"] = 0; }, "rms_norm_eps");
    expect_v41_invalid([](json &t) { t["hc_mult"] = 3; }, "hc_mult");
}

TEST(config_invariants, v41_engram_and_dspark) {
    expect_v41_invalid([](json &t) { t["engram_num_embeddings"] = {384006168}; }, "engram_num_embeddings");
    expect_v41_invalid([](json &t) { t["engram_layer_ids"] = {14, 1}; }, "engram_layer_ids");
    expect_v41_invalid([](json &t) { t["engram_head_dim"] = 100; }, "engram_head_dim");
    expect_v41_invalid([](json &t) { t["dspark_block_size"] = 128; }, "dspark_block_size");
    expect_v41_invalid([](json &t) { t["dspark_target_layer_ids"] = {37, 38, 40}; }, "dspark_target_layer_ids");
    expect_v41_invalid([](json &t) { t["dspark_num_experts_per_tok"] = 129; }, "dspark_num_experts_per_tok");
}

TEST(config_invariants, v4_rules) {
    json j = v4_json();
    j["compress_ratios"][5] = 2;
    expect_invalid(j, "compress_ratios[5]");
    j = v4_json();
    j["qk_rope_head_dim"] = 32;  // nope = 480, not a multiple of 64
    expect_invalid(j, "head_dim - qk_rope_head_dim");
    j = v4_json();
    j["num_hash_layers"] = 44;
    expect_invalid(j, "num_hash_layers");
    j = v4_json();
    j["compress_ratios"][43] = 4;
    expect_invalid(j, "compress_ratios[43]");
}

TEST(config_invariants, validate_struct_directly) {
    // validate() guards structs built in code too (tiny test models), not only parsed ones.
    model_config c = parse_ok(v41_json());
    c.compress_ratios.pop_back();
    Status st = validate(c);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("compress_ratios"), std::string::npos);
}

}  // namespace
}  // namespace ds41rt::model
