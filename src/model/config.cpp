// config.json -> model_config, and the invariants the engine relies on.
//
// Three spellings reach us: the official V4.1 file (model_type deepseek_v41, text keys nested
// under text_config, quantization_config at the root), a flat V4.1 text config
// (deepseek_v41_text), and the flat V4 file (deepseek_v4). transformers 5.x re-saves configs
// with a few keys renamed (rope_parameters {main, compress}, layer_types / mlp_layer_types,
// partial_rotary_factor); those are accepted as fallbacks so a tiny model saved by transformers
// parses to the same struct as the official file. Every error names the key as a JSON path.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/quant_config.h"

namespace ds41rt::model {

using json = nlohmann::json;

const char *arch_name(arch a) { return a == arch::V4 ? "deepseek_v4" : "deepseek_v41"; }

// ---- helpers ------------------------------------------------------------------------------------

namespace {

bool contains(const std::vector<int> &v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The latest element of a sorted-or-not list that is <= layer, -1 if none.
int latest_at_or_before(const std::vector<int> &v, int layer) {
    int best = -1;
    for (int x : v)
        if (x <= layer && x > best) best = x;
    return best;
}

}  // namespace

bool model_config::is_kv_source(int layer) const {
    if (model_arch == arch::V4)
        return layer >= 0 && size_t(layer) < compress_ratios.size() && compress_ratios[size_t(layer)] > 0;
    return contains(kv_source_layers, layer);
}

bool model_config::is_index_source(int layer) const {
    if (model_arch == arch::V4)
        return layer >= 0 && size_t(layer) < compress_ratios.size() && compress_ratios[size_t(layer)] == 4;
    return contains(index_source_layers, layer);
}

bool model_config::has_engram(int layer) const { return contains(engram_layer_ids, layer); }

int model_config::kv_source_for(int layer) const {
    if (model_arch == arch::V4) return is_kv_source(layer) ? layer : -1;
    return latest_at_or_before(kv_source_layers, layer);
}

int model_config::index_source_for(int layer) const {
    if (model_arch == arch::V4) return is_index_source(layer) ? layer : -1;
    return latest_at_or_before(index_source_layers, layer);
}

// ---- field reader -------------------------------------------------------------------------------

namespace {

// Reads typed fields of one JSON object and keeps the first error, so the parser below reads as
// a table of key -> field lines followed by a single check. JSON null counts as absent (transformers
// writes null for unset optional ids).
class field_reader {
public:
    field_reader(const json &obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

    const Status &status() const { return st_; }
    bool ok() const { return st_.is_ok(); }
    std::string path(const std::string &key) const { return prefix_ + key; }
    void fail(Status s) {
        if (st_.is_ok()) st_ = std::move(s);
    }

    const json *find(const std::string &key) const {
        if (!obj_.is_object()) return nullptr;
        auto it = obj_.find(key);
        if (it == obj_.end() || it->is_null()) return nullptr;
        return &*it;
    }
    bool has(const std::string &key) const { return find(key) != nullptr; }

    // Required fields: absence is an error naming the key.
    int64_t i64(const std::string &key) { return i64_or(key, 0, true); }
    int i32(const std::string &key) { return int(i32_or(key, 0, true)); }
    double f64(const std::string &key) { return f64_or(key, 0, true); }
    std::vector<int> ints(const std::string &key) { return ints_or(key, {}, true); }

    int64_t i64_or(const std::string &key, int64_t dflt, bool required = false) {
        const json *v = find(key);
        if (!v) return missing(key, dflt, required);
        if (!v->is_number_integer()) return wrong(key, "an integer", *v, dflt);
        return v->get<int64_t>();
    }
    int i32_or(const std::string &key, int dflt, bool required = false) {
        int64_t v = i64_or(key, dflt, required);
        if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
            fail(Status::invalid_argument(path(key) + ": " + std::to_string(v) + " does not fit in int32"));
            return dflt;
        }
        return int(v);
    }
    double f64_or(const std::string &key, double dflt, bool required = false) {
        const json *v = find(key);
        if (!v) return missing(key, dflt, required);
        if (!v->is_number()) return wrong(key, "a number", *v, dflt);
        return v->get<double>();
    }
    bool boolean_or(const std::string &key, bool dflt) {
        const json *v = find(key);
        if (!v) return dflt;
        if (!v->is_boolean()) return wrong(key, "a boolean", *v, dflt);
        return v->get<bool>();
    }
    std::string str_or(const std::string &key, std::string dflt, bool required = false) {
        const json *v = find(key);
        if (!v) return missing(key, dflt, required);
        if (!v->is_string()) return wrong(key, "a string", *v, dflt);
        return v->get<std::string>();
    }
    std::vector<int64_t> i64s_or(const std::string &key, std::vector<int64_t> dflt, bool required = false) {
        const json *v = find(key);
        if (!v) return missing(key, dflt, required);
        if (!v->is_array()) return wrong(key, "a list of integers", *v, dflt);
        std::vector<int64_t> r;
        for (size_t i = 0; i < v->size(); i++) {
            const json &e = (*v)[i];
            if (!e.is_number_integer()) {
                fail(Status::invalid_argument(path(key) + "[" + std::to_string(i) + "]: expected an integer, got " +
                                              e.dump()));
                return dflt;
            }
            r.push_back(e.get<int64_t>());
        }
        return r;
    }
    std::vector<int> ints_or(const std::string &key, std::vector<int> dflt, bool required = false) {
        std::vector<int64_t> dflt64(dflt.begin(), dflt.end());
        std::vector<int64_t> v = i64s_or(key, dflt64, required);
        std::vector<int> r;
        for (int64_t x : v) {
            if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
                fail(Status::invalid_argument(path(key) + ": " + std::to_string(x) + " does not fit in int32"));
                return dflt;
            }
            r.push_back(int(x));
        }
        return r;
    }
    // An optional nested object; a present non-object is a type error.
    const json *object(const std::string &key) {
        const json *v = find(key);
        if (v && !v->is_object()) {
            wrong(key, "an object", *v, 0);
            return nullptr;
        }
        return v;
    }

private:
    template <typename T>
    T missing(const std::string &key, T dflt, bool required) {
        if (required) fail(Status::invalid_argument(path(key) + ": required key is missing"));
        return dflt;
    }
    template <typename T>
    T wrong(const std::string &key, const char *want, const json &got, T dflt) {
        std::string shown = got.dump();
        if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
        fail(Status::invalid_argument(path(key) + ": expected " + want + ", got " + std::string(got.type_name()) +
                                      " " + shown));
        return dflt;
    }

    const json &obj_;
    std::string prefix_;
    Status st_;
};

// rope_scaling (the released spelling) or rope_parameters (transformers 5.x: either flat, or
// {main: {...}, compress: {...}} keyed by rope type). YaRN only ever applies to the compressed
// layers, so "compress" is where its parameters live in the nested form.
Status parse_rope(field_reader &r, model_config &c) {
    c.rope_theta          = float(r.f64_or("rope_theta", 10000.0));
    c.compress_rope_theta = float(r.f64_or("compress_rope_theta", 160000.0));
    const json *scaling = r.object("rope_scaling");
    const json *params  = r.object("rope_parameters");
    DS41RT_RETURN_IF_ERROR(r.status());

    const json *yarn = nullptr;
    std::string yarn_key;
    if (scaling) {
        yarn = scaling;
        yarn_key = "rope_scaling";
    }
    if (params) {
        auto main_it = params->find("main");
        auto comp_it = params->find("compress");
        bool nested = main_it != params->end() && comp_it != params->end();
        if (nested) {
            if (!main_it->is_object() || !comp_it->is_object())
                return Status::invalid_argument(r.path("rope_parameters") +
                                                ": expected objects under 'main' and 'compress'");
            field_reader m(*main_it, r.path("rope_parameters.main."));
            field_reader k(*comp_it, r.path("rope_parameters.compress."));
            c.rope_theta          = float(m.f64_or("rope_theta", c.rope_theta));
            c.compress_rope_theta = float(k.f64_or("rope_theta", c.compress_rope_theta));
            DS41RT_RETURN_IF_ERROR(m.status());
            DS41RT_RETURN_IF_ERROR(k.status());
            if (!yarn) {
                yarn = &*comp_it;
                yarn_key = "rope_parameters.compress";
            }
        } else if (!yarn) {
            yarn = params;
            yarn_key = "rope_parameters";
        }
    }
    c.rope_factor = 1;
    c.original_seq_len = 0;
    if (!yarn) return Status::ok();

    field_reader y(*yarn, r.path(yarn_key + "."));
    std::string type = y.str_or("rope_type", "");
    if (type.empty()) type = y.str_or("type", "default");
    DS41RT_RETURN_IF_ERROR(y.status());
    if (type == "default") return Status::ok();
    if (type != "yarn")
        return Status::invalid_argument(y.path("rope_type") + ": unsupported '" + type + "' (expected yarn or default)");
    c.rope_factor      = float(y.f64("factor"));
    c.original_seq_len = y.i64("original_max_position_embeddings");
    c.beta_fast        = float(y.f64_or("beta_fast", 32.0));
    c.beta_slow        = float(y.f64_or("beta_slow", 1.0));
    return y.status();
}

// compress_ratios, or (transformers 5.x V4) layer_types + compress_rates. The MTP / DSpark entries
// are always 0; a list of n_layers entries gets them appended, as transformers normalizes it.
Status parse_ratios(field_reader &r, model_config &c) {
    if (r.has("compress_ratios")) {
        c.compress_ratios = r.ints("compress_ratios");
    } else if (c.model_arch == arch::V4 && r.has("layer_types")) {
        const json &types = *r.find("layer_types");
        if (!types.is_array()) return Status::invalid_argument(r.path("layer_types") + ": expected a list of strings");
        int csa = 4, hca = 128;
        if (const json *rates = r.object("compress_rates")) {
            field_reader rr(*rates, r.path("compress_rates."));
            csa = rr.i32_or("compressed_sparse_attention", 4);
            hca = rr.i32_or("heavily_compressed_attention", 128);
            DS41RT_RETURN_IF_ERROR(rr.status());
        }
        for (size_t i = 0; i < types.size(); i++) {
            std::string t = types[i].is_string() ? types[i].get<std::string>() : "";
            if (t == "sliding_attention")                  c.compress_ratios.push_back(0);
            else if (t == "compressed_sparse_attention")   c.compress_ratios.push_back(csa);
            else if (t == "heavily_compressed_attention")  c.compress_ratios.push_back(hca);
            else
                return Status::invalid_argument(r.path("layer_types") + "[" + std::to_string(i) + "]: unknown " +
                                                types[i].dump());
        }
    } else {
        return Status::invalid_argument(r.path("compress_ratios") + ": required key is missing");
    }
    DS41RT_RETURN_IF_ERROR(r.status());
    if (int(c.compress_ratios.size()) == c.n_layers)
        c.compress_ratios.resize(size_t(c.n_layers + c.n_mtp_layers), 0);
    return Status::ok();
}

// num_hash_layers, or (transformers 5.x) the count of leading "hash_moe" in mlp_layer_types.
Status parse_hash_layers(field_reader &r, model_config &c) {
    if (r.has("num_hash_layers") || c.model_arch == arch::V41) {
        c.n_hash_layers = r.i32_or("num_hash_layers", 0);
        return r.status();
    }
    if (const json *types = r.find("mlp_layer_types")) {
        if (!types->is_array()) return Status::invalid_argument(r.path("mlp_layer_types") + ": expected a list");
        int n = 0;
        while (size_t(n) < types->size() && (*types)[size_t(n)] == "hash_moe") n++;
        c.n_hash_layers = n;
        return Status::ok();
    }
    return Status::invalid_argument(r.path("num_hash_layers") + ": required key is missing");
}

// A token id that may be null, an int, or (eos) a list whose first entry counts.
int token_id(field_reader &r, const std::string &key, int dflt) {
    const json *v = r.find(key);
    if (v && v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int>();
    return r.i32_or(key, dflt);
}

}  // namespace

// ---- parse --------------------------------------------------------------------------------------

Result<model_config> parse_config(const std::string &json_text) {
    json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) return Status::invalid_argument("config.json: not valid JSON");
    if (!root.is_object()) return Status::invalid_argument("config.json: top level is not an object");

    field_reader rr(root, "");
    std::string type = rr.str_or("model_type", "", true);
    DS41RT_RETURN_IF_ERROR(rr.status());

    model_config c;
    const json *text = &root;
    std::string prefix;
    if (type == "deepseek_v41") {
        c.model_arch = arch::V41;
        text = rr.object("text_config");
        DS41RT_RETURN_IF_ERROR(rr.status());
        if (!text) return Status::invalid_argument("text_config: required key is missing");
        prefix = "text_config.";
    } else if (type == "deepseek_v41_text") {
        c.model_arch = arch::V41;
    } else if (type == "deepseek_v4") {
        c.model_arch = arch::V4;
    } else {
        return Status::invalid_argument("model_type: unsupported '" + type +
                                        "' (expected deepseek_v41, deepseek_v41_text or deepseek_v4)");
    }
    const bool v41 = c.model_arch == arch::V41;
    field_reader r(*text, prefix);

    // ---- trunk (required: these size every tensor) ----
    c.vocab_size      = r.i64("vocab_size");
    c.dim             = r.i64("hidden_size");
    c.n_layers        = r.i32("num_hidden_layers");
    c.n_mtp_layers    = r.i32("num_nextn_predict_layers");
    c.n_heads         = r.i32("num_attention_heads");
    c.head_dim        = r.i32("head_dim");
    c.q_lora_rank     = r.i32("q_lora_rank");
    c.o_groups        = r.i32("o_groups");
    c.o_lora_rank     = r.i32("o_lora_rank");
    c.window          = r.i32("sliding_window");
    c.norm_eps        = float(r.f64("rms_norm_eps"));
    c.max_position_embeddings = r.i64_or("max_position_embeddings", 0);
    DS41RT_RETURN_IF_ERROR(r.status());
    int kv_heads = r.i32_or("num_key_value_heads", 1);
    if (kv_heads != 1)
        return Status::invalid_argument(r.path("num_key_value_heads") + ": must be 1 (shared-KV MQA), got " +
                                        std::to_string(kv_heads));
    if (r.has("qk_rope_head_dim")) {
        c.rope_head_dim = r.i32("qk_rope_head_dim");
    } else if (r.has("partial_rotary_factor")) {
        double f = r.f64("partial_rotary_factor") * c.head_dim;
        if (f != std::floor(f))
            return Status::invalid_argument(r.path("partial_rotary_factor") + ": times head_dim is not an integer");
        c.rope_head_dim = int(f);
    } else {
        return Status::invalid_argument(r.path("qk_rope_head_dim") + ": required key is missing");
    }
    DS41RT_RETURN_IF_ERROR(parse_rope(r, c));

    // ---- compression / indexer ----
    DS41RT_RETURN_IF_ERROR(parse_ratios(r, c));
    c.index_n_heads  = r.i32("index_n_heads");
    c.index_head_dim = r.i32("index_head_dim");
    c.index_topk     = r.i32("index_topk");
    if (v41) {
        c.kv_source_layers      = r.ints("kv_source_layer_ids");
        c.index_source_layers   = r.ints("index_source_layer_ids");
        // Absent or null: the last KV source (transformers' default); negative disables level one.
        int dflt_cand = c.kv_source_layers.empty() ? -1 : c.kv_source_layers.back();
        c.candidate_source_layer = r.i32_or("candidate_source_layer_id", dflt_cand);
        if (c.candidate_source_layer < 0) c.candidate_source_layer = -1;
        c.candidate_topk_blocks = r.i32_or("candidate_topk_blocks", 2048);
        c.candidate_block_size  = r.i32_or("candidate_block_size", 8);
    }
    DS41RT_RETURN_IF_ERROR(r.status());

    // ---- MoE ----
    c.n_routed_experts    = r.i32("n_routed_experts");
    c.n_activated_experts = r.i32("num_experts_per_tok");
    c.moe_inter_dim       = r.i32("moe_intermediate_size");
    c.n_shared_experts    = r.i32_or("n_shared_experts", 1);
    c.route_scale         = float(r.f64_or("routed_scaling_factor", 1.5));
    c.swiglu_limit        = float(r.f64_or("swiglu_limit", 0.0));
    c.norm_topk_prob      = r.boolean_or("norm_topk_prob", true);
    c.gate_temp           = float(r.f64_or("gate_temp", 1.0));
    std::string scoring   = r.str_or("scoring_func", "sqrtsoftplus");
    DS41RT_RETURN_IF_ERROR(r.status());
    if (scoring != "sqrtsoftplus")
        return Status::invalid_argument(r.path("scoring_func") + ": unsupported '" + scoring +
                                        "' (DeepSeek V4 / V4.1 route with sqrtsoftplus)");
    DS41RT_RETURN_IF_ERROR(parse_hash_layers(r, c));

    // ---- mHC ----
    c.hc_mult           = r.i32_or("hc_mult", 4);
    c.hc_sinkhorn_iters = r.i32_or("hc_sinkhorn_iters", 20);
    c.hc_eps            = float(r.f64_or("hc_eps", 1e-6));

    // ---- Engram: optional as a whole; once layers are listed, the table geometry is required ----
    c.engram_layer_ids = r.ints_or("engram_layer_ids", {});
    if (!c.engram_layer_ids.empty()) {
        c.engram_num_embeddings        = r.i64s_or("engram_num_embeddings", {}, true);
        c.engram_max_ngram             = r.i32("engram_max_ngram_size");
        c.engram_n_heads               = r.i32("engram_n_heads");
        c.engram_head_dim              = r.i32("engram_head_dim");
        c.engram_vocab_size            = r.i64("engram_vocab_size");
        c.engram_pad_id                = r.i32_or("engram_pad_id", 2);
        c.engram_compressed_vocab_size = r.i64("engram_compressed_vocab_size");
    }
    DS41RT_RETURN_IF_ERROR(r.status());

    // ---- DSpark: required for V4.1 when draft stages exist; optional for V4 (0731 variant) ----
    bool dspark_required = v41 && c.n_mtp_layers > 0;
    if (dspark_required || r.has("dspark_block_size")) {
        c.dspark_block_size          = r.i32("dspark_block_size");
        c.dspark_noise_token_id      = r.i32("dspark_noise_token_id");
        c.dspark_target_layers       = r.ints("dspark_target_layer_ids");
        c.dspark_markov_rank         = r.i32("dspark_markov_rank");
        c.dspark_n_routed_experts    = r.i32_or("dspark_n_routed_experts", c.n_routed_experts, v41);
        c.dspark_n_activated_experts = r.i32_or("dspark_num_experts_per_tok", c.n_activated_experts, v41);
    }
    DS41RT_RETURN_IF_ERROR(r.status());

    // ---- storage: quantization_config sits at the root for V4.1 (and V4); a flat text config may
    // carry it too. No quantization_config means plain bf16 weights. ----
    const json *quant = rr.object("quantization_config");
    std::string qprefix = "quantization_config.";
    if (!quant && text != &root) {
        quant = r.object("quantization_config");
        qprefix = prefix + qprefix;
    }
    DS41RT_RETURN_IF_ERROR(rr.status());
    DS41RT_RETURN_IF_ERROR(r.status());
    if (quant) DS41RT_RETURN_IF_ERROR(parse_quantization_config(*quant, qprefix, c));

    // ---- tokens: the root wins over text_config (the official V4.1 file keeps them at the root) ----
    c.bos_token_id = token_id(r, "bos_token_id", 0);
    c.eos_token_id = token_id(r, "eos_token_id", 1);
    c.pad_token_id = token_id(r, "pad_token_id", 2);
    if (text != &root) {
        c.bos_token_id = token_id(rr, "bos_token_id", c.bos_token_id);
        c.eos_token_id = token_id(rr, "eos_token_id", c.eos_token_id);
        c.pad_token_id = token_id(rr, "pad_token_id", c.pad_token_id);
    }
    c.image_token_id = token_id(rr, "image_token_id", -1);
    DS41RT_RETURN_IF_ERROR(r.status());
    DS41RT_RETURN_IF_ERROR(rr.status());

    // ---- vision tower (V4.1 root vision_config) ----
    if (const json *vision = rr.object("vision_config")) {
        field_reader v(*vision, "vision_config.");
        c.vision_n_layers         = v.i32("num_hidden_layers");
        c.vision_dim              = v.i32("hidden_size");
        c.vision_n_heads          = v.i32("num_attention_heads");
        c.vision_inter_dim        = v.i32("intermediate_size");
        c.vision_patch_size       = v.i32("patch_size");
        c.vision_downsample_ratio = v.i32("downsample_ratio");
        DS41RT_RETURN_IF_ERROR(v.status());
    }
    DS41RT_RETURN_IF_ERROR(rr.status());
    return c;
}

Result<model_config> load_config(const std::string &dir) {
    std::string path = dir + "/config.json";
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::not_found(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    if (f.bad()) return Status::io_error(path + ": read failed");
    Result<model_config> c = parse_config(ss.str());
    if (!c) return Status(c.status().code(), path + ": " + c.status().message());
    // ModelOpt's legacy file: vLLM reads it first, so a disagreement with config.json would make
    // two engines read two different models out of one directory. Refuse it.
    std::ifstream h(dir + "/hf_quant_config.json", std::ios::binary);
    if (h) {
        std::stringstream hs;
        hs << h.rdbuf();
        Status st = check_hf_quant_config(hs.str(), c.value());
        if (!st) return Status(st.code(), dir + "/" + st.message());
    }
    return c;
}

// ---- validate -----------------------------------------------------------------------------------

namespace {

std::string list_str(const std::vector<int> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

// Collects the first broken rule; each rule is one line below, named by its key.
struct rule_checker {
    Status st;
    void require(bool ok, const std::string &msg) {
        if (!ok && st.is_ok()) st = Status::invalid_argument(msg);
    }
    void positive(int64_t v, const char *key) {
        require(v > 0, std::string(key) + ": must be > 0, got " + std::to_string(v));
    }
    void multiple(int64_t v, int64_t m, const std::string &what, const char *why) {
        require(m > 0 && v % m == 0, what + " = " + std::to_string(v) + " must be a multiple of " +
                                         std::to_string(m) + " (" + why + ")");
    }
    // Layer-id list: in [0, n), strictly increasing.
    void layer_list(const std::vector<int> &v, int n, const char *key) {
        for (size_t i = 0; i < v.size(); i++) {
            require(v[i] >= 0 && v[i] < n, std::string(key) + ": layer " + std::to_string(v[i]) +
                                               " out of range [0, " + std::to_string(n) + ")");
            require(i == 0 || v[i] > v[i - 1], std::string(key) + ": must be strictly increasing, got " + list_str(v));
        }
    }
};

void validate_common(const model_config &c, rule_checker &k) {
    k.positive(c.vocab_size, "vocab_size");
    k.positive(c.dim, "hidden_size");
    k.positive(c.n_layers, "num_hidden_layers");
    k.require(c.n_mtp_layers >= 0, "num_nextn_predict_layers: must be >= 0");
    k.positive(c.n_heads, "num_attention_heads");
    k.positive(c.head_dim, "head_dim");
    k.positive(c.rope_head_dim, "qk_rope_head_dim");
    k.positive(c.q_lora_rank, "q_lora_rank");
    k.positive(c.o_groups, "o_groups");
    k.positive(c.o_lora_rank, "o_lora_rank");
    k.positive(c.window, "sliding_window");
    k.positive(c.index_n_heads, "index_n_heads");
    k.positive(c.index_head_dim, "index_head_dim");
    k.positive(c.index_topk, "index_topk");
    k.positive(c.n_routed_experts, "n_routed_experts");
    k.positive(c.n_activated_experts, "num_experts_per_tok");
    k.positive(c.moe_inter_dim, "moe_intermediate_size");
    k.positive(c.fp8_block_out, "quantization_config.weight_block_size[0]");
    k.positive(c.fp8_block_in, "quantization_config.weight_block_size[1]");
    k.require(c.norm_eps > 0, "rms_norm_eps: must be > 0");
    k.require(c.n_shared_experts >= 0, "n_shared_experts: must be >= 0");
    k.require(c.n_activated_experts <= c.n_routed_experts,
              "num_experts_per_tok: " + std::to_string(c.n_activated_experts) + " exceeds n_routed_experts " +
                  std::to_string(c.n_routed_experts));
    k.require(c.hc_mult > 0 && (c.hc_mult & (c.hc_mult - 1)) == 0,
              "hc_mult: must be a power of two, got " + std::to_string(c.hc_mult));
    k.positive(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
    if (!k.st.is_ok()) return;

    k.require(c.n_heads % c.o_groups == 0, "o_groups: num_attention_heads " + std::to_string(c.n_heads) +
                                               " is not divisible by o_groups " + std::to_string(c.o_groups));
    k.require(c.rope_head_dim % 2 == 0, "qk_rope_head_dim: must be even (rotated as pairs), got " +
                                            std::to_string(c.rope_head_dim));
    k.require(c.rope_head_dim < c.head_dim, "qk_rope_head_dim: " + std::to_string(c.rope_head_dim) +
                                                " must be < head_dim " + std::to_string(c.head_dim));
    k.require(c.index_head_dim > c.rope_head_dim,
              "index_head_dim: " + std::to_string(c.index_head_dim) + " must be > qk_rope_head_dim " +
                  std::to_string(c.rope_head_dim) + " (the indexer rotates its last rope dims)");
    k.require(c.compress_ratios.size() == size_t(c.n_layers + c.n_mtp_layers),
              "compress_ratios: has " + std::to_string(c.compress_ratios.size()) +
                  " entries, expected num_hidden_layers + num_nextn_predict_layers = " +
                  std::to_string(c.n_layers + c.n_mtp_layers));
    if (!k.st.is_ok()) return;
    for (int i = c.n_layers; i < c.n_layers + c.n_mtp_layers; i++)
        k.require(c.ratio(i) == 0, "compress_ratios[" + std::to_string(i) +
                                       "]: MTP / DSpark layers are window-only (ratio 0), got " +
                                       std::to_string(c.ratio(i)));
    if (c.original_seq_len > 0)
        k.require(c.rope_factor >= 1, "rope_scaling.factor: must be >= 1 with YaRN");
    k.require(c.original_seq_len >= 0, "rope_scaling.original_max_position_embeddings: must be >= 0");
    if (c.expert_dtype == "fp4")
        k.require(c.dim % 32 == 0 && c.moe_inter_dim % 32 == 0,
                  "moe_intermediate_size / hidden_size: FP4 experts need in-dims that are multiples of 32 "
                  "(one e8m0 scale per 32)");
    if (c.routed_quant == expert_quant::NVFP4)
        k.require(c.dim % 32 == 0 && c.moe_inter_dim % 32 == 0,
                  "moe_intermediate_size / hidden_size: NVFP4 experts need multiples of 32 (16-input scale blocks, "
                  "two codes per byte, and the MTP experts stay MXFP4)");
    if (c.routed_quant == expert_quant::EXL3)
        k.require(c.dim % 128 == 0 && c.moe_inter_dim % 128 == 0,
                  "moe_intermediate_size / hidden_size: EXL3 experts need multiples of 128 (the Hadamard blocks)");
    auto token_ok = [&](int id, const char *key) {
        k.require(id >= 0 && id < c.vocab_size, std::string(key) + ": " + std::to_string(id) + " outside [0, vocab_size)");
    };
    token_ok(c.bos_token_id, "bos_token_id");
    token_ok(c.eos_token_id, "eos_token_id");
}

void validate_v4(const model_config &c, rule_checker &k) {
    for (int i = 0; i < c.n_layers; i++) {
        int r = c.ratio(i);
        k.require(r == 0 || r == 4 || r == 128, "compress_ratios[" + std::to_string(i) +
                                                    "]: V4 supports ratios 0, 4 and 128, got " + std::to_string(r));
    }
    k.multiple(c.nope_head_dim(), 64, "head_dim - qk_rope_head_dim", "V4 FP8 KV cache stores nope dims in 64-blocks");
    k.require(c.n_hash_layers >= 0 && c.n_hash_layers <= c.n_layers,
              "num_hash_layers: " + std::to_string(c.n_hash_layers) + " outside [0, num_hidden_layers]");
    k.require(c.kv_source_layers.empty() && c.index_source_layers.empty() && c.engram_layer_ids.empty(),
              "kv_source_layer_ids / index_source_layer_ids / engram_layer_ids: V4.1-only keys in a V4 config");
}

void validate_v41(const model_config &c, rule_checker &k) {
    const int n = c.n_layers;
    for (int i = 0; i < n; i++) {
        int r = c.ratio(i);
        k.require(r == 0 || r == 1 || r == 2, "compress_ratios[" + std::to_string(i) +
                                                  "]: V4.1 supports ratios 0, 1 and 2, got " + std::to_string(r));
    }
    // Spec V4.1 section 11.1: every FP8/FP4 input dim is a multiple of 32. The head widths are
    // not checked against the cache QAT blocks (32 window, 16 compressed, 32 indexer): like
    // transformers, the engine applies a cache QAT only where the width is a whole number of
    // blocks, and tiny test configs use other widths to check the architecture without QAT.
    k.multiple(c.head_dim, 8, "head_dim", "rows are processed in 8-channel units");
    k.multiple(c.index_head_dim, 8, "index_head_dim", "rows are processed in 8-channel units");
    k.multiple(c.dim, 32, "hidden_size", "FP8/FP4 weight input dim");
    k.multiple(c.q_lora_rank, 32, "q_lora_rank", "FP8 weight input dim");
    k.multiple(int64_t(c.o_groups) * c.o_lora_rank, 32, "o_groups * o_lora_rank", "FP8 weight input dim");
    k.multiple(c.moe_inter_dim, 32, "moe_intermediate_size", "FP8/FP4 weight input dim");
    k.require(c.n_hash_layers == 0, "num_hash_layers: V4.1 has no hash-routed layers");
    if (!k.st.is_ok()) return;

    // ---- cross-layer sharing (spec V4.1 section 2) ----
    k.layer_list(c.kv_source_layers, n, "kv_source_layer_ids");
    k.layer_list(c.index_source_layers, n, "index_source_layer_ids");
    if (!k.st.is_ok()) return;
    for (int s : c.kv_source_layers) {
        k.require(c.ratio(s) > 0, "kv_source_layer_ids: layer " + std::to_string(s) + " has compress ratio 0");
        k.require(c.is_index_source(s), "kv_source_layer_ids: layer " + std::to_string(s) +
                                            " is a KV source but not in index_source_layer_ids");
    }
    for (int s : c.index_source_layers) {
        k.require(c.ratio(s) > 0, "index_source_layer_ids: layer " + std::to_string(s) + " has compress ratio 0");
        k.require(c.kv_source_for(s) >= 0, "index_source_layer_ids: Reindex layer " + std::to_string(s) +
                                               " has no KV source before it");
    }
    for (int i = 0; i < n; i++) {
        if (c.ratio(i) == 0) continue;
        int src = c.kv_source_for(i);
        k.require(src >= 0, "kv_source_layer_ids: layer " + std::to_string(i) +
                                " has compress ratio > 0 but no KV source at or before it");
        if (src >= 0)
            k.require(c.ratio(src) == c.ratio(i), "compress_ratios[" + std::to_string(i) + "]: ratio " +
                                                      std::to_string(c.ratio(i)) + " differs from its KV source " +
                                                      std::to_string(src) + " (ratio " +
                                                      std::to_string(c.ratio(src)) + ")");
    }
    if (c.candidate_source_layer >= 0) {
        k.require(c.is_index_source(c.candidate_source_layer),
                  "candidate_source_layer_id: layer " + std::to_string(c.candidate_source_layer) +
                      " is not in index_source_layer_ids");
        k.positive(c.candidate_topk_blocks, "candidate_topk_blocks");
        k.positive(c.candidate_block_size, "candidate_block_size");
        k.require(int64_t(c.candidate_topk_blocks) * c.candidate_block_size >= c.index_topk,
                  "candidate_topk_blocks * candidate_block_size: must be >= index_topk " + std::to_string(c.index_topk));
    }
    if (!k.st.is_ok()) return;

    // ---- Engram ----
    if (!c.engram_layer_ids.empty()) {
        k.layer_list(c.engram_layer_ids, n, "engram_layer_ids");
        k.require(c.engram_num_embeddings.size() == c.engram_layer_ids.size(),
                  "engram_num_embeddings: has " + std::to_string(c.engram_num_embeddings.size()) +
                      " entries, engram_layer_ids has " + std::to_string(c.engram_layer_ids.size()));
        for (int64_t rows : c.engram_num_embeddings)
            k.require(rows > 0, "engram_num_embeddings: every table needs > 0 rows");
        k.require(c.engram_max_ngram >= 2, "engram_max_ngram_size: must be >= 2");
        k.positive(c.engram_n_heads, "engram_n_heads");
        k.positive(c.engram_head_dim, "engram_head_dim");
        k.positive(c.engram_vocab_size, "engram_vocab_size");
        k.positive(c.engram_compressed_vocab_size, "engram_compressed_vocab_size");
        if (k.st.is_ok()) k.multiple(c.engram_head_dim, 32, "engram_head_dim", "one e8m0 scale per 32 channels");
    }

    // ---- DSpark ----
    if (c.n_mtp_layers > 0) {
        k.positive(c.dspark_block_size, "dspark_block_size");
        k.require(c.dspark_block_size < c.window, "dspark_block_size: must be < sliding_window");
        k.require(c.dspark_noise_token_id >= 0 && c.dspark_noise_token_id < c.vocab_size,
                  "dspark_noise_token_id: outside [0, vocab_size)");
        k.require(!c.dspark_target_layers.empty(), "dspark_target_layer_ids: must not be empty");
        k.layer_list(c.dspark_target_layers, n, "dspark_target_layer_ids");
        k.positive(c.dspark_markov_rank, "dspark_markov_rank");
        k.positive(c.dspark_n_routed_experts, "dspark_n_routed_experts");
        k.positive(c.dspark_n_activated_experts, "dspark_num_experts_per_tok");
        k.require(c.dspark_n_activated_experts <= c.dspark_n_routed_experts,
                  "dspark_num_experts_per_tok: exceeds dspark_n_routed_experts");
    }
}

}  // namespace

Status validate(const model_config &c) {
    rule_checker k;
    validate_common(c, k);
    if (k.st.is_ok()) {
        if (c.model_arch == arch::V4)
            validate_v4(c, k);
        else
            validate_v41(c, k);
    }
    return k.st;
}

}  // namespace ds41rt::model
