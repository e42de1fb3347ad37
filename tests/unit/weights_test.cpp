// Weights: check() against the catalog and dequantization to fp32, on tiny checkpoints written
// here with io::write_safetensors. Expected fp32 values are computed in this file from the format
// definitions (e4m3fn bit layout, e8m0 = 2^(e-127), the e2m1 code table with the low nibble as the
// even element), not with core/dtype.h, so a decoding bug there or in the loader shows up here.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <unistd.h>

#include "io/safetensors.h"
#include "model/catalog.h"
#include "model/config.h"
#include "model/weights.h"

namespace ds41rt::model {
namespace {

namespace fs = std::filesystem;

// A tiny V4.1 text config touching every conditional tensor kind: two KV sources (ratio 2 with a
// gate, ratio 1 without), an Engram layer, one DSpark stage. The FP8 block grid 24 x 48 does not
// divide the weights, so partial edge blocks are exercised, and bo != bi catches a swapped grid.
const char *TINY_CONFIG = R"({
  "model_type": "deepseek_v41_text",
  "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 4, "num_nextn_predict_layers": 1,
  "num_attention_heads": 2, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 32,
  "o_groups": 2, "o_lora_rank": 32, "sliding_window": 8, "rms_norm_eps": 1e-20,
  "compress_ratios": [0, 2, 2, 1, 0],
  "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 3], "candidate_source_layer_id": 3,
  "candidate_topk_blocks": 4, "candidate_block_size": 2,
  "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
  "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
  "engram_layer_ids": [2], "engram_num_embeddings": [10], "engram_max_ngram_size": 3,
  "engram_n_heads": 2, "engram_head_dim": 64, "engram_vocab_size": 5, "engram_compressed_vocab_size": 40,
  "dspark_block_size": 2, "dspark_noise_token_id": 63, "dspark_target_layer_ids": [3],
  "dspark_markov_rank": 8, "dspark_n_routed_experts": 2, "dspark_num_experts_per_tok": 1,
  "quantization_config": {"quant_method": "fp8", "weight_block_size": [24, 48], "expert_dtype": "fp4"}
})";

model_config tiny_config() {
    Result<model_config> c = parse_config(TINY_CONFIG);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_TRUE(validate(c.value()).is_ok()) << validate(c.value()).to_string();
    return c.value();
}

// ---- reference decoders, written from the format definitions ----

float ref_e4m3(uint8_t v) {
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float mag = exp == 0 ? std::ldexp(float(man) / 8.0f, -6) : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    return sign ? -mag : mag;
}
float ref_e8m0(uint8_t e) { return std::ldexp(1.0f, int(e) - 127); }
float ref_e2m1(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

// ---- writing test checkpoints ----

struct temp_dir {
    fs::path path;
    temp_dir() {
        static std::atomic<int> n{0};
        path = fs::temp_directory_path() /
               ("ds41rt_weights_test_" + std::to_string(getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    std::string str() const { return path.string(); }
};

// Valid random bytes for a stored tensor: no e4m3 NaN codes, scales near 2^0.
Tensor random_tensor(dtype t, const shape_t &shape, std::mt19937 &rng) {
    Tensor x(t, shape);
    auto *p = x.data_mut<uint8_t>();
    const size_t nb = x.nbytes();
    std::uniform_int_distribution<int> byte(0, 255);
    switch (t) {
    case dtype::F8_E4M3:
        for (size_t i = 0; i < nb; i++) {
            uint8_t v;
            do v = uint8_t(byte(rng));
            while ((v & 0x7f) == 0x7f);
            p[i] = v;
        }
        break;
    case dtype::F8_E8M0:
        for (size_t i = 0; i < nb; i++) p[i] = uint8_t(120 + byte(rng) % 15);
        break;
    case dtype::BF16:
        for (int64_t i = 0; i < x.numel(); i++) x.data_mut<uint16_t>()[i] = f32_to_bf16(float(byte(rng) - 128) / 64.0f);
        break;
    case dtype::F32:
        for (int64_t i = 0; i < x.numel(); i++) x.data_mut<float>()[i] = float(byte(rng) - 128) / 32.0f;
        break;
    case dtype::I64:
        for (int64_t i = 0; i < x.numel(); i++) x.data_mut<int64_t>()[i] = byte(rng) % 4;
        break;
    default:
        for (size_t i = 0; i < nb; i++) p[i] = uint8_t(byte(rng));
    }
    return x;
}

struct writer_options {
    catalog_scope scope = catalog_scope::TEXT;
    bool plain = false;                         // store quantized weights as logical BF16 (no .scale)
    std::set<std::string> skip;                 // stored names to leave out
    std::map<std::string, Tensor> replace;      // stored name -> tensor to write instead
    std::vector<std::pair<std::string, Tensor>> extra;
};

void write_checkpoint(const std::string &dir, const model_config &c, const writer_options &o) {
    std::mt19937 rng(1234);
    std::vector<std::pair<std::string, Tensor>> out;
    auto emit = [&](const std::string &name, Tensor t) {
        if (o.skip.count(name)) return;
        auto it = o.replace.find(name);
        out.emplace_back(name, it != o.replace.end() ? it->second : std::move(t));
    };
    for (const catalog_entry &e : build_catalog(c, o.scope)) {
        if (o.plain && (e.format == storage_format::FP8_BLOCK || e.format == storage_format::MXFP4 ||
                        e.format == storage_format::ENGRAM_TABLE)) {
            emit(e.name, random_tensor(dtype::BF16, e.shape, rng));
            continue;
        }
        for (const stored_tensor &s : stored_tensors(e, c)) emit(s.name, random_tensor(s.type, s.shape, rng));
    }
    for (const auto &x : o.extra) out.push_back(x);
    Status st = io::write_safetensors(dir + "/model.safetensors", out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
}

std::unique_ptr<weights> open_ok(const std::string &dir, const model_config &c) {
    Result<std::unique_ptr<weights>> w = weights::open(dir, c);
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    return w.is_ok() ? std::move(w.value()) : nullptr;
}

// ---- dequantization ------------------------------------------------------------------------------

TEST(weights, fp8_block_dequant_matches_definition) {
    temp_dir d;
    model_config c = tiny_config();
    write_checkpoint(d.str(), c, {});
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    for (const char *name : {"layers.0.attn.wq_a.weight", "layers.0.attn.wq_b.weight", "layers.2.engram.wkv.weight"}) {
        SCOPED_TRACE(name);
        ASSERT_EQ(*w->format(name), storage_format::FP8_BLOCK);
        Tensor q = *w->raw(name);
        Tensor s = *w->raw(scale_name(name));
        const int64_t rows = q.dim(0), cols = q.dim(1);
        // Scale grid: ceil(rows / 24) x ceil(cols / 48), partial blocks at the edges.
        ASSERT_EQ(s.dim(0), (rows + 23) / 24);
        ASSERT_EQ(s.dim(1), (cols + 47) / 48);
        Result<Tensor> f = w->f32(name);
        ASSERT_TRUE(f.is_ok()) << f.status().to_string();
        ASSERT_EQ(f->shape(), q.shape());
        int bad = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < cols; i++) {
                float want = ref_e4m3(q.data<uint8_t>()[r * cols + i]) * ref_e8m0(s.data<uint8_t>()[(r / 24) * s.dim(1) + i / 48]);
                if (f->data<float>()[r * cols + i] != want && bad++ < 5)
                    ADD_FAILURE() << "[" << r << "," << i << "] got " << f->data<float>()[r * cols + i] << " want " << want;
            }
        EXPECT_EQ(bad, 0);
    }
}

TEST(weights, fp8_block_hand_values) {
    // wq_a is [32, 64]: blocks (0,0) (0,1) (1,0) (1,1) cover rows 0-23 / 24-31 and cols 0-47 / 48-63.
    model_config c = tiny_config();
    Tensor q(dtype::F8_E4M3, {32, 64});
    Tensor s(dtype::F8_E8M0, {2, 2});
    q.data_mut<uint8_t>()[0] = 0x38;             // 1.0
    q.data_mut<uint8_t>()[47] = 0xBC;            // -1.5 (sign, exp 7, man 4)
    q.data_mut<uint8_t>()[48] = 0x7E;            // 448
    q.data_mut<uint8_t>()[23 * 64 + 1] = 0x01;   // smallest subnormal 2^-9
    q.data_mut<uint8_t>()[24 * 64 + 0] = 0x40;   // 2.0
    q.data_mut<uint8_t>()[31 * 64 + 63] = 0x3C; // 1.5
    uint8_t scales[4] = {127, 129, 126, 100};    // 1, 4, 0.5, 2^-27
    std::memcpy(s.data_mut<uint8_t>(), scales, 4);
    temp_dir d;
    writer_options o;
    o.replace = {{"layers.0.attn.wq_a.weight", q}, {"layers.0.attn.wq_a.scale", s}};
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    Tensor f = *w->f32("layers.0.attn.wq_a.weight");
    const float *v = f.data<float>();
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[47], -1.5f);
    EXPECT_EQ(v[48], 448.0f * 4.0f);
    EXPECT_EQ(v[23 * 64 + 1], std::ldexp(1.0f, -9));
    EXPECT_EQ(v[24 * 64 + 0], 1.0f);
    EXPECT_EQ(v[31 * 64 + 63], 1.5f * std::ldexp(1.0f, -27));
    EXPECT_EQ(v[5], 0.0f);
}

TEST(weights, mxfp4_dequant_matches_definition) {
    model_config c = tiny_config();
    // experts.1.w1 is logical [32, 64]: I8 [32, 32] and one scale per (row, 32 columns) -> [32, 2].
    Tensor q(dtype::I8, {32, 32});
    Tensor s(dtype::F8_E8M0, {32, 2});
    std::mt19937 rng(7);
    for (int i = 0; i < 32 * 32; i++) q.data_mut<uint8_t>()[i] = uint8_t(rng());
    for (int i = 0; i < 64; i++) s.data_mut<uint8_t>()[i] = uint8_t(124 + rng() % 7);
    // Row 0 by hand: byte 0x71 holds element 0 = code 1 (0.5) and element 1 = code 7 (6.0); byte
    // 0x9A holds element 2 = code 10 (-1.0) and element 3 = code 9 (-0.5). Scales 2^1 and 2^-2.
    q.data_mut<uint8_t>()[0] = 0x71;
    q.data_mut<uint8_t>()[1] = 0x9A;
    q.data_mut<uint8_t>()[16] = 0x0F;  // elements 32, 33: code 15 (-6), code 0 (0)
    s.data_mut<uint8_t>()[0] = 128;
    s.data_mut<uint8_t>()[1] = 125;
    temp_dir d;
    writer_options o;
    o.replace = {{"layers.0.ffn.experts.1.w1.weight", q}, {"layers.0.ffn.experts.1.w1.scale", s}};
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    ASSERT_EQ(*w->format("layers.0.ffn.experts.1.w1.weight"), storage_format::MXFP4);
    Tensor f = *w->f32("layers.0.ffn.experts.1.w1.weight");
    ASSERT_EQ(f.shape(), (shape_t{32, 64}));
    const float *v = f.data<float>();
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_EQ(v[1], 12.0f);
    EXPECT_EQ(v[2], -2.0f);
    EXPECT_EQ(v[3], -1.0f);
    EXPECT_EQ(v[32], -1.5f);
    EXPECT_EQ(v[33], 0.0f);
    for (int r = 0; r < 32; r++)
        for (int i = 0; i < 64; i++) {
            uint8_t byte = q.data<uint8_t>()[r * 32 + i / 2];
            uint8_t code = (i % 2 == 0) ? (byte & 0xf) : (byte >> 4);
            float want = ref_e2m1(code) * ref_e8m0(s.data<uint8_t>()[r * 2 + i / 32]);
            ASSERT_EQ(v[r * 64 + i], want) << r << "," << i;
        }
}

TEST(weights, engram_rows_and_table) {
    model_config c = tiny_config();
    temp_dir d;
    write_checkpoint(d.str(), c, {});
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    const std::string name = "layers.2.engram.embed.weight";
    ASSERT_EQ(*w->format(name), storage_format::ENGRAM_TABLE);
    Tensor q = *w->raw(name);
    Tensor s = *w->raw("layers.2.engram.embed.scale");
    ASSERT_EQ(q.shape(), (shape_t{10, 64}));
    ASSERT_EQ(s.shape(), (shape_t{10, 2}));
    Tensor table = *w->f32(name);
    std::vector<float> row(64);
    for (int r = 0; r < 10; r++) {
        ASSERT_TRUE(w->engram_row(2, r, row.data()).is_ok());
        for (int j = 0; j < 64; j++) {
            // Rows never share a scale: scale [r, j / 32].
            float want = ref_e4m3(q.data<uint8_t>()[r * 64 + j]) * ref_e8m0(s.data<uint8_t>()[r * 2 + j / 32]);
            ASSERT_EQ(row[size_t(j)], want) << r << "," << j;
            ASSERT_EQ(table.data<float>()[r * 64 + j], want);
        }
    }
    Status st = w->engram_row(2, 10, row.data());
    EXPECT_EQ(st.code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(st.message().find("row 10"), std::string::npos) << st.message();
    EXPECT_EQ(w->engram_row(1, 0, row.data()).code(), status_code::INVALID_ARGUMENT);
}

TEST(weights, bf16_and_f32_convert_and_cache_once) {
    model_config c = tiny_config();
    temp_dir d;
    write_checkpoint(d.str(), c, {});
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    Tensor raw = *w->raw("layers.1.attn_norm.weight");
    ASSERT_EQ(raw.type(), dtype::BF16);
    Tensor f = *w->f32("layers.1.attn_norm.weight");
    for (int i = 0; i < 64; i++) {
        uint32_t bits = uint32_t(raw.data<uint16_t>()[i]) << 16;
        float want;
        std::memcpy(&want, &bits, 4);
        ASSERT_EQ(f.data<float>()[i], want);
    }
    EXPECT_EQ(*w->format("layers.0.hc_attn_fn"), storage_format::F32);
    // Cached: the same storage every time, also when many threads ask at once.
    EXPECT_EQ(w->f32("layers.1.attn_norm.weight")->raw(), f.raw());
    std::vector<const void *> seen(8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; t++)
        threads.emplace_back([&, t] { seen[size_t(t)] = w->f32("layers.3.attn.wo_a.weight")->raw(); });
    for (auto &t : threads) t.join();
    for (const void *p : seen) EXPECT_EQ(p, seen[0]);
    EXPECT_EQ(w->format("no.such.weight").status().code(), status_code::NOT_FOUND);
    EXPECT_EQ(w->f32("no.such.weight").status().code(), status_code::NOT_FOUND);
    // tid2eid-free V4.1 has I64 nowhere; scales are stored floats and convert.
    Result<Tensor> sc = w->f32("layers.0.attn.wq_a.scale");
    ASSERT_TRUE(sc.is_ok());
    EXPECT_EQ(sc->type(), dtype::F32);
}

// ---- check() ------------------------------------------------------------------------------------

TEST(weights_check, complete_text_checkpoint_passes) {
    model_config c = tiny_config();
    temp_dir d;
    writer_options o;
    o.extra = {{"junk.weight", Tensor(dtype::I8, {4})}};
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    Status st = w->check();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(w->report().problems.empty());
    EXPECT_EQ(w->report().unexpected, std::vector<std::string>{"junk.weight"});
    EXPECT_EQ(w->report().checked, build_catalog(c, catalog_scope::TEXT).size());
    EXPECT_TRUE(w->has_part(model_part::TEXT));
    EXPECT_FALSE(w->has_part(model_part::MTP));
    EXPECT_EQ(w->parts_present(), std::vector<model_part>{model_part::TEXT});
    // An unexpected float tensor converts; an integer one has no fp32 view.
    EXPECT_EQ(w->f32("junk.weight").status().code(), status_code::NOT_SUPPORTED);
}

TEST(weights_check, opens_from_directory_with_config_json) {
    model_config c = tiny_config();
    temp_dir d;
    writer_options o;
    o.scope = catalog_scope::ALL;
    write_checkpoint(d.str(), c, o);
    std::ofstream(d.path / "config.json") << TINY_CONFIG;
    Result<std::unique_ptr<weights>> w = weights::open(d.str());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    EXPECT_TRUE((*w)->check().is_ok()) << (*w)->check().to_string();
    EXPECT_TRUE((*w)->has_part(model_part::MTP));
    EXPECT_TRUE((*w)->report().unexpected.empty());
    EXPECT_EQ((*w)->report().checked, build_catalog(c, catalog_scope::ALL).size());
}

TEST(weights_check, wrong_dtype_shape_and_missing_are_named) {
    model_config c = tiny_config();
    temp_dir d;
    writer_options o;
    o.replace["layers.0.attn.wq_a.weight"] = Tensor(dtype::BF16, {32, 64});  // .scale still there
    o.replace["layers.2.attn.attn_sink"] = Tensor(dtype::F32, {3});
    o.skip = {"layers.1.attn.compressor.wkv.weight", "layers.3.attn.wkv.scale"};
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    Status st = w->check();
    ASSERT_FALSE(st.is_ok());
    const io::tensor_info *info = w->files().find("layers.0.attn.wq_a.weight");
    ASSERT_NE(info, nullptr);
    const std::string file = d.str() + "/model.safetensors";
    EXPECT_EQ(st.code(), status_code::CORRUPTION);
    EXPECT_EQ(st.message(), "tensor layers.0.attn.wq_a.weight: expected F8_E4M3 [32, 64] got BF16 [32, 64] in file " +
                                info->file + " at byte " + std::to_string(info->data_offset) + " (and 3 more problems)");
    EXPECT_NE(info->file.find("model.safetensors"), std::string::npos);

    const auto &p = w->report().problems;
    ASSERT_EQ(p.size(), 4u);
    EXPECT_EQ(p[0].rfind("tensor layers.0.attn.wq_a.weight: expected F8_E4M3 [32, 64] got BF16 [32, 64]", 0), 0u);
    auto find = [&](const std::string &needle) {
        for (const auto &x : p)
            if (x.find(needle) != std::string::npos) return true;
        return false;
    };
    EXPECT_TRUE(find("tensor layers.2.attn.attn_sink: expected F32 [2] got F32 [3] in file"));
    EXPECT_TRUE(find("tensor layers.1.attn.compressor.wkv.weight: missing (expected BF16 [64, 64])"));
    EXPECT_TRUE(find("tensor layers.3.attn.wkv.scale: missing (expected F8_E8M0 [3, 2])"));
    EXPECT_EQ(w->report().missing,
              (std::vector<std::string>{"layers.1.attn.compressor.wkv.weight", "layers.3.attn.wkv.scale"}));
    // Access to a broken tensor reports the same problem instead of reading garbage.
    EXPECT_EQ(w->f32("layers.2.attn.attn_sink").status().code(), status_code::CORRUPTION);
    EXPECT_EQ(w->format("layers.3.attn.wkv.weight").status().code(), status_code::NOT_FOUND);
}

TEST(weights_check, wrong_scale_grid_is_caught) {
    model_config c = tiny_config();
    temp_dir d;
    // A 32x32 grid where the config says 24x48: [1, 2] instead of [2, 2].
    writer_options o;
    o.replace = {{"layers.0.attn.wq_a.scale", Tensor(dtype::F8_E8M0, {1, 2})}};
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    Status st = w->check();
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.message().rfind("tensor layers.0.attn.wq_a.scale: expected F8_E8M0 [2, 2] got F8_E8M0 [1, 2] in file ", 0), 0u)
        << st.message();
}

TEST(weights_check, present_optional_part_is_checked) {
    model_config c = tiny_config();
    temp_dir d;
    writer_options o;
    o.scope = catalog_scope::ALL;
    o.skip = {"mtp.0.main_proj.scale"};
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    EXPECT_TRUE(w->has_part(model_part::MTP));
    Status st = w->check();
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), status_code::NOT_FOUND);
    EXPECT_NE(st.message().find("mtp.0.main_proj.scale"), std::string::npos) << st.message();
}

TEST(weights_check, plain_bf16_variant_is_accepted) {
    model_config c = tiny_config();
    temp_dir d;
    writer_options o;
    o.plain = true;
    write_checkpoint(d.str(), c, o);
    auto w = open_ok(d.str(), c);
    ASSERT_TRUE(w);
    Status st = w->check();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(*w->format("layers.0.attn.wq_a.weight"), storage_format::BF16);
    EXPECT_EQ(*w->format("layers.0.ffn.experts.2.w2.weight"), storage_format::BF16);
    EXPECT_EQ(*w->format("layers.2.engram.embed.weight"), storage_format::BF16);
    Tensor raw = *w->raw("layers.0.ffn.experts.2.w2.weight");
    Tensor f = *w->f32("layers.0.ffn.experts.2.w2.weight");
    ASSERT_EQ(f.shape(), (shape_t{64, 32}));
    for (int i = 0; i < 64 * 32; i++) ASSERT_EQ(f.data<float>()[i], bf16_to_f32(raw.data<uint16_t>()[i]));
    std::vector<float> row(64);
    ASSERT_TRUE(w->engram_row(2, 3, row.data()).is_ok());
    Tensor t = *w->raw("layers.2.engram.embed.weight");
    for (int j = 0; j < 64; j++) ASSERT_EQ(row[size_t(j)], bf16_to_f32(t.data<uint16_t>()[3 * 64 + j]));
}

TEST(weights_check, invalid_config_refused_at_open) {
    model_config c = tiny_config();
    c.o_groups = 3;
    temp_dir d;
    Result<std::unique_ptr<weights>> w = weights::open(d.str(), c);
    ASSERT_FALSE(w.is_ok());
    EXPECT_NE(w.status().message().find("o_groups"), std::string::npos);
}

}  // namespace
}  // namespace ds41rt::model
