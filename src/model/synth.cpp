// Synthetic V4.1 checkpoints (see synth.h): the config, the random values, and the quantizers
// that store them in the release's formats.
//
// Order of the file: the random streams, the config (written as JSON, then parsed back with
// parse_config so the checkpoint is generated from exactly what the engine will read), the
// initialization rule per tensor name, the storage quantizers, and the writer.
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/catalog.h"
#include "model/config.h"
#include "model/engram_layout.h"

namespace ds41rt::model {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// ================================================================================================
// Random streams. splitmix64 (Steele, Lea, Flood 2014) for the bits, Box-Muller for normals.
// One stream per tensor, seeded from (seed, FNV-1a of the name).
// ================================================================================================

uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string &s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

class random_stream {
public:
    random_stream(uint64_t seed, const std::string &name) : state_(seed ^ fnv1a(name)) {
        splitmix64_next(&state_);  // decorrelate nearby seeds before the first draw
    }
    uint64_t bits() { return splitmix64_next(&state_); }
    // Uniform in (0, 1): 53 random bits, never 0 (Box-Muller takes its log).
    double uniform() { return (double(bits() >> 11) + 0.5) * 0x1.0p-53; }
    double normal() {
        if (have_spare_) {
            have_spare_ = false;
            return spare_;
        }
        double r = std::sqrt(-2.0 * std::log(uniform()));
        double t = 2.0 * std::numbers::pi * uniform();
        spare_ = r * std::sin(t);
        have_spare_ = true;
        return r * std::cos(t);
    }

private:
    uint64_t state_;
    double spare_ = 0;
    bool have_spare_ = false;
};

// ================================================================================================
// Config. The tiny schedule of the fixtures (spec 11.2, head widths that keep the cache QATs on),
// with the caller's vocabulary and width. Engram table sizes are the prime sums the engine
// recomputes at load (engine/engram_hash.cpp): primes drawn in (layer, n, head) order, the search
// restarting at engram_vocab_size for every n-gram size, never reusing a prime.
// ================================================================================================

constexpr int ENGRAM_N_HEADS = 2;

int64_t n_classes(const synth_options &o) {
    if (o.token_map.empty()) return o.vocab_size;
    return *std::max_element(o.token_map.begin(), o.token_map.end()) + 1;
}

ojson config_json(const synth_options &o) {
    const bool real_vocab = o.vocab_size >= 129280;
    // The release's image and DSpark noise ids where the vocabulary holds them; the top ids of a
    // smaller test vocabulary otherwise.
    const int64_t image_id = real_vocab ? 129264 : o.vocab_size - 2;
    const int64_t noise_id = real_vocab ? 128799 : o.vocab_size - 1;
    ojson text = {
        {"model_type", "deepseek_v41_text"},
        {"vocab_size", o.vocab_size},
        {"hidden_size", o.dim},
        {"num_hidden_layers", 12},
        {"num_nextn_predict_layers", 3},
        {"num_attention_heads", 4},
        {"num_key_value_heads", 1},
        {"head_dim", 64},
        {"qk_rope_head_dim", 16},
        {"q_lora_rank", 64},
        {"o_groups", 2},
        {"o_lora_rank", 32},
        {"sliding_window", 8},
        {"max_position_embeddings", 1048576},
        {"rope_theta", 10000},
        {"compress_rope_theta", 160000},
        {"rope_scaling",
         {{"rope_type", "yarn"}, {"factor", 16}, {"beta_fast", 32}, {"beta_slow", 1},
          {"original_max_position_embeddings", 65536}}},
        {"compress_ratios", {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0}},
        {"kv_source_layer_ids", {2, 4, 6}},
        {"index_source_layer_ids", {2, 4, 6, 8, 10}},
        {"candidate_source_layer_id", 6},
        {"candidate_topk_blocks", 3},
        {"candidate_block_size", 2},
        {"index_n_heads", 8},
        {"index_head_dim", 32},
        {"index_topk", 4},
        {"n_routed_experts", 8},
        {"num_experts_per_tok", 2},
        {"moe_intermediate_size", o.moe_intermediate},
        {"n_shared_experts", 1},
        {"scoring_func", "sqrtsoftplus"},
        {"topk_method", "noaux_tc"},
        {"norm_topk_prob", true},
        {"routed_scaling_factor", 1.5},
        {"swiglu_limit", 10.0},
        {"hc_mult", 4},
        {"hc_sinkhorn_iters", 20},
        {"hc_eps", 1e-06},
        {"rms_norm_eps", 1e-20},
        {"engram_layer_ids", SYNTH_ENGRAM_LAYERS},
        {"engram_num_embeddings", engram_prime_sums(o.engram_vocab_size, int(SYNTH_ENGRAM_LAYERS.size()),
                                                    SYNTH_ENGRAM_MAX_NGRAM, ENGRAM_N_HEADS)},
        {"engram_max_ngram_size", SYNTH_ENGRAM_MAX_NGRAM},
        {"engram_n_heads", ENGRAM_N_HEADS},
        {"engram_head_dim", 32},
        {"engram_vocab_size", o.engram_vocab_size},
        {"engram_pad_token_id", 2},
        {"engram_compressed_vocab_size", n_classes(o)},
        {"dspark_block_size", 5},
        {"dspark_noise_token_id", noise_id},
        {"dspark_target_layer_ids", {9, 10, 11}},
        {"dspark_markov_rank", 16},
        {"dspark_n_routed_experts", 4},
        {"dspark_num_experts_per_tok", 2},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"attention_dropout", 0.0},
        {"tie_word_embeddings", false},
        {"initializer_range", 0.02},
        {"use_cache", true},
    };
    // vision_config as released, for layout fidelity only: no vision tensors are written.
    ojson vision = {
        {"model_type", "deepseek_v41_vision"}, {"num_hidden_layers", 32}, {"hidden_size", 1024},
        {"num_attention_heads", 16}, {"intermediate_size", 2816}, {"patch_size", 14},
        {"rope_theta", 10000}, {"downsample_ratio", 3}, {"max_image_tokens", 1024},
        {"min_pixels", 295936}, {"max_wh_ratio", nullptr},
    };
    return ojson{
        {"architectures", {"DeepseekV41ForCausalLM"}},
        {"model_type", "deepseek_v41"},
        {"dtype", "bfloat16"},
        {"bos_token_id", 0},
        {"eos_token_id", 1},
        {"pad_token_id", 2},
        {"image_token_id", image_id},
        {"text_config", text},
        {"vision_config", vision},
        {"quantization_config",
         {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 32}},
          {"scale_fmt", "ue8m0"}, {"expert_dtype", "fp4"}}},
    };
}

// ================================================================================================
// Initialization: realistic scales so activations stay near unit RMS through 12 layers. Linears
// N(0, 1/fan_in) (unit-RMS in, unit-scale out); norms near 1; mHC mixes ~N(0, 1); non-trivial
// router biases, sinks and Engram gates.
// ================================================================================================

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<float> init_values(const catalog_entry &e, uint64_t seed) {
    random_stream rng(seed, e.name);
    std::vector<float> v(size_t(shape_numel(e.shape)));
    auto normal = [&](double mean, double std) {
        for (float &x : v) x = float(mean + std * rng.normal());
    };
    const std::string &name = e.name;
    if (name == "embed.weight" || ends_with(name, "engram.embed.weight") || ends_with(name, "attn.attn_sink")) {
        normal(0, 1);
    } else if (ends_with(name, "norm.weight")) {
        normal(1, 0.1);
    } else if (ends_with(name, "_fn")) {  // hc_attn_fn / hc_ffn_fn [mix, hc * dim]
        normal(0, 1 / std::sqrt(double(e.shape[1])));
    } else if (ends_with(name, "_base")) {
        normal(0, 0.5);
    } else if (ends_with(name, "_scale")) {  // hc_*_scale
        for (float &x : v) x = float(0.6 + 0.8 * rng.uniform());
    } else if (ends_with(name, "gate.bias") || ends_with(name, "gate.bias_vl")) {
        normal(0, 0.1);
    } else if (ends_with(name, "engram.q_weight") || ends_with(name, "engram.k_weight")) {
        normal(1, 0.2);
    } else if (e.shape.size() == 2) {
        const double gain = name.find(".wgate.") != std::string::npos ? 2.0 : 1.0;  // sharper pooling
        normal(0, gain / std::sqrt(double(e.shape[1])));
    } else {
        normal(0, 1);
    }
    return v;
}

// ================================================================================================
// Storage quantizers. Every scale is a power of two, 2^ceil(log2(amax / max_code)), so codes never
// exceed the format's range; codes round to nearest even (core/dtype.h).
// ================================================================================================

// Smallest e with 2^e >= x (x > 0), clamped to the E8M0 range; -127 for x == 0.
int pow2_ceil_exponent(double x) {
    if (!(x > 0)) return -127;
    int e;
    double m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
    if (m == 0.5) e--;
    return std::clamp(e, -127, 127);
}

uint8_t e8m0_byte(int exponent) { return uint8_t(exponent + 127); }

// FP8 E4M3 codes with one E8M0 scale per (bo x bi) block.
void store_fp8_blocks(const std::vector<float> &w, int64_t rows, int64_t cols, int64_t bo, int64_t bi,
                      Tensor *codes, Tensor *scales) {
    *codes = Tensor(dtype::F8_E4M3, {rows, cols});
    const int64_t sr = (rows + bo - 1) / bo, sc = (cols + bi - 1) / bi;
    *scales = Tensor(dtype::F8_E8M0, {sr, sc});
    uint8_t *q = codes->data_mut<uint8_t>();
    uint8_t *s = scales->data_mut<uint8_t>();
    for (int64_t br = 0; br < sr; br++)
        for (int64_t bc = 0; bc < sc; bc++) {
            const int64_t r1 = std::min(rows, (br + 1) * bo), c1 = std::min(cols, (bc + 1) * bi);
            float amax = 0;
            for (int64_t r = br * bo; r < r1; r++)
                for (int64_t c = bc * bi; c < c1; c++) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
            const int e = pow2_ceil_exponent(double(amax) / 448.0);
            s[br * sc + bc] = e8m0_byte(e);
            const float inv = std::ldexp(1.0f, -e);
            for (int64_t r = br * bo; r < r1; r++)
                for (int64_t c = bc * bi; c < c1; c++) q[r * cols + c] = f32_to_e4m3(w[size_t(r * cols + c)] * inv);
        }
}

// MXFP4: two E2M1 codes per byte (low nibble = even column), one E8M0 scale per (row, 32 columns).
void store_mxfp4(const std::vector<float> &w, int64_t rows, int64_t cols, Tensor *packed, Tensor *scales) {
    *packed = Tensor(dtype::I8, {rows, cols / 2});
    const int64_t sc = (cols + 31) / 32;
    *scales = Tensor(dtype::F8_E8M0, {rows, sc});
    uint8_t *p = static_cast<uint8_t *>(packed->raw_mut());
    uint8_t *s = scales->data_mut<uint8_t>();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < sc; b++) {
            const int64_t c0 = b * 32, c1 = std::min(cols, c0 + 32);
            float amax = 0;
            for (int64_t c = c0; c < c1; c++) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
            const int e = pow2_ceil_exponent(double(amax) / 6.0);
            s[r * sc + b] = e8m0_byte(e);
            const float inv = std::ldexp(1.0f, -e);
            for (int64_t c = c0; c < c1; c++) {
                uint8_t code = f32_to_e2m1(w[size_t(r * cols + c)] * inv);
                uint8_t &byte = p[r * (cols / 2) + c / 2];
                byte = (c & 1) ? uint8_t((byte & 0x0f) | (code << 4)) : uint8_t((byte & 0xf0) | code);
            }
        }
}

Tensor store_bf16(const std::vector<float> &w, const shape_t &shape) {
    Tensor t(dtype::BF16, shape);
    uint16_t *d = t.data_mut<uint16_t>();
    for (size_t i = 0; i < w.size(); i++) d[i] = f32_to_bf16(w[i]);
    return t;
}

Tensor store_f32(const std::vector<float> &w, const shape_t &shape) {
    Tensor t(dtype::F32, shape);
    std::copy(w.begin(), w.end(), t.f());
    return t;
}

Tensor store_i64(const std::vector<int64_t> &v, const shape_t &shape) {
    Tensor t(dtype::I64, shape);
    std::copy(v.begin(), v.end(), t.data_mut<int64_t>());
    return t;
}

// The stored tensors of one catalog entry, in stored_tensors() order (weight, then .scale).
Status store_entry(const catalog_entry &e, const model_config &c, uint64_t seed,
                   std::vector<std::pair<std::string, Tensor>> *out) {
    const std::vector<float> v = init_values(e, seed);
    switch (e.format) {
    case storage_format::BF16:
        out->emplace_back(e.name, store_bf16(v, e.shape));
        return Status::ok();
    case storage_format::F32:
        out->emplace_back(e.name, store_f32(v, e.shape));
        return Status::ok();
    case storage_format::FP8_BLOCK:
    case storage_format::ENGRAM_TABLE: {
        const bool table = e.format == storage_format::ENGRAM_TABLE;  // one scale per row, per 32
        Tensor q, s;
        store_fp8_blocks(v, e.shape[0], e.shape[1], table ? 1 : c.fp8_block_out, table ? 32 : c.fp8_block_in, &q, &s);
        out->emplace_back(e.name, std::move(q));
        out->emplace_back(scale_name(e.name), std::move(s));
        return Status::ok();
    }
    case storage_format::MXFP4: {
        Tensor q, s;
        store_mxfp4(v, e.shape[0], e.shape[1], &q, &s);
        out->emplace_back(e.name, std::move(q));
        out->emplace_back(scale_name(e.name), std::move(s));
        return Status::ok();
    }
    case storage_format::I64:
    case storage_format::NVFP4:  // the quantized publications are made by their own producers
    case storage_format::EXL3:
        break;
    }
    return Status::not_supported("synth: no generator for " + e.name + " (" + storage_format_name(e.format) + ")");
}

// Odd multipliers below the released bound's form, (2^63 - 1) // classes // 2 * 2 + 1, from the seed.
std::vector<int64_t> synthetic_multipliers(uint64_t seed, int64_t classes) {
    random_stream rng(seed, "engram.multipliers");
    const uint64_t bound = uint64_t(INT64_MAX) / uint64_t(classes) / 2;
    std::vector<int64_t> m;
    for (size_t i = 0; i < SYNTH_ENGRAM_LAYERS.size() * SYNTH_ENGRAM_MAX_NGRAM; i++)
        m.push_back(int64_t(rng.bits() % bound) * 2 + 1);
    return m;
}

std::string layer_list() {
    std::string s;
    for (int l : SYNTH_ENGRAM_LAYERS) {
        if (!s.empty()) s += ',';
        s += std::to_string(l);
    }
    return s;
}

Status write_text_file(const std::string &path, const std::string &text) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) return Status::io_error(tmp + ": cannot open for writing");
        f << text;
        if (!f.flush()) return Status::io_error(tmp + ": write failed");
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) return Status::io_error(path + ": rename failed: " + ec.message());
    return Status::ok();
}

}  // namespace

// ================================================================================================
// Public entry points.
// ================================================================================================

Result<std::string> synth_config_json(const synth_options &o) {
    if (o.vocab_size < 8) return Status::invalid_argument("synth: vocab_size must be >= 8");
    if (o.dim <= 0 || o.dim % 32 != 0)
        return Status::invalid_argument("synth: dim " + std::to_string(o.dim) + " must be a positive multiple of 32");
    if (o.moe_intermediate <= 0 || o.moe_intermediate % 32 != 0)
        return Status::invalid_argument("synth: moe_intermediate " + std::to_string(o.moe_intermediate) +
                                        " must be a positive multiple of 32 (MXFP4 blocks)");
    if (o.engram_vocab_size < 2) return Status::invalid_argument("synth: engram_vocab_size must be >= 2");
    if (!o.token_map.empty() && int64_t(o.token_map.size()) != o.vocab_size)
        return Status::invalid_argument("synth: the token map has " + std::to_string(o.token_map.size()) +
                                        " entries, vocab_size is " + std::to_string(o.vocab_size));
    std::string text = config_json(o).dump(2) + "\n";
    Result<model_config> c = parse_config(text);
    if (!c) return Status(c.status().code(), "synth: generated config: " + c.status().message());
    Status v = validate(c.value());
    if (!v.is_ok()) return Status(v.code(), "synth: generated config: " + v.message());
    return text;
}

Status load_synth_token_map(const std::string &path, synth_options *o) {
    auto f = io::safetensors_file::open(path);
    if (!f) return f.status();
    auto map = f.value()->get("engram.token_map");
    if (!map) return map.status();
    auto mult = f.value()->get("engram.multipliers");
    if (!mult) return mult.status();
    if (map->type() != dtype::I64 || map->rank() != 1)
        return Status::invalid_argument(path + ": engram.token_map must be I64 [vocab]");
    const shape_t want = {int64_t(SYNTH_ENGRAM_LAYERS.size()), SYNTH_ENGRAM_MAX_NGRAM};
    if (mult->type() != dtype::I64 || mult->shape() != want)
        return Status::invalid_argument(path + ": engram.multipliers must be I64 " + shape_str(want) + ", got " +
                                        shape_str(mult->shape()));
    const auto &meta = f.value()->metadata();
    auto layers = meta.find("engram_layer_ids");
    if (layers != meta.end() && layers->second != layer_list())
        return Status::invalid_argument(path + ": multipliers are for Engram layers " + layers->second +
                                        ", the synth config has " + layer_list());
    o->token_map.assign(map->data<int64_t>(), map->data<int64_t>() + map->numel());
    o->multipliers.assign(mult->data<int64_t>(), mult->data<int64_t>() + mult->numel());
    o->vocab_size = map->numel();
    for (int64_t v : o->token_map)
        if (v < 0) return Status::invalid_argument(path + ": negative class id in engram.token_map");
    return Status::ok();
}

Status synthesize(const std::string &dir, const synth_options &o) {
    Result<std::string> text = synth_config_json(o);
    if (!text) return text.status();
    model_config c = parse_config(text.value()).value();
    if (!o.multipliers.empty() && o.multipliers.size() != SYNTH_ENGRAM_LAYERS.size() * SYNTH_ENGRAM_MAX_NGRAM)
        return Status::invalid_argument("synth: expected " +
                                        std::to_string(SYNTH_ENGRAM_LAYERS.size() * SYNTH_ENGRAM_MAX_NGRAM) +
                                        " Engram multipliers");
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Status::io_error(dir + ": cannot create: " + ec.message());

    std::vector<catalog_entry> entries = build_catalog(c, catalog_scope::TEXT);
    if (o.mtp) {
        std::vector<catalog_entry> mtp = build_catalog(c, catalog_scope::MTP);
        entries.insert(entries.end(), mtp.begin(), mtp.end());
    }
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const catalog_entry &e : entries) DS41RT_RETURN_IF_ERROR(store_entry(e, c, o.seed, &tensors));
    const std::map<std::string, std::string> meta = {
        {"format", "pt"}, {"generator", "ds41rt synth"}, {"seed", std::to_string(o.seed)}};
    DS41RT_RETURN_IF_ERROR(io::write_safetensors(dir + "/model.safetensors", tensors, meta));

    // Engram hashing tables beside the checkpoint (engine/engine.cpp reads them).
    std::vector<int64_t> map = o.token_map;
    if (map.empty())
        for (int64_t i = 0; i < o.vocab_size; i++) map.push_back(i);
    const int64_t classes = c.engram_compressed_vocab_size;
    std::vector<int64_t> mult = o.multipliers.empty() ? synthetic_multipliers(o.seed, classes) : o.multipliers;
    DS41RT_RETURN_IF_ERROR(io::write_safetensors(
        dir + "/engram_token_map.safetensors",
        {{"engram.token_map", store_i64(map, {o.vocab_size})},
         {"engram.multipliers",
          store_i64(mult, {int64_t(SYNTH_ENGRAM_LAYERS.size()), int64_t(SYNTH_ENGRAM_MAX_NGRAM)})}},
        {{"n_classes", std::to_string(classes)}, {"engram_layer_ids", layer_list()},
         {"max_ngram", std::to_string(SYNTH_ENGRAM_MAX_NGRAM)}}));

    return write_text_file(dir + "/config.json", text.value());
}

}  // namespace ds41rt::model
