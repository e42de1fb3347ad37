// The TP partials' reduction (backend/cuda/partial_reduce.cu) against the host's rank-ordered
// fp32 sum (what experts/remote.cpp does with TCP partials), at the V4.1 decode shapes (dim 4096,
// rows 1 and 16) and a ragged size, TP 1..6. Tolerance: bit-exact, since both sides add the same
// fp32 values in the same order with round-to-nearest and no fused multiply-add. The output is
// poisoned with NaN first, so an element left unwritten fails.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/partial_reduce.cuh"

using namespace ds41rt;

namespace {

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(PartialReduce, RankOrderedSumIsBitExact) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    for (int64_t n : {int64_t(4096), int64_t(16) * 4096, int64_t(1000003)})
        for (int tp = 1; tp <= 6; tp++) {
            std::mt19937 rng(uint32_t(n * 7 + tp));
            // Mixed magnitudes, so the order of the adds changes the rounding (a reordered sum fails).
            std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
            std::uniform_int_distribution<int> ex(-12, 12);
            const size_t un = static_cast<size_t>(n);
            std::vector<std::vector<float>> parts(static_cast<size_t>(tp), std::vector<float>(un));
            for (auto &p : parts)
                for (float &v : p) v = std::ldexp(mant(rng), ex(rng));
            std::vector<float> ref(un);
            for (int64_t i = 0; i < n; i++) {
                float s = parts[0][size_t(i)];
                for (int r = 1; r < tp; r++) s += parts[size_t(r)][size_t(i)];
                ref[size_t(i)] = s;
            }
            backend::cuda::partial_set set;
            set.tp = tp;
            std::vector<void *> bufs;
            for (int r = 0; r < tp; r++) {
                void *d = nullptr;
                ASSERT_EQ(cudaMalloc(&d, size_t(n) * 4), cudaSuccess);
                ASSERT_EQ(cudaMemcpy(d, parts[size_t(r)].data(), size_t(n) * 4, cudaMemcpyHostToDevice), cudaSuccess);
                set.p[r] = static_cast<const float *>(d);
                bufs.push_back(d);
            }
            float *out = nullptr;
            ASSERT_EQ(cudaMalloc(&out, size_t(n) * 4), cudaSuccess);
            ASSERT_EQ(cudaMemset(out, 0xff, size_t(n) * 4), cudaSuccess);  // NaN poison
            const auto t0 = std::chrono::steady_clock::now();
            Status st = backend::cuda::reduce_partials(set, n, out, nullptr);
            ASSERT_TRUE(st) << st.to_string();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            std::vector<float> got(un);
            ASSERT_EQ(cudaMemcpy(got.data(), out, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
            size_t diff = 0;
            for (int64_t i = 0; i < n; i++)
                if (std::memcmp(&got[size_t(i)], &ref[size_t(i)], 4) != 0) diff++;
            std::printf("[ partial reduce ] n %8lld TP %d: %zu elements differ from the host sum; %.1f us (info)\n",
                        static_cast<long long>(n), tp, diff, us);
            EXPECT_EQ(diff, 0u) << "n " << n << " TP " << tp;
            for (void *d : bufs) cudaFree(d);
            cudaFree(out);
        }
}

TEST(PartialReduce, RefusesBadRankCounts) {
    backend::cuda::partial_set set;
    set.tp = 0;
    EXPECT_FALSE(backend::cuda::reduce_partials(set, 16, nullptr, nullptr));
    set.tp = backend::cuda::MAX_REDUCE_RANKS + 1;
    EXPECT_FALSE(backend::cuda::reduce_partials(set, 16, nullptr, nullptr));
    set.tp = 2;  // rank 1's pointer missing
    float dummy = 0;
    set.p[0] = &dummy;
    EXPECT_FALSE(backend::cuda::reduce_partials(set, 16, nullptr, nullptr));
}

}  // namespace
