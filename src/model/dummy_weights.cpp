// The dummy-weight plan (see dummy_weights.h): the text part of the catalog, cut at --layers, each
// entry with its stored bytes, scale grid, fill rule and id.
#include "model/dummy_weights.h"

#include <array>
#include <cmath>
#include <string_view>

#include "core/dtype.h"
#include "model/exl3.h"

namespace ds41rt::model {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The last dotted component ("layers.3.hc_attn_fn" -> "hc_attn_fn").
std::string_view leaf(std::string_view name) {
    const size_t dot = name.rfind('.');
    return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

dummy_rule normal(double std, const char *why) { return {dummy_init::NORMAL, std, 0, 0, why}; }
dummy_rule constant(double v, const char *why) { return {dummy_init::CONSTANT, 0, v, 0, why}; }

// The mHC mix logits' multiplier: small, so the mixes stay near their neutral point (header).
constexpr double HC_SCALE = 0.5;

}  // namespace

const char *dummy_init_name(dummy_init i) {
    switch (i) {
    case dummy_init::NORMAL:     return "normal";
    case dummy_init::CONSTANT:   return "constant";
    case dummy_init::EXPERT_IDS: return "expert_ids";
    }
    return "?";
}

uint64_t dummy_tensor_id(const std::string &name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

double exl3_codebook_rms(exl3_codebook cb) {
    static const std::array<double, 3> rms = [] {
        std::array<double, 3> r{};
        for (int k = 0; k < 3; k++) {
            double ms = 0;
            for (uint32_t s = 0; s < 65536; s++) {
                const double v = f16_to_f32(exl3_codebook_value(uint16_t(s), exl3_codebook(k)));
                ms += v * v;
            }
            r[size_t(k)] = std::sqrt(ms / 65536);
        }
        return r;
    }();
    return rms[size_t(cb)];
}

Result<dummy_rule> dummy_rule_for(const catalog_entry &e, const model_config &c) {
    const std::string_view name = e.name, last = leaf(name);
    if (e.format == storage_format::I64) {
        if (last != "tid2eid") return Status::not_supported("dummy weights: no rule for I64 tensor " + e.name);
        return dummy_rule{dummy_init::EXPERT_IDS, 0, 0, c.n_routed_experts, "hash routing to valid, distinct experts"};
    }
    if (ends_with(name, "embed.weight") || name.substr(0, 6) == "image_")  // token, Engram, Markov rows; image markers
        return normal(1.0, "embedding rows of unit RMS");
    if (ends_with(name, "norm.weight") || ends_with(name, "norm1.weight") || ends_with(name, "norm2.weight") ||
        name == "engram.q_weight" || ends_with(name, ".engram.q_weight") || ends_with(name, ".engram.k_weight"))
        return constant(1.0, "RMSNorm gain: identity");
    if (last == "attn_sink") return constant(0.0, "sink logit 0");
    if (last == "bias" || last == "bias_vl") return constant(0.0, "additive bias: neutral");
    if (last == "ape") return constant(0.0, "compressor position bias: pooling by content");
    if (last.substr(0, 3) == "hc_") {
        if (ends_with(last, "_fn") && e.shape.size() == 2)
            return normal(1.0 / std::sqrt(double(e.shape[1])), "mHC projection: unit mix logits");
        if (ends_with(last, "_base")) return constant(0.0, "mHC base: neutral mixes");
        if (ends_with(last, "_scale")) return constant(HC_SCALE, "mHC logit scale: mixes near neutral");
    }
    if (e.shape.size() == 2 && e.shape[1] > 0)
        return normal(1.0 / std::sqrt(double(e.shape[1])), "linear: unit-RMS in, unit-RMS out");
    return Status::not_supported("dummy weights: no fill rule for " + e.name + " (" + tensor_role_name(e.role) + ", " +
                                 storage_format_name(e.format) + ", rank " + std::to_string(e.shape.size()) + ")");
}

Result<dummy_plan> plan_dummy_weights(const model_config &c, int layers) {
    if (layers < -1 || layers > c.n_layers)
        return Status::invalid_argument("dummy weights: --layers " + std::to_string(layers) + " is outside 1.." +
                                        std::to_string(c.n_layers));
    dummy_plan p;
    p.layers = layers < 0 ? c.n_layers : layers;
    for (catalog_entry &e : build_catalog(c, catalog_scope::TEXT)) {
        if (e.layer >= p.layers) continue;  // globals have layer -1
        dummy_tensor t;
        auto rule = dummy_rule_for(e, c);
        if (!rule) return rule.status();
        t.rule = rule.value();
        t.stored = stored_tensors(e, c);
        for (const stored_tensor &s : t.stored) t.bytes += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
        if (e.format == storage_format::FP8_BLOCK) {
            t.block_out = c.fp8_block_out;
            t.block_in = c.fp8_block_in;
        } else if (e.format == storage_format::MXFP4 || e.format == storage_format::ENGRAM_TABLE) {
            t.block_out = 1;
            t.block_in = 32;
        } else if (e.format == storage_format::NVFP4) {
            t.block_out = 1;
            t.block_in = 16;
            t.input_amax = DUMMY_NVFP4_INPUT_AMAX;
        } else if (e.format == storage_format::EXL3) {
            t.block_out = t.block_in = int(exl3_block);
            t.exl3_bits = c.exl3_bits > 0 ? c.exl3_bits : 2;
            t.exl3_code_rms = exl3_codebook_rms(c.exl3_cb);
        }
        t.id = dummy_tensor_id(e.name);
        t.entry = std::move(e);
        p.bytes += t.bytes;
        p.stored_tensors += t.stored.size();
        p.tensors.push_back(std::move(t));
    }
    return p;
}

}  // namespace ds41rt::model
