// GPU mHC (backend/cuda/mhc) against engine/mhc.cpp (linked into this binary alone: it needs
// only core and backend/cpu) at V4.1's shape: hc 4 streams of 5120 (flat 20480), 24 mixes,
// Sinkhorn 20 iterations, eps 1e-6 (hc_eps) and 1e-20 (norm_eps); decode batch of 16 tokens.
// Tolerances:
//  - hc_project: bit-exact, at S = 1, 16 and a prefill-sized 512 (fold after: the prefill kernel
//    on the fp64 tensor cores), both orders, plus a ragged flat 1001 / n_out 7 (the element-load
//    path and the padded tiles) and the prefill kernel's ragged edges (S 200, flat 1000). Both sides sum exact
//    fp32 x fp32 products in fp64 and round once; the orders differ, so a mismatch needs an
//    exact sum within ~2^-29 relative of an fp32 rounding boundary (a host emulation of the
//    GPU's order with these seeds, S 16 and 512, both orders: 0 mismatches of 25344). A
//    mismatch fails the test; the old bound |d| <= 1e-6 |ref| + 1e-6 * the row's max |m| is
//    still checked so a report shows how far off it was.
//  - hc_split_sinkhorn: the same fp32 steps except exp (fp64 rounded vs glibc expf, <= 1 ulp
//    apart), carried through 20 normalizations: 1e-5 relative; pre alone and post + comb in a
//    second call bit-equal to the one call.
//  - hc_pre (V4's head): against the CPU head's pre at 1e-5 relative (one sigmoid: the same exp
//    difference), and bit-equal to the split's pre at the split's row stride.
//  - hc_collapse / hc_expand / hc_expand_sum, fed the CPU's mixes: bit-exact (sequential fp32, no
//    FMA; the sum's add is the engine's fp32 add, bf16-rounded with the streams).
// Bit mismatches are printed for all four. Outputs are poisoned with NaN (expand works in place
// and is checked on every element).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/cpu/ops.h"
#include "backend/cuda/mhc.cuh"
#include "engine/mhc.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

constexpr int HC = 4, N_MIX = (2 + HC) * HC, ITERS = 20;
constexpr int64_t D = 5120, FLAT = HC * D, S = 16;

struct stats {
    double worst = 0;
    size_t bits = 0;
};

class CudaMhc : public testing_util::CudaOps {
protected:
    void SetUp() override {
        testing_util::CudaOps::SetUp();
        if (IsSkipped()) return;
        X = testing_util::random_normal(size_t(S * FLAT), 1);
        fn = Tensor::f32({N_MIX, FLAT});
        std::vector<float> w = testing_util::random_normal(size_t(N_MIX * FLAT), 2);
        for (int64_t i = 0; i < N_MIX * FLAT; i++) fn.f()[i] = 0.01f * w[size_t(i)];
        scale = {0.8f, 1.1f, 0.9f};
        base = testing_util::random_normal(size_t(N_MIX), 3);
    }
    std::vector<float> X, scale, base;
    Tensor fn;
};

// One hc_project call against engine::hc_project on the CPU: bit mismatches (failing), the
// tolerance, and poisoned outputs.
void check_project(const std::vector<float> &X, int64_t S, int64_t flat, const Tensor &fn, int64_t n_out, bool fold) {
    dev_vec<float> dX(X), dfn(std::vector<float>(fn.f(), fn.f() + n_out * flat)), dm(size_t(S * n_out));
    std::vector<float> ref(size_t(S * n_out));
    engine::hc_project(X.data(), S, flat, fn, n_out, 1e-20f, fold, ref.data());
    dm.poison();
    ASSERT_TRUE(cuda::hc_project(dX.p, S, flat, dfn.p, n_out, 1e-20f, fold, dm.p, nullptr).is_ok());
    const std::vector<float> got = dm.download();
    stats st;
    for (int64_t s = 0; s < S; s++) {
        float rowmax = 0;
        for (int64_t j = 0; j < n_out; j++) rowmax = std::max(rowmax, std::fabs(ref[size_t(s * n_out + j)]));
        for (int64_t j = 0; j < n_out; j++) {
            const size_t i = size_t(s * n_out + j);
            ASSERT_TRUE(std::isfinite(got[i])) << "m[" << s << ", " << j << "] not written";
            const double d = std::fabs(double(got[i]) - ref[i]);
            st.bits += f32_bits(got[i]) != f32_bits(ref[i]);
            EXPECT_LE(d, 1e-6 * std::fabs(ref[i]) + 1e-6 * rowmax) << "m[" << s << ", " << j << "] fold " << fold;
            st.worst = std::max(st.worst, d / std::max(1e-30, double(std::fabs(ref[i]))));
        }
    }
    EXPECT_EQ(st.bits, 0u) << "hc_project S " << S << " flat " << flat << " fold " << fold;
    std::printf("[ info ] hc_project [%lld, %lld] x %lld (%s): max rel err %.3g, bit mismatches %zu of %lld\n",
                (long long)S, (long long)flat, (long long)n_out, fold ? "fold after" : "normalize first", st.worst,
                st.bits, (long long)(S * n_out));
}

TEST_F(CudaMhc, ProjectIsBitExact) {
    const int64_t S_PREFILL = 512;
    const std::vector<float> Xp = testing_util::random_normal(size_t(S_PREFILL * FLAT), 7);
    for (bool fold : {true, false}) {
        check_project(std::vector<float>(X.begin(), X.begin() + FLAT), 1, FLAT, fn, N_MIX, fold);
        check_project(X, S, FLAT, fn, N_MIX, fold);
        check_project(Xp, S_PREFILL, FLAT, fn, N_MIX, fold);
    }
    // Ragged: flat % 4 != 0 takes element loads; n_out 7 with S 3 (2 outputs per block) or S 5
    // (6 per block) leaves padded outputs and tokens.
    const int64_t rf = 1001, rn = 7;
    Tensor rfn = Tensor::f32({rn, rf});
    const std::vector<float> w = testing_util::random_normal(size_t(rn * rf), 8);
    for (int64_t i = 0; i < rn * rf; i++) rfn.f()[i] = 0.03f * w[size_t(i)];
    for (int64_t rs : {int64_t(3), int64_t(5)})
        for (bool fold : {true, false})
            check_project(testing_util::random_normal(size_t(rs * rf), uint32_t(9 + rs)), rs, rf, rfn, rn, fold);
    // The prefill kernel (fold after, S >= 128) with a ragged last block of tokens, flat not a
    // multiple of its 64-k step, and padded outputs.
    const int64_t pf = 1000, ps = 200;
    Tensor pfn = Tensor::f32({rn, pf});
    const std::vector<float> pw = testing_util::random_normal(size_t(rn * pf), 10);
    for (int64_t i = 0; i < rn * pf; i++) pfn.f()[i] = 0.03f * pw[size_t(i)];
    check_project(testing_util::random_normal(size_t(ps * pf), 11), ps, pf, pfn, rn, true);

    dev_vec<float> dX(X), dfn(std::vector<float>(fn.f(), fn.f() + N_MIX * FLAT)), dm(size_t(S * N_MIX));
    for (int64_t s : {int64_t(1), S})
        testing_util::print_timing("hc_project [" + std::to_string(s) + ", 20480] x 24", double(s + N_MIX) * FLAT * 4, [&] {
            (void)cuda::hc_project(dX.p, s, FLAT, dfn.p, N_MIX, 1e-20f, true, dm.p, nullptr);
        });
    // A prefill chunk, on each kernel (DS41RT_MHC_DMMA_MIN_S picks): information only.
    const int64_t SP = 8192;
    dev_vec<float> dXp(testing_util::random_normal(size_t(SP * FLAT), 12)), dmp(size_t(SP * N_MIX));
    for (const auto &[min_s, kernel] : {std::pair{"128", "fp64 tensor cores"}, std::pair{"1000000000", "clusters"}}) {
        setenv("DS41RT_MHC_DMMA_MIN_S", min_s, 1);
        testing_util::print_timing(
            std::string("hc_project [8192, 20480] x 24, ") + kernel, double(SP + N_MIX) * FLAT * 4,
            [&] { (void)cuda::hc_project(dXp.p, SP, FLAT, dfn.p, N_MIX, 1e-20f, true, dmp.p, nullptr); }, 10);
    }
    unsetenv("DS41RT_MHC_DMMA_MIN_S");
}

// hc 4 (V4.1 / V4) runs the warp-per-token kernel, hc 3 the thread-per-token one: both against the
// host's steps at the same tolerance.
void check_split(int hc, const std::vector<float> &scale) {
    const int64_t n_mix = int64_t(2 + hc) * hc;
    std::vector<float> m = testing_util::random_normal(size_t(S * n_mix), uint32_t(4 + hc));
    for (auto &v : m) v *= 3.0f;
    const std::vector<float> base = testing_util::random_normal(size_t(n_mix), 3);
    const engine::hc_mixes ref = engine::hc_split_sinkhorn(m.data(), S, hc, scale.data(), base.data(), 1e-6f, ITERS);
    dev_vec<float> dm(m), dsc(scale), db(base), pre(size_t(S * hc)), post(size_t(S * hc)), comb(size_t(S * hc * hc));
    pre.poison();
    post.poison();
    comb.poison();
    ASSERT_TRUE(cuda::hc_split_sinkhorn(dm.p, S, hc, dsc.p, db.p, 1e-6f, ITERS, pre.p, post.p, comb.p, nullptr).is_ok());
    const std::pair<std::vector<float>, const std::vector<float> *> parts[] = {
        {pre.download(), &ref.pre}, {post.download(), &ref.post}, {comb.download(), &ref.comb}};
    const char *names[] = {"pre", "post", "comb"};
    for (int p = 0; p < 3; p++) {
        const auto &got = parts[p].first;
        const auto &want = *parts[p].second;
        stats st;
        for (size_t i = 0; i < want.size(); i++) {
            ASSERT_TRUE(std::isfinite(got[i])) << names[p] << " " << i << " not written";
            const double d = std::fabs(double(got[i]) - want[i]);
            st.bits += f32_bits(got[i]) != f32_bits(want[i]);
            EXPECT_LE(d, 1e-5 * std::fabs(want[i])) << names[p] << " " << i;
            st.worst = std::max(st.worst, d / std::fabs(double(want[i])));
        }
        std::printf("[ info ] hc_split_sinkhorn hc %d %s: max rel err %.3g, bit mismatches %zu of %zu\n", hc, names[p],
                    st.worst, st.bits, want.size());
    }
    // In two calls (pre alone, then post and comb: null outputs are skipped): the same bits.
    dev_vec<float> pre2(size_t(S * hc)), post2(size_t(S * hc)), comb2(size_t(S * hc * hc));
    pre2.poison();
    post2.poison();
    comb2.poison();
    ASSERT_TRUE(cuda::hc_split_sinkhorn(dm.p, S, hc, dsc.p, db.p, 1e-6f, ITERS, pre2.p, nullptr, nullptr, nullptr).is_ok());
    ASSERT_TRUE(cuda::hc_split_sinkhorn(dm.p, S, hc, dsc.p, db.p, 1e-6f, ITERS, nullptr, post2.p, comb2.p, nullptr).is_ok());
    EXPECT_EQ(testing_util::bit_mismatches(pre2.download(), parts[0].first, "pre alone") +
                  testing_util::bit_mismatches(post2.download(), parts[1].first, "post with comb") +
                  testing_util::bit_mismatches(comb2.download(), parts[2].first, "comb with post"),
              0u);
    EXPECT_FALSE(cuda::hc_split_sinkhorn(dm.p, S, hc, dsc.p, db.p, 1e-6f, ITERS, nullptr, nullptr, nullptr, nullptr).is_ok());
    testing_util::print_timing("hc_split_sinkhorn hc " + std::to_string(hc) + " S 1", double(n_mix) * 8, [&] {
        (void)cuda::hc_split_sinkhorn(dm.p, 1, hc, dsc.p, db.p, 1e-6f, ITERS, pre.p, post.p, comb.p, nullptr);
    });
}

TEST_F(CudaMhc, SplitSinkhorn) {
    check_split(HC, scale);
    check_split(3, scale);
}

// hc_pre (V4's hc_head: the pre mixes projected alone, row stride hc) against the CPU head's
// sigmoid(m * scale + base) + eps (v4_model's hc_head; exp differs by <= 1 ulp as in the split:
// 1e-5 relative), and at the split's row stride its bits equal hc_split_sinkhorn's pre.
TEST_F(CudaMhc, PreAloneMatchesTheEngine) {
    const float eps = 1e-6f, sc = 0.8f;
    std::vector<float> m = testing_util::random_normal(size_t(S * N_MIX), 13);
    for (auto &v : m) v *= 3.0f;
    std::vector<float> head_m(size_t(S * HC));
    for (int64_t s = 0; s < S; s++)
        for (int j = 0; j < HC; j++) head_m[size_t(s * HC + j)] = m[size_t(s * N_MIX + j)];
    dev_vec<float> dhm(head_m), dm(m), dsc(scale), db(base), pre(size_t(S * HC)), pre_split(size_t(S * HC));
    pre.poison();
    ASSERT_TRUE(cuda::hc_pre(dhm.p, S, HC, HC, dsc.p, db.p, eps, pre.p, nullptr).is_ok());
    const std::vector<float> got = pre.download();
    stats st;
    for (int64_t s = 0; s < S; s++)
        for (int j = 0; j < HC; j++) {
            const size_t i = size_t(s * HC + j);
            const float want = backend::cpu::sigmoid(head_m[i] * sc + base[size_t(j)]) + eps;
            ASSERT_TRUE(std::isfinite(got[i])) << "pre " << i << " not written";
            const double d = std::fabs(double(got[i]) - want);
            st.bits += f32_bits(got[i]) != f32_bits(want);
            EXPECT_LE(d, 1e-5 * std::fabs(want)) << "pre[" << s << ", " << j << "]";
            st.worst = std::max(st.worst, d / std::fabs(double(want)));
        }
    std::printf("[ info ] hc_pre hc %d: max rel err %.3g, bit mismatches %zu of %lld\n", HC, st.worst, st.bits,
                (long long)(S * HC));
    pre.poison();
    pre_split.poison();
    ASSERT_TRUE(cuda::hc_pre(dm.p, S, HC, N_MIX, dsc.p, db.p, eps, pre.p, nullptr).is_ok());
    ASSERT_TRUE(cuda::hc_split_sinkhorn(dm.p, S, HC, dsc.p, db.p, eps, ITERS, pre_split.p, nullptr, nullptr, nullptr).is_ok());
    EXPECT_EQ(testing_util::bit_mismatches(pre.download(), pre_split.download(), "hc_pre vs the split's pre"), 0u);
    EXPECT_FALSE(cuda::hc_pre(dm.p, S, HC, HC - 1, dsc.p, db.p, eps, pre.p, nullptr).is_ok());
}

TEST_F(CudaMhc, CollapseAndExpandAreBitExact) {
    std::vector<float> m = testing_util::random_normal(size_t(S * N_MIX), 5);
    const engine::hc_mixes mx = engine::hc_split_sinkhorn(m.data(), S, HC, scale.data(), base.data(), 1e-6f, ITERS);
    const std::vector<float> y = testing_util::random_normal(size_t(S * D), 6);
    for (bool rb : {false, true}) {
        std::vector<float> xref(size_t(S * D));
        engine::hc_collapse(X.data(), mx.pre.data(), S, HC, D, xref.data());
        std::vector<float> Xref = X;
        engine::hc_expand(Xref.data(), y.data(), mx, S, HC, D);
        if (rb) {
            for (auto &v : xref) v = round_bf16(v);
            for (auto &v : Xref) v = round_bf16(v);
        }
        dev_vec<float> dX(X), dpre(mx.pre), dpost(mx.post), dcomb(mx.comb), dy(y), dx(size_t(S * D));
        dx.poison();
        ASSERT_TRUE(cuda::hc_collapse(dX.p, dpre.p, S, HC, D, rb, dx.p, nullptr).is_ok());
        ASSERT_TRUE(cuda::hc_expand(dX.p, dy.p, dpost.p, dcomb.p, S, HC, D, rb, nullptr).is_ok());
        const size_t bc = testing_util::bit_mismatches(dx.download(), xref, "hc_collapse");
        const size_t be = testing_util::bit_mismatches(dX.download(), Xref, "hc_expand");
        EXPECT_EQ(bc + be, 0u);
        std::printf("[ info ] hc_collapse / hc_expand [%lld, %d, %lld]%s: mismatches %zu / %zu\n", (long long)S, HC,
                    (long long)D, rb ? " bf16" : "", bc, be);

        // hc_expand_sum: y = a + b rounded as the engine's add, then the same expand.
        const std::vector<float> a = testing_util::random_normal(size_t(S * D), 7);
        std::vector<float> ysum(size_t(S * D));
        for (size_t i = 0; i < ysum.size(); i++) ysum[i] = rb ? round_bf16(a[i] + y[i]) : a[i] + y[i];
        std::vector<float> Xsum = X;
        engine::hc_expand(Xsum.data(), ysum.data(), mx, S, HC, D);
        if (rb)
            for (auto &v : Xsum) v = round_bf16(v);
        dev_vec<float> dX2(X), da(a);
        ASSERT_TRUE(cuda::hc_expand_sum(dX2.p, da.p, dy.p, dpost.p, dcomb.p, S, HC, D, rb, nullptr).is_ok());
        const size_t bs = testing_util::bit_mismatches(dX2.download(), Xsum, "hc_expand_sum");
        EXPECT_EQ(bs, 0u);
        std::printf("[ info ] hc_expand_sum [%lld, %d, %lld]%s: mismatches %zu\n", (long long)S, HC, (long long)D,
                    rb ? " bf16" : "", bs);
    }
}

}  // namespace
