// quantization_config -> storage fields of model_config (quant_config.h).
//
// The three publications we serve spell their storage differently (spec quant-formats 1.2, 2.2):
//  - official: {quant_method "fp8", fmt, activation_scheme, scale_fmt, weight_block_size} with the
//    routed experts in MXFP4 (expert_dtype "fp4", implied when absent);
//  - nvidia/DeepSeek-V4.1-Flash-NVFP4: the official block plus moe_quant_algo "NVFP4",
//    quant_algo "MIXED_PRECISION", group_size 16 and quantized_layers naming only the routed
//    experts of the target layers;
//  - diffbot EXL3: {quant_method "exl3", bits, codebook, mtp_experts "source",
//    non_routed_quantization {the official fp8 block}}.
// Anything else that claims a quantization we do not run (ModelOpt exports that quantize every
// linear, mixed-K EXL3, NVFP4 outside the routed experts, other group sizes) is refused here rather
// than misread later.
#include "model/quant_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace ds41rt::model {

using json = nlohmann::json;

const char *expert_quant_name(expert_quant q) {
    switch (q) {
    case expert_quant::OFFICIAL: return "official";
    case expert_quant::NVFP4:    return "nvfp4";
    case expert_quant::EXL3:     return "exl3";
    }
    return "?";
}

const char *exl3_codebook_name(exl3_codebook cb) {
    switch (cb) {
    case exl3_codebook::INST3: return "3inst";
    case exl3_codebook::MCG:   return "mcg";
    case exl3_codebook::MUL1:  return "mul1";
    }
    return "?";
}

namespace {

Status bad(const std::string &path, const std::string &why) { return Status::invalid_argument(path + ": " + why); }

// An optional string field; a present non-string is an error.
Status opt_string(const json &o, const std::string &prefix, const char *key, std::string *out) {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return Status::ok();
    if (!it->is_string()) return bad(prefix + key, "expected a string, got " + it->dump());
    *out = it->get<std::string>();
    return Status::ok();
}

Status block_size(const json &o, const std::string &prefix, model_config &c) {
    auto it = o.find("weight_block_size");
    if (it == o.end() || it->is_null()) return Status::ok();
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() || !(*it)[1].is_number_integer())
        return bad(prefix + "weight_block_size", "expected [out, in], got " + it->dump());
    c.fp8_block_out = (*it)[0].get<int>();
    c.fp8_block_in = (*it)[1].get<int>();
    return Status::ok();
}

// The official block: quant_method fp8 (or absent / empty: plain bf16), expert_dtype, block grid.
Status parse_official(const json &q, const std::string &prefix, model_config &c) {
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "quant_method", &c.quant_method));
    if (!c.quant_method.empty() && c.quant_method != "fp8" && c.quant_method != "deepseek_v4_fp8")
        return bad(prefix + "quant_method", "unsupported '" + c.quant_method +
                                                "' (supported: fp8 official / ModelOpt NVFP4 experts, exl3)");
    if (c.quant_method == "deepseek_v4_fp8") c.quant_method = "fp8";
    // The reference ModelArgs of both lines default expert_dtype to fp4 with fp8 weights (V4's
    // official config.json does not spell it out).
    c.expert_dtype = c.quant_method == "fp8" ? "fp4" : "";
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "expert_dtype", &c.expert_dtype));
    return block_size(q, prefix, c);
}

// One NVFP4 quantization descriptor ({quant_algo, group_size} or a config_groups weights block).
Status require_group16(const json &o, const std::string &path) {
    auto g = o.find("group_size");
    if (g != o.end() && !g->is_null() && (!g->is_number_integer() || g->get<int64_t>() != 16))
        return bad(path + "group_size", "NVFP4 needs 16 (one E4M3 scale per 16 inputs), got " + g->dump());
    return Status::ok();
}

// "layers.N.ffn.experts" with 0 <= N < n_layers: the only prefixes NVFP4 may quantize here.
bool is_routed_prefix(const std::string &k, int n_layers) {
    const std::string head = "layers.", tail = ".ffn.experts";
    if (k.size() <= head.size() + tail.size() || k.compare(0, head.size(), head) != 0 ||
        k.compare(k.size() - tail.size(), tail.size(), tail) != 0)
        return false;
    std::string num = k.substr(head.size(), k.size() - head.size() - tail.size());
    if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos) return false;
    return std::stoi(num) < n_layers;
}

Status parse_nvfp4(const json &q, const std::string &prefix, model_config &c) {
    DS41RT_RETURN_IF_ERROR(parse_official(q, prefix, c));
    if (c.quant_method != "fp8")
        return bad(prefix + "quant_method", "NVFP4 routed experts come with the official fp8 backbone, got '" +
                                                c.quant_method + "'");
    if (c.expert_dtype != "fp4") return bad(prefix + "expert_dtype", "NVFP4 experts need 'fp4', got '" + c.expert_dtype + "'");
    std::string algo;
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "quant_algo", &algo));
    if (!algo.empty() && algo != "MIXED_PRECISION" && algo != "NVFP4")
        return bad(prefix + "quant_algo", "expected MIXED_PRECISION (NVFP4 routed experts), got '" + algo + "'");
    DS41RT_RETURN_IF_ERROR(require_group16(q, prefix));
    auto layers = q.find("quantized_layers");
    if (layers != q.end() && !layers->is_null()) {
        if (!layers->is_object()) return bad(prefix + "quantized_layers", "expected an object, got " + layers->dump());
        for (auto it = layers->begin(); it != layers->end(); ++it) {
            const std::string p = prefix + "quantized_layers." + it.key() + ".";
            if (!is_routed_prefix(it.key(), c.n_layers))
                return bad(prefix + "quantized_layers." + it.key(),
                           "only the routed experts of the target layers (layers.N.ffn.experts) may be quantized");
            if (!it->is_object()) return bad(p.substr(0, p.size() - 1), "expected an object");
            std::string a;
            DS41RT_RETURN_IF_ERROR(opt_string(*it, p, "quant_algo", &a));
            if (a != "NVFP4") return bad(p + "quant_algo", "expected NVFP4, got '" + a + "'");
            DS41RT_RETURN_IF_ERROR(require_group16(*it, p));
        }
    }
    auto groups = q.find("config_groups");
    if (groups != q.end() && groups->is_object()) {
        for (auto it = groups->begin(); it != groups->end(); ++it) {
            for (const char *part : {"weights", "input_activations"}) {
                const std::string p = prefix + "config_groups." + it.key() + "." + part + ".";
                auto w = it->find(part);
                if (w == it->end() || !w->is_object()) continue;
                auto nb = w->find("num_bits");
                if (nb != w->end() && (!nb->is_number_integer() || nb->get<int>() != 4))
                    return bad(p + "num_bits", "NVFP4 needs 4, got " + nb->dump());
                DS41RT_RETURN_IF_ERROR(require_group16(*w, p));
            }
        }
    }
    c.routed_quant = expert_quant::NVFP4;
    return Status::ok();
}

Status parse_exl3(const json &q, const std::string &prefix, model_config &c) {
    // ds41rt's strict parser accepts exactly these keys (spec quant-formats 2.2); anything else may
    // change the meaning of the tensors, so it is refused rather than ignored.
    static const char *known[] = {"quant_method", "bits", "codebook", "mtp_experts", "mtp_experts_start_layer",
                                  "weight_block_size", "non_routed_quantization", "out_scales", "group_size",
                                  "desc_act", "pack_dtype"};
    for (auto it = q.begin(); it != q.end(); ++it) {
        bool ok = false;
        for (const char *k : known) ok = ok || it.key() == k;
        if (!ok)
            return bad(prefix + it.key(), "unknown key for a routed-expert EXL3 publication (upstream exllamav3 "
                                          "checkpoints with tensor_storage / mixed K are not supported)");
    }
    auto bits = q.find("bits");
    if (bits == q.end() || !bits->is_number()) return bad(prefix + "bits", "required: the uniform trellis K (1..8)");
    const double b = bits->get<double>();
    if (b != std::floor(b) || b < 1 || b > 8)
        return bad(prefix + "bits", "expected a whole K in 1..8 (mixed-K EXL3 is not supported), got " + bits->dump());
    c.exl3_bits = int(b);
    std::string cb;
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "codebook", &cb));
    if (cb == "mcg") c.exl3_cb = exl3_codebook::MCG;
    else if (cb == "mul1") c.exl3_cb = exl3_codebook::MUL1;
    else if (cb == "3inst") c.exl3_cb = exl3_codebook::INST3;
    else return bad(prefix + "codebook", "expected mcg, mul1 or 3inst, got '" + cb + "'");
    std::string mtp = "source";
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "mtp_experts", &mtp));
    if (mtp != "source")
        return bad(prefix + "mtp_experts", "only 'source' (MTP / DSpark experts in the official MXFP4) is supported, got '" +
                                               mtp + "'");
    auto start = q.find("mtp_experts_start_layer");
    if (start != q.end() && !start->is_null() && (!start->is_number_integer() || start->get<int>() != c.n_layers))
        return bad(prefix + "mtp_experts_start_layer",
                   "must equal num_hidden_layers (" + std::to_string(c.n_layers) + "), got " + start->dump());
    auto nr = q.find("non_routed_quantization");
    if (nr == q.end() || !nr->is_object())
        return bad(prefix + "non_routed_quantization", "required: the storage of everything but the routed experts");
    DS41RT_RETURN_IF_ERROR(parse_official(*nr, prefix + "non_routed_quantization.", c));
    if (c.quant_method != "fp8")
        return bad(prefix + "non_routed_quantization.quant_method", "expected deepseek_v4_fp8 (the official backbone)");
    DS41RT_RETURN_IF_ERROR(block_size(*nr, prefix + "non_routed_quantization.", c));
    c.routed_quant = expert_quant::EXL3;
    return Status::ok();
}

}  // namespace

Status parse_quantization_config(const json &q, const std::string &prefix, model_config &c) {
    c.routed_quant = expert_quant::OFFICIAL;
    std::string method;
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "quant_method", &method));
    if (method == "exl3") return parse_exl3(q, prefix, c);
    if (method == "modelopt")
        return bad(prefix + "quant_method", "a ModelOpt export quantizing every linear is not supported; only the "
                                            "routed-expert NVFP4 publication (quant_method fp8, moe_quant_algo NVFP4)");
    std::string moe;
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "moe_quant_algo", &moe));
    if (!moe.empty()) {
        if (moe != "NVFP4") return bad(prefix + "moe_quant_algo", "only NVFP4 is supported, got '" + moe + "'");
        return parse_nvfp4(q, prefix, c);
    }
    std::string algo;
    DS41RT_RETURN_IF_ERROR(opt_string(q, prefix, "quant_algo", &algo));
    if (!algo.empty())
        return bad(prefix + "quant_algo", "'" + algo + "' without moe_quant_algo: not a publication we can read");
    return parse_official(q, prefix, c);
}

Status check_hf_quant_config(const std::string &json_text, const model_config &c) {
    json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::invalid_argument("hf_quant_config.json: not a JSON object");
    auto prod = j.find("producer");
    if (prod != j.end() && prod->is_object()) {
        auto name = prod->find("name");
        if (name != prod->end() && (!name->is_string() || name->get<std::string>() != "modelopt"))
            return bad("hf_quant_config.json: producer.name", "expected modelopt, got " + name->dump());
    }
    auto qz = j.find("quantization");
    if (qz == j.end() || !qz->is_object()) return bad("hf_quant_config.json: quantization", "required object is missing");
    std::string algo;
    DS41RT_RETURN_IF_ERROR(opt_string(*qz, "hf_quant_config.json: quantization.", "quant_algo", &algo));
    if (algo != "NVFP4" && algo != "MIXED_PRECISION")
        return bad("hf_quant_config.json: quantization.quant_algo", "expected NVFP4 or MIXED_PRECISION, got '" + algo + "'");
    if (c.routed_quant != expert_quant::NVFP4)
        return bad("hf_quant_config.json: quantization.quant_algo",
                   "says " + algo + " but config.json quantization_config has no moe_quant_algo NVFP4 (found " +
                       expert_quant_name(c.routed_quant) + " experts)");
    DS41RT_RETURN_IF_ERROR(require_group16(*qz, "hf_quant_config.json: quantization."));
    auto kv = qz->find("kv_cache_quant_algo");
    if (kv != qz->end() && !kv->is_null())
        return bad("hf_quant_config.json: quantization.kv_cache_quant_algo",
                   "a quantized KV cache is not part of these publications, got " + kv->dump());
    return Status::ok();
}

}  // namespace ds41rt::model
