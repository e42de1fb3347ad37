// Sampler semantics on hand-made logits (serving/sampling.h): greedy ties, penalties, each filter
// alone, seed determinism, raw logprobs; and the stop-string text stream (serving/stop_text.h).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "serving/sampling.h"
#include "serving/stop_text.h"

using namespace ds41rt;
using namespace ds41rt::serving;

namespace {

sampling_params temp(float t) {
    sampling_params p;
    p.temperature = t;
    return p;
}

std::map<int32_t, int> histogram_of(const sampling_params &p, const std::vector<float> &logits, uint64_t seed, int n) {
    std::map<int32_t, int> h;
    sampler_state s(p, seed);
    for (int i = 0; i < n; i++) h[s.sample(logits, i, nullptr)]++;
    return h;
}

}  // namespace

TEST(Sampling, OmittedTemperatureIsGreedyLowestIdOnTies) {
    sampling_params p;
    EXPECT_TRUE(p.greedy());
    sampler_state s(p, 1);
    std::vector<float> l = {0.5f, 2.0f, 1.0f, 2.0f};
    for (int i = 0; i < 10; i++) EXPECT_EQ(s.sample(l, i, nullptr), 1);
    EXPECT_TRUE(temp(0.0f).greedy());
    EXPECT_TRUE(temp(1e-6f).greedy());
    EXPECT_FALSE(temp(0.7f).greedy());
}

TEST(Sampling, FrequencyAndPresencePenaltiesCountGeneratedTokens) {
    sampling_params p;
    p.frequency_penalty = 1.0f;
    sampler_state s(p, 1);
    std::vector<float> l = {3.0f, 2.5f, 0.0f};
    EXPECT_EQ(s.sample(l, 0, nullptr), 0);
    s.accept(0);  // 3.0 - 1 = 2.0 < 2.5
    EXPECT_EQ(s.sample(l, 1, nullptr), 1);
    s.accept(1);  // 1.5
    EXPECT_EQ(s.sample(l, 2, nullptr), 0);  // 2.0 vs 1.5
    s.accept(0);  // 1.0 vs 1.5
    EXPECT_EQ(s.sample(l, 3, nullptr), 1);

    sampling_params q;
    q.presence_penalty = 2.0f;
    sampler_state t(q, 1);
    t.accept(0);
    t.accept(0);  // presence counts once: 3 - 2 = 1 < 2.5
    EXPECT_EQ(t.sample(l, 2, nullptr), 1);
}

TEST(Sampling, FiltersRestrictTheCandidates) {
    std::vector<float> l = {1.0f, 3.0f, 2.9f, 0.5f, 2.95f};
    sampling_params k1 = temp(1.0f);
    k1.top_k = 1;
    EXPECT_EQ(histogram_of(k1, l, 7, 200), (std::map<int32_t, int>{{1, 200}}));
    sampling_params k3 = temp(1.0f);
    k3.top_k = 3;
    for (auto [id, n] : histogram_of(k3, l, 7, 500)) EXPECT_TRUE(id == 1 || id == 2 || id == 4) << id;
    sampling_params mp = temp(1.0f);
    mp.min_p = 1.0f;  // only the maximum survives
    EXPECT_EQ(histogram_of(mp, l, 7, 200), (std::map<int32_t, int>{{1, 200}}));
    sampling_params tp = temp(1.0f);
    tp.top_p = 0.01f;  // the first token of the descending order reaches it alone
    EXPECT_EQ(histogram_of(tp, l, 7, 200), (std::map<int32_t, int>{{1, 200}}));
    // Plain temperature 1: frequencies follow softmax.
    auto h = histogram_of(temp(1.0f), l, 11, 20000);
    double z = 0;
    for (float x : l) z += std::exp(x);
    for (size_t i = 0; i < l.size(); i++)
        EXPECT_NEAR(h[int32_t(i)] / 20000.0, std::exp(l[i]) / z, 0.015) << i;
}

TEST(Sampling, SameSeedSameDraws) {
    std::vector<float> l(64);
    for (size_t i = 0; i < l.size(); i++) l[i] = float(std::sin(double(i)));
    sampler_state a(temp(1.0f), 42), b(temp(1.0f), 42), c(temp(1.0f), 43);
    int diff = 0;
    for (int i = 0; i < 100; i++) {
        int32_t x = a.sample(l, i, nullptr), y = b.sample(l, i, nullptr), z = c.sample(l, i, nullptr);
        EXPECT_EQ(x, y);
        diff += x != z;
    }
    EXPECT_GT(diff, 10);
    for (int i = 0; i < 1000; i++) {
        double u = sampling_uniform(99, i);
        EXPECT_GE(u, 0.0);
        EXPECT_LT(u, 1.0);
    }
}

TEST(Sampling, LogprobsAreOfTheRawDistribution) {
    std::vector<float> l = {0.0f, 1.0f, 2.0f, 2.0f};
    sampling_params p = temp(0.5f);
    p.logprobs = true;
    p.top_logprobs = 3;
    p.frequency_penalty = 2.0f;
    sampler_state s(p, 5);
    s.accept(2);
    token_logprobs lp;
    int32_t id = s.sample(l, 1, &lp);
    double z = std::log(1 + std::exp(1.0) + 2 * std::exp(2.0));
    EXPECT_NEAR(lp.logprob, l[size_t(id)] - z, 1e-6);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].id, 2);  // tie: lowest id first, and the penalty does not show here
    EXPECT_EQ(lp.top[1].id, 3);
    EXPECT_EQ(lp.top[2].id, 1);
    EXPECT_NEAR(lp.top[2].logprob, 1.0 - z, 1e-6);
}

TEST(Sampling, ValidateNamesTheField) {
    sampling_params p = temp(-1.0f);
    Status st = validate_sampling_params(p);
    EXPECT_EQ(st.code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(st.message().find("temperature"), std::string::npos);
    p = {};
    p.top_logprobs = 2;
    EXPECT_FALSE(validate_sampling_params(p).is_ok());
    p.logprobs = true;
    EXPECT_TRUE(validate_sampling_params(p).is_ok());
    p.top_p = 1.5f;
    EXPECT_FALSE(validate_sampling_params(p).is_ok());
    p = {};
    p.top_k = -2;
    EXPECT_FALSE(validate_sampling_params(p).is_ok());
}

TEST(StopText, HoldsBackPrefixesAndDropsTheStop) {
    stop_text s({"END", "xy"});
    std::string out;
    out += s.push("hello E");
    EXPECT_EQ(out, "hello ");  // "E" may start "END"
    out += s.push("N");
    EXPECT_EQ(out, "hello ");
    out += s.push("Dtrailing");
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(out, "hello ");
    EXPECT_EQ(s.push("more"), "");
    EXPECT_EQ(s.finish(), "");
}

TEST(StopText, FalseStartIsReleasedAndUtf8IsCarried) {
    stop_text s({"END"});
    std::string out = s.push("EN");
    EXPECT_EQ(out, "");
    out += s.push("a\xC3");  // "ENa" is no stop; \xC3 starts a character
    EXPECT_EQ(out, "ENa");
    out += s.push("\xA9!");
    EXPECT_EQ(out, "ENa\xC3\xA9!");
    out += s.push("\xFF");  // never valid: replaced, not held
    EXPECT_EQ(out, "ENa\xC3\xA9!\xEF\xBF\xBD");
    out += s.push("E");
    out += s.finish();
    EXPECT_EQ(out, "ENa\xC3\xA9!\xEF\xBF\xBD" "E");
    EXPECT_FALSE(s.stopped());
}

TEST(StopText, StopAcrossManyPiecesAndEarliestWins) {
    stop_text s({"cde", "de"});
    std::string out;
    for (char c : std::string("abcdefg")) out += s.push(std::string(1, c));
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(out, "ab");
}

// The draw's uniform is part of the seed contract (same seed, same output across versions and on
// the GPU). Expected bits from an independent Python rendering of splitmix64 (Vigna's published
// constants) composed as sampling_row.h documents: splitmix64(splitmix64(seed) ^ position *
// 0xD1B54A32D192ED03) >> 11, computed when the arithmetic moved to backend/cpu.
TEST(SamplingRow, UniformBitsArePinned) {
    EXPECT_EQ(backend::cpu::sampling_uniform_bits(42, 7), 466803804666104ull);
    EXPECT_EQ(backend::cpu::sampling_uniform_bits(uint64_t(int64_t(-1)), 0), 3298815481631822ull);
    EXPECT_EQ(backend::cpu::sampling_uniform_bits(0, 123456), 7283513231366527ull);
    EXPECT_EQ(sampling_uniform(42, 7), double(466803804666104ull) * 0x1.0p-53);
}

// The boundary margin the GPU test uses to judge a mismatch: two tokens with masses 1/3 and 1
// (logits 0 and ln 3 at temperature 1), walked in id order, total 4/3.
TEST(SamplingRow, TraceReportsTheDrawMargin) {
    std::vector<float> l = {0.0f, std::log(3.0f)};
    backend::cpu::row_sampling p;
    p.greedy = false;
    std::vector<float> work;
    std::vector<int32_t> order;
    for (double u : {0.1, 0.2, 0.3, 0.9}) {
        backend::cpu::sample_trace tr;
        const int32_t t = backend::cpu::sample_row(l, p, {}, {}, u, work, order, &tr);
        const double m0 = std::exp(0.0 - double(std::log(3.0f))), total = m0 + 1.0, x = u * total;
        EXPECT_EQ(t, x < m0 ? 0 : 1) << u;
        const double want = x < m0 ? std::min(x, m0 - x) / total : std::min(x - m0, total - x) / total;
        EXPECT_NEAR(tr.draw_margin, want, 1e-12) << u;
        EXPECT_EQ(tr.top_p_margin, 1.0);
    }
}
