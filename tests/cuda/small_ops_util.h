// Helpers of the small-op GPU tests (norm, rope, quantizers, packing, SwiGLU, gathers): device
// buffers that upload / download host vectors, NaN / 0xff poisoning, bit comparisons, and the
// official GEMV that checks a producer's split (gemv_split) through what it is for.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/gemv.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace ds41rt::testing_util {

// A device array of T with host copies in and out.
template <typename T>
struct dev_vec {
    T *p = nullptr;
    size_t n = 0;
    explicit dev_vec(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess); }
    explicit dev_vec(const std::vector<T> &h) : dev_vec(h.size()) { upload(h); }
    ~dev_vec() { cudaFree(p); }
    dev_vec(const dev_vec &) = delete;
    dev_vec &operator=(const dev_vec &) = delete;
    void upload(const std::vector<T> &h) {
        ASSERT_EQ(h.size(), n);
        ASSERT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    std::vector<T> download() const {
        std::vector<T> h(n);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    }
    // Every byte 0xff: a NaN for floats, an out-of-range code for the quantized arrays.
    void poison(int byte = 0xff) { ASSERT_EQ(cudaMemset(p, byte, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess); }
};

// Elements whose bits differ (signed zeros and NaN payloads count); reports the first few.
inline size_t bit_mismatches(const std::vector<float> &got, const std::vector<float> &ref, const std::string &what) {
    EXPECT_EQ(got.size(), ref.size()) << what;
    size_t bad = 0;
    for (size_t i = 0; i < std::min(got.size(), ref.size()); i++)
        if (f32_bits(got[i]) != f32_bits(ref[i]) && bad++ < 5)
            ADD_FAILURE() << what << ": element " << i << " " << got[i] << " (0x" << std::hex << f32_bits(got[i])
                          << ") vs " << ref[i] << " (0x" << f32_bits(ref[i]) << std::dec << ")";
    return bad;
}

// Distance in units in the last place between two finite floats of the same sign.
inline int64_t ulp_distance(float a, float b) {
    auto key = [](float f) {
        const int64_t u = int64_t(f32_bits(f) & 0x7fffffffu);
        return (f32_bits(f) >> 31) ? -u : u;
    };
    return std::llabs(key(a) - key(b));
}

// Rows with magnitudes spread over 2^-20 .. 2^10 (a different power of two per row), so the
// block scales of the quantizers take many values; v ~ N(0, 1) * 2^k.
inline std::vector<float> spread_rows(int64_t rows, int64_t dim, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(size_t(rows * dim));
    for (int64_t r = 0; r < rows; r++) {
        const float sc = std::ldexp(1.0f, int(rng() % 31) - 20);
        for (int64_t c = 0; c < dim; c++) v[size_t(r * dim + c)] = d(rng) * sc;
    }
    return v;
}

// spread_rows, then the first rows overwritten with blocks that hit the quantizers' edges: exact
// E2M1 and E4M3 rounding ties (the blocks' amax 6 or 448 makes the scale 1), E4M3 subnormals,
// signed zeros, an all-zero block (the amax floor) and tiny values (quotients that underflow).
inline std::vector<float> quant_rows(int64_t rows, int64_t dim, uint32_t seed) {
    std::vector<float> v = spread_rows(rows, dim, seed);
    const float e2m1_ties[] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -1.25f,
                               -1.75f, -2.5f, -3.5f, -5.0f, -0.0f, 0.0f, 0.1f, -5.9f, 4.4f};
    const float e4m3_ties[] = {448.0f, 1.0625f, 1.1875f, -1.0625f, 17.0f, -19.0f, 0x1p-10f, 0x3p-10f, -0x5p-11f,
                               0x1p-11f, -0.0f, 0.0f, 232.0f, -240.0f, 0x1.1p-5f, 300.0f};
    auto fill = [&](int64_t r, const float *vals, size_t n) {
        for (int64_t c = 0; c < dim; c++) v[size_t(r * dim + c)] = vals[size_t(c) % n];
    };
    if (rows > 0) fill(0, e2m1_ties, std::size(e2m1_ties));
    if (rows > 1) fill(1, e4m3_ties, std::size(e4m3_ties));
    if (rows > 2) {
        const float zero = 0.0f;
        fill(2, &zero, 1);
    }
    if (rows > 3)
        for (int64_t c = 0; c < dim; c++) v[size_t(3 * dim + c)] = float(c % 7 - 3) * 1e-30f;
    return v;
}

// Mean time of one call of fn (launches on the legacy stream) over reps back-to-back calls after
// a warm-up, in microseconds. Information, never asserted.
template <typename F>
double time_us(F &&fn, int reps = 100) {
    fn();
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int i = 0; i < reps; i++) fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1e3 * ms / reps;
}

// time_us, printed with the bandwidth that moving `bytes` per call in that time means.
template <typename F>
void print_timing(const std::string &what, double bytes, F &&fn, int reps = 100) {
    const double us = time_us(fn, reps);
    std::printf("[ time ] %s: %.2f us per call, %.0f GB/s for %.0f bytes\n", what.c_str(), us, bytes / us * 1e-3, bytes);
}

// Skips the test when there is no usable GPU (CI builds without one).
class CudaOps : public ::testing::Test {
protected:
    void SetUp() override {
        auto d = backend::cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
    }
};

// y = W x in official numerics: W (q) FP8 [N, K] on an act_block grid, x [S, K] on the device,
// split by the GEMV itself or, given one, taken from the producer's split.
inline std::vector<float> official_gemv(const backend::cuda::device_info &dev, const quant_weight &q, const float *x,
                                        int S, int N, int K, int act_block, const backend::cuda::gemv_split *split) {
    dev_vec<uint8_t> w(q.w), sc(q.scale);
    dev_vec<float> y(size_t(S) * N);
    y.poison();
    backend::cuda::gemv_matrix m;
    m.w = w.p, m.scale = sc.p, m.block_out = m.block_in = act_block;
    m.N = N, m.K = K, m.M = S, m.x = x, m.y = y.p, m.act_block = act_block;
    if (split) m.split = *split;
    auto plan = backend::cuda::plan_gemv(dev, {m});
    EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
    if (!plan) return {};
    dev_vec<uint8_t> ws(plan->workspace_bytes);
    EXPECT_EQ(cudaMemset(ws.p, 0, ws.n), cudaSuccess);
    const Status st = backend::cuda::run_gemv(*plan, ws.p, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return y.download();
}

}  // namespace ds41rt::testing_util
