// GPU sampling (backend/cuda/sampling.cu) against the CPU row arithmetic the serving sampler runs
// (backend/cpu/sampling_math.h; serving/sampling.cpp calls it, and tests/unit/sampling_test.cpp
// pins its semantics on hand-made rows), on random rows at the real vocabulary (129,280).
//
// Tolerances:
//  - greedy (with masks, penalties and many tied maxima): identical token on every row;
//  - stochastic: identical token on >= 99.9% of rows; every mismatch must have a CPU boundary
//    margin (sample_trace: distance of u * total, or of the top_p target, from the nearest
//    candidate boundary, relative to the mass) below 1e-6: the GPU sums masses in 46-bit fixed
//    point, the CPU in fp64 running sums, and only that rounding may separate them;
//  - logprobs: top ids identical (ties: lowest id), values within 1e-5 * max(1, |lp|) (both fp64
//    log-sum-exp, different summation order, one rounding to fp32).
// Outputs are poisoned (-1 ids, NaN logprobs) before each launch, so an unwritten one fails.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/sampling_math.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/sampling.cuh"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

constexpr int V = 129280;
constexpr int B = 16;
constexpr int MASK_WORDS = (V + 31) / 32;
constexpr int TOPN = cuda::SAMPLING_MAX_TOP_LOGPROBS;

struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
    ~dev_buf() { cudaFree(p); }
    template <typename T> T *as() const { return static_cast<T *>(p); }
};

struct row_case {
    std::vector<float> logits;
    cuda::sampling_row row;
    std::vector<cpu::token_count> counts;
    std::vector<uint32_t> mask;  // empty: none
};

struct row_ref {
    int32_t token = -1;
    cpu::sample_trace trace;
    float logprob = 0;
    std::vector<cpu::id_logprob> top;
};

struct row_got {
    int32_t token = -1;
    float logprob = NAN;
    int32_t top_ids[TOPN];
    float top_lps[TOPN];
};

row_case random_row(std::mt19937_64 &rng, bool force_greedy) {
    row_case c;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    const float scales[] = {1.0f, 2.0f, 4.0f, 8.0f};
    const float scale = scales[rng() % 4];
    const bool ties = rng() % 4 == 0;  // coarse values: many equal logits, equal maxima
    c.logits.resize(V);
    for (auto &x : c.logits) {
        x = nd(rng) * scale;
        if (ties) x = std::round(x * 2.0f) / 2.0f;
    }
    cpu::row_sampling &p = c.row.p;
    p.greedy = force_greedy || rng() % 5 == 0;
    if (!p.greedy) {
        p.inv_temperature = 1.0f / (0.2f + 1.3f * ud(rng));
        const int32_t ks[] = {0, 0, 0, -1, 1, 2, 20, 50, 1000};
        p.top_k = ks[rng() % 9];
        const float ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.0f};
        p.top_p = ps[rng() % 6];
        const float mps[] = {0.0f, 0.0f, 0.01f, 0.1f};
        p.log_min_p = cpu::sampling_log_min_p(mps[rng() % 4]);
    }
    if (rng() % 3 == 0) {  // penalties on tokens near the top, where they change the outcome
        p.presence_penalty = -2.0f + 4.0f * ud(rng);
        p.frequency_penalty = -2.0f + 4.0f * ud(rng);
        std::vector<int32_t> ids(V);
        for (int i = 0; i < V; i++) ids[i] = i;
        std::partial_sort(ids.begin(), ids.begin() + 64, ids.end(),
                          [&](int32_t a, int32_t b) { return c.logits[a] > c.logits[b]; });
        std::shuffle(ids.begin(), ids.begin() + 64, rng);
        for (int j = 0; j < 24; j++) c.counts.push_back({ids[j], int32_t(1 + rng() % 5)});
    }
    if (rng() % 3 == 0) {
        c.mask.resize(MASK_WORDS);
        for (auto &w : c.mask) w = uint32_t(rng()) & uint32_t(rng());  // ~25% allowed
    }
    c.row.seed = rng();
    c.row.position = int64_t(rng() % 100000);
    c.row.logprobs = rng() % 2;
    c.row.top_logprobs = c.row.logprobs ? int32_t(rng() % (TOPN + 1)) : 0;
    return c;
}

row_ref cpu_reference(const row_case &c) {
    row_ref r;
    std::vector<float> work;
    std::vector<int32_t> order;
    r.token = cpu::sample_row(c.logits, c.row.p, c.counts, c.mask,
                              cpu::sampling_uniform(c.row.seed, c.row.position), work, order, &r.trace);
    if (c.row.logprobs) r.logprob = cpu::raw_logprob(c.logits, r.token, c.row.top_logprobs, &r.top);
    return r;
}

// Builds rows [first, first + n) of a seeded stream (row i from its own generator, so any chunk
// is reproducible alone) and their CPU references, on every core.
void make_rows(uint64_t seed, int first, int n, bool greedy, std::vector<row_case> &cases, std::vector<row_ref> &ref) {
    cases.assign(size_t(n), {});
    ref.assign(size_t(n), {});
    const unsigned nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; t++)
        th.emplace_back([&, t] {
            for (int i = int(t); i < n; i += int(nt)) {
                std::mt19937_64 rng(seed * 1000003u + uint64_t(first + i));
                cases[size_t(i)] = random_row(rng, greedy);
                ref[size_t(i)] = cpu_reference(cases[size_t(i)]);
            }
        });
    for (auto &t : th) t.join();
}

class CudaSampling : public ::testing::Test {
protected:
    void SetUp() override {
        auto d = cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
    }

    // Runs one batch (any size <= B) on the GPU; poisons every output first.
    std::vector<row_got> run(const std::vector<const row_case *> &rows, float *ms = nullptr, int reps = 1) {
        const int n = int(rows.size());
        std::vector<float> logits(size_t(n) * V);
        std::vector<cuda::sampling_row> params(n);
        std::vector<cpu::token_count> counts;
        std::vector<uint32_t> mask(size_t(n) * MASK_WORDS, 0);
        for (int r = 0; r < n; r++) {
            std::copy(rows[r]->logits.begin(), rows[r]->logits.end(), logits.begin() + size_t(r) * V);
            params[r] = rows[r]->row;
            params[r].counts_begin = int32_t(counts.size());
            params[r].counts_len = int32_t(rows[r]->counts.size());
            counts.insert(counts.end(), rows[r]->counts.begin(), rows[r]->counts.end());
            params[r].has_mask = !rows[r]->mask.empty();
            if (params[r].has_mask) std::copy(rows[r]->mask.begin(), rows[r]->mask.end(), mask.begin() + size_t(r) * MASK_WORDS);
        }
        dev_buf d_logits(logits.size() * 4), d_params(params.size() * sizeof(cuda::sampling_row)),
            d_counts(std::max<size_t>(1, counts.size()) * sizeof(cpu::token_count)), d_mask(mask.size() * 4),
            d_ws(cuda::sampling_workspace_bytes(n, V)), d_tok(size_t(n) * 4), d_lp(size_t(n) * 4),
            d_tid(size_t(n) * TOPN * 4), d_tlp(size_t(n) * TOPN * 4);
        EXPECT_EQ(cudaMemcpy(d_logits.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(d_params.p, params.data(), params.size() * sizeof(cuda::sampling_row), cudaMemcpyHostToDevice), cudaSuccess);
        if (!counts.empty()) {
            EXPECT_EQ(cudaMemcpy(d_counts.p, counts.data(), counts.size() * sizeof(cpu::token_count), cudaMemcpyHostToDevice), cudaSuccess);
        }
        EXPECT_EQ(cudaMemcpy(d_mask.p, mask.data(), mask.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaMemset(d_tok.p, 0xff, size_t(n) * 4), cudaSuccess);       // -1
        EXPECT_EQ(cudaMemset(d_lp.p, 0xff, size_t(n) * 4), cudaSuccess);        // NaN
        EXPECT_EQ(cudaMemset(d_tid.p, 0x7f, size_t(n) * TOPN * 4), cudaSuccess);  // a huge id
        EXPECT_EQ(cudaMemset(d_tlp.p, 0xff, size_t(n) * TOPN * 4), cudaSuccess);
        cuda::sampling_batch b;
        b.B = n;
        b.V = V;
        b.logits = d_logits.as<float>();
        b.ld = V;
        b.rows = d_params.as<cuda::sampling_row>();
        b.counts = d_counts.as<cpu::token_count>();
        b.allowed = d_mask.as<uint32_t>();
        b.mask_words = MASK_WORDS;
        b.workspace = d_ws.p;
        b.tokens = d_tok.as<int32_t>();
        b.logprob = d_lp.as<float>();
        b.top_ids = d_tid.as<int32_t>();
        b.top_logprobs = d_tlp.as<float>();
        Status st = cuda::run_sampling(b, nullptr);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        if (ms) {
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0);
            for (int i = 0; i < reps; i++) (void)cuda::run_sampling(b, nullptr);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(ms, e0, e1);
            *ms /= float(reps);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        std::vector<int32_t> tok(n), tid(size_t(n) * TOPN);
        std::vector<float> lp(n), tlp(size_t(n) * TOPN);
        EXPECT_EQ(cudaMemcpy(tok.data(), d_tok.p, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(lp.data(), d_lp.p, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(tid.data(), d_tid.p, tid.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(tlp.data(), d_tlp.p, tlp.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        std::vector<row_got> out(n);
        for (int r = 0; r < n; r++) {
            out[r].token = tok[r];
            out[r].logprob = lp[r];
            for (int j = 0; j < TOPN; j++) {
                out[r].top_ids[j] = tid[size_t(r) * TOPN + j];
                out[r].top_lps[j] = tlp[size_t(r) * TOPN + j];
            }
        }
        return out;
    }
};

bool close_lp(float got, float ref) { return std::fabs(got - ref) <= 1e-5f * std::max(1.0f, std::fabs(ref)); }

}  // namespace

TEST_F(CudaSampling, MatchesCpuOnRandomRows) {
    constexpr int ROWS = 4096, CHUNK = 256;
    std::vector<row_case> cases, first_cases;
    std::vector<row_ref> ref, first_ref;
    int greedy = 0, greedy_same = 0, stoch = 0, stoch_same = 0, lp_rows = 0;
    double worst_mismatch_margin = 0, min_margin_seen = 1, max_lp_err = 0;
    std::vector<int32_t> first_batch;
    for (int start = 0; start < ROWS; start += B) {
        if (start % CHUNK == 0) {
            make_rows(20261130, start, CHUNK, false, cases, ref);
            if (start == 0) first_cases = cases;
        }
        std::vector<const row_case *> rows;
        for (int r = 0; r < B; r++) rows.push_back(&cases[size_t(start % CHUNK + r)]);
        const std::vector<row_got> got = run(rows);
        if (start == 0) {
            for (auto &g : got) first_batch.push_back(g.token);
        }
        for (int r = 0; r < B; r++) {
            const row_case &c = cases[size_t(start % CHUNK + r)];
            const row_ref &want = ref[size_t(start % CHUNK + r)];
            const row_got &g = got[r];
            ASSERT_TRUE(g.token >= 0 && g.token < V) << "row " << start + r << ": token not written (" << g.token << ")";
            const double margin = std::min(want.trace.draw_margin, want.trace.top_p_margin);
            if (c.row.p.greedy) {
                greedy++;
                greedy_same += g.token == want.token;
                EXPECT_EQ(g.token, want.token) << "greedy row " << start + r;
            } else {
                stoch++;
                min_margin_seen = std::min(min_margin_seen, margin);
                if (g.token == want.token) {
                    stoch_same++;
                } else {
                    worst_mismatch_margin = std::max(worst_mismatch_margin, margin);
                    EXPECT_LT(margin, 1e-6) << "row " << start + r << ": GPU " << g.token << " CPU " << want.token
                                            << " with boundary margin " << margin;
                }
            }
            if (!c.row.logprobs) continue;
            lp_rows++;
            // The chosen token's raw logprob, for whatever token the GPU chose.
            const float want_lp = cpu::raw_logprob(c.logits, g.token, 0, nullptr);
            ASSERT_FALSE(std::isnan(g.logprob)) << "row " << start + r << ": logprob not written";
            max_lp_err = std::max(max_lp_err, double(std::fabs(g.logprob - want_lp)));
            EXPECT_TRUE(close_lp(g.logprob, want_lp)) << "row " << start + r << ": " << g.logprob << " vs " << want_lp;
            for (int j = 0; j < TOPN; j++) {
                if (j < int(want.top.size())) {
                    EXPECT_EQ(g.top_ids[j], want.top[j].id) << "row " << start + r << " top " << j;
                    max_lp_err = std::max(max_lp_err, double(std::fabs(g.top_lps[j] - want.top[j].logprob)));
                    EXPECT_TRUE(close_lp(g.top_lps[j], want.top[j].logprob)) << "row " << start + r << " top " << j;
                } else {
                    EXPECT_EQ(g.top_ids[j], -1) << "row " << start + r << " top " << j << " past k";
                }
            }
        }
    }
    std::printf("[sampling] %d rows: greedy %d/%d identical; stochastic %d/%d identical (%.4f%%), worst mismatch "
                "margin %.3g, smallest margin seen %.3g; logprob rows %d, max |err| %.3g\n",
                ROWS, greedy_same, greedy, stoch_same, stoch, 100.0 * stoch_same / std::max(1, stoch),
                worst_mismatch_margin, min_margin_seen, lp_rows, max_lp_err);
    EXPECT_GE(double(stoch_same), 0.999 * stoch);
    EXPECT_GT(greedy, 100);
    EXPECT_GT(stoch, 1000);

    // Batch invariance: the first batch reversed, and each of its rows alone, pick the same tokens.
    std::vector<const row_case *> rev;
    for (int r = B - 1; r >= 0; r--) rev.push_back(&first_cases[size_t(r)]);
    const std::vector<row_got> again = run(rev);
    for (int r = 0; r < B; r++) EXPECT_EQ(again[B - 1 - r].token, first_batch[r]) << "row " << r << " reversed";
    for (int r = 0; r < 4; r++) EXPECT_EQ(run({&first_cases[size_t(r)]})[0].token, first_batch[r]) << "row " << r << " alone";
}

TEST_F(CudaSampling, GreedyTiesMasksPenaltiesExactly) {
    // Rows built so that the answer hinges on the tie rule, the mask and the penalty rounding.
    std::vector<row_case> cases;
    std::vector<row_ref> unused;
    make_rows(7, 0, B, true, cases, unused);
    for (int i = 0; i < B; i++) {
        row_case &c = cases[size_t(i)];
        for (auto &x : c.logits) x = std::min(x, 3.0f);  // a plateau of equal maxima
        if (i % 2) {
            c.mask.assign(MASK_WORDS, 0);
            for (int t = 5000 + i; t < V; t += 977) c.mask[t / 32] |= 1u << (t % 32);
        }
        if (i % 4 == 3) {  // every allowed token masked but none: the all -inf row picks token 0
            c.mask.assign(MASK_WORDS, 0);
        }
        c.row.p.presence_penalty = 0.1f * float(i % 3);
        c.row.p.frequency_penalty = 0.3f;
        c.counts.clear();
        for (int t = 0; t < V && c.counts.size() < 40; t++)
            if (c.logits[t] == 3.0f) c.counts.push_back({t, 1 + t % 3});
    }
    std::vector<const row_case *> rows;
    for (auto &c : cases) rows.push_back(&c);
    const std::vector<row_got> got = run(rows);
    int tied = 0;
    for (int r = 0; r < B; r++) {
        const row_ref want = cpu_reference(cases[size_t(r)]);
        EXPECT_EQ(got[r].token, want.token) << "row " << r;
        tied += want.token != 0 && cases[size_t(r)].logits[size_t(want.token)] == 3.0f;
    }
    EXPECT_GT(tied, 0) << "the rows should exercise the tie rule";
}

TEST_F(CudaSampling, TimingInformational) {
    std::vector<row_case> cases;
    std::vector<row_ref> unused;
    make_rows(11, 0, B, true, cases, unused);
    std::vector<const row_case *> rows;
    for (auto &c : cases) rows.push_back(&c);
    auto set = [&](bool greedy, int32_t k, float p, float min_p, bool lp) {
        for (auto &c : cases) {
            c.row.p.greedy = greedy;
            c.row.p.inv_temperature = 1.0f / 0.8f;
            c.row.p.top_k = k;
            c.row.p.top_p = p;
            c.row.p.log_min_p = cpu::sampling_log_min_p(min_p);
            c.row.logprobs = lp;
            c.row.top_logprobs = lp ? 20 : 0;
            c.mask.clear();
            c.counts.clear();
        }
    };
    struct mode {
        const char *name;
        bool greedy;
        int32_t k;
        float p, min_p;
        bool lp;
    };
    const mode modes[] = {{"greedy", true, 0, 1, 0, false},
                          {"temperature only", false, 0, 1, 0, false},
                          {"top_k 50 + top_p 0.9", false, 50, 0.9f, 0, false},
                          {"top_p 0.9", false, 0, 0.9f, 0, false},
                          {"min_p 0.05 + top_p 0.95", false, 0, 0.95f, 0.05f, false},
                          {"top_p 0.9 + 20 logprobs", false, 0, 0.9f, 0, true}};
    for (const mode &m : modes) {
        set(m.greedy, m.k, m.p, m.min_p, m.lp);
        float ms = 0;
        run(rows, &ms, 20);
        const double hbm = double(B) * V * 4 * (m.greedy ? 1 : 2);  // logits read (+ workspace write)
        std::printf("[sampling timing] B=%d V=%d %-26s %8.1f us/launch, %.1f MB HBM (%.0f GB/s), informational\n", B,
                    V, m.name, ms * 1000.0, hbm / 1e6, hbm / (ms * 1e-3) / 1e9);
    }
}

TEST(CudaSamplingArgs, RejectsBadShapes) {
    cuda::sampling_batch b;
    b.B = 1;
    b.V = 0;
    EXPECT_FALSE(cuda::run_sampling(b, nullptr).is_ok());
    b.V = 10;
    b.ld = 5;
    EXPECT_FALSE(cuda::run_sampling(b, nullptr).is_ok());
}
