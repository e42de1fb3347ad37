// GPU tail RoPE (backend/cuda/rope) against the engine's rotary tables (engine/rope.cpp, linked
// into this binary alone: it needs only model_config's fields) and backend/cpu rope_tail, at
// V4.1 shapes: q rows [S, 64 heads, 512] with a 64-channel tail, kv rows [S, 512], the inverse
// rotation on the attention output; both frequency sets (rope_theta 10000; compress_rope_theta
// 160000 with YaRN factor 16 over 65536, beta 32 / 1: spec V4.1 section 2, same as V4).
// Tolerances:
//  - tables: the GPU evaluates cos/sin in fp64 and rounds once; the host calls glibc cosf /
//    sinf (<= ~0.5 ulp). Each entry within 1 ulp; mismatches printed.
//  - rotation with the GPU's own tables: bit-exact against cpu::rope_tail (the same fp32 steps,
//    no FMA on either side), so any difference is in the tables alone.
//  - rotation against the engine (host tables): |d| <= 2^-21 (|a| + |b|) per channel of pair
//    (a, b): one table ulp (2^-24 relative) plus each side's three roundings (<= 2^-23 (|a| + |b|)).
// Outputs are poisoned with NaN where the kernel writes a separate array (tables); the in-place
// rotation is checked on every channel, tail and head.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cpu/ops.h"
#include "backend/cuda/rope.cuh"
#include "engine/rope.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

model::model_config v41_rope_config() {
    model::model_config c;  // spec deepseek-v41-flash.md section 2 (config.json table)
    c.head_dim = 512;
    c.rope_head_dim = 64;
    c.rope_theta = 10000;
    c.compress_rope_theta = 160000;
    c.rope_factor = 16;
    c.beta_fast = 32;
    c.beta_slow = 1;
    c.original_seq_len = 65536;
    return c;
}

std::vector<int64_t> test_positions(int64_t n) {
    std::vector<int64_t> p(n);
    std::mt19937 rng(5);
    const int64_t fixed[] = {0, 1, 2, 127, 128, 4095, 65535, 65536, 131071, 1048575};
    for (int64_t i = 0; i < n; i++) p[size_t(i)] = i < 10 ? fixed[i] : int64_t(rng() % 1048576);
    return p;
}

class CudaRope : public testing_util::CudaOps {};

TEST_F(CudaRope, TablesMatchEngineWithinOneUlp) {
    for (bool yarn : {false, true}) {
        const engine::rope_table t = engine::make_rope_table(v41_rope_config(), yarn);
        ASSERT_EQ(t.n_pairs, 32);
        const int64_t n = 4096;
        std::vector<int64_t> pos = test_positions(n);
        std::vector<float> hc(size_t(n * 32)), hs(hc.size());
        t.eval(pos.data(), n, hc.data(), hs.data());
        dev_vec<int64_t> dpos(pos);
        dev_vec<float> dinv(t.inv_freq), dc(hc.size()), ds(hc.size());
        dc.poison();
        ds.poison();
        ASSERT_TRUE(cuda::rope_tables(dpos.p, n, dinv.p, 32, dc.p, ds.p, nullptr).is_ok());
        std::vector<float> gc = dc.download(), gs = ds.download();
        size_t mism = 0;
        int64_t worst = 0;
        for (size_t i = 0; i < hc.size(); i++) {
            ASSERT_TRUE(std::isfinite(gc[i]) && std::isfinite(gs[i])) << "table entry " << i << " not written";
            for (auto [g, h] : {std::pair{gc[i], hc[i]}, std::pair{gs[i], hs[i]}}) {
                const int64_t u = (std::signbit(g) == std::signbit(h)) ? testing_util::ulp_distance(g, h)
                                                                       : (g == 0 && h == 0 ? 0 : 1 << 30);
                mism += u != 0;
                worst = std::max(worst, u);
            }
        }
        EXPECT_LE(worst, 1) << (yarn ? "yarn" : "plain");
        std::printf("[ info ] rope tables (%s, %lld positions x 32 pairs): %zu of %zu entries differ from glibc, max %lld ulp\n",
                    yarn ? "compress_rope_theta + YaRN" : "rope_theta", (long long)n, mism, 2 * hc.size(), (long long)worst);
    }
}

// rows of width dim, rows_per_pos rows per position; checks forward / inverse / bf16 variants.
void check_rotation(int64_t tokens, int64_t heads, bool yarn, bool inverse, bool rb) {
    const int64_t dim = 512, rows = tokens * heads;
    const std::string what = std::string("rope ") + (yarn ? "yarn" : "plain") + (inverse ? " inverse" : "") +
                             (rb ? " bf16" : "") + " [" + std::to_string(tokens) + ", " + std::to_string(heads) + ", 512]";
    const engine::rope_table t = engine::make_rope_table(v41_rope_config(), yarn);
    std::vector<int64_t> pos = test_positions(tokens);
    std::vector<float> x = testing_util::random_normal(size_t(rows * dim), uint32_t(rows + yarn));

    dev_vec<int64_t> dpos(pos);
    dev_vec<float> dinv(t.inv_freq), dx(x), dc(size_t(tokens * 32)), ds(size_t(tokens * 32));
    ASSERT_TRUE(cuda::rope_tail_rows(dx.p, rows, dim, dpos.p, heads, dinv.p, 32, inverse, rb, nullptr).is_ok());
    ASSERT_TRUE(cuda::rope_tables(dpos.p, tokens, dinv.p, 32, dc.p, ds.p, nullptr).is_ok());
    std::vector<float> got = dx.download(), gc = dc.download(), gs = ds.download();

    // (1) bit-exact against the CPU rotation fed with the GPU's tables (one table row per x row).
    std::vector<float> rc(size_t(rows * 32)), rs(rc.size());
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < 32; i++) {
            rc[size_t(r * 32 + i)] = gc[size_t((r / heads) * 32 + i)];
            rs[size_t(r * 32 + i)] = gs[size_t((r / heads) * 32 + i)];
        }
    std::vector<float> exact = x;
    cpu::rope_tail(exact.data(), rows, dim, rc.data(), rs.data(), 32, inverse);
    if (rb)
        for (auto &v : exact) v = round_bf16(v);
    EXPECT_EQ(testing_util::bit_mismatches(got, exact, what + " vs cpu rope_tail on the GPU tables"), 0u);

    // (2) against the engine's own rotation (host tables).
    std::vector<int64_t> rpos(rows);
    for (int64_t r = 0; r < rows; r++) rpos[size_t(r)] = pos[size_t(r / heads)];
    std::vector<float> ref = x;
    engine::rope_rows(ref.data(), rows, dim, rpos.data(), t, inverse);
    if (rb)
        for (auto &v : ref) v = round_bf16(v);
    double worst = 0;
    size_t bits = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t p = 0; p < dim / 2; p++) {
            const size_t i = size_t(r * dim + 2 * p);
            const double mag = std::fabs(double(x[i])) + std::fabs(double(x[i + 1]));
            for (size_t k : {i, i + 1}) {
                bits += f32_bits(got[k]) != f32_bits(ref[k]);
                const double d = std::fabs(double(got[k]) - ref[k]);
                // bf16 output: a tiny difference may cross a bf16 tie, one bf16 ulp.
                const double tol = rb ? std::ldexp(mag, -7) : std::ldexp(mag, -21);
                if (d > tol) ADD_FAILURE() << what << ": row " << r << " channel " << 2 * p << " " << got[k] << " vs " << ref[k];
                worst = std::max(worst, d / std::max(mag, 1e-30));
            }
        }
    std::printf("[ info ] %s vs engine rope_rows: max |d| / (|a|+|b|) %.3g, bit mismatches %zu of %lld\n", what.c_str(),
                worst, bits, (long long)(rows * dim));
}

TEST_F(CudaRope, QueryRowsForwardMatchesCpu) {
    check_rotation(5, 64, false, false, false);
    check_rotation(5, 64, true, false, false);
}

TEST_F(CudaRope, KvRowsAndBf16WriteBack) {
    check_rotation(64, 1, true, false, true);
    check_rotation(16, 1, false, false, false);
}

TEST_F(CudaRope, InverseOnAttentionOutput) {
    check_rotation(3, 64, true, true, false);
    check_rotation(3, 64, false, true, true);
}

TEST_F(CudaRope, RejectsBadShapes) {
    EXPECT_FALSE(cuda::rope_tail_rows(nullptr, 1, 511, nullptr, 1, nullptr, 32, false, false, nullptr).is_ok());
    EXPECT_FALSE(cuda::rope_tail_rows(nullptr, 1, 32, nullptr, 1, nullptr, 32, false, false, nullptr).is_ok());
}

}  // namespace
