// The placement planner: routed-expert bytes per format and TP slice against the figures the
// specs publish, the state and weight charges against the specs' sizes, and the acceptance
// layouts of issue 5 (V4.1 Flash official, NVFP4 and EXL3 K2 on 1 H200, 2 H200, 1 GPU capped at
// 32 GiB with 2 workers, 2 GPUs with no workers), including the refusals and their shortfalls.
// Every golden names its source; none is a number this code printed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "dist/byte_size.h"
#include "dist/placement.h"
#include "model/catalog.h"
#include "model/flash_configs.h"

namespace ds41rt::dist {
namespace {

constexpr uint64_t GiB = 1ull << 30;

model::model_config v41() { return model::flash_config(model::arch::V41).value(); }
model::model_config v4() { return model::flash_config(model::arch::V4).value(); }

uint64_t slice(expert_format f, const model::model_config &c, int64_t width, int bits = 2) {
    auto b = layer_slice_bytes(f, c, width, bits);
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return b.is_ok() ? *b : 0;
}

// ---- routed-expert bytes ------------------------------------------------------------------------

// reference-system 1.3 and Appendix A; V4.1 spec 8.5.
TEST(placement_bytes, official_mxfp4_matches_the_reference_per_rank_figures) {
    const auto c = v41();
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 2304), 7219445760ull);  // per layer (V4.1 spec 8.5)
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 1152), 3609722880ull);  // TP2 per rank (ref 1.3)
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 768), 2406481920ull);   // TP3 per rank (ref 1.3)
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 384), 1203240960ull);   // TP6 per rank (ref 1.3)
    // TP4: one expert's TP4 slice is 4,700,160 B (ref Appendix A), so an unpadded rank holds
    // 384 x 4,700,160; the reference's 2,005,401,600 "padded" is the 576-wide slice stored at its
    // kernels' 640-wide extent (a multiple of 128 channels): 384 x 3 x 5120 x 640 x 17/32.
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 576), 384ull * 4700160ull);
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 640), 2005401600ull);
}

// The catalog describes the official release tensor by tensor; both must agree.
TEST(placement_bytes, official_formula_equals_the_catalog) {
    for (const auto &c : {v41(), v4()}) {
        uint64_t catalog = 0;
        for (const auto &e : model::build_catalog(c, model::catalog_scope::TEXT))
            if (e.layer == 3 && e.role == model::tensor_role::ROUTED_EXPERT)
                for (const auto &s : model::stored_tensors(e, c)) catalog += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
        EXPECT_EQ(slice(expert_format::OFFICIAL, c, c.moe_inter_dim), catalog) << model::arch_name(c.model_arch);
    }
}

// One expert of a layer: its three projections (the specs give per-projection figures).
model::model_config one_expert(model::model_config c) {
    c.n_routed_experts = 1;
    return c;
}

// quant-formats.md 1.14: 6,635,528 B per projection, 7,644,128,256 B per layer, 305.8 GB
// (284.8 GiB) for the 40 layers.
TEST(placement_bytes, nvfp4_matches_the_quant_spec) {
    const auto c = v41();
    EXPECT_EQ(slice(expert_format::NVFP4, one_expert(c), 2304), 3 * 6635528ull);  // w1, w3 [2304, 5120], w2 [5120, 2304]
    EXPECT_EQ(slice(expert_format::NVFP4, c, 2304), 7644128256ull);
    EXPECT_EQ(std::llround(40.0 * double(slice(expert_format::NVFP4, c, 2304)) / 1e8), 3058);          // 305.8 GB
    EXPECT_EQ(std::llround(40.0 * double(slice(expert_format::NVFP4, c, 2304)) / double(GiB) * 10), 2848);  // 284.8 GiB
}

// quant-formats.md 2.6: K=2 projection 2,949,120 trellis + 14,848 suh/svh + 4; expert 8,891,916;
// layer 3,414,495,744; 40 layers 127.2 GiB, K=3 190.5 GiB, K=4 253.8 GiB.
TEST(placement_bytes, exl3_matches_the_quant_spec) {
    const auto c = v41();
    EXPECT_EQ(slice(expert_format::EXL3, one_expert(c), 2304, 2), 3 * (2949120ull + 14848 + 4));
    EXPECT_EQ(slice(expert_format::EXL3, one_expert(c), 2304, 2), 8891916ull);
    EXPECT_EQ(slice(expert_format::EXL3, c, 2304, 2), 3414495744ull);
    EXPECT_EQ(std::llround(40.0 * double(slice(expert_format::EXL3, c, 2304, 2)) / double(GiB) * 10), 1272);
    EXPECT_EQ(std::llround(40.0 * double(slice(expert_format::EXL3, c, 2304, 3)) / double(GiB) * 10), 1905);
    EXPECT_EQ(std::llround(40.0 * double(slice(expert_format::EXL3, c, 2304, 4)) / double(GiB) * 10), 2538);
}

// The planner prices a slice with the model room's function: the full width is exactly
// model::expert_layer_bytes of that format (one source of storage bytes).
TEST(placement_bytes, full_width_is_the_model_rooms_figure) {
    auto c = v41();
    c.exl3_bits = 3;
    EXPECT_EQ(slice(expert_format::OFFICIAL, c, 2304), model::expert_layer_bytes(c, model::storage_format::MXFP4));
    EXPECT_EQ(slice(expert_format::NVFP4, c, 2304), model::expert_layer_bytes(c, model::storage_format::NVFP4));
    EXPECT_EQ(slice(expert_format::EXL3, c, 2304, 3), model::expert_layer_bytes(c, model::storage_format::EXL3));
    EXPECT_EQ(expert_slice_align(c, expert_format::OFFICIAL), 32);
    EXPECT_EQ(expert_slice_align(c, expert_format::NVFP4), 16);
    EXPECT_EQ(expert_slice_align(c, expert_format::EXL3), 128);
}

TEST(placement_bytes, formats_refuse_slices_that_break_their_blocks) {
    const auto c = v41();
    EXPECT_FALSE(layer_slice_bytes(expert_format::EXL3, c, 576, 2).is_ok());  // TP4 576 is not 128-aligned
    EXPECT_FALSE(layer_slice_bytes(expert_format::NVFP4, c, 24, 0).is_ok());
    EXPECT_FALSE(layer_slice_bytes(expert_format::OFFICIAL, c, 48, 0).is_ok());
    EXPECT_FALSE(layer_slice_bytes(expert_format::EXL3, c, 2304, 9).is_ok());
    EXPECT_FALSE(layer_slice_bytes(expert_format::OFFICIAL, c, 2336, 0).is_ok());  // wider than the layer
}

// The publication comes from the model room's reading of config.json (model/quant_config);
// quant-formats.md 1.2 (nvidia NVFP4 snapshot) and 2.2 (diffbot EXL3 snapshot).
TEST(placement_bytes, model_source_takes_the_format_from_the_config) {
    const std::string dir = ::testing::TempDir() + "/placement_model_source";
    std::filesystem::create_directories(dir);
    const nlohmann::json official = nlohmann::json::parse(model::flash_config_json(model::arch::V41));
    auto write = [&](const nlohmann::json &qc) {
        nlohmann::json j = official;
        j["quantization_config"] = qc;
        std::ofstream(dir + "/config.json") << j.dump();
        return load_model_source(dir);
    };
    const nlohmann::json off_qc = official.at("quantization_config");
    nlohmann::json nv_qc = off_qc;
    nv_qc["moe_quant_algo"] = "NVFP4";
    nlohmann::json backbone = off_qc;
    backbone["quant_method"] = "deepseek_v4_fp8";
    const nlohmann::json ex_qc = {{"quant_method", "exl3"}, {"bits", 3}, {"codebook", "mcg"}, {"mtp_experts", "source"},
                                  {"non_routed_quantization", backbone}};
    auto nv = write(nv_qc);
    ASSERT_TRUE(nv.is_ok()) << nv.status().to_string();
    EXPECT_EQ(nv->format, expert_format::NVFP4);
    auto ex = write(ex_qc);
    ASSERT_TRUE(ex.is_ok()) << ex.status().to_string();
    EXPECT_EQ(ex->format, expert_format::EXL3);
    EXPECT_EQ(ex->exl3_bits, 3);
    EXPECT_EQ(ex->config.quant_method, "fp8");  // non-expert tensors priced in the official storage
    auto off = write(off_qc);
    ASSERT_TRUE(off.is_ok()) << off.status().to_string();
    EXPECT_EQ(off->format, expert_format::OFFICIAL);
    EXPECT_FALSE(write({{"quant_method", "modelopt"}}).is_ok());  // a publication we do not run
}

// ---- state and weight charges ---------------------------------------------------------------

// V4.1 spec 7 / reference-system 3: 890 B per token, a 512-token page group of 455,680 B;
// window rings 40 x 128 x 528 B (2.70 MB); DSpark rings 203 KB.
TEST(placement_charges, v41_state_matches_the_spec) {
    const auto c = v41();
    uint64_t page = 0, window = 0;
    for (int l = 0; l < c.n_layers; l++) {
        auto s = layer_state_bytes(c, l, KV_PAGE_TOKENS);
        page += s.compressed + s.index_keys;
        window += s.window;
    }
    EXPECT_EQ(page, 455680ull);
    EXPECT_EQ(window, 2703360ull);
    EXPECT_EQ(drafter_state_bytes(c), 202752ull);
    EXPECT_EQ(kv_tokens(1), 512);
    EXPECT_EQ(kv_tokens(1048576), 1048576);
}

// V4 spec 4: 21 (584 + 68) / 4 + 20 x 584 / 128 = 3,514.25 B per token; rings 44 x 128 x 584 B
// (~3.1 MiB with the MTP layer); compressor states 21 x 80 KiB + 20 x 512 KiB (~11.6 MiB).
TEST(placement_charges, v4_state_matches_the_spec) {
    const auto c = v4();
    uint64_t grow = 0, window = 0, carry = 0;
    for (int l = 0; l < c.n_layers; l++) {
        auto s = layer_state_bytes(c, l, 1048576);
        grow += s.compressed + s.index_keys;
        window += s.window;
        carry += s.carry;
    }
    EXPECT_EQ(grow, 3514ull * 1048576 + 1048576 / 4);
    EXPECT_EQ(window + drafter_state_bytes(c), 44ull * 128 * 584);
    EXPECT_EQ(carry, 21ull * 80 * 1024 + 20ull * 512 * 1024);
}

placement_input h200s(int gpus, int workers, expert_format f) {
    placement_input in;
    in.config = v41();
    in.format = f;
    in.exl3_bits = 2;
    in.gpu_budgets.assign(size_t(gpus), DEFAULT_GPU_BUDGET);
    for (int i = 0; i < workers; i++) in.workers.push_back({"127.0.0.1:" + std::to_string(19441 + i), 0, DEFAULT_GPU_BUDGET});
    return in;
}

uint64_t charge(const DeviceBudget &b, const std::string &k) {
    auto it = b.charges.find(k);
    return it == b.charges.end() ? 0 : it->second;
}

uint64_t sum_charges(const placement &p, const std::string &k) {
    uint64_t s = 0;
    for (const auto &d : p.plan.coordinator) s += charge(d, k);
    for (const auto &w : p.plan.workers) s += charge(w.budget, k);
    return s;
}

// The catalog partition: every byte of the release is charged somewhere (or left mapped on the
// host) exactly once. V4.1 spec 8.1: 510,286,023,000 B in all; 8.5: DSpark 7.93 GB; 8.1:
// Engram tables 202.76 GB.
TEST(placement_charges, every_weight_of_the_release_is_charged_once) {
    auto p = place(h200s(2, 2, expert_format::OFFICIAL));
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    // Workers hold TP slices (and replicate per-tensor extras); count every layer at full width.
    const uint64_t experts = uint64_t(p->plan.layers.size()) * p->full_layer_bytes;
    const uint64_t total = experts + sum_charges(*p, "weights.dense") + sum_charges(*p, "weights.embed") +
                           sum_charges(*p, "weights.head") + sum_charges(*p, "weights.vision") +
                           sum_charges(*p, "weights.drafter") + p->host_mapped_bytes;
    EXPECT_EQ(total, 510286023000ull);
    EXPECT_EQ(std::llround(double(sum_charges(*p, "weights.drafter")) / 1e7), 793);  // 7.93 GB
    EXPECT_EQ(std::llround(double(p->host_mapped_bytes) / 1e7), 20276);             // 202.76 GB
    EXPECT_EQ(sum_charges(*p, "weights.engram"), 0u);
    // The same tables on the device move into a GPU budget (and do not fit next to the rest).
    placement_input dev = h200s(2, 2, expert_format::OFFICIAL);
    dev.engram_on_device = true;
    auto q = place(dev);
    ASSERT_FALSE(q.is_ok());
    EXPECT_NE(q.status().message().find("weights.engram"), std::string::npos);
}

// Headroom follows the concurrency (reference-system 6.1: a fixed 2 GiB broke at C16).
TEST(placement_charges, headroom_grows_with_concurrency) {
    placement_input a = h200s(1, 2, expert_format::OFFICIAL), b = a;
    a.load.concurrency = 1;
    b.load.concurrency = 16;
    auto pa = place(a), pb = place(b);
    ASSERT_TRUE(pa.is_ok() && pb.is_ok());
    const uint64_t ha = charge(pa->plan.coordinator[0], "headroom"), hb = charge(pb->plan.coordinator[0], "headroom");
    EXPECT_GE(hb, ha + 15 * 64 * (1ull << 20));
    EXPECT_GT(charge(pb->plan.coordinator[0], "request"), charge(pa->plan.coordinator[0], "request"));
    EXPECT_GT(charge(pb->plan.coordinator[0], "kv.compressed"), charge(pa->plan.coordinator[0], "kv.compressed"));
}

// ---- acceptance layouts (issue 5) -----------------------------------------------------------------

void expect_complete(const placement &p, int local_expected_min) {
    ASSERT_EQ(int(p.plan.layers.size()), 40);
    int local = 0;
    for (const auto &l : p.plan.layers) local += !l.remote;
    EXPECT_GE(local, local_expected_min);
    for (int i = 0; i + 1 < 40; i++)  // bottom-up: no local layer above a remote one
        EXPECT_FALSE(p.plan.layers[size_t(i)].remote && !p.plan.layers[size_t(i) + 1].remote);
    EXPECT_TRUE(validate(p.plan).is_ok());
    auto back = parse_plan(to_json(p.plan));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->version(), p.plan.version());
}

int local_layers(const placement &p) {
    int n = 0;
    for (const auto &l : p.plan.layers) n += !l.remote;
    return n;
}

TEST(placement_layouts, one_h200_with_two_workers) {
    for (auto f : {expert_format::OFFICIAL, expert_format::NVFP4, expert_format::EXL3}) {
        auto p = place(h200s(1, 2, f));
        ASSERT_TRUE(p.is_ok()) << model::expert_quant_name(f) << ": " << p.status().to_string();
        expect_complete(*p, 1);
        // The GPU's free space is smaller than one more layer: nothing is left unused.
        const auto &g = p->plan.coordinator[0];
        EXPECT_LT(g.budget_bytes - g.charged(), p->full_layer_bytes) << model::expert_quant_name(f);
        for (const auto &r : p->ranks) EXPECT_EQ(r.slice.width(), 1152);
    }
    auto official = place(h200s(1, 2, expert_format::OFFICIAL));
    EXPECT_EQ(official->ranks[0].layer_bytes, 3609722880ull);  // ref 1.3 TP2 per rank
}

TEST(placement_layouts, two_h200_with_two_workers_fill_bottom_up) {
    for (auto f : {expert_format::OFFICIAL, expert_format::NVFP4, expert_format::EXL3}) {
        auto one = place(h200s(1, 2, f));
        auto two = place(h200s(2, 2, f));
        ASSERT_TRUE(two.is_ok()) << model::expert_quant_name(f) << ": " << two.status().to_string();
        expect_complete(*two, local_layers(*one) + 1);
        int last_device = 0;
        for (const auto &l : two->plan.layers) {
            if (l.remote) break;
            EXPECT_GE(l.local_device, last_device);
            last_device = l.local_device;
        }
        EXPECT_EQ(two->dense_owner[19], 0);
        EXPECT_EQ(two->dense_owner[20], 1);
        EXPECT_EQ(charge(two->plan.coordinator[0], "weights.drafter"), 0u);
        EXPECT_GT(charge(two->plan.coordinator[1], "weights.drafter"), 0u);
    }
    // EXL3 K2 experts (127.2 GiB) fit on two H200s next to everything else: nothing is remote,
    // and each layer's experts sit with its attention (layers 0-19 on gpu0, 20-39 on gpu1).
    auto exl3 = place(h200s(2, 2, expert_format::EXL3));
    EXPECT_EQ(local_layers(*exl3), 40);
    for (const auto &l : exl3->plan.layers) EXPECT_EQ(l.local_device, l.layer < 20 ? 0 : 1) << l.layer;
    EXPECT_TRUE(exl3->ranks[0].layers.empty());
}

// The compact profile: one GPU capped at 32 GiB (34.36 GB, reference-system 4.4), 2 workers.
placement_input compact(expert_format f, uint64_t worker_budget) {
    placement_input in = h200s(1, 0, f);
    in.gpu_budgets = {32 * GiB};
    in.load.context = 65536;
    in.load.concurrency = 4;
    in.load.prefill_batch = 256;  // the reference's compact profile caps prefill at 256 (4.4)
    for (int i = 0; i < 2; i++) in.workers.push_back({"10.0.0." + std::to_string(2 + i) + ":19441", 0, worker_budget});
    return in;
}

double shortfall_gib(const std::string &msg);

TEST(placement_layouts, compact_32gib_gpu_with_two_workers) {
    for (auto f : {expert_format::OFFICIAL, expert_format::EXL3}) {
        auto p = place(compact(f, DEFAULT_GPU_BUDGET));
        ASSERT_TRUE(p.is_ok()) << model::expert_quant_name(f) << ": " << p.status().to_string();
        expect_complete(*p, 1);
        EXPECT_LE(p->plan.coordinator[0].charged(), 32 * GiB);
    }
    // EXL3 K2 puts its first layers on the GPU, as the reference's compact profile does (4.4).
    auto exl3 = place(compact(expert_format::EXL3, DEFAULT_GPU_BUDGET));
    EXPECT_GE(local_layers(*exl3), 1);
    // NVFP4: one layer (7.12 GiB) fits on the GPU; TP2 halves of the other 39 are
    // 39 x 7,644,128,256 / 2 B (quant-formats 1.14) = 0.02 GiB over an H200 budget before any
    // other charge, so both workers are refused, short by a little more than that.
    auto nv = place(compact(expert_format::NVFP4, DEFAULT_GPU_BUDGET));
    ASSERT_FALSE(nv.is_ok());
    const double weights_over = (39.0 * 7644128256.0 / 2 - double(DEFAULT_GPU_BUDGET)) / double(GiB);
    const double s = shortfall_gib(nv.status().message());
    EXPECT_GT(s, weights_over) << nv.status().message();
    EXPECT_LT(s, weights_over + 2.0) << nv.status().message();
    EXPECT_NE(nv.status().message().find("worker1"), std::string::npos);
    // Three workers at TP3 hold it.
    placement_input three = compact(expert_format::NVFP4, DEFAULT_GPU_BUDGET);
    three.workers.push_back({"10.0.0.4:19441", 0, DEFAULT_GPU_BUDGET});
    auto p3 = place(three);
    ASSERT_TRUE(p3.is_ok()) << p3.status().to_string();
    EXPECT_EQ(p3->ranks[2].slice.width(), 768);
}

// Refusals say who does not fit and by how much, in GiB with two decimals.
double shortfall_gib(const std::string &msg) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(msg, m, std::regex(R"(short by (\d+\.\d\d) GiB)"))) << msg;
    return m.empty() ? -1 : std::stod(m[1]);
}

TEST(placement_layouts, two_gpus_without_workers) {
    // EXL3 K2: all 40 layers on the pair (the reference's "2x6000 0-spark" layout, ref 1.3).
    auto exl3 = place(h200s(2, 0, expert_format::EXL3));
    ASSERT_TRUE(exl3.is_ok()) << exl3.status().to_string();
    expect_complete(*exl3, 40);
    // Official and NVFP4 experts alone (288.8 GB, V4.1 spec 8.5; 305.8 GB, quant-formats 1.14)
    // outgrow two H200 budgets: refused, with the shortfall at least what the experts, the
    // drafter (7.93 GB) and the rest of the weights exceed the budgets by.
    for (auto f : {expert_format::OFFICIAL, expert_format::NVFP4}) {
        auto p = place(h200s(2, 0, f));
        ASSERT_FALSE(p.is_ok()) << model::expert_quant_name(f);
        const std::string msg = p.status().message();
        EXPECT_EQ(msg.rfind("infeasible:", 0), 0u) << msg;
        EXPECT_NE(msg.find("there are no workers"), std::string::npos) << msg;
        const double experts = 40.0 * double(f == expert_format::OFFICIAL ? 7219445760ull : 7644128256ull);
        const double weights = experts + 7.93e9 + (510286023000.0 - 202.76e9 - 7.93e9 - 40 * 7219445760.0);
        const double lower = (weights - 2.0 * double(DEFAULT_GPU_BUDGET)) / double(GiB);
        const double s = shortfall_gib(msg);
        EXPECT_GT(s, lower) << msg;
        EXPECT_LT(s, lower + 20.0) << msg;  // the non-weight charges of two GPUs stay far below 20 GiB
    }
}

TEST(placement_layouts, infeasible_plans_are_refused_with_the_shortfall) {
    // One H200 and no workers: EXL3 K2's 127.2 GiB of experts plus the rest do not fit.
    auto one = place(h200s(1, 0, expert_format::EXL3));
    ASSERT_FALSE(one.is_ok());
    EXPECT_GT(shortfall_gib(one.status().message()), 0.0);
    // The compact GPU (layer 0 local) with 128 GiB workers: official TP2 slices of layers 1-39
    // are 39 x 3,609,722,880 B (ref 1.3) = 131.11 GiB > 128 GiB, so each worker is short by
    // more than 3.11 GiB.
    auto p = place(compact(expert_format::OFFICIAL, 128 * GiB));
    ASSERT_FALSE(p.is_ok());
    const std::string msg = p.status().message();
    EXPECT_NE(msg.find("worker0 (10.0.0.2:19441, budget 128.00 GiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("worker1"), std::string::npos) << msg;
    const double slices = 39.0 * 3609722880.0 / double(GiB) - 128.0;
    EXPECT_GT(shortfall_gib(msg), slices) << msg;
    EXPECT_LT(shortfall_gib(msg), slices + 2.0) << msg;
    // A GPU too small for the fixed charges alone.
    placement_input tiny = h200s(1, 2, expert_format::OFFICIAL);
    tiny.gpu_budgets = {8 * GiB};
    auto t = place(tiny);
    ASSERT_FALSE(t.is_ok());
    EXPECT_NE(t.status().message().find("gpu0 (budget 8.00 GiB) is charged"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("before any routed expert"), std::string::npos);
}

TEST(placement_layouts, worker_groups_take_contiguous_layer_runs) {
    placement_input in = h200s(1, 4, expert_format::EXL3);
    in.tp = 2;
    in.max_local_layers = 4;
    auto p = place(in);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->plan.layers[4].ranks, (std::vector<int>{0, 1}));
    EXPECT_EQ(p->plan.layers[21].ranks, (std::vector<int>{0, 1}));  // 36 remote layers: 18 + 18
    EXPECT_EQ(p->plan.layers[22].ranks, (std::vector<int>{2, 3}));
    EXPECT_EQ(p->ranks[3].layers.size(), 18u);
    in.tp = 3;
    EXPECT_NE(place(in).status().message().find("cannot form groups of TP 3"), std::string::npos);
}

// EXL3 TP4 cuts the 18 Hadamard blocks 5/5/4/4 (ref 1.3: 640/640/512/512); official TP4 at the
// reference's kernel extent reproduces its padded per-rank figure.
TEST(placement_layouts, tp4_slices_per_format) {
    placement_input in = h200s(1, 4, expert_format::EXL3);
    in.max_local_layers = 0;
    auto p = place(in);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    std::vector<int> widths;
    for (const auto &r : p->ranks) widths.push_back(r.padded_width);
    EXPECT_EQ(widths, (std::vector<int>{640, 640, 512, 512}));
    in.format = expert_format::OFFICIAL;
    in.kernel_extent = 128;
    auto q = place(in);
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    for (const auto &r : q->ranks) EXPECT_EQ(r.layer_bytes, 2005401600ull);
}

TEST(placement_layouts, deterministic_and_v4_plans_too) {
    auto a = place(h200s(2, 2, expert_format::NVFP4)), b = place(h200s(2, 2, expert_format::NVFP4));
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(to_json(a->plan), to_json(b->plan));
    placement_input in = h200s(1, 2, expert_format::OFFICIAL);
    in.config = v4();
    auto p = place(in);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->plan.model_type, "deepseek_v4");
    EXPECT_EQ(int(p->plan.layers.size()), 43);
    EXPECT_EQ(p->draft_tokens, 1);
}

// A CPU coordinator with CPU workers and every layer remote: the CI topology of issue 5. The
// tiny V4 fixture's 128-wide expert intermediate splits into 32-channel MXFP4 blocks; the tiny
// V4.1 fixture's 32 is a single block, so TP2 must be refused with the reason.
TEST(placement_layouts, cpu_coordinator_and_cpu_workers_on_a_tiny_model) {
    for (const char *name : {"deepseek-v4-flash-quant", "deepseek-v41-flash-quant"}) {
        auto src = load_model_source(std::string(DS41RT_FIXTURES_DIR) + "/" + name);
        ASSERT_TRUE(src.is_ok()) << src.status().to_string();
        placement_input in;
        in.config = src->config;
        in.cpu_coordinator = true;
        in.max_local_layers = 0;
        in.workers = {{"127.0.0.1:19441", -1, 0}, {"127.0.0.1:19442", -1, 0}};
        auto p = place(in);
        if (in.config.moe_inter_dim < 64) {
            ASSERT_FALSE(p.is_ok()) << name;
            EXPECT_NE(p.status().message().find("cannot be split over TP2"), std::string::npos) << p.status().message();
            continue;
        }
        ASSERT_TRUE(p.is_ok()) << p.status().to_string();
        for (const auto &l : p->plan.layers) EXPECT_EQ(l.ranks, (std::vector<int>{0, 1}));
        EXPECT_EQ(p->ranks[0].slice.width(), in.config.moe_inter_dim / 2);
        EXPECT_EQ(charge(p->plan.workers[0].budget, "runtime"), 0u);
        EXPECT_EQ(p->plan.coordinator[0].name, "cpu");
        in.max_local_layers = -1;
        in.workers.clear();
        auto all_local = place(in);  // an unchecked CPU budget holds every layer
        ASSERT_TRUE(all_local.is_ok()) << all_local.status().to_string();
        EXPECT_EQ(local_layers(*all_local), in.config.n_layers);
    }
}

TEST(placement_sizes, parse_and_format) {
    EXPECT_EQ(*parse_size("32GiB"), 32 * GiB);
    EXPECT_EQ(*parse_size("141GB"), 141000000000ull);
    EXPECT_EQ(*parse_size("1.5 tib"), 3 * (1ull << 39));
    EXPECT_EQ(*parse_size("4096"), 4096u);
    EXPECT_FALSE(parse_size("32 GiBs").is_ok());
    EXPECT_FALSE(parse_size("GiB").is_ok());
    EXPECT_FALSE(parse_size("1.2.3GB").is_ok());
    EXPECT_EQ(format_size(17), "17 B");
    EXPECT_EQ(format_size(3 * GiB / 2), "1.50 GiB");
    EXPECT_EQ(format_gib(GiB / 100 * 31), "0.31 GiB");
}

TEST(placement_model, builtin_configs_reproduce_the_release_totals) {
    // V4.1 spec 8.1 and V4 spec 5.
    auto a = v41(), b = v4();
    auto ta = model::totals(model::build_catalog(a, model::catalog_scope::ALL), a);
    auto tb = model::totals(model::build_catalog(b, model::catalog_scope::ALL), b);
    EXPECT_EQ(ta.tensors, 96085u);
    EXPECT_EQ(ta.bytes, 510286023000ull);
    EXPECT_EQ(tb.tensors, 69187u);
    EXPECT_EQ(tb.bytes, 159609485896ull);
    EXPECT_FALSE(builtin_model_source("deepseek_v5").is_ok());
}

}  // namespace
}  // namespace ds41rt::dist
