// The engine against transformers on tiny random-weight fixtures (tests/fixtures/v41-*, v4-*;
// made by tools/fixtures/make_fixtures.py, provenance.json in each). TRANSFORMERS numerics:
//  - prompt logits at every position within relative error ||a-b|| / ||b|| <= 1e-4, same argmax;
//  - 16 greedy decode steps: same ids, logits within the same bound;
//  - three sequences of different lengths prefilled and decoded together in one batch;
//  - teacher-forced one-token decode of the prompt reproduces the prefill logits (state bugs);
//  - a prefill split into uneven chunks reproduces them too (state carried across calls).
// The limit is the acceptance bound: both sides compute in fp32, so anything above a few
// 1e-6 is a semantic difference, not rounding.
//
// Except where the V4.1 cache QATs are on (head widths that are whole numbers of their blocks):
// there an FP8/FP4 code whose input lies within fp32 noise of a rounding boundary flips between
// any two fp32 implementations, and one flip moves the logits by ~1e-3. This is a property of
// the oracle, not of the engine: transformers' own float32 and float64 runs of the same fixture
// differ by up to 1e-3, and 2e-6 of noise on the QAT inputs moves its logits by more than 2e-5
// on most 40-token prompts (tools/fixtures/make_fixtures.py measures both). For those fixtures
// the logits bound is QAT_FLIP_LIMIT, the greedy tokens and every argmax must still agree, and
// the state is checked exactly against the engine's own prefill (teacher-forced decode and
// chunked prefill reproduce it to fp32 rounding). The QAT-free fixtures
// (deepseek-v41-flash-noqat-*, and V4) hold the full 1e-4 everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/config.h"

using namespace ds41rt;
namespace fs = std::filesystem;

namespace {

// The same checks run on the CUDA backend in ds41rt_cuda_engine_tests (built with
// DS41RT_FIXTURE_BACKEND=CUDA); fixtures that backend cannot run (plain f32 storage, V4) and
// machines without a GPU skip there.
#ifndef DS41RT_FIXTURE_BACKEND
#define DS41RT_FIXTURE_BACKEND CPU
#endif

engine::engine_options fixture_options(engine::numerics mode) {
    engine::engine_options o;
    o.mode = mode;
    o.backend = engine::backend_kind::DS41RT_FIXTURE_BACKEND;
    return o;
}

bool skippable(const Status &s) {
    return s.code() == status_code::NOT_SUPPORTED || s.code() == status_code::UNAVAILABLE;
}

constexpr double REL_LIMIT = 1e-4;
constexpr double QAT_FLIP_LIMIT = 5e-3;
constexpr double SELF_LIMIT = 1e-5;  // the engine against itself: summation order only

double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

int64_t argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

struct expected_seq {
    std::vector<int32_t> prompt, gen;  // gen[0] follows the prompt; gen[i+1] follows step i
    Tensor prompt_logits, gen_logits;
};

expected_seq read_seq(const io::safetensors_file &f, const std::string &prefix) {
    expected_seq e;
    auto ids = [&](const std::string &name) {
        Tensor t = f.get(prefix + name).value();
        return std::vector<int32_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
    };
    e.prompt = ids("prompt.ids");
    e.gen = ids("gen.ids");
    e.prompt_logits = f.get(prefix + "prompt.logits").value();
    e.gen_logits = f.get(prefix + "gen.logits").value();
    return e;
}

void expect_rows(const std::string &what, const Tensor &got, const float *want, int64_t rows, int64_t vocab,
                 double limit) {
    ASSERT_EQ(got.dim(0), rows) << what;
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *g = got.data<float>() + r * vocab, *w = want + r * vocab;
        double e = rel_err(g, w, vocab);
        worst = std::max(worst, e);
        EXPECT_LE(e, limit) << what << " row " << r;
        EXPECT_EQ(argmax(g, vocab), argmax(w, vocab)) << what << " row " << r;
    }
    std::printf("    %-40s rows %3lld  max rel err %.3g\n", what.c_str(), (long long)rows, worst);
}

std::vector<fs::path> fixture_dirs() {
    std::vector<fs::path> dirs;
    for (auto &e : fs::directory_iterator(DS41RT_FIXTURES_DIR))
        if (fs::exists(e.path() / "expected.safetensors") && fs::exists(e.path() / "config.json"))
            dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    return dirs;
}

class EngineFixture : public ::testing::TestWithParam<fs::path> {};

TEST_P(EngineFixture, MatchesTransformers) {
    const fs::path dir = GetParam();
    auto opened = engine::engine::open(dir.string(), fixture_options(engine::numerics::TRANSFORMERS));
    if (!opened && skippable(opened.status())) GTEST_SKIP() << opened.status().to_string();
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    engine::engine &eng = *opened.value();
    const int64_t V = eng.config().vocab_size;
    const model::model_config &c = eng.config();
    const bool cache_qat = c.model_arch == model::arch::V41 &&
                           (c.head_dim % 32 == 0 || c.head_dim % 16 == 0 || c.index_head_dim % 32 == 0);
    const double limit = cache_qat ? QAT_FLIP_LIMIT : REL_LIMIT;
    auto ef = io::safetensors_file::open((dir / "expected.safetensors").string());
    ASSERT_TRUE(ef.is_ok()) << ef.status().to_string();
    const io::safetensors_file &f = *ef.value();
    Tensor own_prefill;  // the engine's own prefill logits of the main prompt

    // Single sequence: prefill, then greedy decode fed with the reference ids.
    {
        expected_seq e = read_seq(f, "");
        engine::seq_id s = eng.create_sequence();
        std::vector<Tensor> out;
        ASSERT_TRUE(eng.step({{s, e.prompt}}, &out).is_ok());
        own_prefill = out[0];
        expect_rows("single prefill", out[0], e.prompt_logits.data<float>(), int64_t(e.prompt.size()), V, limit);
        EXPECT_EQ(argmax(out[0].data<float>() + (out[0].dim(0) - 1) * V, V), e.gen[0]);
        for (size_t i = 0; i + 1 < e.gen.size(); i++) {
            ASSERT_TRUE(eng.step({{s, {e.gen[i]}}}, &out).is_ok());
            expect_rows("single decode " + std::to_string(i), out[0], e.gen_logits.data<float>() + i * V, 1, V, limit);
            EXPECT_EQ(argmax(out[0].data<float>(), V), e.gen[i + 1]) << "greedy step " << i;
        }
        eng.free_sequence(s);
    }

    // Teacher-forced one-token decode of the prompt reproduces the prefill logits.
    {
        expected_seq e = read_seq(f, "");
        engine::seq_id s = eng.create_sequence();
        std::vector<Tensor> out;
        for (size_t t = 0; t < e.prompt.size(); t++) {
            ASSERT_TRUE(eng.step({{s, {e.prompt[t]}}}, &out).is_ok());
            double err = rel_err(out[0].data<float>(), e.prompt_logits.data<float>() + int64_t(t) * V, V);
            EXPECT_LE(err, limit) << "teacher-forced position " << t;
            EXPECT_LE(rel_err(out[0].data<float>(), own_prefill.data<float>() + int64_t(t) * V, V), SELF_LIMIT)
                << "teacher-forced position " << t << " vs the engine's prefill";
        }
        eng.free_sequence(s);
    }

    // Chunked prefill: uneven chunks, sharing each step with a second sequence.
    {
        expected_seq e = read_seq(f, "");
        engine::seq_id s = eng.create_sequence(), other = eng.create_sequence();
        const size_t cuts[] = {5, 1, 2, 13, 3};
        size_t at = 0, ci = 0;
        std::vector<Tensor> out;
        while (at < e.prompt.size()) {
            size_t n = std::min(cuts[ci++ % 5], e.prompt.size() - at);
            std::vector<int32_t> chunk(e.prompt.begin() + long(at), e.prompt.begin() + long(at + n));
            ASSERT_TRUE(eng.step({{other, {e.prompt[at]}}, {s, chunk}}, &out).is_ok());
            for (size_t i = 0; i < n; i++) {
                double err = rel_err(out[1].data<float>() + int64_t(i) * V,
                                     e.prompt_logits.data<float>() + int64_t(at + i) * V, V);
                EXPECT_LE(err, limit) << "chunked prefill position " << at + i;
                EXPECT_LE(rel_err(out[1].data<float>() + int64_t(i) * V, own_prefill.data<float>() + int64_t(at + i) * V, V),
                          SELF_LIMIT)
                    << "chunked prefill position " << at + i << " vs the engine's prefill";
            }
            at += n;
        }
        eng.free_sequence(s);
        eng.free_sequence(other);
    }

    // Three sequences of different lengths in one batch: prefill together, decode together.
    {
        Tensor lens = f.get("batch.lengths").value();
        const int n = int(lens.numel());
        ASSERT_GE(n, 2);
        std::vector<expected_seq> es;
        std::vector<engine::step_input> in;
        for (int i = 0; i < n; i++) {
            es.push_back(read_seq(f, "batch." + std::to_string(i) + "."));
            in.push_back({eng.create_sequence(), es.back().prompt});
        }
        std::vector<Tensor> out;
        ASSERT_TRUE(eng.step(in, &out).is_ok());
        for (int i = 0; i < n; i++)
            expect_rows("batch " + std::to_string(i) + " prefill", out[size_t(i)], es[size_t(i)].prompt_logits.data<float>(),
                        int64_t(es[size_t(i)].prompt.size()), V, limit);
        const size_t steps = es[0].gen.size() - 1;
        for (size_t k = 0; k < steps; k++) {
            for (int i = 0; i < n; i++) in[size_t(i)].tokens = {es[size_t(i)].gen[k]};
            ASSERT_TRUE(eng.step(in, &out).is_ok());
            for (int i = 0; i < n; i++) {
                const float *want = es[size_t(i)].gen_logits.data<float>() + int64_t(k) * V;
                EXPECT_LE(rel_err(out[size_t(i)].data<float>(), want, V), limit) << "batch " << i << " step " << k;
                EXPECT_EQ(argmax(out[size_t(i)].data<float>(), V), es[size_t(i)].gen[k + 1]) << "batch " << i << " step " << k;
            }
        }
    }
}

// OFFICIAL numerics (DeepSeek's reference: bf16 rounding points, FP8 activation quantization
// before FP8/FP4 matmuls, bf16 indexer scores) on the same fixtures. transformers is no oracle
// for these numerics: on tiny random-weight models (not trained to tolerate FP8 activations)
// they move the logits by tens of percent and flip indexer and router picks. So the distance to
// transformers is a report (printed, in the closing note), and what is asserted is what must
// hold in any numerics: finite logits, and the cache state is position-exact: a prefill, a
// teacher-forced one-token decode and an uneven chunked prefill of the prompt agree.
TEST_P(EngineFixture, OfficialNumerics) {
    const fs::path dir = GetParam();
    auto opened = engine::engine::open(dir.string(), fixture_options(engine::numerics::OFFICIAL));
    if (!opened && skippable(opened.status())) GTEST_SKIP() << opened.status().to_string();
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    engine::engine &eng = *opened.value();
    const int64_t V = eng.config().vocab_size;
    auto ef = io::safetensors_file::open((dir / "expected.safetensors").string());
    ASSERT_TRUE(ef.is_ok());
    expected_seq e = read_seq(*ef.value(), "");
    const int64_t T = int64_t(e.prompt.size());

    engine::seq_id s = eng.create_sequence();
    std::vector<Tensor> out;
    const Status prefilled = eng.step({{s, e.prompt}}, &out);
    ASSERT_TRUE(prefilled.is_ok()) << prefilled.to_string();
    const Tensor prefill = out[0];
    double worst = 0, sum = 0;
    int argmax_same = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *g = prefill.data<float>() + t * V, *w = e.prompt_logits.data<float>() + t * V;
        for (int64_t i = 0; i < V; i++) ASSERT_TRUE(std::isfinite(g[i])) << "position " << t;
        const double err = rel_err(g, w, V);
        worst = std::max(worst, err);
        sum += err;
        argmax_same += argmax(g, V) == argmax(w, V);
    }
    std::vector<int32_t> gen{int32_t(argmax(prefill.data<float>() + (T - 1) * V, V))};
    for (size_t i = 0; i + 1 < e.gen.size(); i++) {
        ASSERT_TRUE(eng.step({{s, {gen.back()}}}, &out).is_ok());
        gen.push_back(int32_t(argmax(out[0].data<float>(), V)));
    }
    eng.free_sequence(s);
    size_t same_prefix = 0;
    while (same_prefix < gen.size() && gen[same_prefix] == e.gen[same_prefix]) same_prefix++;
    std::printf("    official vs transformers: prompt rel err mean %.3g max %.3g, argmax agrees at %d/%lld positions, "
                "greedy continuation identical for %zu/%zu tokens\n",
                sum / double(T), worst, argmax_same, (long long)T, same_prefix, gen.size());

    double worst_tf = 0, worst_chunk = 0;
    s = eng.create_sequence();
    for (int64_t t = 0; t < T; t++) {
        ASSERT_TRUE(eng.step({{s, {e.prompt[size_t(t)]}}}, &out).is_ok());
        worst_tf = std::max(worst_tf, rel_err(out[0].data<float>(), prefill.data<float>() + t * V, V));
    }
    eng.free_sequence(s);
    s = eng.create_sequence();
    const int64_t cuts[] = {5, 1, 2, 13, 3};
    for (int64_t at = 0, ci = 0; at < T;) {
        const int64_t n = std::min(cuts[ci++ % 5], T - at);
        std::vector<int32_t> chunk(e.prompt.begin() + at, e.prompt.begin() + at + n);
        ASSERT_TRUE(eng.step({{s, chunk}}, &out).is_ok());
        for (int64_t i = 0; i < n; i++)
            worst_chunk = std::max(worst_chunk, rel_err(out[0].data<float>() + i * V, prefill.data<float>() + (at + i) * V, V));
        at += n;
    }
    eng.free_sequence(s);
    std::printf("    official self-consistency: teacher-forced decode %.3g, chunked prefill %.3g\n", worst_tf, worst_chunk);
    // Every official quantization point is per row, so the three schedules run the same
    // arithmetic up to fp32 summation order.
    EXPECT_LE(worst_tf, 1e-5);
    EXPECT_LE(worst_chunk, 1e-5);
}

std::string fixture_name(const ::testing::TestParamInfo<fs::path> &info) {
    std::string n = info.param.filename().string();
    for (char &ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    return n;
}

INSTANTIATE_TEST_SUITE_P(fixtures, EngineFixture, ::testing::ValuesIn(fixture_dirs()), fixture_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EngineFixture);

}  // namespace
