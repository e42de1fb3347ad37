// Built-in full-size configs (see flash_configs.h). Keep them equal to tests/fixtures/configs/.
#include "model/flash_configs.h"

#include <nlohmann/json.hpp>

namespace ds41rt::model {

namespace {

constexpr const char *V41_FLASH = R"json({
  "architectures": ["DeepseekV41ForCausalLM"],
  "model_type": "deepseek_v41",
  "dtype": "bfloat16",
  "bos_token_id": 0,
  "eos_token_id": 1,
  "pad_token_id": 2,
  "image_token_id": 129264,
  "tie_word_embeddings": false,
  "quantization_config": {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "weight_block_size": [32, 32],
    "scale_fmt": "ue8m0",
    "expert_dtype": "fp4"
  },
  "vision_config": {
    "model_type": "deepseek_v41_vision",
    "num_hidden_layers": 32,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "intermediate_size": 2816,
    "patch_size": 14,
    "rope_theta": 10000,
    "downsample_ratio": 3,
    "max_image_tokens": 1024,
    "min_pixels": 295936,
    "max_wh_ratio": null
  },
  "text_config": {
    "model_type": "deepseek_v41_text",
    "vocab_size": 129280,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "num_nextn_predict_layers": 3,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "sliding_window": 128,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "compress_ratios": [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "n_routed_experts": 384,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2304,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": true,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-20,
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_vocab_size": 16000000,
    "engram_pad_id": 2,
    "engram_compressed_vocab_size": 99092,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_num_experts_per_tok": 3,
    "hidden_act": "silu",
    "attention_bias": false,
    "attention_dropout": 0.0,
    "tie_word_embeddings": false,
    "initializer_range": 0.02,
    "use_cache": true
  }
}
)json";

constexpr const char *V4_FLASH = R"json({
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "torch_dtype": "bfloat16",
  "vocab_size": 129280,
  "hidden_size": 4096,
  "num_hidden_layers": 43,
  "num_nextn_predict_layers": 1,
  "num_attention_heads": 64,
  "num_key_value_heads": 1,
  "head_dim": 512,
  "qk_rope_head_dim": 64,
  "q_lora_rank": 1024,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "sliding_window": 128,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
  "compress_rope_theta": 160000,
  "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576,
  "index_n_heads": 64,
  "index_head_dim": 128,
  "index_topk": 512,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "num_experts_per_tok": 6,
  "moe_intermediate_size": 2048,
  "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "num_hash_layers": 3,
  "swiglu_limit": 10.0,
  "hidden_act": "silu",
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-6,
  "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false,
  "attention_bias": false,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                          "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
}
)json";

}  // namespace

const char *flash_config_json(arch a) { return a == arch::V4 ? V4_FLASH : V41_FLASH; }

Result<model_config> flash_config(arch a) {
    Result<model_config> c = parse_config(flash_config_json(a));
    if (!c) return c;
    Status st = validate(*c);
    if (!st) return st;
    return c;
}

Result<model_config> flash_config(arch a, expert_quant q) {
    if (q == expert_quant::OFFICIAL) return flash_config(a);
    nlohmann::json j = nlohmann::json::parse(flash_config_json(a));
    const nlohmann::json official = j["quantization_config"];
    const int layers = j.contains("text_config") ? j["text_config"].value("num_hidden_layers", 0)
                                                 : j.value("num_hidden_layers", 0);
    nlohmann::json qc;
    if (q == expert_quant::NVFP4) {
        qc = official;
        qc["quant_algo"] = "MIXED_PRECISION";
        qc["moe_quant_algo"] = "NVFP4";
        qc["expert_dtype"] = "fp4";
        qc["group_size"] = 16;
        qc["kv_cache_quant_algo"] = nullptr;
        qc["ignore"] = {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"};
        qc["producer"] = {{"name", "modelopt"}, {"version", "0.47.0rc0"}};
        nlohmann::json ql = nlohmann::json::object();
        for (int l = 0; l < layers; l++)
            ql["layers." + std::to_string(l) + ".ffn.experts"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
        qc["quantized_layers"] = ql;
        const nlohmann::json part = {{"num_bits", 4}, {"type", "float"}, {"group_size", 16}, {"dynamic", false}};
        qc["config_groups"] = {{"group_0", {{"targets", {"Linear"}}, {"weights", part}, {"input_activations", part}}}};
    } else {
        nlohmann::json nr = official;
        nr["quant_method"] = "deepseek_v4_fp8";
        qc = {{"quant_method", "exl3"}, {"bits", 2}, {"codebook", "mcg"}, {"mtp_experts", "source"},
              {"mtp_experts_start_layer", layers}, {"non_routed_quantization", nr}};
        if (official.contains("weight_block_size")) qc["weight_block_size"] = official["weight_block_size"];
    }
    j["quantization_config"] = qc;
    Result<model_config> c = parse_config(j.dump());
    if (!c) return c;
    if (c->routed_quant != q)
        return Status::internal(std::string("built-in ") + expert_quant_name(q) + " config was read as " +
                                expert_quant_name(c->routed_quant));
    Status st = validate(*c);
    if (!st) return st;
    return c;
}

}  // namespace ds41rt::model
