// GPU dense_linear (backend/cuda/dense) against an fp64 matmul written here (exact fp32 x fp32
// products summed in fp64, so it sits within one fp32 rounding of the exact product), on
// hash-generated inputs: the V4.1 head [129280, 5120] bf16 at M = 1 and 16, small F32 / BF16
// shapes with K 64, 80, 192 and 81 (81: the element-load path) at every M in 1..40, and two
// prefill shapes (row slices over grid.y, several row tiles per slice). The narrow decode shapes
// (dense_narrow_kernel at M <= 16) are held to a host emulation of the documented order: 0 bits
// may differ.
// Tolerance: |d| <= 1e-6 |ref| + 5e-7 * sum_k |x_k w_k|. The kernel adds K / 8 products per part
// sequentially in fp32 and combines 8 parts: the rounding error is a random walk of about
// 2^-24 * sqrt(K / 8) * |partial sums|, ~2.4e-8 of sum |x w| in rms (any K), ~1e-6 of a typical
// |y| at K = 5120. A host emulation of this order on 320,000 head outputs (these generators)
// reached at most 0.11 of the bound (max |d| / sum |x w| 5.3e-8).
// Batch invariance: every row of an M-row call must equal, bit for bit, the same row computed
// alone (M = 1). Outputs are poisoned with NaN before each call. dense_linear_pair's two outputs
// are held to the same order emulation. The head's speed is printed
// next to the copy bandwidth measured here (cudaMemcpy D2D of 1 GiB, read + write counted).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/dense.cuh"
#include "core/dtype.h"
#include "core/threads.h"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [-1, 1), a multiple of 2^-23; a function of (seed, i) so threads fill in parallel.
float uniform(uint64_t seed, uint64_t i) {
    return float(int64_t(mix(seed * 0x100000001b3ull ^ i) >> 40) - (int64_t(1) << 23)) * 0x1p-23f;
}

std::vector<float> random_x(int64_t M, int64_t K, uint64_t seed) {
    std::vector<float> x(size_t(M * K));
    parallel_for(M * K, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; i++) x[size_t(i)] = uniform(seed, uint64_t(i));
    }, 1 << 16);
    return x;
}

// Weights [N, K] of scale 0.05, stored as the kernel reads them (bf16 bits or fp32).
struct weights {
    bool bf16 = false;
    int64_t N = 0, K = 0;
    std::vector<uint16_t> b;
    std::vector<float> f;
    weights(bool is_bf16, int64_t n, int64_t k, uint64_t seed) : bf16(is_bf16), N(n), K(k) {
        if (bf16) b.resize(size_t(N * K));
        else f.resize(size_t(N * K));
        parallel_for(N * K, [&](int64_t a, int64_t e) {
            for (int64_t i = a; i < e; i++) {
                const float v = 0.05f * uniform(seed, uint64_t(i));
                if (bf16) b[size_t(i)] = f32_to_bf16(v);
                else f[size_t(i)] = v;
            }
        }, 1 << 16);
    }
    double at(int64_t n, int64_t k) const {
        return bf16 ? double(bf16_to_f32(b[size_t(n * K + k)])) : double(f[size_t(n * K + k)]);
    }
    size_t bytes() const { return size_t(N * K) * (bf16 ? 2 : 4); }
    const void *host() const { return bf16 ? static_cast<const void *>(b.data()) : static_cast<const void *>(f.data()); }
};

struct reference {
    std::vector<double> y, abs;  // [M, N]: the fp64 sums and sum_k |x_k w_k|
};

reference matmul_fp64(const std::vector<float> &x, int64_t M, const weights &w) {
    reference r;
    r.y.resize(size_t(M * w.N));
    r.abs.resize(size_t(M * w.N));
    parallel_for(w.N, [&](int64_t n0, int64_t n1) {
        std::vector<double> row(size_t(w.K));
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t k = 0; k < w.K; k++) row[size_t(k)] = w.at(n, k);
            for (int64_t m = 0; m < M; m++) {
                const float *xr = x.data() + m * w.K;
                double s = 0, a = 0;
                for (int64_t k = 0; k < w.K; k++) {
                    const double t = double(xr[k]) * row[size_t(k)];
                    s += t;
                    a += std::fabs(t);
                }
                r.y[size_t(m * w.N + n)] = s;
                r.abs[size_t(m * w.N + n)] = a;
            }
        }
    }, 4);
    return r;
}

struct device_weights {
    void *p = nullptr;
    explicit device_weights(const weights &w) {
        EXPECT_EQ(cudaMalloc(&p, w.bytes()), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(p, w.host(), w.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    ~device_weights() { cudaFree(p); }
    device_weights(const device_weights &) = delete;
    device_weights &operator=(const device_weights &) = delete;
};

// dense_linear on rows [m0, m0 + M) of dx, into a poisoned output; returns the output.
std::vector<float> run(const dev_vec<float> &dx, int64_t m0, int64_t M, const device_weights &dw, const weights &w) {
    dev_vec<float> dy(size_t(M * w.N));
    dy.poison();
    const Status st = cuda::dense_linear(dx.p + m0 * w.K, dw.p, w.bf16, dy.p, M, w.N, w.K, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return dy.download();
}

struct errors {
    double worst_abs = 0;  // max |d| / sum |x w|
    double worst_rel = 0;  // max |d| / |ref| over outputs with |ref| >= sum |x w| / sqrt(K) (typical ones)
};

// Rows [0, M) of got against rows [r0, r0 + M) of ref; fails on an unwritten or out-of-bound output.
void check(const std::vector<float> &got, const reference &ref, int64_t r0, int64_t M, const weights &w, errors &e,
           const std::string &what) {
    size_t bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < w.N; n++) {
            const size_t gi = size_t(m * w.N + n), ri = size_t((r0 + m) * w.N + n);
            const double g = got[gi], y = ref.y[ri], a = ref.abs[ri], d = std::fabs(g - y);
            if (!std::isfinite(g)) {
                ADD_FAILURE() << what << ": y[" << m << ", " << n << "] not written (NaN poison)";
                return;
            }
            if (d > 1e-6 * std::fabs(y) + 5e-7 * a && bad++ < 5)
                ADD_FAILURE() << what << ": y[" << m << ", " << n << "] " << g << " vs " << y << " (sum |xw| " << a << ")";
            e.worst_abs = std::max(e.worst_abs, d / std::max(a, 1e-300));
            if (std::fabs(y) >= a / std::sqrt(double(w.K))) e.worst_rel = std::max(e.worst_rel, d / std::fabs(y));
        }
}

size_t count_bit_diffs(const std::vector<float> &a, size_t a0, const std::vector<float> &b, size_t b0, size_t n) {
    size_t diffs = 0;
    for (size_t i = 0; i < n; i++) diffs += f32_bits(a[a0 + i]) != f32_bits(b[b0 + i]);
    return diffs;
}

// Device-to-device copy bandwidth, read + write bytes counted, best of 5.
double copy_gbps() {
    const size_t bytes = size_t(1) << 30;
    void *a = nullptr, *b = nullptr;
    EXPECT_EQ(cudaMalloc(&a, bytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double best = 0;
    for (int i = 0; i < 6; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0) best = std::max(best, 2.0 * double(bytes) / (ms * 1e-3) * 1e-9);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return best;
}

class CudaDense : public testing_util::CudaOps {};

TEST_F(CudaDense, HeadBf16MatchesFp64AndIsBatchInvariant) {
    const int64_t N = 129280, K = 5120, M = 16;
    const weights w(true, N, K, 11);
    const std::vector<float> x = random_x(M, K, 12);
    const reference ref = matmul_fp64(x, M, w);
    const device_weights dw(w);
    dev_vec<float> dx(x);
    errors e;
    const std::vector<float> y16 = run(dx, 0, M, dw, w);
    check(y16, ref, 0, M, w, e, "head M 16");
    size_t diffs = 0;
    for (int64_t r : {int64_t(0), int64_t(5), M - 1}) {
        const std::vector<float> y1 = run(dx, r, 1, dw, w);
        check(y1, ref, r, 1, w, e, "head M 1 row " + std::to_string(r));
        diffs += count_bit_diffs(y16, size_t(r * N), y1, 0, size_t(N));
    }
    EXPECT_EQ(diffs, 0u) << "rows of the M = 16 call differ from the same rows alone";
    std::printf("[ info ] dense_linear head [%lld, %lld] bf16: max |d| / sum|xw| %.3g, max rel err %.3g, "
                "M 16 vs M 1 bit differences %zu\n",
                (long long)N, (long long)K, e.worst_abs, e.worst_rel, diffs);

    const double copy = copy_gbps();
    std::printf("[ time ] cudaMemcpy D2D 1 GiB: %.0f GB/s (read + write)\n", copy);
    dev_vec<float> dy(size_t(M * N));
    for (int64_t m : {int64_t(1), int64_t(4), M}) {
        const double us = testing_util::time_us([&] { (void)cuda::dense_linear(dx.p, dw.p, true, dy.p, m, N, K, nullptr); }, 20);
        const double bytes = double(w.bytes()) + double(m * K * 4) + double(m * N * 4);
        std::printf("[ time ] dense_linear head M %lld: %.1f us, %.0f GB/s = %.0f%% of copy, %.1f TFLOP/s fp32\n",
                    (long long)m, us, bytes / us * 1e-3, 100.0 * bytes / us * 1e-3 / copy, 2.0 * m * N * K / us * 1e-6);
    }
}

TEST_F(CudaDense, SmallShapesEveryM) {
    const int64_t MAXM = 40;
    struct shape {
        int64_t N, K;
    };
    for (bool bf16 : {false, true})
        for (shape s : {shape{8, 64}, shape{8, 80}, shape{37, 192}, shape{19, 81}}) {
            const weights w(bf16, s.N, s.K, uint64_t(100 + s.N * 1000 + s.K));
            const std::vector<float> x = random_x(MAXM, s.K, uint64_t(200 + s.K));
            const reference ref = matmul_fp64(x, MAXM, w);
            const device_weights dw(w);
            dev_vec<float> dx(x);
            const std::string name = std::string(bf16 ? "bf16" : "f32") + " [" + std::to_string(s.N) + ", " +
                                     std::to_string(s.K) + "]";
            std::vector<float> alone(size_t(MAXM * s.N));
            errors e;
            for (int64_t r = 0; r < MAXM; r++) {
                const std::vector<float> y = run(dx, r, 1, dw, w);
                check(y, ref, r, 1, w, e, name + " row " + std::to_string(r) + " alone");
                std::copy(y.begin(), y.end(), alone.begin() + r * s.N);
            }
            size_t diffs = 0;
            for (int64_t M = 2; M <= MAXM; M++) {
                const std::vector<float> y = run(dx, 0, M, dw, w);
                check(y, ref, 0, M, w, e, name + " M " + std::to_string(M));
                diffs += count_bit_diffs(y, 0, alone, 0, size_t(M * s.N));
            }
            EXPECT_EQ(diffs, 0u) << name << ": rows of M > 1 calls differ from the rows alone";
            std::printf("[ info ] dense_linear %s M 1..40: max |d| / sum|xw| %.3g, max rel err %.3g, batch bit "
                        "differences %zu\n",
                        name.c_str(), e.worst_abs, e.worst_rel, diffs);
        }
}

TEST_F(CudaDense, PrefillShapes) {
    struct shape {
        bool bf16;
        int64_t M, N, K;
    };
    // 1000 x 300: one 16-row tile per grid.y slice; 200 x 16384: several tiles per slice.
    for (shape s : {shape{true, 1000, 300, 1024}, shape{false, 200, 16384, 256}}) {
        const weights w(s.bf16, s.N, s.K, uint64_t(300 + s.M));
        const std::vector<float> x = random_x(s.M, s.K, uint64_t(400 + s.M));
        const reference ref = matmul_fp64(x, s.M, w);
        const device_weights dw(w);
        dev_vec<float> dx(x);
        const std::string name = std::string(s.bf16 ? "bf16" : "f32") + " M " + std::to_string(s.M) + " [" +
                                 std::to_string(s.N) + ", " + std::to_string(s.K) + "]";
        errors e;
        const std::vector<float> y = run(dx, 0, s.M, dw, w);
        check(y, ref, 0, s.M, w, e, name);
        size_t diffs = 0;
        for (int64_t r : {int64_t(0), int64_t(17), s.M - 1}) {
            const std::vector<float> y1 = run(dx, r, 1, dw, w);
            diffs += count_bit_diffs(y, size_t(r * s.N), y1, 0, size_t(s.N));
        }
        EXPECT_EQ(diffs, 0u) << name << ": rows differ from the same rows alone";
        std::printf("[ info ] dense_linear %s: max |d| / sum|xw| %.3g, max rel err %.3g, batch bit differences %zu\n",
                    name.c_str(), e.worst_abs, e.worst_rel, diffs);
    }
}

// The order dense.cuh documents, on the host (std::fmaf is correctly rounded; the butterfly is
// the kernels' shuffle sequence), for outputs [M, N] of x [M, K] (K % 8 == 0).
std::vector<float> order_emulation(const std::vector<float> &x, int64_t M, const weights &w) {
    std::vector<float> y(size_t(M * w.N));
    const int64_t nchunks = w.K / 8;
    parallel_for(w.N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++)
            for (int64_t m = 0; m < M; m++) {
                float v[8];
                for (int p = 0; p < 8; p++) {
                    float acc = 0.0f;
                    for (int64_t c = p; c < nchunks; c += 8)
                        for (int64_t k = c * 8; k < c * 8 + 8; k++)
                            acc = std::fmaf(x[size_t(m * w.K + k)], float(w.at(n, k)), acc);
                    v[p] = acc;
                }
                for (int o : {4, 2, 1}) {
                    float t[8];
                    for (int p = 0; p < 8; p++) t[p] = v[p] + v[p ^ o];
                    std::copy(t, t + 8, v);
                }
                y[size_t(m * w.N + n)] = v[0];
            }
    }, 4);
    return y;
}

// Narrow products at decode sizes (the router gate 384 x 5120 bf16, the compressor and indexer
// projections, an F32 one) take dense_narrow_kernel for M <= 16 and dense_kernel above: both must
// give the documented order's bits exactly (so a row is the same in a prefill and a decode).
// Timing (informational): the router gate at M = 1.
TEST_F(CudaDense, NarrowShapesGiveTheOrdersBits) {
    struct shape {
        bool bf16;
        int64_t N, K;
    };
    for (shape s : {shape{true, 384, 5120}, shape{true, 512, 5120}, shape{true, 64, 5120}, shape{false, 100, 1024},
                    shape{true, 3, 64}}) {
        const weights w(s.bf16, s.N, s.K, uint64_t(500 + s.N + s.K));
        const int64_t MAXM = 17;
        const std::vector<float> x = random_x(MAXM, s.K, uint64_t(600 + s.K));
        const device_weights dw(w);
        dev_vec<float> dx(x);
        const std::string name = std::string(s.bf16 ? "bf16" : "f32") + " [" + std::to_string(s.N) + ", " +
                                 std::to_string(s.K) + "]";
        for (int64_t M : {1, 2, 5, 16, 17}) {
            const std::vector<float> want = order_emulation(x, M, w);
            const std::vector<float> got = run(dx, 0, M, dw, w);
            EXPECT_EQ(count_bit_diffs(got, 0, want, 0, want.size()), 0u) << name << " M " << M;
        }
        if (s.N == 384) {
            dev_vec<float> dy(size_t(s.N));
            const double us = testing_util::time_us([&] { (void)cuda::dense_linear(dx.p, dw.p, true, dy.p, 1, s.N, s.K, nullptr); }, 50);
            std::printf("[ info ] dense_linear %s M 1 (router gate): %.2f us, %.0f GB/s of weights\n", name.c_str(), us,
                        double(w.bytes()) / (us * 1e-6) * 1e-9);
        }
    }
}

// dense_linear_pair (the compressor's kv and gate, [512, 5120] F32 each, in one launch at decode;
// bf16 pairs of unequal width; a pair too wide for the narrow kernel, two dense_linear calls):
// each output the documented order's bits, as dense_linear alone gives them; both poisoned first.
TEST_F(CudaDense, PairGivesEachProductsBits) {
    struct pair_shape {
        bool bf16;
        int64_t N1, N2, K;
    };
    for (pair_shape s : {pair_shape{false, 512, 512, 5120}, pair_shape{true, 384, 64, 5120}, pair_shape{true, 3, 5, 64},
                         pair_shape{true, 20000, 512, 512}}) {
        const weights w1(s.bf16, s.N1, s.K, uint64_t(700 + s.N1)), w2(s.bf16, s.N2, s.K, uint64_t(800 + s.N2));
        const std::vector<float> x = random_x(17, s.K, uint64_t(900 + s.K));
        const device_weights dw1(w1), dw2(w2);
        dev_vec<float> dx(x);
        for (int64_t M : {1, 3, 16, 17}) {
            dev_vec<float> y1(size_t(M * s.N1)), y2(size_t(M * s.N2));
            y1.poison();
            y2.poison();
            const Status st = cuda::dense_linear_pair(dx.p, dw1.p, y1.p, s.N1, dw2.p, y2.p, s.N2, s.bf16, M, s.K, nullptr);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            const std::vector<float> want1 = order_emulation(x, M, w1), want2 = order_emulation(x, M, w2);
            const std::string name = std::string(s.bf16 ? "bf16" : "f32") + " [" + std::to_string(s.N1) + " + " +
                                     std::to_string(s.N2) + ", " + std::to_string(s.K) + "] M " + std::to_string(M);
            EXPECT_EQ(count_bit_diffs(y1.download(), 0, want1, 0, want1.size()), 0u) << name << " first";
            EXPECT_EQ(count_bit_diffs(y2.download(), 0, want2, 0, want2.size()), 0u) << name << " second";
        }
    }
    dev_vec<float> d(64);
    EXPECT_FALSE(cuda::dense_linear_pair(d.p, d.p, d.p, 8, nullptr, d.p, 8, false, 1, 8, nullptr).is_ok());
}

TEST_F(CudaDense, RejectsBadShapes) {
    dev_vec<float> d(64);
    EXPECT_FALSE(cuda::dense_linear(d.p, d.p, false, d.p, 0, 8, 8, nullptr).is_ok());
    EXPECT_FALSE(cuda::dense_linear(d.p, d.p, false, d.p, 1, 8, 0, nullptr).is_ok());
    EXPECT_FALSE(cuda::dense_linear(nullptr, d.p, false, d.p, 1, 8, 8, nullptr).is_ok());
}

}  // namespace
