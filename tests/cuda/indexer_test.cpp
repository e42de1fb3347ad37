// GPU indexer scores (backend/cuda/indexer) against the score loop of engine v41_model.cpp
// indexer() (a member of the engine, not callable alone: the loop is repeated here as written
// there, with backend/cpu's own dot and core's round_bf16), both numerics branches.
// Shapes: V4.1 (32 heads of 128, ratio 1 as at layer 20) at decode (1 and 16 query rows) and
// T = 8192 / 65536 keys, ratio 2 with a partly visible tail, 64 heads (the largest shared-memory
// tile), and the fixture (4 heads of 32, 5 keys); short lists (T <= 2048, a thread per (key, head))
// and long ones (a thread per key) both. q and the keys are FP4-fake-quantized as the
// engine does (cpu::fake_quant_fp4_ue8m0, block 32) or left as random fp32 (a harder case for
// the sum order). Metric: bit-exact, -inf entries included; the GPU sums each dot in fp64 in the
// host's channel order and the heads in the host's order, without contraction. scores are
// poisoned with NaN. Where the keys are FP4 (as the engines store them), the same keys packed
// (cache_pack) give the same bits, and so do the keys paged as the engines' page pools hold them
// (fp32 rows and FP4 records, pages in reverse order). index_scores_rows (several sequences' rows
// in one launch) and a top-k over its padded block: bit-equal to each sequence's own scores and
// top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <cstdio>
#include <limits>
#include <memory>

#include "backend/cpu/ops.h"
#include "backend/cuda/indexer.cuh"
#include "backend/cuda/topk.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

// v41_model.cpp indexer(): the score of every (query row, key).
std::vector<float> host_scores(const std::vector<float> &q, const std::vector<float> &keys, const std::vector<float> &w,
                               const cuda::index_score_params &p) {
    const int64_t S = p.S, T = p.T, ih = p.ih, ihd = p.ihd;
    const float qk_scale = p.qk_scale, head_scale = p.head_scale;
    std::vector<float> scores(size_t(S * T));
    for (int64_t s = 0; s < S; s++) {
        const int64_t visible = (p.p0 + s + 1) / p.ratio;
        for (int64_t t = 0; t < T; t++) {
            if (t >= visible) {
                scores[size_t(s * T + t)] = -std::numeric_limits<float>::infinity();
                continue;
            }
            const float *kt = keys.data() + t * ihd;
            float acc = 0;
            for (int64_t h = 0; h < ih; h++) {
                const float *qh = q.data() + (s * ih + h) * ihd;
                const float dot = cpu::dot(qh, kt, ihd);
                if (p.official) {
                    float wh = round_bf16(w[size_t(s * ih + h)] * (qk_scale * head_scale));
                    acc += round_bf16(std::max(round_bf16(dot), 0.0f) * wh);
                } else {
                    acc += std::max(dot, 0.0f) * qk_scale * (w[size_t(s * ih + h)] * head_scale);
                }
            }
            scores[size_t(s * T + t)] = p.official ? round_bf16(acc) : acc;
        }
    }
    return scores;
}

// Keys [T, ihd] (device, fp32) paged as engine/cuda paged_rows holds them: page_rows keys a page,
// each key an fp32 row or (fp4) an FP4 + E8M0 record, `pitch` bytes apart, the pages laid out in
// reverse order, so a reader that ignored the table would read other keys.
struct paged_keys {
    std::unique_ptr<dev_vec<uint8_t>> buf;
    std::unique_ptr<dev_vec<const uint8_t *>> table;
    cuda::index_keys keys;
    paged_keys(const float *dk, int64_t T, int ihd, bool fp4, int64_t page_rows) {
        const int64_t pitch = fp4 ? (ihd / 2 + ihd / 32 + 3) / 4 * 4 : 4 * ihd + 16;  // fp32: a gap after each row
        const int64_t pages = (T + page_rows - 1) / page_rows, page_bytes = page_rows * pitch;
        buf = std::make_unique<dev_vec<uint8_t>>(size_t(std::max<int64_t>(pages, 1) * page_bytes));
        buf->poison();
        std::vector<const uint8_t *> tab;
        for (int64_t g = 0; g < pages; g++) {
            uint8_t *page = buf->p + (pages - 1 - g) * page_bytes;
            tab.push_back(page);
            const int64_t t0 = g * page_rows, n = std::min(page_rows, T - t0);
            if (fp4) {
                EXPECT_TRUE(cuda::pack_fp4_ue8m0(dk + t0 * ihd, n, ihd, 32, {page, page + ihd / 2, pitch}, nullptr).is_ok());
            } else {
                EXPECT_EQ(cudaMemcpy2D(page, size_t(pitch), dk + t0 * ihd, size_t(ihd) * 4, size_t(ihd) * 4, size_t(n),
                                       cudaMemcpyDeviceToDevice),
                          cudaSuccess);
            }
        }
        table = std::make_unique<dev_vec<const uint8_t *>>(tab);
        keys = cuda::index_keys::paged(table->p, page_rows, pitch, fp4);
    }
};

class CudaIndexer : public testing_util::CudaOps {
protected:
    void check(int64_t S, int64_t T, int ih, int ihd, int ratio, int64_t p0, bool quant, uint32_t seed,
               bool time = false) {
        cuda::index_score_params p;
        p.S = S;
        p.T = T;
        p.ih = ih;
        p.ihd = ihd;
        p.ratio = ratio;
        p.p0 = p0;
        p.qk_scale = 1.0f / std::sqrt(float(ihd));
        p.head_scale = 1.0f / std::sqrt(float(ih));
        std::vector<float> q = testing_util::random_normal(size_t(S * ih * ihd), seed);
        std::vector<float> keys = testing_util::random_normal(size_t(T * ihd), seed + 1);
        std::vector<float> w = testing_util::random_normal(size_t(S * ih), seed + 2);
        if (quant) {
            cpu::fake_quant_fp4_ue8m0(q.data(), S * ih, ihd, 32);
            cpu::fake_quant_fp4_ue8m0(keys.data(), T, ihd, 32);
        }
        dev_vec<float> dq(q), dk(keys), dw(w), ds(size_t(S * T));
        for (bool official : {false, true}) {
            p.official = official;
            if (official) {  // the host holds OFFICIAL's keys and weights in bf16
                for (auto &v : keys) v = round_bf16(v);
                for (auto &v : w) v = round_bf16(v);
                dk.upload(keys);
                dw.upload(w);
            }
            const std::vector<float> ref = host_scores(q, keys, w, p);
            ds.poison();
            ASSERT_TRUE(cuda::index_scores(dq.p, dk.p, dw.p, p, ds.p, nullptr).is_ok());
            const std::string what = "index_scores S " + std::to_string(S) + " T " + std::to_string(T) + " ih " +
                                     std::to_string(ih) + " ratio " + std::to_string(ratio) +
                                     (quant ? " fp4" : " fp32") + (official ? " official" : " transformers");
            const size_t bad = testing_util::bit_mismatches(ds.download(), ref, what);
            size_t masked = 0;
            for (float v : ref) masked += std::isinf(v);
            std::printf("[ info ] %s: %zu bit mismatches of %zu (%zu masked)\n", what.c_str(), bad, ref.size(), masked);
            if (quant && ihd % 32 == 0) {  // the same keys packed as the cache stores them: the same bits
                dev_vec<uint8_t> codes(size_t(T * ihd / 2)), scales(size_t(T * ihd / 32));
                ASSERT_TRUE(cuda::pack_fp4_ue8m0(dk.p, T, ihd, 32, {codes.p, scales.p}, nullptr).is_ok());
                ds.poison();
                ASSERT_TRUE(cuda::index_scores(dq.p, cuda::fp4_rows{codes.p, scales.p}, dw.p, p, ds.p, nullptr).is_ok());
                const size_t pbad = testing_util::bit_mismatches(ds.download(), ref, what + " packed keys");
                std::printf("[ info ] %s, packed keys: %zu bit mismatches\n", what.c_str(), pbad);
                if (time)
                    testing_util::print_timing(
                        what + " packed keys", double(T * (ihd / 2 + ihd / 32) + S * ih * ihd * 4 + S * T * 4), [&] {
                            (void)cuda::index_scores(dq.p, cuda::fp4_rows{codes.p, scales.p}, dw.p, p, ds.p, nullptr);
                        }, 20);
            }
            for (bool fp4 : {false, true}) {  // paged as the page pools hold them: the same bits
                if (fp4 && !(quant && ihd % 32 == 0)) continue;
                const paged_keys pk(dk.p, T, ihd, fp4, 100);
                ds.poison();
                ASSERT_TRUE(cuda::index_scores(dq.p, pk.keys, dw.p, p, ds.p, nullptr).is_ok());
                EXPECT_EQ(testing_util::bit_mismatches(ds.download(), ref, what + (fp4 ? " paged fp4" : " paged fp32")), 0u);
                if (time)
                    testing_util::print_timing(what + (fp4 ? " paged fp4 keys" : " paged fp32 keys"),
                                               double(T * pk.keys.pitch + S * ih * ihd * 4 + S * T * 4),
                                               [&] { (void)cuda::index_scores(dq.p, pk.keys, dw.p, p, ds.p, nullptr); }, 20);
            }
            if (time)
                testing_util::print_timing(what, double(T * ihd * 4 + S * ih * ihd * 4 + S * T * 4),
                                           [&] { (void)cuda::index_scores(dq.p, dk.p, dw.p, p, ds.p, nullptr); }, 20);
        }
    }
};

TEST_F(CudaIndexer, V41Decode) {
    check(1, 65536, 32, 128, 1, 65535, true, 1, true);
    check(16, 8192, 32, 128, 1, 8176, true, 2, true);
    check(2, 65536, 32, 128, 1, 65534, false, 3);
}

// Short key lists (the kernel's thread-per-(key, head) layout, T <= 2048; the larger T above take
// the thread-per-key one): a C1 / C16 decode step's rows early in a sequence.
TEST_F(CudaIndexer, V41DecodeShortLists) {
    check(1, 64, 32, 128, 2, 127, true, 11, true);
    check(16, 8, 32, 128, 2, 1, true, 12, true);  // rows 0..15 see 0 .. 8 keys
    check(1, 2048, 32, 128, 2, 4095, false, 13, true);
}

TEST_F(CudaIndexer, RatioTwoPartlyVisibleAndWideHeads) {
    check(16, 700, 32, 128, 2, 1370, true, 4);  // rows see 685 .. 693 of 700 keys
    check(4, 1000, 64, 128, 1, 900, false, 5);
}

TEST_F(CudaIndexer, FixtureShapes) {
    check(3, 5, 4, 32, 1, 2, true, 6);
    check(7, 5, 4, 32, 2, 3, false, 7);
}

TEST(CudaIndexerTiming, V41DecodeRows) {
    auto d = cuda::query_device();
    if (!d) GTEST_SKIP() << d.status().to_string();
    for (int64_t S : {1, 16}) {
        cuda::index_score_params p;
        p.S = S;
        p.T = 65536;
        p.ih = 32;
        p.ihd = 128;
        p.p0 = p.T - S;
        p.qk_scale = 1.0f / std::sqrt(128.0f);
        p.head_scale = 1.0f / std::sqrt(32.0f);
        dev_vec<float> q(testing_util::random_normal(size_t(S * 32 * 128), 8));
        dev_vec<float> k(testing_util::random_normal(size_t(p.T * 128), 9));
        dev_vec<float> w(testing_util::random_normal(size_t(S * 32), 10));
        dev_vec<float> out(size_t(S * p.T));
        testing_util::print_timing("index_scores S " + std::to_string(S) + " T 65536 ih 32 ihd 128 (" +
                                       std::to_string(2.0 * S * p.T * 32 * 128 * 1e-9) + " GFLOP fp64)",
                                   double(p.T * 128 * 4 + S * p.T * 4),
                                   [&] { (void)cuda::index_scores(q.p, k.p, w.p, p, out.p, nullptr); }, 20);
    }
}

// A decode step's rows of several sequences in one index_scores_rows launch, then one top-k over
// the [rows, Tmax] block (the engine's batched selection), against each sequence's own
// index_scores and top-k: the scores bit-equal on each row's T columns and -inf on its padding,
// the picks and counts equal. The sequences' key counts straddle index_topk (some select all their
// visible keys, some a top 64 of more), one sees only part of its keys, and one row has T = 0.
TEST(CudaIndexerRows, BatchedRowsSelectAsEachSequenceAlone) {
    auto d = cuda::query_device();
    if (!d) GTEST_SKIP() << d.status().to_string();
    const int ih = 32, ihd = 128, topk = 64;
    struct seq {
        int64_t T, p0;
        int ratio, rows;
    };
    const std::vector<seq> seqs = {{40, 163, 4, 1}, {300, 1203, 4, 2}, {64, 255, 4, 1}, {1000, 990, 1, 3}, {0, 2, 4, 1}};
    int64_t Tmax = 0;
    int R = 0;
    for (const seq &q : seqs) Tmax = std::max(Tmax, q.T), R += q.rows;
    cuda::index_score_params p;
    p.ih = ih;
    p.ihd = ihd;
    p.qk_scale = 1.0f / std::sqrt(float(ihd));
    p.head_scale = 1.0f / std::sqrt(float(ih));
    p.official = true;
    std::deque<dev_vec<float>> dq, dk, dw;  // never moved (dev_vec owns device memory)
    std::vector<cuda::index_row> rows;
    for (size_t i = 0; i < seqs.size(); i++) {
        std::vector<float> q = testing_util::random_normal(size_t(seqs[i].rows * ih * ihd), uint32_t(20 + 3 * i));
        std::vector<float> k = testing_util::random_normal(size_t(std::max<int64_t>(seqs[i].T, 1) * ihd), uint32_t(21 + 3 * i));
        std::vector<float> w = testing_util::random_normal(size_t(seqs[i].rows * ih), uint32_t(22 + 3 * i));
        cpu::fake_quant_fp4_ue8m0(q.data(), seqs[i].rows * ih, ihd, 32);
        cpu::fake_quant_fp4_ue8m0(k.data(), std::max<int64_t>(seqs[i].T, 1), ihd, 32);
        for (auto &v : k) v = round_bf16(v);
        for (auto &v : w) v = round_bf16(v);
        dq.emplace_back(q), dk.emplace_back(k), dw.emplace_back(w);
    }
    for (size_t i = 0; i < seqs.size(); i++)
        for (int s = 0; s < seqs[i].rows; s++)
            rows.push_back({dq[i].p + size_t(s) * ih * ihd, dw[i].p + size_t(s) * ih, dk[i].p, seqs[i].T,
                            (seqs[i].p0 + s + 1) / seqs[i].ratio});
    const int K = int(std::min<int64_t>(topk, Tmax));
    dev_vec<float> batch(size_t(R) * Tmax);
    dev_vec<int32_t> bidx(size_t(R) * K), bcnt{size_t(R)};
    batch.poison();
    ASSERT_TRUE(cuda::index_scores_rows(rows.data(), R, p, Tmax, batch.p, nullptr).is_ok());
    ASSERT_TRUE(cuda::topk_lower_index(batch.p, R, Tmax, Tmax, K, bidx.p, bcnt.p, nullptr).is_ok());
    const std::vector<float> bs = batch.download();
    const std::vector<int32_t> bi = bidx.download(), bc = bcnt.download();
    size_t score_bad = 0, pick_bad = 0;
    int r0 = 0;
    for (size_t i = 0; i < seqs.size(); i++) {
        const seq &q = seqs[i];
        if (q.T > 0) {
            cuda::index_score_params pi = p;
            pi.S = q.rows, pi.T = q.T, pi.p0 = q.p0, pi.ratio = q.ratio;
            dev_vec<float> own(size_t(q.rows * q.T));
            const int k = int(std::min<int64_t>(topk, q.T));
            dev_vec<int32_t> oidx(size_t(q.rows * k)), ocnt(size_t(q.rows));
            ASSERT_TRUE(cuda::index_scores(dq[i].p, dk[i].p, dw[i].p, pi, own.p, nullptr).is_ok());
            ASSERT_TRUE(cuda::topk_lower_index(own.p, q.rows, q.T, q.T, k, oidx.p, ocnt.p, nullptr).is_ok());
            const std::vector<float> os = own.download();
            const std::vector<int32_t> oi = oidx.download(), oc = ocnt.download();
            for (int s = 0; s < q.rows; s++) {
                const size_t br = size_t(r0 + s);
                for (int64_t t = 0; t < Tmax; t++) {
                    const float want = t < q.T ? os[size_t(s * q.T + t)] : -std::numeric_limits<float>::infinity();
                    score_bad += std::memcmp(&bs[br * Tmax + t], &want, sizeof(float)) != 0;
                }
                pick_bad += bc[br] != oc[size_t(s)];
                for (int j = 0; j < oc[size_t(s)] && j < K; j++) pick_bad += bi[br * K + j] != oi[size_t(s * k + j)];
            }
        } else {
            for (int s = 0; s < q.rows; s++) {
                for (int64_t t = 0; t < Tmax; t++) score_bad += !std::isinf(bs[size_t(r0 + s) * Tmax + t]);
                pick_bad += bc[size_t(r0 + s)] != 0;
            }
        }
        r0 += q.rows;
    }
    std::printf("[ info ] index_scores_rows: %d rows of %zu sequences, Tmax %lld: %zu score and %zu pick mismatches\n", R,
                seqs.size(), (long long)Tmax, score_bad, pick_bad);
    EXPECT_EQ(score_bad, 0u);
    EXPECT_EQ(pick_bad, 0u);
    // The same rows with every sequence's keys packed as the cache stores them: the same bits.
    std::deque<dev_vec<uint8_t>> codes, scales;
    std::vector<cuda::index_row> packed = rows;
    for (size_t i = 0, r = 0; i < seqs.size(); i++) {
        const int64_t T = std::max<int64_t>(seqs[i].T, 1);
        codes.emplace_back(size_t(T * ihd / 2)), scales.emplace_back(size_t(T * ihd / 32));
        ASSERT_TRUE(cuda::pack_fp4_ue8m0(dk[i].p, T, ihd, 32, {codes.back().p, scales.back().p}, nullptr).is_ok());
        for (int s = 0; s < seqs[i].rows; s++, r++) packed[r].keys = cuda::fp4_rows{codes.back().p, scales.back().p};
    }
    batch.poison();
    ASSERT_TRUE(cuda::index_scores_rows(packed.data(), R, p, Tmax, batch.p, nullptr).is_ok());
    EXPECT_EQ(testing_util::bit_mismatches(batch.download(), bs, "index_scores_rows, packed keys"), 0u);
    // And paged (FP4 records, 7 keys a page; the empty sequence's row has T 0 and no keys).
    std::deque<paged_keys> pages;
    std::vector<cuda::index_row> paged = rows;
    for (size_t i = 0, r = 0; i < seqs.size(); i++) {
        pages.emplace_back(dk[i].p, std::max<int64_t>(seqs[i].T, 1), ihd, true, 7);
        for (int s = 0; s < seqs[i].rows; s++, r++) paged[r].keys = pages.back().keys;
    }
    batch.poison();
    ASSERT_TRUE(cuda::index_scores_rows(paged.data(), R, p, Tmax, batch.p, nullptr).is_ok());
    EXPECT_EQ(testing_util::bit_mismatches(batch.download(), bs, "index_scores_rows, paged keys"), 0u);
    std::vector<cuda::index_row> too_many(size_t(cuda::INDEX_ROWS_MAX + 1), rows[0]);
    EXPECT_FALSE(cuda::index_scores_rows(too_many.data(), int(too_many.size()), p, Tmax, batch.p, nullptr).is_ok());
    rows[0].T = Tmax + 1;
    EXPECT_FALSE(cuda::index_scores_rows(rows.data(), R, p, Tmax, batch.p, nullptr).is_ok());
}

TEST(CudaIndexerArgs, RejectsBadShapes) {
    cuda::index_score_params p;
    p.S = 1;
    p.T = 4;
    p.ih = 4;
    p.ihd = 31;
    EXPECT_FALSE(cuda::index_scores(nullptr, nullptr, nullptr, p, nullptr, nullptr).is_ok());
    p.ihd = 32;
    p.ratio = 0;
    EXPECT_FALSE(cuda::index_scores(nullptr, nullptr, nullptr, p, nullptr, nullptr).is_ok());
    // A paged key that does not hold its row (FP4 at ihd 32: 20 bytes, 4-byte aligned).
    p.ratio = 1;
    const uint8_t *const *table = reinterpret_cast<const uint8_t *const *>(&p);  // never read: rejected first
    float x = 0;
    EXPECT_FALSE(cuda::index_scores(&x, cuda::index_keys::paged(table, 4, 18, true), &x, p, &x, nullptr).is_ok());
    EXPECT_FALSE(cuda::index_scores(&x, cuda::index_keys::paged(table, 4, 127, false), &x, p, &x, nullptr).is_ok());
}

}  // namespace
