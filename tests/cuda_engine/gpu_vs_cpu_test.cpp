// The GPU engine against the CPU reference engine on the V4.1 and V4 fixtures stored as the
// official checkpoint (FP8 blocks + MXFP4 experts), in both numerics (issue 4's acceptance):
//  - TRANSFORMERS: prompt logits at every position within 1e-3 relative (||a-b|| / ||b||) of the
//    CPU engine's (5e-3 where the cache QATs are on, see below), and the same 16-token greedy
//    continuation. The two engines share every rounding
//    point; what differs is fp32 summation order (GEMV tiles, warp butterflies vs fp64 sums), so
//    the distance is ~1e-6 unless a cache-QAT code flips (a value within fp32 noise of an FP8 /
//    FP4 rounding boundary), which moves logits by ~1e-3 (see engine_fixture_test.cpp).
//  - OFFICIAL: the same run, distance and continuation printed; asserted: finite logits and the
//    same greedy continuation for the QAT-free fixtures. bf16 rounding points amplify summation-
//    order differences (a 1-ulp bf16 flip is 0.4% of an element), so there is no tight bound to
//    promise; the engine-core issue set none for OFFICIAL either (reported, not asserted).
// V4's TRANSFORMERS numerics simulate no cache quantization (transformers' deepseek_v4 has none),
// so its quant fixture counts as QAT-free: 1e-3 and identical greedy tokens in TRANSFORMERS,
// identical greedy tokens in OFFICIAL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "engine/engine.h"
#include "io/safetensors.h"

using namespace ds41rt;
namespace fs = std::filesystem;

namespace {

double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

int32_t argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return int32_t(best);
}

struct run_result {
    Tensor prefill;
    std::vector<int32_t> greedy;
    std::vector<Tensor> decode;
};

run_result run(engine::engine &eng, const std::vector<int32_t> &prompt, int steps) {
    run_result r;
    const int64_t V = eng.config().vocab_size;
    engine::seq_id s = eng.create_sequence();
    std::vector<Tensor> out;
    EXPECT_TRUE(eng.step({{s, prompt}}, &out).is_ok());
    if (out.empty()) return r;
    r.prefill = out[0];
    r.greedy.push_back(argmax(r.prefill.data<float>() + (r.prefill.dim(0) - 1) * V, V));
    for (int i = 0; i < steps; i++) {
        Status st = eng.step({{s, {r.greedy.back()}}}, &out);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        if (!st.is_ok()) break;
        r.decode.push_back(out[0]);
        r.greedy.push_back(argmax(out[0].data<float>(), V));
    }
    eng.free_sequence(s);
    return r;
}

struct gpu_case {
    std::string fixture;
    engine::numerics mode;
};

class GpuVsCpu : public ::testing::TestWithParam<gpu_case> {};

// A fixture's GPU and CPU engines in one numerics mode, and its prompt. `skip` says why the GPU
// engine cannot run here (no device, an unsupported format); failures to open are test failures.
struct engine_pair {
    std::unique_ptr<engine::engine> gpu, cpu;
    std::vector<int32_t> prompt;
    std::string skip;
};

// The fixture's recorded prompt (expected.safetensors "prompt.ids"); empty, with a failure, if absent.
std::vector<int32_t> fixture_prompt(const fs::path &dir) {
    auto ef = io::safetensors_file::open((dir / "expected.safetensors").string());
    EXPECT_TRUE(ef.is_ok());
    if (!ef) return {};
    Tensor ids = ef.value()->get("prompt.ids").value();
    return std::vector<int32_t>(ids.data<int64_t>(), ids.data<int64_t>() + ids.numel());
}

engine_pair open_pair(const fs::path &dir, engine::numerics mode) {
    engine_pair p;
    engine::engine_options go, co;
    go.mode = co.mode = mode;
    go.backend = engine::backend_kind::CUDA;
    auto gpu = engine::engine::open(dir.string(), go);
    if (!gpu && (gpu.status().code() == status_code::UNAVAILABLE || gpu.status().code() == status_code::NOT_SUPPORTED)) {
        p.skip = gpu.status().to_string();
        return p;
    }
    auto cpu = engine::engine::open(dir.string(), co);
    EXPECT_TRUE(gpu.is_ok()) << gpu.status().to_string();
    EXPECT_TRUE(cpu.is_ok()) << cpu.status().to_string();
    if (!gpu || !cpu) return p;
    p.prompt = fixture_prompt(dir);
    if (p.prompt.empty()) return p;
    p.gpu = std::move(gpu.value()), p.cpu = std::move(cpu.value());
    return p;
}

TEST_P(GpuVsCpu, PrefillAndGreedyDecode) {
    const fs::path dir = fs::path(DS41RT_FIXTURES_DIR) / GetParam().fixture;
    const bool official = GetParam().mode == engine::numerics::OFFICIAL;
    // V4: transformers 5.24's deepseek_v4 simulates no cache quantization (v4_model.cpp, deviations 1-2).
    const bool v4 = GetParam().fixture.rfind("deepseek-v4-", 0) == 0;
    const bool qat = !v4 && GetParam().fixture.find("noqat") == std::string::npos;
    engine_pair e = open_pair(dir, GetParam().mode);
    if (!e.skip.empty()) GTEST_SKIP() << e.skip;
    ASSERT_TRUE(e.gpu && e.cpu);
    const int steps = 16;
    const int64_t V = e.cpu->config().vocab_size, T = int64_t(e.prompt.size());

    run_result g = run(*e.gpu, e.prompt, steps), c = run(*e.cpu, e.prompt, steps);
    ASSERT_EQ(g.prefill.dim(0), T);
    double worst = 0;
    int64_t worst_pos = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *gp = g.prefill.data<float>() + t * V, *cp = c.prefill.data<float>() + t * V;
        for (int64_t i = 0; i < V; i++) ASSERT_TRUE(std::isfinite(gp[i])) << "position " << t;
        const double e = rel_err(gp, cp, V);
        if (e > worst) worst = e, worst_pos = t;
    }
    double worst_dec = 0;
    for (size_t i = 0; i < std::min(g.decode.size(), c.decode.size()); i++)
        worst_dec = std::max(worst_dec, rel_err(g.decode[i].data<float>(), c.decode[i].data<float>(), V));
    size_t same = 0;
    while (same < std::min(g.greedy.size(), c.greedy.size()) && g.greedy[same] == c.greedy[same]) same++;
    std::printf("    [gpu vs cpu] %s %s: prefill %lld positions, max rel err %.3g (position %lld); decode max rel "
                "err %.3g; greedy identical for %zu/%zu tokens\n",
                GetParam().fixture.c_str(), official ? "official" : "transformers", (long long)T, worst,
                (long long)worst_pos, worst_dec, same, c.greedy.size());
    if (!official) {
        // 1e-3 is the bound; a QAT code flip alone moves logits by ~1e-3, so the QAT
        // fixture gets the engine fixture test's QAT_FLIP_LIMIT (5e-3) with identical greedy tokens.
        const double limit = qat ? 5e-3 : 1e-3;
        EXPECT_LE(worst, limit);
        EXPECT_LE(worst_dec, limit);
        EXPECT_EQ(g.greedy, c.greedy);
    } else if (!qat) {
        EXPECT_EQ(g.greedy, c.greedy);
    }
}

// OFFICIAL prefill with env var `var` = `value` while the GPU engine runs, against the CPU engine:
// the same greedy continuation on the QAT-free fixtures, and prompt logits as close as the
// default paths' (another fp32 summation order, the same rounding points: ~1e-7 here).
void official_prefill_with(const std::string &fixture, const char *var, const char *value, const char *what) {
    struct env_guard {
        const char *v;
        env_guard(const char *var, const char *value) : v(var) { setenv(var, value, 1); }
        ~env_guard() { unsetenv(v); }
    } guard(var, value);
    const fs::path dir = fs::path(DS41RT_FIXTURES_DIR) / fixture;
    const bool v4 = fixture.rfind("deepseek-v4-", 0) == 0;
    const bool qat = !v4 && fixture.find("noqat") == std::string::npos;
    engine_pair e = open_pair(dir, engine::numerics::OFFICIAL);
    if (!e.skip.empty()) GTEST_SKIP() << e.skip;
    ASSERT_TRUE(e.gpu && e.cpu);
    const int64_t V = e.cpu->config().vocab_size, T = int64_t(e.prompt.size());
    ASSERT_GT(T, 16) << "the prompt must be longer than a GEMV piece for the prefill paths to differ";
    run_result g = run(*e.gpu, e.prompt, 16), c = run(*e.cpu, e.prompt, 16);
    ASSERT_EQ(g.prefill.dim(0), T);
    double worst = 0;
    for (int64_t t = 0; t < T; t++)
        worst = std::max(worst, rel_err(g.prefill.data<float>() + t * V, c.prefill.data<float>() + t * V, V));
    std::printf("    [%s vs cpu] %s official: prefill %lld positions, max rel err %.3g\n", what, fixture.c_str(),
                (long long)T, worst);
    EXPECT_LE(worst, 1e-5);
    if (!qat) {
        EXPECT_EQ(g.greedy, c.greedy);
    }
}

// The routed experts as grouped GEMMs (routed_prefill takes them from 48 rows an expert;
// DS41RT_GROUPED_MIN_ROWS=1 makes the fixtures' few rows take them too).
TEST_P(GpuVsCpu, OfficialPrefillWithGroupedExperts) {
    if (GetParam().mode != engine::numerics::OFFICIAL) GTEST_SKIP() << "grouped experts serve official numerics";
    official_prefill_with(GetParam().fixture, "DS41RT_GROUPED_MIN_ROWS", "1", "grouped experts");
}

// The dense FP8 products on the tensor-core GEMM whatever its tiles (device_model::takes_gemm
// leaves a short chunk's few-tile products to the GEMV pieces, which the fixtures' narrow
// weights always are; DS41RT_PREFILL_GEMV_MAX_M=16 gives every prefill product the GEMM).
TEST_P(GpuVsCpu, OfficialPrefillWithDenseGemms) {
    if (GetParam().mode != engine::numerics::OFFICIAL) GTEST_SKIP() << "the GEMM serves official numerics";
    official_prefill_with(GetParam().fixture, "DS41RT_PREFILL_GEMV_MAX_M", "16", "dense gemms");
}

// The index keys stored as fp32 rows (DS41RT_PACKED_INDEX_KEYS=0; by default FP4 records wherever
// index_head_dim is whole blocks of 32: the V4.1 QAT fixture's 32-channel keys and V4's 128, while
// the other V4.1 fixtures' 40 keep fp32 rows), so both stores meet the CPU on those fixtures: the
// same bits either way, since every key is FP4-quantized before it is stored.
TEST_P(GpuVsCpu, OfficialPrefillWithFp32IndexKeys) {
    if (GetParam().mode != engine::numerics::OFFICIAL) GTEST_SKIP() << "official_prefill_with runs official numerics";
    official_prefill_with(GetParam().fixture, "DS41RT_PACKED_INDEX_KEYS", "0", "fp32 index keys");
}

// The window rings and compressed entries stored as packed records (DS41RT_PACKED_KV=1) against
// fp32 rows (=0): every stored value is on its format's grid already, so the GPU engine's prompt
// logits and 16 decode steps agree bit for bit. V4.1 (FP8 + E8M0 rows, FP4 + E4M3 entries), both
// numerics: only the QAT fixture (head_dim 64) packs anything. V4 (FP8 + E8M0 per 64 with a bf16
// rope tail, rows and entries alike): official numerics only (TRANSFORMERS leaves them
// unquantized). The others would compare fp32 with fp32, so they skip.
TEST_P(GpuVsCpu, PackedKvGivesTheBitsOfFp32Rows) {
    const std::string &fx = GetParam().fixture;
    const bool v4 = fx.rfind("deepseek-v4-", 0) == 0;
    if (v4 ? GetParam().mode != engine::numerics::OFFICIAL : fx.find("noqat") != std::string::npos)
        GTEST_SKIP() << "no packed KV here (V4 TRANSFORMERS, or head_dim 40: unquantized rows)";
    const fs::path dir = fs::path(DS41RT_FIXTURES_DIR) / fx;
    engine::engine_options go;
    go.mode = GetParam().mode;
    go.backend = engine::backend_kind::CUDA;
    auto open_with = [&](const char *packed) {
        setenv("DS41RT_PACKED_KV", packed, 1);  // read when the engine is made
        auto e = engine::engine::open(dir.string(), go);
        unsetenv("DS41RT_PACKED_KV");
        return e;
    };
    auto packed = open_with("1");
    if (!packed && (packed.status().code() == status_code::UNAVAILABLE ||
                    packed.status().code() == status_code::NOT_SUPPORTED))
        GTEST_SKIP() << packed.status().to_string();
    auto plain = open_with("0");
    ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
    ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
    const std::vector<int32_t> prompt = fixture_prompt(dir);
    ASSERT_FALSE(prompt.empty());
    const run_result a = run(*packed.value(), prompt, 16), b = run(*plain.value(), prompt, 16);
    auto mismatches = [](const Tensor &x, const Tensor &y) {
        EXPECT_EQ(x.numel(), y.numel());
        size_t bad = 0;
        for (int64_t i = 0; i < std::min(x.numel(), y.numel()); i++)
            bad += std::memcmp(x.data<float>() + i, y.data<float>() + i, sizeof(float)) != 0;
        return bad;
    };
    size_t bad = mismatches(a.prefill, b.prefill);
    ASSERT_EQ(a.decode.size(), b.decode.size());
    for (size_t i = 0; i < a.decode.size(); i++) bad += mismatches(a.decode[i], b.decode[i]);
    std::printf("    [packed kv vs fp32 rows] %s %s: %lld prompt positions + %zu decode steps, %zu logits differ\n",
                fx.c_str(), GetParam().mode == engine::numerics::OFFICIAL ? "official" : "transformers",
                (long long)prompt.size(), a.decode.size(), bad);
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(a.greedy, b.greedy);
}

// Decode steps whose fixed-shape pieces replay CUDA graphs (engine/cuda step_graphs) against the
// same engine launching every kernel eagerly: the same kernels on the same inputs, so the logits
// must agree bit for bit, step after step (the first decode step of a row count runs eagerly and
// sizes the workspaces; the graphs are captured on the second and replayed from the third). Two
// sequences decode together as well, a second row count.
TEST_P(GpuVsCpu, DecodeFromCudaGraphsEqualsEagerBitForBit) {
    const fs::path dir = fs::path(DS41RT_FIXTURES_DIR) / GetParam().fixture;
    engine::engine_options go;
    go.mode = GetParam().mode;
    go.backend = engine::backend_kind::CUDA;
    auto opened = engine::engine::open(dir.string(), go);
    if (!opened && (opened.status().code() == status_code::UNAVAILABLE ||
                    opened.status().code() == status_code::NOT_SUPPORTED))
        GTEST_SKIP() << opened.status().to_string();
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    engine::engine &eng = *opened.value();
    const int64_t V = eng.config().vocab_size;
    const std::vector<int32_t> prompt = {11, 42, 7, 99, 3, 250, 17, 64, 5, 8, 13, 21, 34, 55};
    auto decode = [&](bool graphs) {
        eng.set_cuda_graphs(graphs);
        std::vector<std::vector<float>> logits;
        engine::seq_id a = eng.create_sequence(), b = eng.create_sequence();
        std::vector<Tensor> out;
        EXPECT_TRUE(eng.step({{a, prompt}}, &out).is_ok());
        EXPECT_TRUE(eng.step({{b, std::vector<int32_t>(prompt.begin(), prompt.begin() + 9)}}, &out).is_ok());
        int32_t ta = 1, tb = 2;
        for (int i = 0; i < 12; i++) {
            if (i < 6) {  // one row
                EXPECT_TRUE(eng.step({{a, {ta}}}, &out).is_ok());
                if (out.size() != 1) break;
                logits.emplace_back(out[0].data<float>(), out[0].data<float>() + V);
                ta = argmax(out[0].data<float>(), V);
            } else {  // two rows
                Status st = eng.step({{a, {ta}}, {b, {tb}}}, &out);
                EXPECT_TRUE(st.is_ok()) << st.to_string();
                if (out.size() != 2) break;
                for (int k = 0; k < 2; k++) logits.emplace_back(out[k].data<float>(), out[k].data<float>() + V);
                ta = argmax(out[0].data<float>(), V), tb = argmax(out[1].data<float>(), V);
            }
        }
        eng.free_sequence(a);
        eng.free_sequence(b);
        return logits;
    };
    const auto eager = decode(false), graphs = decode(true);
    ASSERT_EQ(eager.size(), graphs.size());
    size_t differ = 0;
    for (size_t i = 0; i < eager.size(); i++)
        for (int64_t v = 0; v < V; v++)
            if (std::memcmp(&eager[i][size_t(v)], &graphs[i][size_t(v)], sizeof(float)) != 0) differ++;
    std::printf("    [graphs vs eager] %s: %zu decode rows, %zu logits differ\n", GetParam().fixture.c_str(),
                eager.size(), differ);
    EXPECT_EQ(differ, 0u);
}

// The OFFICIAL GPU engine's logits for three sequences of different lengths decoding together
// (10 steps after their prompts) with env var `var` set to `value` while the engine opens.
Status decode_together(const std::string &fixture, const char *var, const char *value,
                       std::vector<std::vector<float>> *logits) {
    const fs::path dir = fs::path(DS41RT_FIXTURES_DIR) / fixture;
    setenv(var, value, 1);
    engine::engine_options go;
    go.mode = engine::numerics::OFFICIAL;
    go.backend = engine::backend_kind::CUDA;
    auto opened = engine::engine::open(dir.string(), go);
    unsetenv(var);
    if (!opened) return opened.status();
    engine::engine &eng = *opened.value();
    const int64_t V = eng.config().vocab_size;
    const std::vector<int32_t> prompt = {11, 42, 7, 99, 3, 250, 17, 64, 5, 8, 13, 21, 34, 55, 89, 144};
    std::vector<engine::seq_id> ids;
    std::vector<int32_t> next;
    std::vector<Tensor> out;
    for (size_t n : {size_t(16), size_t(9), size_t(5)}) {
        ids.push_back(eng.create_sequence());
        engine::step_input in;
        in.seq = ids.back(), in.tokens.assign(prompt.begin(), prompt.begin() + n), in.logits = engine::logit_rows::LAST;
        DS41RT_RETURN_IF_ERROR(eng.step({in}, &out));
        next.push_back(argmax(out[0].data<float>(), V));
    }
    for (int i = 0; i < 10; i++) {
        std::vector<engine::step_input> in;
        for (size_t k = 0; k < ids.size(); k++) in.push_back({ids[k], {next[k]}, engine::logit_rows::LAST});
        DS41RT_RETURN_IF_ERROR(eng.step(in, &out));
        for (size_t k = 0; k < ids.size(); k++) {
            logits->emplace_back(out[k].data<float>(), out[k].data<float>() + V);
            next[k] = argmax(out[k].data<float>(), V);
        }
    }
    return Status::ok();
}

// decode_together with var = "1" and var = "0": the logits equal bit for bit.
void expect_same_decode(const std::string &fixture, const char *var, const char *what) {
    std::vector<std::vector<float>> on, off;
    const Status a = decode_together(fixture, var, "1", &on);
    if (a.code() == status_code::UNAVAILABLE || a.code() == status_code::NOT_SUPPORTED) GTEST_SKIP() << a.to_string();
    ASSERT_TRUE(a.is_ok()) << a.to_string();
    ASSERT_TRUE(decode_together(fixture, var, "0", &off).is_ok());
    ASSERT_EQ(on.size(), off.size());
    size_t differ = 0;
    for (size_t i = 0; i < on.size(); i++)
        for (size_t v = 0; v < on[i].size(); v++) differ += std::memcmp(&on[i][v], &off[i][v], sizeof(float)) != 0;
    std::printf("    [%s, %s] %zu decode rows, %zu logits differ\n", fixture.c_str(), what, on.size(), differ);
    EXPECT_EQ(differ, 0u);
}

// OFFICIAL's indexer selection for a decode step's rows of all sequences at once (v41_gpu
// select_rows: one scores launch and one top-k over a padded block) against the same engine
// selecting sequence by sequence (DS41RT_BATCHED_SELECT=0). On the V4.1 quant fixture the index
// sources before the candidate layer (2 and 4) take the batched path, with index_topk 4 below
// most of the sequences' key counts.
TEST(GpuBatchedSelect, EqualsSequenceBySequence) {
    expect_same_decode("deepseek-v41-flash-quant", "DS41RT_BATCHED_SELECT", "batched vs per-sequence selection");
}

// Key lists whose window halves the device writes (key_lists.h, backend/cuda fill_key_rows: no
// host copy at V4.1's OFFICIAL decode) against the host-built lists (DS41RT_DEVICE_KEY_LISTS=0),
// on V4.1 (device picks after the windows) and V4 (host entries after them on its HCA layers).
TEST(GpuKeyLists, DeviceWindowsEqualHostWindowsV41) {
    expect_same_decode("deepseek-v41-flash-quant", "DS41RT_DEVICE_KEY_LISTS", "device vs host key lists");
}
TEST(GpuKeyLists, DeviceWindowsEqualHostWindowsV4) {
    expect_same_decode("deepseek-v4-flash-quant", "DS41RT_DEVICE_KEY_LISTS", "device vs host key lists");
}

INSTANTIATE_TEST_SUITE_P(
    V41, GpuVsCpu,
    ::testing::Values(gpu_case{"deepseek-v41-flash-noqat-quant", engine::numerics::TRANSFORMERS},
                      gpu_case{"deepseek-v41-flash-quant", engine::numerics::TRANSFORMERS},
                      gpu_case{"deepseek-v41-flash-noqat-quant", engine::numerics::OFFICIAL},
                      gpu_case{"deepseek-v41-flash-quant", engine::numerics::OFFICIAL}),
    [](const ::testing::TestParamInfo<gpu_case> &i) {
        std::string n = i.param.fixture.find("noqat") != std::string::npos ? "NoQat" : "Qat";
        return n + (i.param.mode == engine::numerics::OFFICIAL ? "Official" : "Transformers");
    });

INSTANTIATE_TEST_SUITE_P(
    V4, GpuVsCpu,
    ::testing::Values(gpu_case{"deepseek-v4-flash-quant", engine::numerics::TRANSFORMERS},
                      gpu_case{"deepseek-v4-flash-quant", engine::numerics::OFFICIAL}),
    [](const ::testing::TestParamInfo<gpu_case> &i) {
        return std::string(i.param.mode == engine::numerics::OFFICIAL ? "QuantOfficial" : "QuantTransformers");
    });

}  // namespace
