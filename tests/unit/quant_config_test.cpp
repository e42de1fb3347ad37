// Format detection from quantization_config / hf_quant_config.json, the catalog of the two
// quantized publications, and their per-layer expert bytes. The expected byte figures are the
// spec's (quant-formats 1.14 and 2.6, computed there from the published safetensors headers and
// the format definitions), not numbers this code produced.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/catalog.h"
#include "model/config.h"

namespace ds41rt::model {
namespace {

using json = nlohmann::json;

json full_v41() {
    std::ifstream f(std::string(DS41RT_FIXTURES_DIR) + "/configs/deepseek-v41-flash.json");
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str());
}

// The quantization_config of nvidia/DeepSeek-V4.1-Flash-NVFP4 (spec quant-formats 1.2).
json nvfp4_qc(int n_layers) {
    json q = {{"quant_method", "fp8"}, {"quant_algo", "MIXED_PRECISION"}, {"moe_quant_algo", "NVFP4"},
              {"expert_dtype", "fp4"}, {"activation_scheme", "dynamic"}, {"group_size", 16},
              {"scale_fmt", "ue8m0"}, {"weight_block_size", {32, 32}}, {"kv_cache_quant_algo", nullptr},
              {"ignore", {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"}},
              {"producer", {{"name", "modelopt"}, {"version", "0.47.0rc0"}}}};
    for (int l = 0; l < n_layers; l++)
        q["quantized_layers"]["layers." + std::to_string(l) + ".ffn.experts"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
    json w = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
    q["config_groups"]["group_0"] = {{"targets", {"Linear"}}, {"weights", w}, {"input_activations", w}};
    return q;
}

// The quantization_config of diffbot/DeepSeek-V4.1-Flash-EXL3-2.0bpw (spec quant-formats 2.2).
json exl3_qc() {
    return {{"quant_method", "exl3"}, {"bits", 2}, {"codebook", "mcg"}, {"mtp_experts", "source"},
            {"mtp_experts_start_layer", 40}, {"weight_block_size", {32, 32}},
            {"non_routed_quantization",
             {{"quant_method", "deepseek_v4_fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
              {"scale_fmt", "ue8m0"}, {"weight_block_size", {32, 32}}, {"expert_dtype", "fp4"}}}};
}

Result<model_config> with_qc(const json &qc) {
    json c = full_v41();
    c["quantization_config"] = qc;
    return parse_config(c.dump());
}

TEST(quant_config, official_is_official) {
    Result<model_config> c = parse_config(full_v41().dump());
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->routed_quant, expert_quant::OFFICIAL);
    EXPECT_EQ(c->expert_dtype, "fp4");
}

TEST(quant_config, detects_nvfp4_publication) {
    Result<model_config> c = with_qc(nvfp4_qc(40));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->routed_quant, expert_quant::NVFP4);
    EXPECT_EQ(c->quant_method, "fp8");
    EXPECT_EQ(c->fp8_block_out, 32);
    EXPECT_TRUE(validate(*c).is_ok());
}

TEST(quant_config, detects_exl3_publication) {
    Result<model_config> c = with_qc(exl3_qc());
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->routed_quant, expert_quant::EXL3);
    EXPECT_EQ(c->exl3_bits, 2);
    EXPECT_EQ(c->exl3_cb, exl3_codebook::MCG);
    EXPECT_EQ(c->quant_method, "fp8");  // the backbone, from non_routed_quantization
    EXPECT_EQ(c->expert_dtype, "fp4");  // MTP experts stay MXFP4
    EXPECT_TRUE(validate(*c).is_ok());
}

// Each refusal names the offending field.
TEST(quant_config, refuses_unsupported_or_inconsistent) {
    struct bad_case {
        const char *what;
        json qc;
        const char *field;
    };
    std::vector<bad_case> cases;
    json q = nvfp4_qc(40);
    q["moe_quant_algo"] = "W4A8_AWQ";
    cases.push_back({"other moe algo", q, "quantization_config.moe_quant_algo"});
    q = nvfp4_qc(40);
    q["group_size"] = 32;
    cases.push_back({"group 32", q, "quantization_config.group_size"});
    q = nvfp4_qc(40);
    q["quantized_layers"]["layers.3.attn.wq_a"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
    cases.push_back({"nvfp4 attention", q, "quantization_config.quantized_layers.layers.3.attn.wq_a"});
    q = nvfp4_qc(40);
    q["quantized_layers"]["layers.5.ffn.experts"]["quant_algo"] = "FP8";
    cases.push_back({"fp8 experts", q, "quantization_config.quantized_layers.layers.5.ffn.experts.quant_algo"});
    q = nvfp4_qc(40);
    q["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
    cases.push_back({"8-bit group", q, "quantization_config.config_groups.group_0.weights.num_bits"});
    cases.push_back({"modelopt dense", json{{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}},
                     "quantization_config.quant_method"});
    cases.push_back({"unknown method", json{{"quant_method", "gptq"}}, "quantization_config.quant_method"});
    q = exl3_qc();
    q["bits"] = 2.5;
    cases.push_back({"mixed K", q, "quantization_config.bits"});
    q = exl3_qc();
    q["codebook"] = "lut";
    cases.push_back({"codebook", q, "quantization_config.codebook"});
    q = exl3_qc();
    q["mtp_experts"] = "exl3";
    cases.push_back({"mtp exl3", q, "quantization_config.mtp_experts"});
    q = exl3_qc();
    q["tensor_storage"] = json::object();
    cases.push_back({"upstream exl3", q, "quantization_config.tensor_storage"});
    q = exl3_qc();
    q.erase("non_routed_quantization");
    cases.push_back({"no backbone", q, "quantization_config.non_routed_quantization"});
    q = exl3_qc();
    q["mtp_experts_start_layer"] = 39;
    cases.push_back({"start layer", q, "quantization_config.mtp_experts_start_layer"});
    for (const bad_case &b : cases) {
        Result<model_config> c = with_qc(b.qc);
        ASSERT_FALSE(c.is_ok()) << b.what;
        EXPECT_EQ(c.status().code(), status_code::INVALID_ARGUMENT) << b.what;
        EXPECT_EQ(c.status().message().rfind(std::string(b.field) + ":", 0), 0u)
            << b.what << ": " << c.status().message();
    }
}

TEST(quant_config, hf_quant_config_must_agree) {
    Result<model_config> nv = with_qc(nvfp4_qc(40));
    Result<model_config> off = parse_config(full_v41().dump());
    ASSERT_TRUE(nv.is_ok() && off.is_ok());
    json hf = {{"producer", {{"name", "modelopt"}, {"version", "0.47.0"}}},
               {"quantization", {{"quant_algo", "MIXED_PRECISION"}, {"kv_cache_quant_algo", nullptr},
                                 {"group_size", 16}, {"exclude_modules", {"head"}}}}};
    EXPECT_TRUE(check_hf_quant_config(hf.dump(), *nv).is_ok());
    Status st = check_hf_quant_config(hf.dump(), *off);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("quantization.quant_algo"), std::string::npos) << st.message();
    hf["quantization"]["kv_cache_quant_algo"] = "FP8";
    st = check_hf_quant_config(hf.dump(), *nv);
    EXPECT_NE(st.message().find("kv_cache_quant_algo"), std::string::npos) << st.message();
    hf["quantization"]["kv_cache_quant_algo"] = nullptr;
    hf["quantization"]["group_size"] = 32;
    st = check_hf_quant_config(hf.dump(), *nv);
    EXPECT_NE(st.message().find("group_size"), std::string::npos) << st.message();
}

// load_config reads hf_quant_config.json beside config.json and refuses a disagreement.
TEST(quant_config, load_config_reads_hf_quant_config) {
    const std::filesystem::path d = std::filesystem::temp_directory_path() / ("ds41rt_hfq_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    std::ofstream(d / "config.json") << full_v41().dump();  // official: no NVFP4 experts
    EXPECT_TRUE(load_config(d.string()).is_ok());
    std::ofstream(d / "hf_quant_config.json")
        << R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}})";
    Result<model_config> c = load_config(d.string());
    ASSERT_FALSE(c.is_ok());
    EXPECT_NE(c.status().message().find("hf_quant_config.json: quantization.quant_algo"), std::string::npos)
        << c.status().message();
    json cfg = full_v41();
    cfg["quantization_config"] = nvfp4_qc(40);
    std::ofstream(d / "config.json") << cfg.dump();
    c = load_config(d.string());
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    std::filesystem::remove_all(d);
}

// Spec quant-formats 1.3 / 2.3 (checked there against the real safetensors headers).
TEST(quant_config, catalog_names_dtypes_shapes) {
    Result<model_config> nv = with_qc(nvfp4_qc(40));
    ASSERT_TRUE(nv.is_ok());
    std::vector<catalog_entry> cat = build_catalog(*nv, catalog_scope::ALL);
    const catalog_entry *w1 = nullptr, *w2 = nullptr, *mtp = nullptr;
    for (const catalog_entry &e : cat) {
        if (e.name == "layers.7.ffn.experts.11.w1.weight") w1 = &e;
        if (e.name == "layers.39.ffn.experts.383.w2.weight") w2 = &e;
        if (e.name == "mtp.0.ffn.experts.0.w1.weight") mtp = &e;
        if (e.role != tensor_role::ROUTED_EXPERT && (e.format == storage_format::NVFP4 || e.format == storage_format::EXL3))
            ADD_FAILURE() << e.name << " should keep its official format";
    }
    ASSERT_TRUE(w1 && w2 && mtp);
    EXPECT_EQ(mtp->format, storage_format::MXFP4);
    std::vector<stored_tensor> s = stored_tensors(*w1, *nv);
    ASSERT_EQ(s.size(), 4u);
    EXPECT_EQ(s[0].name, "layers.7.ffn.experts.11.w1.weight");
    EXPECT_EQ(s[0].type, dtype::U8);
    EXPECT_EQ(s[0].shape, (shape_t{2304, 2560}));
    EXPECT_EQ(s[1].name, "layers.7.ffn.experts.11.w1.weight_scale");
    EXPECT_EQ(s[1].type, dtype::F8_E4M3);
    EXPECT_EQ(s[1].shape, (shape_t{2304, 320}));
    EXPECT_EQ(s[2].name, "layers.7.ffn.experts.11.w1.weight_scale_2");
    EXPECT_EQ(s[2].shape, shape_t{});
    EXPECT_EQ(s[3].name, "layers.7.ffn.experts.11.w1.input_scale");
    s = stored_tensors(*w2, *nv);
    EXPECT_EQ(s[0].shape, (shape_t{5120, 1152}));
    EXPECT_EQ(s[1].shape, (shape_t{5120, 144}));

    Result<model_config> ex = with_qc(exl3_qc());
    ASSERT_TRUE(ex.is_ok());
    cat = build_catalog(*ex, catalog_scope::TEXT);
    for (const catalog_entry &e : cat) {
        if (e.name == "layers.0.ffn.experts.0.w1.weight") {
            s = stored_tensors(e, *ex);
            ASSERT_EQ(s.size(), 4u);
            EXPECT_EQ(s[0].name, "layers.0.ffn.experts.0.w1.trellis");
            EXPECT_EQ(s[0].type, dtype::I16);
            EXPECT_EQ(s[0].shape, (shape_t{320, 144, 32}));
            EXPECT_EQ(s[1].name, "layers.0.ffn.experts.0.w1.suh");
            EXPECT_EQ(s[1].shape, shape_t{5120});
            EXPECT_EQ(s[2].name, "layers.0.ffn.experts.0.w1.svh");
            EXPECT_EQ(s[2].shape, shape_t{2304});
            EXPECT_EQ(s[3].name, "layers.0.ffn.experts.0.w1.mcg");
            EXPECT_EQ(s[3].type, dtype::I32);
        }
        if (e.name == "layers.0.ffn.experts.0.w2.weight") {
            s = stored_tensors(e, *ex);
            EXPECT_EQ(s[0].shape, (shape_t{144, 320, 32}));
            EXPECT_EQ(s[1].shape, shape_t{2304});
            EXPECT_EQ(s[2].shape, shape_t{5120});
        }
    }
}

// Spec quant-formats 1.14 (NVFP4: 7,644,128,256 B per layer), 2.6 (EXL3 K=2: 3,414,495,744 B per
// layer; K=3 / K=4: 190.5 / 253.8 GiB over 40 layers); official MXFP4: 4.25 bits per weight.
TEST(quant_config, expert_layer_bytes_per_format) {
    Result<model_config> c = parse_config(full_v41().dump());
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(expert_layer_bytes(*c, storage_format::NVFP4), 7644128256ull);
    model_config k = *c;
    k.exl3_bits = 2;
    EXPECT_EQ(expert_layer_bytes(k, storage_format::EXL3), 3414495744ull);
    k.exl3_bits = 3;
    EXPECT_NEAR(40.0 * double(expert_layer_bytes(k, storage_format::EXL3)) / (1ull << 30), 190.5, 0.05);
    k.exl3_bits = 4;
    EXPECT_NEAR(40.0 * double(expert_layer_bytes(k, storage_format::EXL3)) / (1ull << 30), 253.8, 0.05);
    EXPECT_EQ(expert_layer_bytes(*c, storage_format::MXFP4), 384ull * 3 * (2304ull * 5120 * 17 / 32));
    // And the catalog totals of the NVFP4 publication agree with the function.
    Result<model_config> nv = with_qc(nvfp4_qc(40));
    ASSERT_TRUE(nv.is_ok());
    uint64_t layer0 = 0;
    for (const catalog_entry &e : build_catalog(*nv, catalog_scope::TEXT))
        if (e.layer == 0 && e.role == tensor_role::ROUTED_EXPERT)
            for (const stored_tensor &s : stored_tensors(e, *nv)) layer0 += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
    EXPECT_EQ(layer0, 7644128256ull);
}

// The TP unit of each format (spec quant-formats 2.5: V4.1's I = 2304 = 18 EXL3 blocks).
TEST(quant_config, routed_format_and_tp_alignment) {
    Result<model_config> off = parse_config(full_v41().dump()), nv = with_qc(nvfp4_qc(40)), ex = with_qc(exl3_qc());
    ASSERT_TRUE(off.is_ok() && nv.is_ok() && ex.is_ok());
    EXPECT_EQ(routed_expert_format(*off), storage_format::MXFP4);
    EXPECT_EQ(routed_expert_format(*nv), storage_format::NVFP4);
    EXPECT_EQ(routed_expert_format(*ex), storage_format::EXL3);
    EXPECT_EQ(expert_tp_align(*off, storage_format::MXFP4), 32);
    EXPECT_EQ(expert_tp_align(*nv, storage_format::NVFP4), 16);
    EXPECT_EQ(expert_tp_align(*ex, storage_format::EXL3), 128);
    EXPECT_EQ(2304 % expert_tp_align(*ex, storage_format::EXL3), 0);
}

}  // namespace
}  // namespace ds41rt::model
