// Model configuration: the shape constants of one DeepSeek V4 / V4.1 checkpoint.
//
// Parsed from the checkpoint's config.json (transformers names; V4.1 nests the text model under
// text_config and keeps quantization_config at the root) and validated once, so the rest of the
// code can rely on the invariants listed in validate(). Field names follow the reference code's
// ModelArgs where they differ from transformers (dim, n_layers, window, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds41rt::model {

enum class arch { V4, V41 };
const char *arch_name(arch a);  // "deepseek_v4" / "deepseek_v41"

enum class expert_quant { OFFICIAL, NVFP4, EXL3 };
const char *expert_quant_name(expert_quant q);  // "official" / "nvfp4" / "exl3"
// exllamav3's codebooks, numbered as its kernels number them (cb 0, 1, 2).
enum class exl3_codebook { INST3 = 0, MCG = 1, MUL1 = 2 };
const char *exl3_codebook_name(exl3_codebook cb);  // "3inst" / "mcg" / "mul1"

struct model_config {
    arch model_arch = arch::V41;

    // ---- trunk ----
    int64_t vocab_size = 0;
    int64_t dim = 0;            // hidden_size
    int n_layers = 0;           // num_hidden_layers (target layers, MTP/DSpark excluded)
    int n_mtp_layers = 0;       // num_nextn_predict_layers
    int n_heads = 0;
    int head_dim = 0;
    int rope_head_dim = 0;      // qk_rope_head_dim: the last rope_head_dim dims of a head rotate
    int q_lora_rank = 0;
    int o_groups = 0;
    int o_lora_rank = 0;
    int window = 0;             // sliding_window
    float norm_eps = 0;         // rms_norm_eps (1e-6 V4, 1e-20 V4.1)

    // ---- rope / yarn ----
    float rope_theta = 10000;           // ratio-0 layers, no YaRN
    float compress_rope_theta = 160000; // ratio>0 layers, with YaRN
    float rope_factor = 1;
    float beta_fast = 32, beta_slow = 1;
    int64_t original_seq_len = 0;       // rope_scaling.original_max_position_embeddings (0: no YaRN)
    int64_t max_position_embeddings = 0;

    // ---- compression / indexer ----
    std::vector<int> compress_ratios;   // n_layers + n_mtp_layers entries
    int index_n_heads = 0;
    int index_head_dim = 0;
    int index_topk = 0;
    // V4.1 cross-layer sharing (empty for V4)
    std::vector<int> kv_source_layers;
    std::vector<int> index_source_layers;
    int candidate_source_layer = -1;
    int candidate_topk_blocks = 0;
    int candidate_block_size = 0;

    // ---- MoE ----
    int n_routed_experts = 0;
    int n_activated_experts = 0;
    int n_shared_experts = 0;
    int moe_inter_dim = 0;
    float route_scale = 1;
    float swiglu_limit = 0;     // 0: no clamp
    bool norm_topk_prob = true;
    float gate_temp = 1;
    int n_hash_layers = 0;      // V4: layers < n_hash_layers route by tid2eid

    // ---- mHC ----
    int hc_mult = 4;
    int hc_sinkhorn_iters = 20;
    float hc_eps = 1e-6f;

    // ---- Engram (V4.1) ----
    std::vector<int> engram_layer_ids;
    std::vector<int64_t> engram_num_embeddings;  // table rows per engram layer
    int engram_max_ngram = 0;
    int engram_n_heads = 0;
    int engram_head_dim = 0;
    int64_t engram_vocab_size = 0;               // prime search start
    int engram_pad_id = 2;
    int64_t engram_compressed_vocab_size = 0;

    // ---- DSpark drafter (V4.1; V4-0731) ----
    int dspark_block_size = 0;
    int dspark_noise_token_id = -1;
    std::vector<int> dspark_target_layers;
    int dspark_markov_rank = 0;
    int dspark_n_routed_experts = 0;
    int dspark_n_activated_experts = 0;

    // ---- storage (quantization_config) ----
    int fp8_block_out = 128, fp8_block_in = 128;  // weight_block_size
    std::string expert_dtype;                      // "fp4" or "" (bf16/fp8 experts)
    std::string quant_method;                      // backbone: "fp8" or "" (EXL3: its non_routed_quantization)
    // How the routed experts of the target layers (not MTP / DSpark) are stored: the official
    // MXFP4 (or whatever expert_dtype says), ModelOpt NVFP4, or exllamav3 EXL3 trellis.
    expert_quant routed_quant = expert_quant::OFFICIAL;
    int exl3_bits = 0;                             // EXL3: uniform trellis K (1..8)
    exl3_codebook exl3_cb = exl3_codebook::MCG;    // EXL3: codebook the config announces

    // ---- tokens ----
    int bos_token_id = 0, eos_token_id = 1, pad_token_id = 2;
    int image_token_id = -1;    // V4.1 root image_token_id (-1: none)

    // ---- vision tower (V4.1 vision_config; vision_n_layers 0: no vision part) ----
    int vision_n_layers = 0;
    int vision_dim = 0;
    int vision_n_heads = 0;
    int vision_inter_dim = 0;
    int vision_patch_size = 0;
    int vision_downsample_ratio = 0;

    // Derived helpers.
    int nope_head_dim() const { return head_dim - rope_head_dim; }
    int ratio(int layer) const { return compress_ratios.at(size_t(layer)); }
    bool is_kv_source(int layer) const;
    bool is_index_source(int layer) const;
    bool has_engram(int layer) const;
    // V4.1: the latest KV / index source at or before layer (-1 if none). V4 has no sharing:
    // every compressing layer is its own KV source (and, at ratio 4, its own index source).
    int kv_source_for(int layer) const;
    int index_source_for(int layer) const;
    bool has_vision() const { return vision_n_layers > 0; }
};

// Parses config.json text. Unknown keys are ignored; missing or out-of-range required keys are
// INVALID_ARGUMENT naming the key.
Result<model_config> parse_config(const std::string &json_text);
// Reads dir/config.json and, when present, dir/hf_quant_config.json (ModelOpt's legacy file),
// which must agree with config.json's quantization_config.
Result<model_config> load_config(const std::string &dir);
// Checks hf_quant_config.json text against a parsed config (what load_config does with the file).
Status check_hf_quant_config(const std::string &json_text, const model_config &c);
// Checks every invariant the engine relies on; the message names the key and the rule broken.
Status validate(const model_config &c);

}  // namespace ds41rt::model
