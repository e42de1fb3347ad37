// A tiny V4.1 model whose routed experts are stored as a quantized publication stores them
// (NVFP4 as ModelOpt exports it, or EXL3 K = 2 MCG), with random stored bytes: the synthesized
// official model of seed 3 with its experts re-stored. Shared by the worker tests (CPU) and the
// GPU engine tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/routed.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/catalog.h"
#include "model/config.h"
#include "model/synth.h"
#include "tiny_synth.h"

namespace ds41rt {

// One MoE layer's test input for the GPU routed-sum tests: S rows of x ~ N(0, 1), each routed to
// expert 3 (so S rows of one expert: 16-row chunks of it) and to one of experts 0-2, 4-7, weights
// in (0.2, 2), all drawn from one generator of `seed` in that order.
struct two_route_rows {
    std::vector<float> x;
    backend::cpu::route_table rt;
};
inline two_route_rows expert3_rows(int64_t S, int64_t D, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> wd(0.2f, 2.0f);
    two_route_rows in;
    in.x.resize(static_cast<size_t>(S * D));
    for (float &v : in.x) v = nd(rng);
    in.rt.offsets.push_back(0);
    for (int64_t r = 0; r < S; r++) {
        const uint32_t other = uint32_t(r % 7 >= 3 ? r % 7 + 1 : r % 7);
        in.rt.routes.push_back({other, wd(rng)});
        in.rt.routes.push_back({3, wd(rng)});
        in.rt.offsets.push_back(uint32_t(in.rt.routes.size()));
    }
    return in;
}

// Writes into dir the synthesized model of seed 3 with its routed experts re-stored as `format`.
inline void make_quantized_model(const std::filesystem::path &dir, const std::string &format) {
    namespace fs = std::filesystem;
    const bool exl3 = format == "exl3";
    const fs::path src = dir.string() + "_src";
    fs::remove_all(src);
    model::synth_options o = tiny_synth();
    o.dim = exl3 ? 128 : 64;
    o.moe_intermediate = exl3 ? 384 : 96;
    ASSERT_TRUE(model::synthesize(src.string(), o));
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
    const nlohmann::json official = cfg["quantization_config"];
    const int n_layers = cfg["text_config"]["num_hidden_layers"].get<int>();
    if (exl3) {
        cfg["quantization_config"] = {
            {"quant_method", "exl3"}, {"bits", 2}, {"codebook", "mcg"}, {"mtp_experts", "source"},
            {"mtp_experts_start_layer", n_layers},
            {"non_routed_quantization",
             {{"quant_method", "deepseek_v4_fp8"}, {"weight_block_size", official["weight_block_size"]}, {"expert_dtype", "fp4"}}}};
    } else {
        auto &q = cfg["quantization_config"];
        q["quant_algo"] = "MIXED_PRECISION";
        q["moe_quant_algo"] = "NVFP4";
        q["group_size"] = 16;
        for (int l = 0; l < n_layers; l++)
            q["quantized_layers"]["layers." + std::to_string(l) + ".ffn.experts"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
    }
    auto c = model::parse_config(cfg.dump());
    ASSERT_TRUE(c) << c.status().to_string();

    auto ck = io::checkpoint::open(src.string());
    ASSERT_TRUE(ck) << ck.status().to_string();
    std::vector<std::pair<std::string, Tensor>> out;
    for (const std::string &n : ck->names())
        if (n.find(".ffn.experts.") == std::string::npos) out.emplace_back(n, *ck->get(n));
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> mag(0.5f, 1.5f);
    auto sign = [&] { return (rng() & 1) ? -1.0f : 1.0f; };
    for (const model::catalog_entry &e : model::build_catalog(*c, model::catalog_scope::TEXT)) {
        if (e.format != model::storage_format::NVFP4 && e.format != model::storage_format::EXL3) continue;
        const int64_t fan_in = e.shape[1];
        // One weight_scale_2 per expert (gate and up must share it): unit-RMS rows in, unit-scale out,
        // as the synthesized linears (E2M1 codes have RMS ~2.9, the scale bytes below ~1.2).
        const float ws2 = 1.0f / (3.5f * std::sqrt(float(fan_in)));
        for (const model::stored_tensor &st : model::stored_tensors(e, *c)) {
            Tensor t(st.type, st.shape);
            const bool is = st.name.find(".input_scale") != std::string::npos;
            switch (st.type) {
            case dtype::U8:  // E2M1 code pairs: any byte
                for (int64_t i = 0; i < t.numel(); i++) t.data_mut<uint8_t>()[i] = uint8_t(rng());
                break;
            case dtype::F8_E4M3:  // 0x30..0x3f: 0.5 .. 1.875, never NaN
                for (int64_t i = 0; i < t.numel(); i++) t.data_mut<uint8_t>()[i] = uint8_t(0x30 + rng() % 16);
                break;
            case dtype::F32: t.data_mut<float>()[0] = is ? 8.0f / 2688.0f : ws2; break;  // input_scale: |x| <= 8
            case dtype::I16:
                for (int64_t i = 0; i < t.numel(); i++) t.data_mut<uint16_t>()[i] = uint16_t(rng());
                break;
            case dtype::F16:
                for (int64_t i = 0; i < t.numel(); i++)
                    t.data_mut<uint16_t>()[i] =
                        f32_to_f16(sign() * mag(rng) * (st.name.find(".suh") != std::string::npos ? 1.0f / std::sqrt(float(fan_in)) : 1.0f));
                break;
            case dtype::I32: t.data_mut<int32_t>()[0] = -877912083; break;  // the MCG codebook marker
            default: FAIL() << st.name << ": unexpected stored dtype";
            }
            out.emplace_back(st.name, t);
        }
    }
    fs::remove_all(dir);
    fs::create_directories(dir);
    ASSERT_TRUE(io::write_safetensors((dir / "model.safetensors").string(), out));
    fs::copy_file(src / "engram_token_map.safetensors", dir / "engram_token_map.safetensors");
    std::ofstream(dir / "config.json") << cfg.dump(2);
    fs::remove_all(src);
}

}  // namespace ds41rt
