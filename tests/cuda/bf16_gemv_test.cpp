// backend/cuda bf16_gemv (the decode GEMV over plain BF16 weights) against a CPU reference: the
// fp64 sum of the exact products x[m, k] * w[n, k] rounded once. The kernel adds the same exact
// products (x in three BF16 pieces) in fp32 on the tensor cores, so each output may differ by
// fp32 summation error: bound 1e-5 * sum_k |x_k w_k| per output (the measured worst is printed).
// y is NaN-poisoned first (every output written); a row gives the same bits at every M (1, 5, 9,
// 16: both token-tile instances); bad shapes are refused. The timing lines (V4.1's head, against
// dense_linear) are information only.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cuda/bf16_gemv.cuh"
#include "backend/cuda/dense.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using testing_util::dev_vec;

namespace {

class CudaBf16Gemv : public testing_util::CudaOps {};

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.05f);
    std::vector<uint16_t> v(n);
    for (auto &b : v) b = uint16_t(std::bit_cast<uint32_t>(d(rng)) >> 16);  // truncation: any bf16 will do
    return v;
}
float bf16_value(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

std::vector<float> run(const dev_vec<float> &x, const dev_vec<uint16_t> &w, int M, int N, int K) {
    dev_vec<float> y(size_t(M) * N);
    y.poison();
    dev_vec<uint8_t> ws(backend::cuda::bf16_gemv_workspace_bytes(M, K));
    const Status st = backend::cuda::bf16_gemv(x.p, w.p, y.p, M, N, K, ws.p, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return y.download();
}

TEST_F(CudaBf16Gemv, MatchesExactProductsSummedInFp64) {
    for (auto [M, N, K] : {std::tuple{16, 1037, 5120}, std::tuple{3, 77, 64}, std::tuple{9, 4096, 1024}}) {
        const std::vector<float> xh = testing_util::random_normal(size_t(M) * K, uint32_t(M * 31 + K));
        const std::vector<uint16_t> wh = random_bf16(size_t(N) * K, uint32_t(N));
        dev_vec<float> x(xh);
        dev_vec<uint16_t> w(wh);
        const std::vector<float> got = run(x, w, M, N, K);
        double worst = 0;
        size_t bad = 0;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    const double p = double(xh[size_t(m) * K + k]) * double(bf16_value(wh[size_t(n) * K + k]));
                    ref += p, mag += std::fabs(p);
                }
                const float g = got[size_t(m) * N + n];
                const double r = std::fabs(double(g) - double(float(ref))) / mag;
                if (!(r <= 1e-5) && bad++ < 5) ADD_FAILURE() << "M " << M << " row " << m << " column " << n << ": " << g << " vs " << ref;
                if (std::isfinite(r)) worst = std::max(worst, r);
            }
        EXPECT_EQ(bad, 0u);
        std::printf("[ info ] bf16_gemv M %d N %d K %d: max |gpu - ref| / sum |x w| = %.3g\n", M, N, K, worst);
    }
}

TEST_F(CudaBf16Gemv, RowsDoNotDependOnM) {
    const int N = 3001, K = 2048;
    const std::vector<float> xh = testing_util::random_normal(size_t(16) * K, 7);
    dev_vec<float> x(xh);
    dev_vec<uint16_t> w(random_bf16(size_t(N) * K, 8));
    const std::vector<float> all = run(x, w, 16, N, K);
    for (int M : {1, 5, 9}) {
        const std::vector<float> part = run(x, w, M, N, K);
        EXPECT_EQ(testing_util::bit_mismatches(part, std::vector<float>(all.begin(), all.begin() + size_t(M) * N),
                                               "rows of M " + std::to_string(M) + " vs M 16"),
                  0u);
    }
}

TEST_F(CudaBf16Gemv, RefusesBadShapes) {
    dev_vec<float> x(64), y(64);
    dev_vec<uint16_t> w(64);
    dev_vec<uint8_t> ws(4096);
    EXPECT_FALSE(backend::cuda::bf16_gemv(x.p, w.p, y.p, 17, 1, 32, ws.p, nullptr).is_ok());
    EXPECT_FALSE(backend::cuda::bf16_gemv(x.p, w.p, y.p, 1, 1, 48, ws.p, nullptr).is_ok());
    EXPECT_FALSE(backend::cuda::bf16_gemv(x.p, w.p, y.p, 1, 1, 32, nullptr, nullptr).is_ok());
}

// Information only: V4.1's head (129280 x 5120 bf16, 1.32 GB) at decode batches, against
// dense_linear (the FMA kernel the engine used for it).
TEST_F(CudaBf16Gemv, HeadTiming) {
    const int N = 129280, K = 5120;
    dev_vec<uint16_t> w(size_t(N) * K);
    const std::vector<uint16_t> piece = random_bf16(size_t(1) << 23, 9);
    for (size_t o = 0; o < w.n; o += piece.size())
        ASSERT_EQ(cudaMemcpy(w.p + o, piece.data(), std::min(piece.size(), w.n - o) * 2, cudaMemcpyHostToDevice), cudaSuccess);
    dev_vec<float> x(testing_util::random_normal(size_t(16) * K, 10)), y(size_t(16) * N);
    dev_vec<uint8_t> ws(backend::cuda::bf16_gemv_workspace_bytes(16, K));
    for (int M : {1, 2, 4, 8, 16}) {
        const double bytes = double(N) * K * 2;
        testing_util::print_timing("bf16_gemv head M " + std::to_string(M), bytes,
                                   [&] { (void)backend::cuda::bf16_gemv(x.p, w.p, y.p, M, N, K, ws.p, nullptr); }, 20);
        testing_util::print_timing("dense_linear head M " + std::to_string(M), bytes,
                                   [&] { (void)backend::cuda::dense_linear(x.p, w.p, true, y.p, M, N, K, nullptr); }, 20);
    }
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
