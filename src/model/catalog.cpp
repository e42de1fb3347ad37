// Tensor catalogs of V4 Flash (spec V4 section 5) and V4.1 Flash (spec V4.1 section 8.2).
//
// Each model line is one function that lists its tensors in checkpoint order of thought (globals,
// then per block, then MTP / DSpark, then vision), one row per tensor, so a row can be read against
// the spec's table. Shapes come from the config, never from the released numbers, so the same code
// describes the tiny test models. The full-size totals are pinned by tests/unit/catalog_test.cpp.
#include "model/catalog.h"

#include <algorithm>
#include <string_view>

namespace ds41rt::model {

const char *tensor_role_name(tensor_role r) {
    switch (r) {
    case tensor_role::EMBED:         return "embed";
    case tensor_role::HEAD:          return "head";
    case tensor_role::NORM:          return "norm";
    case tensor_role::ATTN:          return "attn";
    case tensor_role::COMPRESSOR:    return "compressor";
    case tensor_role::INDEXER:       return "indexer";
    case tensor_role::MHC:           return "mhc";
    case tensor_role::ROUTER:        return "router";
    case tensor_role::SHARED_EXPERT: return "shared_expert";
    case tensor_role::ROUTED_EXPERT: return "routed_expert";
    case tensor_role::ENGRAM:        return "engram";
    case tensor_role::MTP:           return "mtp";
    case tensor_role::VISION:        return "vision";
    }
    return "?";
}

const char *storage_format_name(storage_format f) {
    switch (f) {
    case storage_format::BF16:         return "BF16";
    case storage_format::F32:          return "F32";
    case storage_format::FP8_BLOCK:    return "FP8_BLOCK";
    case storage_format::MXFP4:        return "MXFP4";
    case storage_format::ENGRAM_TABLE: return "ENGRAM_TABLE";
    case storage_format::I64:          return "I64";
    case storage_format::NVFP4:        return "NVFP4";
    case storage_format::EXL3:         return "EXL3";
    }
    return "?";
}

const char *model_part_name(model_part p) {
    switch (p) {
    case model_part::TEXT:   return "text";
    case model_part::MTP:    return "mtp";
    case model_part::VISION: return "vision";
    }
    return "?";
}

std::string scale_name(const std::string &weight_name) {
    constexpr std::string_view suffix = ".weight";
    if (weight_name.size() >= suffix.size() &&
        std::string_view(weight_name).substr(weight_name.size() - suffix.size()) == suffix)
        return weight_name.substr(0, weight_name.size() - suffix.size()) + ".scale";
    return weight_name + ".scale";
}

std::string companion_name(const std::string &weight_name, const char *suffix) {
    constexpr std::string_view w = ".weight";
    std::string p = weight_name;
    if (p.size() >= w.size() && std::string_view(p).substr(p.size() - w.size()) == w) p.resize(p.size() - w.size());
    return p + "." + suffix;
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

shape_t stored_weight_shape(storage_format f, const shape_t &logical) {
    if (f == storage_format::MXFP4 || f == storage_format::NVFP4) return {logical[0], logical[1] / 2};
    return logical;
}

shape_t stored_scale_shape(storage_format f, const shape_t &logical, const model_config &c) {
    switch (f) {
    case storage_format::FP8_BLOCK:    return {ceil_div(logical[0], c.fp8_block_out), ceil_div(logical[1], c.fp8_block_in)};
    case storage_format::MXFP4:        return {logical[0], ceil_div(logical[1], 32)};
    case storage_format::ENGRAM_TABLE: return {logical[0], ceil_div(logical[1], 32)};
    case storage_format::NVFP4:        return {logical[0], ceil_div(logical[1], 16)};
    default:                           return {};
    }
}

std::vector<stored_tensor> stored_tensors(const catalog_entry &e, const model_config &c) {
    switch (e.format) {
    case storage_format::BF16: return {{e.name, dtype::BF16, e.shape}};
    case storage_format::F32:  return {{e.name, dtype::F32, e.shape}};
    case storage_format::I64:  return {{e.name, dtype::I64, e.shape}};
    case storage_format::FP8_BLOCK:
    case storage_format::ENGRAM_TABLE:
        return {{e.name, dtype::F8_E4M3, e.shape},
                {scale_name(e.name), dtype::F8_E8M0, stored_scale_shape(e.format, e.shape, c)}};
    case storage_format::MXFP4:
        return {{e.name, dtype::I8, stored_weight_shape(e.format, e.shape)},
                {scale_name(e.name), dtype::F8_E8M0, stored_scale_shape(e.format, e.shape, c)}};
    case storage_format::NVFP4:
        return {{e.name, dtype::U8, stored_weight_shape(e.format, e.shape)},
                {companion_name(e.name, "weight_scale"), dtype::F8_E4M3, stored_scale_shape(e.format, e.shape, c)},
                {companion_name(e.name, "weight_scale_2"), dtype::F32, {}},
                {companion_name(e.name, "input_scale"), dtype::F32, {}}};
    case storage_format::EXL3: {
        // Logical [out, in] as every other linear; EXL3 stores W[in, out] (y = x W) as 16x16 tiles.
        const int64_t out = e.shape[0], in = e.shape[1], k = c.exl3_bits > 0 ? c.exl3_bits : 2;
        std::vector<stored_tensor> v = {{companion_name(e.name, "trellis"), dtype::I16, {in / 16, out / 16, 16 * k}},
                                        {companion_name(e.name, "suh"), dtype::F16, {in}},
                                        {companion_name(e.name, "svh"), dtype::F16, {out}}};
        if (c.exl3_cb == exl3_codebook::MCG) v.push_back({companion_name(e.name, "mcg"), dtype::I32, {}});
        if (c.exl3_cb == exl3_codebook::MUL1) v.push_back({companion_name(e.name, "mul1"), dtype::I32, {}});
        return v;
    }
    }
    return {};
}

int expert_tp_align(const model_config &c, storage_format f) {
    switch (f) {
    case storage_format::MXFP4:     return 32;
    case storage_format::NVFP4:     return 16;
    case storage_format::EXL3:      return 128;
    case storage_format::FP8_BLOCK: return std::max(c.fp8_block_out, c.fp8_block_in);
    default:                        return 1;
    }
}

uint64_t expert_layer_bytes(const model_config &c, storage_format f) {
    const int64_t inter = c.moe_inter_dim, dim = c.dim;
    uint64_t per_expert = 0;
    for (const shape_t &s : {shape_t{inter, dim}, shape_t{inter, dim}, shape_t{dim, inter}}) {
        catalog_entry e{"x.weight", tensor_role::ROUTED_EXPERT, f, s, 0, model_part::TEXT};
        for (const stored_tensor &t : stored_tensors(e, c)) per_expert += dtype_bytes(t.type, size_t(shape_numel(t.shape)));
    }
    return per_expert * uint64_t(c.n_routed_experts);
}

catalog_totals totals(const std::vector<catalog_entry> &entries, const model_config &c) {
    catalog_totals t;
    for (const auto &e : entries) {
        for (const auto &s : stored_tensors(e, c)) {
            t.tensors++;
            t.bytes += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
        }
    }
    return t;
}

// ---- builder ------------------------------------------------------------------------------------

namespace {

using R = tensor_role;
using F = storage_format;

// Appends rows under one name prefix ("layers.7.", "mtp.1.", "") for one part and layer.
struct rows {
    std::vector<catalog_entry> &out;
    std::string prefix;
    int layer;
    model_part part;

    void add(const std::string &suffix, R role, F fmt, shape_t shape) const {
        out.push_back({prefix + suffix, role, fmt, std::move(shape), layer, part});
    }
};

// Routed experts are FP4 in the official releases; fp8 and bf16 expert checkpoints exist
// (V4-Flash-Base) and are described by their quantization_config. The quantized publications
// re-encode only the target layers' routed experts; MTP / DSpark experts stay official.
F expert_format(const model_config &c, model_part part) {
    if (part == model_part::TEXT && c.routed_quant == expert_quant::NVFP4) return F::NVFP4;
    if (part == model_part::TEXT && c.routed_quant == expert_quant::EXL3) return F::EXL3;
    if (c.expert_dtype == "fp4") return F::MXFP4;
    if (c.quant_method == "fp8") return F::FP8_BLOCK;
    return F::BF16;
}

}  // namespace

storage_format routed_expert_format(const model_config &c) { return expert_format(c, model_part::TEXT); }

namespace {

// Linears the release stores as FP8 blocks; plain bf16 when the config has no quantization.
F linear_format(const model_config &c) { return c.quant_method == "fp8" ? F::FP8_BLOCK : F::BF16; }

// ---- the parts of a block both lines share ----

void add_block_norms_and_mhc(const rows &b, const model_config &c) {
    const int64_t mix = int64_t(2 + c.hc_mult) * c.hc_mult;  // pre, post and the hc x hc combine
    const int64_t hc_dim = int64_t(c.hc_mult) * c.dim;
    b.add("attn_norm.weight",  R::NORM, F::BF16, {c.dim});
    b.add("ffn_norm.weight",   R::NORM, F::BF16, {c.dim});
    b.add("hc_attn_fn",        R::MHC,  F::F32,  {mix, hc_dim});
    b.add("hc_attn_base",      R::MHC,  F::F32,  {mix});
    b.add("hc_attn_scale",     R::MHC,  F::F32,  {3});
    b.add("hc_ffn_fn",         R::MHC,  F::F32,  {mix, hc_dim});
    b.add("hc_ffn_base",       R::MHC,  F::F32,  {mix});
    b.add("hc_ffn_scale",      R::MHC,  F::F32,  {3});
}

void add_attention_core(const rows &b, const model_config &c) {
    const F fp8 = linear_format(c);
    const int64_t q_dim = int64_t(c.n_heads) * c.head_dim;
    const int64_t o_dim = int64_t(c.o_groups) * c.o_lora_rank;
    b.add("attn.attn_sink",        R::ATTN, F::F32,  {c.n_heads});
    b.add("attn.wq_a.weight",      R::ATTN, fp8,     {c.q_lora_rank, c.dim});
    b.add("attn.q_norm.weight",    R::ATTN, F::BF16, {c.q_lora_rank});
    b.add("attn.wq_b.weight",      R::ATTN, fp8,     {q_dim, c.q_lora_rank});
    b.add("attn.wkv.weight",       R::ATTN, fp8,     {c.head_dim, c.dim});
    b.add("attn.kv_norm.weight",   R::ATTN, F::BF16, {c.head_dim});
    b.add("attn.wo_a.weight",      R::ATTN, fp8,     {o_dim, q_dim / c.o_groups});  // row = g * o_lora_rank + r
    b.add("attn.wo_b.weight",      R::ATTN, fp8,     {c.dim, o_dim});
}

void add_moe(const rows &b, const model_config &c, int n_experts, bool hash_routed, bool vl_bias) {
    const F fp8 = linear_format(c);
    const F fp4 = expert_format(c, b.part);
    const int64_t inter = c.moe_inter_dim;
    b.add("ffn.gate.weight", R::ROUTER, F::BF16, {n_experts, c.dim});
    if (hash_routed)
        b.add("ffn.gate.tid2eid", R::ROUTER, F::I64, {c.vocab_size, c.n_activated_experts});
    else
        b.add("ffn.gate.bias",    R::ROUTER, F::F32, {n_experts});
    if (vl_bias)
        b.add("ffn.gate.bias_vl", R::ROUTER, F::F32, {n_experts});
    for (int e = 0; e < n_experts; e++) {
        const std::string x = "ffn.experts." + std::to_string(e) + ".";
        b.add(x + "w1.weight", R::ROUTED_EXPERT, fp4, {inter, c.dim});
        b.add(x + "w3.weight", R::ROUTED_EXPERT, fp4, {inter, c.dim});
        b.add(x + "w2.weight", R::ROUTED_EXPERT, fp4, {c.dim, inter});
    }
    const int64_t shared = inter * c.n_shared_experts;
    if (shared == 0) return;
    b.add("ffn.shared_experts.w1.weight", R::SHARED_EXPERT, fp8, {shared, c.dim});
    b.add("ffn.shared_experts.w3.weight", R::SHARED_EXPERT, fp8, {shared, c.dim});
    b.add("ffn.shared_experts.w2.weight", R::SHARED_EXPERT, fp8, {c.dim, shared});
}

void add_embed_head(std::vector<catalog_entry> &out, const model_config &c) {
    rows g{out, "", -1, model_part::TEXT};
    g.add("embed.weight", R::EMBED, F::BF16, {c.vocab_size, c.dim});
    g.add("head.weight",  R::HEAD,  F::BF16, {c.vocab_size, c.dim});
    g.add("norm.weight",  R::NORM,  F::BF16, {c.dim});
}

// hc_head collapses the 4 streams into one before the final norm (V4 only; V4.1 has no learned
// head collapse).
void add_hc_head(const rows &b, const model_config &c) {
    const int64_t hc_dim = int64_t(c.hc_mult) * c.dim;
    b.add("hc_head_fn",    R::MHC, F::F32, {c.hc_mult, hc_dim});
    b.add("hc_head_base",  R::MHC, F::F32, {c.hc_mult});
    b.add("hc_head_scale", R::MHC, F::F32, {1});
}

// ================================================================================================
// V4 Flash (spec V4 section 5). CSA layers (ratio 4) compress with overlap, hence the doubled
// compressor width and their own indexer compressor; HCA layers (ratio 128) compress without.
// Hash-routed layers (< num_hash_layers) replace gate.bias by tid2eid. One MTP layer.
// ================================================================================================

void add_v4_block(const rows &b, const model_config &c) {
    const F fp8 = linear_format(c);
    const int ratio = c.ratio(b.layer);
    add_block_norms_and_mhc(b, c);
    add_attention_core(b, c);
    if (ratio > 0) {
        const int64_t width = ratio == 4 ? 2 * c.head_dim : c.head_dim;  // overlap doubles CSA
        b.add("attn.compressor.wkv.weight",   R::COMPRESSOR, F::BF16, {width, c.dim});
        b.add("attn.compressor.wgate.weight", R::COMPRESSOR, F::BF16, {width, c.dim});
        b.add("attn.compressor.ape",          R::COMPRESSOR, F::F32,  {ratio, width});
        b.add("attn.compressor.norm.weight",  R::COMPRESSOR, F::BF16, {c.head_dim});
    }
    if (ratio == 4) {
        const int64_t iw = 2 * int64_t(c.index_head_dim);
        b.add("attn.indexer.wq_b.weight",              R::INDEXER, fp8,     {int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank});
        b.add("attn.indexer.weights_proj.weight",      R::INDEXER, F::BF16, {c.index_n_heads, c.dim});
        b.add("attn.indexer.compressor.wkv.weight",    R::INDEXER, F::BF16, {iw, c.dim});
        b.add("attn.indexer.compressor.wgate.weight",  R::INDEXER, F::BF16, {iw, c.dim});
        b.add("attn.indexer.compressor.ape",           R::INDEXER, F::F32,  {ratio, iw});
        b.add("attn.indexer.compressor.norm.weight",   R::INDEXER, F::BF16, {c.index_head_dim});
    }
    const bool is_mtp = b.layer >= c.n_layers;
    add_moe(b, c, c.n_routed_experts, !is_mtp && b.layer < c.n_hash_layers, /*vl_bias=*/false);
}

void build_v4(std::vector<catalog_entry> &out, const model_config &c, catalog_scope scope) {
    const bool text = scope == catalog_scope::TEXT || scope == catalog_scope::ALL;
    const bool mtp  = scope == catalog_scope::MTP || scope == catalog_scope::ALL;
    if (text) {
        add_embed_head(out, c);
        add_hc_head(rows{out, "", -1, model_part::TEXT}, c);
        for (int l = 0; l < c.n_layers; l++)
            add_v4_block(rows{out, "layers." + std::to_string(l) + ".", l, model_part::TEXT}, c);
    }
    if (mtp) {
        // The original V4 MTP layer: a block plus embedding / hidden projections and its own
        // hc_head and final norm (spec V4 section 3.11).
        const F fp8 = linear_format(c);
        for (int s = 0; s < c.n_mtp_layers; s++) {
            rows m{out, "mtp." + std::to_string(s) + ".", c.n_layers + s, model_part::MTP};
            add_v4_block(m, c);
            m.add("e_proj.weight", R::MTP, fp8,     {c.dim, c.dim});
            m.add("h_proj.weight", R::MTP, fp8,     {c.dim, c.dim});
            m.add("enorm.weight",  R::MTP, F::BF16, {c.dim});
            m.add("hnorm.weight",  R::MTP, F::BF16, {c.dim});
            m.add("norm.weight",   R::MTP, F::BF16, {c.dim});
            add_hc_head(m, c);
        }
    }
}

// ================================================================================================
// V4.1 Flash (spec V4.1 section 8.2). Only KV sources carry a compressor and index keys (ratio-1
// sources have no gate); index sources carry the indexer query side; Engram layers their tables.
// Every gate has bias_vl for image tokens. DSpark stages are window-only blocks with their own
// expert count; stage 0 projects the target taps, stage 2 owns the heads.
// ================================================================================================

void add_v41_block(const rows &b, const model_config &c, int n_experts) {
    const F fp8 = linear_format(c);
    const int l = b.layer;
    const bool target = l < c.n_layers;
    add_block_norms_and_mhc(b, c);
    add_attention_core(b, c);
    if (target && c.is_kv_source(l)) {
        b.add("attn.compressor.wkv.weight",       R::COMPRESSOR, F::BF16, {c.head_dim, c.dim});
        if (c.ratio(l) > 1)
            b.add("attn.compressor.wgate.weight", R::COMPRESSOR, F::BF16, {c.head_dim, c.dim});
        b.add("attn.compressor.norm.weight",      R::COMPRESSOR, F::BF16, {c.head_dim});
        b.add("attn.indexer.wk.weight",           R::INDEXER,    F::BF16, {c.index_head_dim, c.head_dim});
        b.add("attn.indexer.k_norm.weight",       R::INDEXER,    F::BF16, {c.index_head_dim});
    }
    if (target && c.is_index_source(l)) {
        b.add("attn.indexer.wq_b.weight",         R::INDEXER,    fp8,     {int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank});
        b.add("attn.indexer.weights_proj.weight", R::INDEXER,    F::BF16, {c.index_n_heads, c.dim});
    }
    if (target && c.has_engram(l)) {
        size_t k = 0;
        while (c.engram_layer_ids[k] != l) k++;
        const int64_t rows_k = k < c.engram_num_embeddings.size() ? c.engram_num_embeddings[k] : 0;
        const int64_t lookup = int64_t(c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim;
        const F table = c.quant_method == "fp8" ? F::ENGRAM_TABLE : F::BF16;
        b.add("engram.embed.weight", R::ENGRAM, table,   {rows_k, c.engram_head_dim});
        b.add("engram.wkv.weight",   R::ENGRAM, fp8,     {c.dim * (c.hc_mult + 1), lookup});  // value + hc keys
        b.add("engram.q_weight",     R::ENGRAM, F::BF16, {c.hc_mult, c.dim});
        b.add("engram.k_weight",     R::ENGRAM, F::BF16, {c.hc_mult, c.dim});
    }
    add_moe(b, c, n_experts, /*hash_routed=*/false, /*vl_bias=*/true);
}

void add_v41_vision(std::vector<catalog_entry> &out, const model_config &c) {
    rows g{out, "", -1, model_part::VISION};
    g.add("image_start",   R::VISION, F::BF16, {c.dim});
    g.add("image_end",     R::VISION, F::BF16, {c.dim});
    g.add("image_newline", R::VISION, F::BF16, {c.dim});
    const int64_t vd = c.vision_dim;
    const int64_t patch = 3 * int64_t(c.vision_patch_size) * c.vision_patch_size;
    const int64_t unfold = vd * c.vision_downsample_ratio * c.vision_downsample_ratio;
    g.add("vision.patch_embed.proj.weight", R::VISION, F::BF16, {vd, patch});
    g.add("vision.patch_embed.proj.bias",   R::VISION, F::BF16, {vd});
    for (int i = 0; i < c.vision_n_layers; i++) {
        rows v{out, "vision.blocks." + std::to_string(i) + ".", i, model_part::VISION};
        v.add("norm1.weight",     R::VISION, F::BF16, {vd});
        v.add("norm2.weight",     R::VISION, F::BF16, {vd});
        v.add("attn.wqkv.weight", R::VISION, F::BF16, {3 * vd, vd});
        v.add("attn.wqkv.bias",   R::VISION, F::BF16, {3 * vd});
        v.add("attn.wo.weight",   R::VISION, F::BF16, {vd, vd});
        v.add("attn.wo.bias",     R::VISION, F::BF16, {vd});
        v.add("mlp.w1.weight",    R::VISION, F::BF16, {2 * int64_t(c.vision_inter_dim), vd});  // gate | up
        v.add("mlp.w2.weight",    R::VISION, F::BF16, {vd, c.vision_inter_dim});
    }
    g.add("vision.norm.weight", R::VISION, F::BF16, {vd});
    g.add("aligner.w1.weight",  R::VISION, F::BF16, {c.dim, unfold});
    g.add("aligner.w1.bias",    R::VISION, F::BF16, {c.dim});
    g.add("aligner.w2.weight",  R::VISION, F::BF16, {c.dim, c.dim});
    g.add("aligner.w2.bias",    R::VISION, F::BF16, {c.dim});
}

void build_v41(std::vector<catalog_entry> &out, const model_config &c, catalog_scope scope) {
    const bool text   = scope == catalog_scope::TEXT || scope == catalog_scope::ALL;
    const bool mtp    = scope == catalog_scope::MTP || scope == catalog_scope::ALL;
    const bool vision = scope == catalog_scope::VISION || scope == catalog_scope::ALL;
    if (text) {
        add_embed_head(out, c);
        for (int l = 0; l < c.n_layers; l++)
            add_v41_block(rows{out, "layers." + std::to_string(l) + ".", l, model_part::TEXT}, c, c.n_routed_experts);
    }
    if (mtp && c.n_mtp_layers > 0) {
        const F fp8 = linear_format(c);
        for (int s = 0; s < c.n_mtp_layers; s++)
            add_v41_block(rows{out, "mtp." + std::to_string(s) + ".", c.n_layers + s, model_part::MTP}, c,
                          c.dspark_n_routed_experts);
        const int last = c.n_mtp_layers - 1;
        rows first{out, "mtp.0.", c.n_layers, model_part::MTP};
        rows final{out, "mtp." + std::to_string(last) + ".", c.n_layers + last, model_part::MTP};
        const int64_t taps = int64_t(c.dspark_target_layers.size()) * c.dim;
        first.add("main_proj.weight",                R::MTP, fp8,     {c.dim, taps});
        first.add("main_norm.weight",                R::MTP, F::BF16, {c.dim});
        final.add("norm.weight",                     R::MTP, F::BF16, {c.dim});
        final.add("markov_head.embed.weight",        R::MTP, F::BF16, {c.vocab_size, c.dspark_markov_rank});
        final.add("markov_head.head.weight",         R::MTP, F::BF16, {c.vocab_size, c.dspark_markov_rank});
        final.add("confidence_head.proj.weight",     R::MTP, F::BF16, {1, c.dim + c.dspark_markov_rank});
    }
    if (vision && c.has_vision()) add_v41_vision(out, c);
}

}  // namespace

std::vector<catalog_entry> build_catalog(const model_config &c, catalog_scope scope) {
    std::vector<catalog_entry> out;
    if (c.model_arch == arch::V4)
        build_v4(out, c, scope);
    else
        build_v41(out, c, scope);
    return out;
}

}  // namespace ds41rt::model
