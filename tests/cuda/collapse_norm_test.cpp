// hc_collapse_norm and rms_norm_split (backend/cuda/collapse_norm) against the launches they
// replace: hc_collapse (not for rms_norm_split), then rms_norm_rows (the reference for y), then a
// GEMV that splits that y itself (the reference for the split). Tolerance: none. y must be bit-identical; the split is checked through what it
// is for: the same official-numerics GEMV run on it (gemv_matrix::split) must give the bits the
// GEMV gives when it splits y itself. V4.1's shapes (hc 4, D 5120, act_block 32) and V4's
// activation blocks (128), S 1, 5 and 16 rows, both numerics (OFFICIAL rounds the collapse and
// the norm to bf16). Outputs and split buffers start poisoned.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "backend/cuda/collapse_norm.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/mhc.cuh"
#include "backend/cuda/norm.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

constexpr int HC = 4;
constexpr int64_t D = 5120, N = 320;  // N: the check GEMV's rows (20 tiles)

class CudaCollapseNorm : public testing_util::CudaOps {};

// body(q, act_block, official, S, what) for every act_block (32, 128), both numerics and each S,
// q: the check GEMV's weights on that act_block's grid.
template <class F>
void each_case(std::initializer_list<int> rows, uint32_t seed, F body) {
    for (int act_block : {32, 128}) {
        const testing_util::quant_weight q = testing_util::random_fp8_block(int(N), int(D), act_block, act_block, seed);
        for (bool official : {false, true})
            for (int S : rows)
                body(q, act_block, official, S,
                     "act_block " + std::to_string(act_block) + (official ? " official" : " transformers") + " S " +
                         std::to_string(S));
    }
}

std::vector<float> norm_weights() {
    std::vector<float> w = testing_util::random_normal(size_t(D), 11);
    for (float &v : w) v = 1.0f + 0.1f * v;
    return w;
}

// y against the reference rows, bit for bit; the GEMV on the split against the GEMV splitting
// the reference rows itself, bit for bit.
void expect_same(const testing_util::quant_weight &q, const dev_vec<float> &got, const dev_vec<float> &ref,
                 const cuda::gemv_split &split, int S, int act_block, const std::string &what) {
    auto dev = cuda::query_device();
    ASSERT_TRUE(dev.is_ok());
    EXPECT_EQ(testing_util::bit_mismatches(got.download(), ref.download(), what + ": y"), 0u);
    const std::vector<float> own = testing_util::official_gemv(*dev, q, ref.p, S, int(N), int(D), act_block, nullptr);
    const std::vector<float> given = testing_util::official_gemv(*dev, q, ref.p, S, int(N), int(D), act_block, &split);
    EXPECT_EQ(testing_util::bit_mismatches(given, own, what + ": GEMV on the split"), 0u);
}

TEST_F(CudaCollapseNorm, EqualsCollapseThenNormAndTheGemvSplit) {
    each_case({1, 5, 16}, 7, [](const testing_util::quant_weight &q, int act_block, bool official, int S, const std::string &what) {
        std::vector<float> X = testing_util::random_normal(size_t(S) * HC * D, uint32_t(S + act_block));
        std::vector<float> pre = testing_util::random_normal(size_t(S) * HC, uint32_t(S + 3));
        for (float &p : pre) p = 0.5f + 0.25f * p;
        dev_vec<float> dX(X), dpre(pre), dw(norm_weights()), ref(size_t(S) * D), got(size_t(S) * D);
        dev_vec<uint8_t> xs(size_t(S) * D);
        dev_vec<float> sx(size_t(D / 32) * 16);
        ref.poison(), got.poison(), xs.poison(), sx.poison();
        ASSERT_TRUE(cuda::hc_collapse(dX.p, dpre.p, S, HC, D, official, ref.p, nullptr).is_ok());
        ASSERT_TRUE(cuda::rms_norm_rows(ref.p, dw.p, ref.p, S, D, 1e-6f, official, nullptr).is_ok());
        const cuda::gemv_split split{xs.p, sx.p};
        const Status st =
            cuda::hc_collapse_norm(dX.p, dpre.p, S, HC, D, official, dw.p, 1e-6f, got.p, &split, act_block, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        expect_same(q, got, ref, split, S, act_block, what);
    });
}

// rms_norm_split in place (as the engine runs it on the q rows) against rms_norm_rows, and the
// GEMV on its split against the GEMV splitting the normalized rows itself.
TEST_F(CudaCollapseNorm, NormSplitEqualsNormAndTheGemvSplit) {
    each_case({1, 16}, 9, [](const testing_util::quant_weight &q, int act_block, bool official, int S, const std::string &what) {
        std::vector<float> x = testing_util::random_normal(size_t(S) * D, uint32_t(S + 2 * act_block));
        dev_vec<float> ref(x), got(x), dw(norm_weights());
        dev_vec<uint8_t> xs(size_t(S) * D);
        dev_vec<float> sx(size_t(D / 32) * 16);
        xs.poison(), sx.poison();
        ASSERT_TRUE(cuda::rms_norm_rows(ref.p, dw.p, ref.p, S, D, 1e-6f, official, nullptr).is_ok());
        const cuda::gemv_split split{xs.p, sx.p};
        const Status st = cuda::rms_norm_split(got.p, dw.p, got.p, S, D, official, 1e-6f, &split, act_block, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        expect_same(q, got, ref, split, S, act_block, "norm split, " + what);
    });
}

TEST_F(CudaCollapseNorm, RejectsBadShapes) {
    dev_vec<float> X(size_t(2) * HC * 64), pre(8), y(128);
    dev_vec<uint8_t> xs(128);
    dev_vec<float> sx(64);
    const cuda::gemv_split split{xs.p, sx.p};
    auto run = [&](int64_t S, int hc, int64_t dim, const cuda::gemv_split *sp, int ab) {
        return cuda::hc_collapse_norm(X.p, pre.p, S, hc, dim, false, nullptr, 1e-6f, y.p, sp, ab, nullptr);
    };
    EXPECT_TRUE(run(2, HC, 64, &split, 32).is_ok());
    EXPECT_FALSE(run(2, 9, 64, nullptr, 32).is_ok());       // hc above 8
    EXPECT_FALSE(run(2, HC, 62, nullptr, 32).is_ok());      // D not a multiple of 4
    EXPECT_FALSE(run(2, HC, 9000, nullptr, 32).is_ok());    // D above 8192
    EXPECT_FALSE(run(2, HC, 64, &split, 48).is_ok());       // act_block neither 32 nor 128
    EXPECT_FALSE(run(2, HC, 64, &split, 128).is_ok());      // act_block does not divide D
    EXPECT_FALSE(run(17, HC, 64, &split, 32).is_ok());      // a split holds 16 rows
    EXPECT_FALSE(cuda::hc_collapse_norm(X.p, pre.p, 1, HC, 64, false, nullptr, 1e-6f, X.p, nullptr, 32, nullptr).is_ok());
    EXPECT_TRUE(cuda::rms_norm_split(y.p, nullptr, y.p, 2, 64, false, 1e-6f, &split, 32, nullptr).is_ok());  // in place
    EXPECT_FALSE(cuda::rms_norm_split(y.p, nullptr, y.p + 4, 1, 64, false, 1e-6f, nullptr, 32, nullptr).is_ok());
}

}  // namespace
