// GPU top-k with lower-index ties (backend/cuda/topk) against engine::top_indices_ordered
// itself (engine/topk.cpp is linked into this binary: it needs only the standard library).
// Metric: exact equality of every row's index list (order included) and count. Shapes: V4.1's
// indexer at decode (16 rows of T = 65536 entries, k = index_topk 512), a prefill block (1024
// rows of 4096, k 512), the router (16 rows of 384 experts, k 6), and fixture sizes (T = 5,
// k 4 > visible). Rows with heavy ties (bf16-like levels, relu zeros of both signs) and -inf
// tails (invisible entries) test the tie order and the dropping of -inf picks. idx and count
// are poisoned (0xff bytes = -1, so 0x7f: 2139062143) before each run.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>

#include "backend/cuda/topk.cuh"
#include "engine/topk.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

enum class fill { NORMAL, TIES, MASKED };

std::vector<float> make_rows(int64_t rows, int64_t n, fill f, uint32_t seed) {
    std::vector<float> v = testing_util::random_normal(size_t(rows * n), seed);
    std::mt19937 rng(seed + 7);
    for (int64_t r = 0; r < rows; r++) {
        float *row = v.data() + r * n;
        if (f == fill::TIES)  // few distinct levels: relu zeros (both signs), small bf16-rounded values
            for (int64_t i = 0; i < n; i++) {
                const float x = row[i];
                row[i] = x < 0 ? ((i & 1) ? -0.0f : 0.0f) : round_bf16(float(int(x * 4)) * 0.25f);
            }
        if (f != fill::NORMAL) {  // a visible prefix, then -inf (as the indexer masks later entries)
            const int64_t visible = int64_t(rng() % uint32_t(n + 1));
            for (int64_t i = visible; i < n; i++) row[i] = -std::numeric_limits<float>::infinity();
        }
    }
    return v;
}

class CudaTopk : public testing_util::CudaOps {
protected:
    void check(int64_t rows, int64_t n, int k, fill f, uint32_t seed, bool time = false) {
        const std::vector<float> v = make_rows(rows, n, f, seed);
        dev_vec<float> dv(v);
        dev_vec<int32_t> idx(size_t(rows * k)), cnt{size_t(rows)};
        idx.poison(0x7f);
        cnt.poison(0x7f);
        ASSERT_TRUE(cuda::topk_lower_index(dv.p, rows, n, n, k, idx.p, cnt.p, nullptr).is_ok());
        const std::vector<int32_t> gi = idx.download(), gc = cnt.download();
        int64_t picks = 0, bad_rows = 0;
        for (int64_t r = 0; r < rows; r++) {
            const std::vector<int64_t> ref = engine::top_indices_ordered(v.data() + r * n, n, k);
            picks += int64_t(ref.size());
            bool ok = gc[size_t(r)] == int32_t(ref.size());
            for (int i = 0; i < k && ok; i++)
                ok = gi[size_t(r * k + i)] == (size_t(i) < ref.size() ? int32_t(ref[size_t(i)]) : -1);
            if (!ok && bad_rows++ < 3)
                ADD_FAILURE() << "row " << r << " of [" << rows << ", " << n << "] k " << k << ": count "
                              << gc[size_t(r)] << " vs " << ref.size();
        }
        std::printf("[ info ] topk_lower_index [%lld, %lld] k %d (%s): %lld picks, %lld rows differ\n",
                    (long long)rows, (long long)n, k, f == fill::NORMAL ? "normal" : f == fill::TIES ? "ties" : "masked",
                    (long long)picks, (long long)bad_rows);
        EXPECT_EQ(bad_rows, 0);
        if (time)
            testing_util::print_timing(
                "topk_lower_index [" + std::to_string(rows) + ", " + std::to_string(n) + "] k " + std::to_string(k),
                double(rows * n * 4), [&] { (void)cuda::topk_lower_index(dv.p, rows, n, n, k, idx.p, cnt.p, nullptr); });
    }
};

TEST_F(CudaTopk, IndexerDecodeRows) {
    check(16, 65536, 512, fill::NORMAL, 1, true);
    check(16, 65536, 512, fill::TIES, 2);
    check(16, 65536, 512, fill::MASKED, 3);
    check(4, 8192, 512, fill::TIES, 4, true);
}

TEST_F(CudaTopk, PrefillRows) { check(1024, 4096, 512, fill::MASKED, 5, true); }

TEST_F(CudaTopk, RouterAndFixtureSizes) {
    check(16, 384, 6, fill::NORMAL, 6, true);
    check(16, 384, 6, fill::TIES, 7);
    check(8, 5, 4, fill::MASKED, 8);   // fixture indexer: index_topk 4 over a handful of entries
    check(8, 3, 4, fill::NORMAL, 9);   // k > n
    check(3, 1000, 1024, fill::TIES, 10);  // largest k
}

// Indexer lists no longer than index_topk (every value picked, no radix passes: only the sort).
TEST_F(CudaTopk, ShortListsTakeEveryValue) {
    check(1, 64, 512, fill::MASKED, 11, true);
    check(16, 300, 512, fill::TIES, 12);
    check(2, 512, 512, fill::NORMAL, 13);  // n == k
}

TEST_F(CudaTopk, RejectsBadShapes) {
    EXPECT_FALSE(cuda::topk_lower_index(nullptr, 1, 10, 10, 0, nullptr, nullptr, nullptr).is_ok());
    EXPECT_FALSE(cuda::topk_lower_index(nullptr, 1, 10, 10, cuda::TOPK_MAX_K + 1, nullptr, nullptr, nullptr).is_ok());
    EXPECT_FALSE(cuda::topk_lower_index(nullptr, 1, 10, 5, 4, nullptr, nullptr, nullptr).is_ok());
}

}  // namespace
