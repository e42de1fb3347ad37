// The NVFP4 and EXL3 routed experts through model::weights: catalog check of every companion
// tensor, the gate/up scale rule, per-tensor EXL3 K, codebook markers, and f32() giving the
// logical [out, in] of the decoders (whose own correctness is tested in nvfp4_test / exl3_test
// and against the producers in quant_fixture_test).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <unistd.h>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/catalog.h"
#include "model/config.h"
#include "model/weights.h"

namespace ds41rt::model {
namespace {

namespace fs = std::filesystem;

std::string tiny_json(const std::string &qc) {
    return R"({
  "model_type": "deepseek_v41_text",
  "vocab_size": 64, "hidden_size": 128, "num_hidden_layers": 2, "num_nextn_predict_layers": 1,
  "num_attention_heads": 2, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 32,
  "o_groups": 2, "o_lora_rank": 32, "sliding_window": 8, "rms_norm_eps": 1e-20,
  "compress_ratios": [0, 2, 0], "kv_source_layer_ids": [1], "index_source_layer_ids": [1],
  "candidate_source_layer_id": 1, "candidate_topk_blocks": 4, "candidate_block_size": 2,
  "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
  "n_routed_experts": 3, "num_experts_per_tok": 2, "moe_intermediate_size": 256, "n_shared_experts": 1,
  "dspark_block_size": 2, "dspark_noise_token_id": 63, "dspark_target_layer_ids": [1],
  "dspark_markov_rank": 8, "dspark_n_routed_experts": 2, "dspark_num_experts_per_tok": 1,
  "quantization_config": )" + qc + "}";
}

const char *NVFP4_QC = R"({"quant_method": "fp8", "quant_algo": "MIXED_PRECISION", "moe_quant_algo": "NVFP4",
  "expert_dtype": "fp4", "group_size": 16, "weight_block_size": [32, 32],
  "quantized_layers": {"layers.0.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16},
                       "layers.1.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16}}})";
const char *EXL3_QC = R"({"quant_method": "exl3", "bits": 2, "codebook": "mcg", "mtp_experts": "source",
  "mtp_experts_start_layer": 2, "non_routed_quantization": {"quant_method": "deepseek_v4_fp8",
  "weight_block_size": [32, 32], "expert_dtype": "fp4"}})";

model_config cfg(const char *qc) {
    Result<model_config> c = parse_config(tiny_json(qc));
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_TRUE(validate(*c).is_ok()) << validate(*c).to_string();
    return *c;
}

struct temp_dir {
    fs::path path;
    temp_dir() {
        static std::atomic<int> n{0};
        path = fs::temp_directory_path() / ("ds41rt_qweights_" + std::to_string(getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    std::string str() const { return path.string(); }
};

bool ends_with(const std::string &s, const std::string &t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Valid contents: non-NaN non-negative e4m3, e8m0 near 1, finite fp16, gate/up-equal scalars.
Tensor fill(const stored_tensor &s, std::mt19937 &rng) {
    Tensor x(s.type, s.shape);
    auto *p = x.data_mut<uint8_t>();
    std::uniform_int_distribution<int> byte(0, 255);
    switch (s.type) {
    case dtype::F8_E4M3:
        for (size_t i = 0; i < x.nbytes(); i++) p[i] = uint8_t(byte(rng) % 0x7f);
        break;
    case dtype::F8_E8M0:
        for (size_t i = 0; i < x.nbytes(); i++) p[i] = uint8_t(120 + byte(rng) % 15);
        break;
    case dtype::F32:
        for (int64_t i = 0; i < x.numel(); i++)
            x.data_mut<float>()[i] = ends_with(s.name, "input_scale") ? 0.02f
                                     : ends_with(s.name, "weight_scale_2") ? 0.01f : float(byte(rng) - 128) / 32.0f;
        break;
    case dtype::F16:
        for (int64_t i = 0; i < x.numel(); i++) x.data_mut<uint16_t>()[i] = f32_to_f16(float(byte(rng) - 128) / 64.0f);
        break;
    case dtype::BF16:
        for (int64_t i = 0; i < x.numel(); i++) x.data_mut<uint16_t>()[i] = f32_to_bf16(float(byte(rng) - 128) / 64.0f);
        break;
    case dtype::I32:
        x.data_mut<int32_t>()[0] = -877912083;  // exllamav3's mcg marker value
        break;
    case dtype::I64:
        for (int64_t i = 0; i < x.numel(); i++) x.data_mut<int64_t>()[i] = byte(rng) % 3;
        break;
    default:
        for (size_t i = 0; i < x.nbytes(); i++) p[i] = uint8_t(byte(rng));
    }
    return x;
}

void write(const std::string &dir, const model_config &c, const std::map<std::string, Tensor> &replace = {},
           const std::set<std::string> &skip = {}, std::vector<std::pair<std::string, Tensor>> extra = {}) {
    std::mt19937 rng(99);
    std::vector<std::pair<std::string, Tensor>> out;
    for (const catalog_entry &e : build_catalog(c, catalog_scope::TEXT))
        for (const stored_tensor &s : stored_tensors(e, c)) {
            if (skip.count(s.name)) continue;
            auto it = replace.find(s.name);
            out.emplace_back(s.name, it != replace.end() ? it->second : fill(s, rng));
        }
    for (auto &x : extra) out.push_back(std::move(x));
    ASSERT_TRUE(io::write_safetensors(dir + "/model.safetensors", out).is_ok());
}

Tensor scalar(float v) {
    Tensor t(dtype::F32, {});
    t.data_mut<float>()[0] = v;
    return t;
}

TEST(quant_weights, nvfp4_checkpoint_checks_and_dequantizes) {
    model_config c = cfg(NVFP4_QC);
    temp_dir d;
    write(d.str(), c);
    auto w = weights::open(d.str(), c);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    Status st = (*w)->check();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::string n = "layers.1.ffn.experts.2.w2.weight";
    EXPECT_EQ(*(*w)->format(n), storage_format::NVFP4);
    Result<nvfp4_linear> l = (*w)->nvfp4(n);
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    EXPECT_EQ(l->out, 128);
    EXPECT_EQ(l->in, 256);
    EXPECT_EQ(l->weight_scale_2, 0.01f);
    EXPECT_EQ(l->input_scale, 0.02f);
    Result<Tensor> f = (*w)->f32(n);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    ASSERT_EQ(f->shape(), (shape_t{128, 256}));
    std::vector<float> ref(128 * 256);
    nvfp4_dequantize(*l, ref.data());
    EXPECT_EQ(std::memcmp(ref.data(), f->data<float>(), ref.size() * 4), 0);
    // Element (5, 37): byte 18 of row 5, high nibble; scale block 2.
    const Tensor q = *(*w)->raw(n), s = *(*w)->raw("layers.1.ffn.experts.2.w2.weight_scale");
    const float want = e2m1_to_f32(uint8_t(q.data<uint8_t>()[5 * 128 + 18] >> 4)) *
                       (e4m3_to_f32(s.data<uint8_t>()[5 * 16 + 2]) * 0.01f);
    EXPECT_EQ(f->data<float>()[5 * 256 + 37], want);
    EXPECT_EQ(*(*w)->format("layers.0.attn.wq_a.weight"), storage_format::FP8_BLOCK);
}

TEST(quant_weights, nvfp4_gate_up_scale_mismatch_is_refused_by_name) {
    model_config c = cfg(NVFP4_QC);
    for (const char *sfx : {"weight_scale_2", "input_scale"}) {
        temp_dir d;
        const std::string bad = std::string("layers.1.ffn.experts.2.w3.") + sfx;
        write(d.str(), c, {{bad, scalar(0.03f)}});
        auto w = weights::open(d.str(), c);
        ASSERT_TRUE(w.is_ok());
        Status st = (*w)->check();
        EXPECT_EQ(st.code(), status_code::CORRUPTION);
        EXPECT_NE(st.message().find("tensor " + bad + ": 0.03 differs from layers.1.ffn.experts.2.w1." + sfx),
                  std::string::npos)
            << st.message();
    }
}

TEST(quant_weights, nvfp4_missing_or_bad_companions) {
    model_config c = cfg(NVFP4_QC);
    temp_dir d;
    write(d.str(), c, {{"layers.0.ffn.experts.1.w1.weight_scale_2", scalar(-1.0f)}},
          {"layers.0.ffn.experts.0.w2.input_scale"});
    auto w = weights::open(d.str(), c);
    ASSERT_TRUE(w.is_ok());
    Status st = (*w)->check();
    EXPECT_FALSE(st.is_ok());
    ASSERT_EQ((*w)->report().missing.size(), 1u);
    EXPECT_EQ((*w)->report().missing[0], "layers.0.ffn.experts.0.w2.input_scale");
    // A negative global scale is caught where the linear is read.
    Result<Tensor> f = (*w)->f32("layers.0.ffn.experts.1.w1.weight");
    ASSERT_FALSE(f.is_ok());
    EXPECT_NE(f.status().message().find("layers.0.ffn.experts.1.w1.weight_scale_2"), std::string::npos);
}

TEST(quant_weights, exl3_checkpoint_checks_and_dequantizes) {
    model_config c = cfg(EXL3_QC);
    temp_dir d;
    // One tensor at K = 3: K is per tensor.
    std::mt19937 rng(5);
    Tensor k3 = fill({"t", dtype::I16, {16, 8, 48}}, rng);
    write(d.str(), c, {{"layers.0.ffn.experts.1.w2.trellis", k3}});
    auto w = weights::open(d.str(), c);
    ASSERT_TRUE(w.is_ok());
    Status st = (*w)->check();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE((*w)->report().unexpected.empty());
    for (const char *n : {"layers.0.ffn.experts.1.w2.weight", "layers.1.ffn.experts.0.w1.weight"}) {
        SCOPED_TRACE(n);
        EXPECT_EQ(*(*w)->format(n), storage_format::EXL3);
        Result<exl3_linear> l = (*w)->exl3(n);
        ASSERT_TRUE(l.is_ok()) << l.status().to_string();
        Result<Tensor> f = (*w)->f32(n);
        ASSERT_TRUE(f.is_ok()) << f.status().to_string();
        std::vector<float> win(size_t(l->in * l->out));
        exl3_dequantize(*l, win.data());
        ASSERT_EQ(f->shape(), (shape_t{l->out, l->in}));
        int bad = 0;
        for (int64_t i = 0; i < l->in; i++)
            for (int64_t o = 0; o < l->out; o++) bad += f->data<float>()[o * l->in + i] != win[size_t(i * l->out + o)];
        EXPECT_EQ(bad, 0);
    }
    EXPECT_EQ((*w)->exl3("layers.0.ffn.experts.1.w2.weight")->k, 3);
    EXPECT_EQ((*w)->exl3("layers.0.ffn.experts.1.w1.weight")->k, 2);
    EXPECT_EQ((*w)->exl3("layers.0.ffn.experts.1.w2.weight")->in, 256);
}

TEST(quant_weights, exl3_wrong_codebook_marker_and_bad_rotations) {
    model_config c = cfg(EXL3_QC);
    temp_dir d;
    Tensor mul1(dtype::I32, {});
    mul1.data_mut<int32_t>()[0] = -2082680531;
    Tensor suh(dtype::F16, {128});
    for (int i = 0; i < 128; i++) suh.data_mut<uint16_t>()[i] = 0x3c00;
    suh.data_mut<uint16_t>()[9] = 0x7c00;  // +inf
    write(d.str(), c, {{"layers.1.ffn.experts.0.w3.suh", suh}}, {},
          {{"layers.0.ffn.experts.2.w1.mul1", mul1}});
    auto w = weights::open(d.str(), c);
    ASSERT_TRUE(w.is_ok());
    Status st = (*w)->check();
    EXPECT_NE(st.message().find("tensor layers.0.ffn.experts.2.w1.mul1: present, but quantization_config.codebook is mcg"),
              std::string::npos)
        << st.message();
    Result<Tensor> f = (*w)->f32("layers.1.ffn.experts.0.w3.weight");
    ASSERT_FALSE(f.is_ok());
    EXPECT_NE(f.status().message().find("layers.1.ffn.experts.0.w3.suh[9]"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace ds41rt::model
