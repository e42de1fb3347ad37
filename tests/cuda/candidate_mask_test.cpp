// GPU candidate blocks (backend/cuda/candidate_mask) against the level-one loop of engine
// v41_model.cpp indexer() (a member of the engine, repeated here as written there with the
// OFFICIAL numerics' selection, engine::top_indices_ordered, linked into this binary), and the
// masking of a later index source's scores against the loop that follows it there.
// Shapes: V4.1 (block 8, top 2048 blocks) at decode with T = 65536 (8192 blocks, a real choice)
// and T = 8192 (1024 blocks: all visible blocks kept), 64 prefill rows with a growing visible
// count (ratio 2), and the fixture (block 2, top 3, T 5). Scores are relu-like with many ties
// (bf16 levels, zeros) and -inf past each row's visible count. Metric: the masks are equal
// element for element; the masked scores bit-exact. The mask is poisoned (0xff) before the run.
// candidate_mask_rows / apply_candidate_rows (several sequences' rows in one padded block): each
// row against the host loop for its own sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "backend/cuda/candidate_mask.cuh"
#include "engine/topk.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

std::vector<uint8_t> host_mask(const std::vector<float> &scores, const cuda::candidate_params &p) {
    const int64_t S = p.S, T = p.T, bs = p.block_size, nb = (T + bs - 1) / bs;
    std::vector<uint8_t> mask(size_t(S * T), 0);
    for (int64_t s = 0; s < S; s++) {
        std::vector<float> bscore(size_t(nb), NEG_INF);
        for (int64_t t = 0; t < T; t++)
            bscore[size_t(t / bs)] = std::max(bscore[size_t(t / bs)], scores[size_t(s * T + t)]);
        const int64_t visible = (p.p0 + s + 1) / p.ratio;
        if (visible >= 1) bscore[size_t((visible - 1) / bs)] = std::numeric_limits<float>::infinity();
        for (int64_t b : engine::top_indices_ordered(bscore.data(), nb, std::min<int64_t>(p.topk_blocks, nb)))
            for (int64_t t = b * bs; t < std::min(T, (b + 1) * bs); t++) mask[size_t(s * T + t)] = 1;
    }
    return mask;
}

class CudaCandidates : public testing_util::CudaOps {
protected:
    void check(int64_t S, int64_t T, int64_t p0, int ratio, int bs, int topk, uint32_t seed, bool time = false) {
        cuda::candidate_params p;
        p.S = S;
        p.T = T;
        p.p0 = p0;
        p.ratio = ratio;
        p.block_size = bs;
        p.topk_blocks = topk;
        std::vector<float> scores = testing_util::random_normal(size_t(S * T), seed);
        for (int64_t s = 0; s < S; s++) {
            const int64_t visible = (p0 + s + 1) / ratio;
            for (int64_t t = 0; t < T; t++) {
                float &v = scores[size_t(s * T + t)];
                v = t >= visible ? NEG_INF : v < 0 ? 0.0f : round_bf16(float(int(v * 8)) * 0.125f);
            }
        }
        const std::vector<uint8_t> ref = host_mask(scores, p);
        dev_vec<float> ds(scores);
        dev_vec<uint8_t> dm(size_t(S * T));
        dm.poison();
        ASSERT_TRUE(cuda::candidate_mask(ds.p, p, dm.p, nullptr).is_ok());
        const std::vector<uint8_t> got = dm.download();
        int64_t bad = 0, kept = 0;
        for (size_t i = 0; i < ref.size(); i++) {
            kept += ref[i];
            if (got[i] != ref[i] && bad++ < 5)
                ADD_FAILURE() << "mask[" << i / size_t(T) << ", " << i % size_t(T) << "] " << int(got[i]) << " vs "
                              << int(ref[i]);
        }
        EXPECT_EQ(bad, 0);
        // The later source's masking (v41_model.cpp: scores outside the mask become -inf).
        std::vector<float> later = testing_util::random_normal(size_t(S * T), seed + 1), later_ref = later;
        for (size_t i = 0; i < ref.size(); i++)
            if (!ref[i]) later_ref[i] = NEG_INF;
        dev_vec<float> dl(later);
        ASSERT_TRUE(cuda::apply_candidate_mask(dl.p, dm.p, S, T, nullptr).is_ok());
        const size_t bits = testing_util::bit_mismatches(dl.download(), later_ref, "apply_candidate_mask");
        std::printf("[ info ] candidate_mask S %lld T %lld block %d top %d: %lld of %lld positions kept, %lld differ; "
                    "apply: %zu bit mismatches\n",
                    (long long)S, (long long)T, bs, topk, (long long)kept, (long long)(S * T), (long long)bad, bits);
        if (time)
            testing_util::print_timing("candidate_mask S " + std::to_string(S) + " T " + std::to_string(T),
                                       double(S * T * 5), [&] { (void)cuda::candidate_mask(ds.p, p, dm.p, nullptr); });
    }
};

TEST_F(CudaCandidates, V41Decode) {
    check(16, 65536, 65536 - 16, 1, 8, 2048, 1, true);
    check(16, 8192, 8192 - 16, 1, 8, 2048, 2);
}

TEST_F(CudaCandidates, PrefillRowsRatioTwo) { check(64, 30000, 59000, 2, 8, 2048, 3); }

TEST_F(CudaCandidates, FixtureShapes) {
    check(5, 5, 0, 1, 2, 3, 4);
    check(12, 9, 6, 2, 2, 3, 5);
}

// Rows of several sequences in one [n, ld] block (the engine's batched selection): each row's
// mask equals the host's for its own sequence (its T columns), and apply_candidate_rows masks a
// later block's rows (a row without a mask left alone) as the host loop does.
TEST_F(CudaCandidates, RowsOfSeveralSequences) {
    struct seq {
        int64_t T, p0;
        int ratio;
    };
    const std::vector<seq> seqs = {{9000, 17999, 2}, {700, 2799, 4}, {30, 29, 1}, {8192, 8191, 1}};
    const int bs = 8, topk = 64;
    int64_t ld = 0;
    for (const seq &q : seqs) ld = std::max(ld, q.T);
    const int n = int(seqs.size());
    std::vector<float> block(size_t(n) * ld, NEG_INF);
    std::vector<cuda::candidate_row> rows;
    std::vector<std::vector<uint8_t>> refs;
    for (int i = 0; i < n; i++) {
        cuda::candidate_params p;
        p.S = 1, p.T = seqs[size_t(i)].T, p.p0 = seqs[size_t(i)].p0, p.ratio = seqs[size_t(i)].ratio;
        p.block_size = bs, p.topk_blocks = topk;
        std::vector<float> sc = testing_util::random_normal(size_t(p.T), uint32_t(40 + i));
        const int64_t visible = (p.p0 + 1) / p.ratio;
        for (int64_t t = 0; t < p.T; t++) {
            float &v = sc[size_t(t)];
            v = t >= visible ? NEG_INF : v < 0 ? 0.0f : round_bf16(float(int(v * 8)) * 0.125f);
        }
        std::copy(sc.begin(), sc.end(), block.begin() + size_t(i) * ld);
        refs.push_back(host_mask(sc, p));
        rows.push_back({p.T, visible});
    }
    dev_vec<float> ds(block);
    dev_vec<uint8_t> dm(size_t(n) * ld);
    dm.poison();
    ASSERT_TRUE(cuda::candidate_mask_rows(ds.p, ld, rows.data(), n, bs, topk, dm.p, nullptr).is_ok());
    const std::vector<uint8_t> got = dm.download();
    int64_t bad = 0;
    for (int i = 0; i < n; i++)
        for (int64_t t = 0; t < seqs[size_t(i)].T; t++) bad += got[size_t(i) * ld + t] != refs[size_t(i)][size_t(t)];
    EXPECT_EQ(bad, 0);
    std::vector<float> later = testing_util::random_normal(size_t(n) * ld, 50), later_ref = later;
    std::vector<cuda::candidate_apply_row> ar;
    for (int i = 0; i < n; i++) {
        if (i == 2) {  // no candidates for this sequence: its row stays
            ar.push_back({});
            continue;
        }
        ar.push_back({dm.p + size_t(i) * ld, seqs[size_t(i)].T});
        for (int64_t t = 0; t < seqs[size_t(i)].T; t++)
            if (!refs[size_t(i)][size_t(t)]) later_ref[size_t(i) * ld + t] = NEG_INF;
    }
    dev_vec<float> dl(later);
    ASSERT_TRUE(cuda::apply_candidate_rows(dl.p, ld, ar.data(), n, nullptr).is_ok());
    const size_t bits = testing_util::bit_mismatches(dl.download(), later_ref, "apply_candidate_rows");
    EXPECT_EQ(bits, 0u);
    std::printf("[ info ] candidate_mask_rows: %d sequences, ld %lld: %lld mask differences; apply: %zu bit mismatches\n",
                n, (long long)ld, (long long)bad, bits);
    rows[0].T = ld + 1;
    EXPECT_FALSE(cuda::candidate_mask_rows(ds.p, ld, rows.data(), n, bs, topk, dm.p, nullptr).is_ok());
}

TEST_F(CudaCandidates, RejectsBadShapes) {
    cuda::candidate_params p;
    p.S = 1;
    p.T = 8;
    p.block_size = 0;
    p.topk_blocks = 2;
    EXPECT_FALSE(cuda::candidate_mask(nullptr, p, nullptr, nullptr).is_ok());
}

}  // namespace
