// kv_norm_rope_quant (backend/cuda/kv_row) against the three launches it replaces, run on the same
// rows: rms_norm_rows (kv_norm weight), rope_tail_rows (one row per position, forward), then
// fake_quant_fp8_ue8m0. Tolerance: none, every element bit-identical. V4.1's window KV row (512
// channels, a 64-channel RoPE tail, blocks of 32) at 1, 5 and 300 rows, both roundings, positions
// up to 2^20; an odd shape (dim 96: 8 pairs, blocks of 16; no weight). Outputs start from the
// same input, so an element the fused kernel skipped keeps its input and shows as a mismatch.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/kv_row.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/rope.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

class CudaKvRow : public testing_util::CudaOps {};

void check(int64_t rows, int64_t dim, int n_pairs, int64_t block, bool weighted, bool rb, uint32_t seed) {
    const std::string what = "rows " + std::to_string(rows) + " dim " + std::to_string(dim) + " pairs " +
                             std::to_string(n_pairs) + " block " + std::to_string(block) + (rb ? " bf16" : "");
    std::vector<float> x = testing_util::random_normal(size_t(rows * dim), seed);
    for (auto &v : x) v *= 3.0f;
    std::vector<float> w = testing_util::random_normal(size_t(dim), seed + 1);
    for (auto &v : w) v = 1.0f + 0.1f * v;
    std::vector<float> inv(static_cast<size_t>(n_pairs));
    for (int i = 0; i < n_pairs; i++) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(2 * n_pairs));
    std::mt19937 rng(seed + 2);
    std::vector<int64_t> pos(static_cast<size_t>(rows));
    for (auto &p : pos) p = int64_t(rng() % (1u << 20));
    dev_vec<float> ref(x), got(x), dw(w), dinv(inv);
    dev_vec<int64_t> dpos(pos);
    const float eps = 1e-6f;
    ASSERT_TRUE(cuda::rms_norm_rows(ref.p, weighted ? dw.p : nullptr, ref.p, rows, dim, eps, rb, nullptr).is_ok());
    ASSERT_TRUE(cuda::rope_tail_rows(ref.p, rows, dim, dpos.p, 1, dinv.p, n_pairs, false, rb, nullptr).is_ok());
    ASSERT_TRUE(cuda::fake_quant_fp8_ue8m0(ref.p, rows, dim, block, nullptr).is_ok());
    const Status st = cuda::kv_norm_rope_quant(got.p, weighted ? dw.p : nullptr, rows, dim, eps, rb, dpos.p, dinv.p,
                                               n_pairs, block, nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(testing_util::bit_mismatches(got.download(), ref.download(), what), 0u);
}

TEST_F(CudaKvRow, EqualsNormThenRopeThenQuant) {
    for (bool rb : {false, true})
        for (int64_t rows : {1, 5, 300}) check(rows, 512, 32, 32, true, rb, uint32_t(rows + rb));
    check(7, 96, 8, 16, false, true, 41);
    check(3, 96, 8, 16, false, false, 43);
}

TEST_F(CudaKvRow, RejectsBadShapes) {
    dev_vec<float> x(512), w(512), inv(32);
    dev_vec<int64_t> pos(1);
    auto run = [&](int64_t dim, int pairs, int64_t block) {
        return cuda::kv_norm_rope_quant(x.p, w.p, 1, dim, 1e-6f, false, pos.p, inv.p, pairs, block, nullptr);
    };
    EXPECT_TRUE(run(512, 32, 32).is_ok());
    EXPECT_FALSE(run(510, 32, 32).is_ok());    // dim not a multiple of 4
    EXPECT_FALSE(run(512, 300, 32).is_ok());   // tail wider than the row
    EXPECT_FALSE(run(512, 32, 48).is_ok());    // block not a power of two
    EXPECT_FALSE(run(512, 32, 256).is_ok());   // block above 128
    EXPECT_FALSE(run(9000, 32, 32).is_ok());   // more than one block of threads holds
}

}  // namespace
