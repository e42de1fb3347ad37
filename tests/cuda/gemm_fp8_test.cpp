// GPU prefill GEMM in official numerics (backend/cuda/gemm_fp8.cu) against the CPU reference:
// backend/cpu fake_quant_fp8_ue8m0 of x, then matmul_nt against the weight dequantized by
// core/dtype (cuda_test_util.h), at ragged small shapes and at V4.1 / V4 prefill shapes, on each
// kernel the device and build can run (mma.sync everywhere; wgmma on sm_90a, gemm_fp8_sm90.cu).
// Tolerance: relative Frobenius error <= 1e-5 and every element within 1e-4 of max|ref|: the
// products of E4M3 codes and power-of-two scales are exact on both sides; the kernel sums each
// 32-k block inside the MMA and the blocks in fp32 (wgmma: BF16 operands, 64-k partials added in
// fp32), the reference in fp64. Outputs are poisoned
// with NaN first, so an element the kernel skips fails. At M = 2048 the reference covers a
// sample of rows (rows are independent), the NaN check covers all of them.
// The TFLOP/s lines are information, not assertions: 2 M N K over the time of run_gemm_fp8
// (pre-passes included), against 1,278 TFLOP/s, the dense FP8 rate measured on the H200 for
// issue 4.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>

#include "backend/cpu/ops.h"
#include "backend/cuda/gemm_fp8.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

constexpr double PEAK_TFLOPS = 1278.0;

struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1)), cudaSuccess); }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
};

struct spec {
    bool fp4;
    int M, N, K;
    int block;      // FP8 weight grid block_out = block_in
    int act_block;  // 32 (V4.1) or 128 (V4)
    cuda::gemm_fp8_kernel kernel = cuda::gemm_fp8_kernel::AUTO;
    std::string what() const {
        const char *k = kernel == cuda::gemm_fp8_kernel::WGMMA      ? "wgmma "
                        : kernel == cuda::gemm_fp8_kernel::MMA_SYNC ? "mma "
                                                                    : "";
        return std::string(k) + (fp4 ? "mxfp4" : "fp8 b" + std::to_string(block)) + " act" + std::to_string(act_block) + " M" +
               std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K);
    }
};

// Activations with a spread of magnitudes, so blocks get different power-of-two scales.
std::vector<float> make_x(int M, int K, uint32_t seed) {
    std::vector<float> x = testing_util::random_normal(size_t(M) * K, seed);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) x[size_t(m) * K + k] *= std::ldexp(1.0f, (m * 7 + k / 32) % 9 - 4);
    return x;
}

// The weight and x of one case on the device, and run_gemm_fp8 over them.
class gpu_case {
public:
    gpu_case(const cuda::device_info &dev, const spec &s, const testing_util::quant_weight &q, const std::vector<float> &x)
        : dev_(dev), w_(q.w.size()), scale_(q.scale.size()), x_(x.size() * 4), y_(size_t(s.M) * s.N * 4) {
        cudaMemcpy(w_.p, q.w.data(), q.w.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(scale_.p, q.scale.data(), q.scale.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(x_.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
        a_.x = static_cast<const float *>(x_.p);
        a_.M = s.M, a_.K = s.K, a_.act_block = s.act_block;
        a_.w = static_cast<const uint8_t *>(w_.p), a_.scale = static_cast<const uint8_t *>(scale_.p);
        a_.fp4 = s.fp4, a_.N = s.N, a_.block_out = s.block, a_.block_in = s.block;
        a_.y = static_cast<float *>(y_.p);
        a_.kernel = s.kernel;
        ws_ = std::make_unique<dev_buf>(cuda::gemm_fp8_workspace_bytes(a_));
    }
    // Poison y with NaN, run, return y.
    std::vector<float> run() {
        cudaMemset(y_.p, 0xff, size_t(a_.M) * a_.N * 4);
        Status st = cuda::run_gemm_fp8(dev_, a_, ws_->p, 0);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> y(size_t(a_.M) * a_.N);
        cudaMemcpy(y.data(), y_.p, y.size() * 4, cudaMemcpyDeviceToHost);
        return y;
    }
    cuda::gemm_fp8_args &args() { return a_; }
    void size_workspace() { ws_ = std::make_unique<dev_buf>(cuda::gemm_fp8_workspace_bytes(a_)); }  // after changing args()
    double seconds_per_run(int reps) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        (void)cuda::run_gemm_fp8(dev_, a_, ws_->p, 0);  // warm-up
        cudaEventRecord(e0);
        for (int i = 0; i < reps; i++) (void)cuda::run_gemm_fp8(dev_, a_, ws_->p, 0);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        return ms * 1e-3 / reps;
    }

private:
    cuda::device_info dev_;
    dev_buf w_, scale_, x_, y_;
    std::unique_ptr<dev_buf> ws_;
    cuda::gemm_fp8_args a_;
};

void compare_rows(const std::vector<float> &got, const std::vector<float> &ref, const std::vector<int> &rows, int N,
                  const std::string &what) {
    double num = 0, den = 0, maxref = 0;
    for (float r : ref) maxref = std::max(maxref, std::fabs(double(r)));
    size_t bad = 0;
    for (size_t i = 0; i < rows.size(); i++)
        for (int n = 0; n < N; n++) {
            const double g = got[size_t(rows[i]) * N + n], r = ref[i * N + n], d = g - r;
            num += d * d, den += r * r;
            if (std::fabs(d) > 1e-4 * maxref && bad++ < 5)
                ADD_FAILURE() << what << ": y[" << rows[i] << ", " << n << "] " << g << " vs " << r;
        }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("[ gemm_fp8 ] %-40s rows checked %5zu  rel err %.3g\n", what.c_str(), rows.size(), rel);
    EXPECT_LE(rel, 1e-5) << what;
}

// Runs g (exact_x: x taken as it is) and checks every row against x times the dequantized weight.
void check_unquantized_x(gpu_case &g, const std::vector<float> &x, const testing_util::quant_weight &q,
                         const std::string &what) {
    const int M = g.args().M, N = g.args().N, K = g.args().K;
    const std::vector<float> y = g.run();
    std::vector<float> ref(size_t(M) * N);
    cpu::matmul_nt(x.data(), q.dequant.data(), ref.data(), M, N, K);
    std::vector<int> rows(static_cast<size_t>(M), 0);
    for (int m = 0; m < M; m++) rows[size_t(m)] = m;
    compare_rows(y, ref, rows, N, what);
}

class CudaGemmFp8 : public ::testing::Test {
protected:
    void SetUp() override {
        auto d = cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
        dev_ = d.value();
        for (cuda::gemm_fp8_kernel k : {cuda::gemm_fp8_kernel::MMA_SYNC, cuda::gemm_fp8_kernel::WGMMA})
            if (cuda::gemm_fp8_kernel_usable(dev_, k)) kernels_.push_back(k);
    }
    cuda::device_info dev_;
    std::vector<cuda::gemm_fp8_kernel> kernels_;  // every kernel this device and build can run

    // check() of `s` on every kernel.
    void check_each(spec s, bool timed = false) {
        for (cuda::gemm_fp8_kernel k : kernels_) {
            s.kernel = k;
            check(s, timed);
        }
    }

    // Runs one case and checks it against the CPU reference on every row (small M) or on a
    // sample of rows (large M); with `timed`, prints the rate. Returns y.
    std::vector<float> check(const spec &s, bool timed = false) {
        const auto q = s.fp4 ? testing_util::random_mxfp4(s.N, s.K, uint32_t(s.N * 7 + s.K))
                             : testing_util::random_fp8_block(s.N, s.K, s.block, s.block, uint32_t(s.N * 3 + s.K));
        const std::vector<float> x = make_x(s.M, s.K, uint32_t(s.M + s.K));
        gpu_case g(dev_, s, q, x);
        const std::vector<float> y = g.run();
        for (size_t i = 0; i < y.size(); i++)
            if (!std::isfinite(y[i])) {
                ADD_FAILURE() << s.what() << ": y[" << i / s.N << ", " << i % s.N << "] not written (NaN poison)";
                return y;
            }
        std::vector<int> rows;
        if (s.M <= 128) {
            for (int m = 0; m < s.M; m++) rows.push_back(m);
        } else {
            for (int m = 0; m < s.M; m++)
                if (m < 8 || m % 61 == 0 || m >= s.M - 8) rows.push_back(m);
        }
        std::vector<float> xq(rows.size() * size_t(s.K));
        for (size_t i = 0; i < rows.size(); i++)
            std::memcpy(xq.data() + i * s.K, x.data() + size_t(rows[i]) * s.K, size_t(s.K) * 4);
        cpu::fake_quant_fp8_ue8m0(xq.data(), int64_t(rows.size()), s.K, s.act_block);  // rows are independent
        std::vector<float> ref(rows.size() * size_t(s.N));
        cpu::matmul_nt(xq.data(), q.dequant.data(), ref.data(), int64_t(rows.size()), s.N, s.K);
        compare_rows(y, ref, rows, s.N, s.what());
        if (timed) {
            const double t = g.seconds_per_run(5);
            const double tflops = 2.0 * s.M * s.N * s.K / t * 1e-12;
            std::printf("[ gemm_fp8 ] %-40s %8.1f us  %6.1f TFLOP/s  %5.1f%% of %.0f TFLOP/s dense FP8\n", s.what().c_str(),
                        t * 1e6, tflops, 100.0 * tflops / PEAK_TFLOPS, PEAK_TFLOPS);
            // The runs after the first give the same bits (no state carried between runs).
            const std::vector<float> again = g.run();
            EXPECT_EQ(std::memcmp(again.data(), y.data(), y.size() * 4), 0) << s.what() << ": a second run differs";
        }
        return y;
    }
};

TEST_F(CudaGemmFp8, small_ragged_shapes) {
    for (bool fp4 : {false, true})
        for (int M : {1, 17, 100})
            for (auto [N, K] : {std::pair{37, 64}, std::pair{300, 96}, std::pair{257, 160}}) check_each({fp4, M, N, K, 32, 32});
    check_each({false, 17, 200, 256, 128, 128});   // V4 grid
    check_each({true, 5, 77, 384, 32, 128});       // V4 expert blocks
    check_each({false, 130, 513, 384, 128, 32});   // 128-grid weights with 32-channel activations
    check_each({false, 300, 1000, 1280, 32, 32});  // several M and N tiles, ten 128-k stages
}

TEST_F(CudaGemmFp8, v41_prefill_shapes) {
    check_each({false, 2048, 32768, 1280, 32, 32}, true);  // wq_b
    check_each({true, 2048, 2304, 5120, 32, 32}, true);    // routed expert w1 / w3
    check_each({true, 2048, 5120, 2304, 32, 32}, true);    // routed expert w2
    check_each({false, 2048, 5120, 8192, 32, 32}, true);   // wo_b
}

TEST_F(CudaGemmFp8, v4_prefill_shapes) {
    check_each({false, 1024, 32768, 1024, 128, 128}, true);  // wq_b
    check_each({true, 1024, 2048, 4096, 32, 128}, true);     // routed expert w1
}

// One product's short tiles (DS41RT_GEMM_IMAGE_COLS=128: 128 weight rows a block, the MMA loop
// that overlaps its adds with the next stage's wgmmas) sum the same 64-k partials in the same
// order as the 256-row tiles: the same bits, every element written (NaN poison), and the time of
// each printed.
TEST_F(CudaGemmFp8, image_short_tiles_give_the_same_bits) {
    if (!cuda::gemm_fp8_kernel_usable(dev_, cuda::gemm_fp8_kernel::WGMMA)) GTEST_SKIP() << "short tiles are the wgmma kernel's";
    struct unset_at_exit {
        ~unset_at_exit() { unsetenv("DS41RT_GEMM_IMAGE_COLS"); }
    } unset;
    for (const auto &[M, N, K] : {std::tuple{17, 300, 96}, std::tuple{300, 1000, 1280}, std::tuple{2048, 32768, 1280},
                                  std::tuple{2048, 5120, 8192}})
        for (bool exact : {false, true}) {
            const auto q = testing_util::random_fp8_block(N, K, 32, 32, uint32_t(N + K));
            spec s{false, M, N, K, 32, 32};
            s.kernel = cuda::gemm_fp8_kernel::WGMMA;
            gpu_case g(dev_, s, q, make_x(M, K, uint32_t(M + 3)));
            g.args().exact_x = exact;
            g.size_workspace();
            const std::string what = s.what() + (exact ? " exact_x" : "");
            unsetenv("DS41RT_GEMM_IMAGE_COLS");
            const std::vector<float> tall = g.run();
            const double t_tall = g.seconds_per_run(5);
            setenv("DS41RT_GEMM_IMAGE_COLS", "128", 1);
            const std::vector<float> short_tiles = g.run();
            const double t_short = g.seconds_per_run(5);
            ASSERT_TRUE(std::all_of(tall.begin(), tall.end(), [](float v) { return std::isfinite(v); })) << what;
            EXPECT_EQ(std::memcmp(tall.data(), short_tiles.data(), tall.size() * 4), 0) << what << ": short tiles differ";
            const double flop = 2.0 * M * N * K * (exact ? 3 : 1);
            std::printf("[ gemm_fp8 ] %-40s tiles 128 x 256 %8.1f us %6.1f TFLOP/s, 128 x 128 %8.1f us %6.1f TFLOP/s\n",
                        what.c_str(), t_tall * 1e6, flop / t_tall * 1e-12, t_short * 1e6, flop / t_short * 1e-12);
        }
}

// Row m's bits do not depend on M: the first rows of a 2048-row run equal the same rows run
// alone (no split K, one k order per output). The two kernels may differ from each other in the
// last bits (the tensor cores' sums of a 32-k block), not from themselves.
TEST_F(CudaGemmFp8, rows_do_not_depend_on_batch) {
    for (cuda::gemm_fp8_kernel k : kernels_)
        for (bool fp4 : {false, true}) {
            const int N = 1000, K = 1280, M = 2048;
            const auto q = fp4 ? testing_util::random_mxfp4(N, K, 11) : testing_util::random_fp8_block(N, K, 32, 32, 11);
            const std::vector<float> x = make_x(M, K, 12);
            spec big{fp4, M, N, K, 32, 32};
            big.kernel = k;
            const std::vector<float> y_big = gpu_case(dev_, big, q, x).run();
            for (int m : {1, 37, 129}) {
                spec small{fp4, m, N, K, 32, 32};
                small.kernel = k;
                const std::vector<float> xs(x.begin(), x.begin() + size_t(m) * K);
                const std::vector<float> y = gpu_case(dev_, small, q, xs).run();
                EXPECT_EQ(std::memcmp(y.data(), y_big.data(), y.size() * 4), 0)
                    << big.what() << ": first " << m << " rows differ";
            }
        }
}

// exact_x (official numerics' BF16 class over an FP8 weight, wo_a): x not quantized, products
// exact from its three BF16 pieces; against matmul_nt of x itself, the same 1e-5. The wgmma
// kernel only; the mma.sync one refuses it.
TEST_F(CudaGemmFp8, exact_x) {
    for (const auto &[M, N, K] : {std::tuple{17, 300, 96}, std::tuple{300, 1024, 4096}}) {
        const auto q = testing_util::random_fp8_block(N, K, 32, 32, uint32_t(N + K));
        const std::vector<float> x = make_x(M, K, uint32_t(M + 5));
        spec s{false, M, N, K, 32, 32};
        s.kernel = cuda::gemm_fp8_kernel::WGMMA;
        gpu_case g(dev_, s, q, x);
        g.args().exact_x = true;
        g.size_workspace();
        if (!cuda::gemm_fp8_kernel_usable(dev_, cuda::gemm_fp8_kernel::WGMMA)) {
            g.args().kernel = cuda::gemm_fp8_kernel::AUTO;
            EXPECT_EQ(cuda::run_gemm_fp8(dev_, g.args(), nullptr, 0).code(), status_code::NOT_SUPPORTED);
            continue;
        }
        check_unquantized_x(g, x, q, "exact x " + s.what());
    }
}

// exact_x over an x whose values are all BF16 values (official numerics' activations, e.g. wo_a's
// attention output): the kernel sums x's hi piece only (the pre-pass found every mid and lo piece
// zero). Against matmul_nt as above, and bit for bit the three-piece sums: one non-BF16 value in
// the last row makes the launch sum every piece, and the other rows keep their bits (rows are
// independent). FP8 and plain BF16 weights.
TEST_F(CudaGemmFp8, exact_x_of_bf16_values_sums_one_piece_with_the_same_bits) {
    if (!cuda::gemm_fp8_kernel_usable(dev_, cuda::gemm_fp8_kernel::WGMMA)) GTEST_SKIP() << "exact_x needs the wgmma kernel";
    const int M = 300, N = 1024, K = 4096;
    std::vector<float> x = make_x(M, K, 31);
    for (float &v : x) v = round_bf16(v);
    for (bool bf16_weight : {false, true}) {
        testing_util::quant_weight q = testing_util::random_fp8_block(N, K, 32, 32, 32);
        if (bf16_weight) {  // the FP8 weight's values as plain BF16 (exact)
            q.w.resize(size_t(N) * K * 2);
            for (size_t i = 0; i < q.dequant.size(); i++) {
                const uint16_t b = f32_to_bf16(q.dequant[i]);
                std::memcpy(q.w.data() + 2 * i, &b, 2);
            }
        }
        spec s{false, M, N, K, 32, 32};
        s.kernel = cuda::gemm_fp8_kernel::WGMMA;
        const std::string what = std::string(bf16_weight ? "bf16 weight, " : "") + "bf16 x " + s.what();
        gpu_case one(dev_, s, q, x);
        one.args().exact_x = true, one.args().bf16_weight = bf16_weight;
        one.size_workspace();
        check_unquantized_x(one, x, q, what);
        const std::vector<float> y_one = one.run();
        std::vector<float> x3 = x;
        x3[size_t(M - 1) * K] = std::nextafter(x3[size_t(M - 1) * K], 1e30f);  // no BF16 value: a lo piece
        gpu_case three(dev_, s, q, x3);
        three.args().exact_x = true, three.args().bf16_weight = bf16_weight;
        three.size_workspace();
        check_unquantized_x(three, x3, q, "three pieces, " + what);
        const std::vector<float> y_three = three.run();
        EXPECT_EQ(std::memcmp(y_one.data(), y_three.data(), size_t(M - 1) * N * 4), 0) << what << ": rows 0..M-2 differ";
    }
}

// y rounded to bf16 where it is stored (round_bf16) is, bit for bit, the unrounded y rounded on
// the host, on each kernel: the rounding comes after the same sums.
TEST_F(CudaGemmFp8, round_bf16_output) {
    for (cuda::gemm_fp8_kernel k : kernels_) {
        spec s{false, 300, 600, 256, 32, 32};
        s.kernel = k;
        const auto q = testing_util::random_fp8_block(s.N, s.K, 32, 32, 77);
        gpu_case g(dev_, s, q, make_x(s.M, s.K, 78));
        const std::vector<float> plain = g.run();
        g.args().round_bf16 = true;
        const std::vector<float> rounded = g.run();
        size_t differ = 0;
        for (size_t i = 0; i < plain.size(); i++) differ += round_bf16(plain[i]) != rounded[i];
        EXPECT_EQ(differ, 0u) << "round_bf16 " << s.what();
    }
}

// Plain BF16 weights (the BF16 class's unquantized weights: compressors, indexer projections) with
// x taken exactly: against the CPU's fp64 sums of the same products, and refused by mma.sync.
TEST_F(CudaGemmFp8, bf16_weights) {
    for (const auto &[M, N, K] : {std::tuple{17, 300, 96}, std::tuple{300, 1024, 4096}}) {
        testing_util::quant_weight q;  // w: the bf16 bits; no scales
        const std::vector<float> w = testing_util::random_normal(size_t(N) * K, uint32_t(N * 5 + K));
        q.w.resize(w.size() * 2), q.dequant.resize(w.size()), q.scale.resize(1);
        for (size_t i = 0; i < w.size(); i++) {
            const uint16_t b = f32_to_bf16(w[i]);
            std::memcpy(q.w.data() + 2 * i, &b, 2);
            q.dequant[i] = bf16_to_f32(b);
        }
        const std::vector<float> x = make_x(M, K, uint32_t(M + 9));
        for (cuda::gemm_fp8_kernel k : kernels_) {
            spec s{false, M, N, K, 32, 32};
            s.kernel = k;
            gpu_case g(dev_, s, q, x);
            g.args().bf16_weight = g.args().exact_x = true;
            g.args().scale = nullptr;
            g.size_workspace();
            if (k != cuda::gemm_fp8_kernel::WGMMA) {
                EXPECT_EQ(cuda::run_gemm_fp8(dev_, g.args(), nullptr, 0).code(), status_code::NOT_SUPPORTED) << s.what();
                continue;
            }
            check_unquantized_x(g, x, q, "bf16 weight, exact x " + s.what());
        }
    }
}

// Grouped products (a prefill's routed experts): every group's rows against the CPU reference
// (every row), the bf16 output rounding, rows shared by two groups, empty groups, and each group's
// bits equal to the same rows run alone as one product (rows do not depend on the other groups).
TEST_F(CudaGemmFp8, grouped_experts) {
    if (!cuda::gemm_fp8_kernel_usable(dev_, cuda::gemm_fp8_kernel::WGMMA))
        GTEST_SKIP() << "the grouped product needs the wgmma kernel";
    // Both x tile heights (256 rows; 128, the short tiles' overlapped MMA loop): the same bits as
    // the rows run alone, whose kernel sums the same partials in the same order.
    struct unset_at_exit {
        ~unset_at_exit() { unsetenv("DS41RT_GEMM_GROUP_ROWS"); }
    } unset;
    for (const char *tile_rows : {"256", "128"})
    for (bool fp4 : {true, false}) {
        setenv("DS41RT_GEMM_GROUP_ROWS", tile_rows, 1);
        const int N = 300, K = 640, act = 32;
        const std::vector<int64_t> rows = {37, 0, 1, 130, 300};  // expert e's rows follow expert e - 1's
        int64_t R = 0;
        for (int64_t r : rows) R += r;
        const std::vector<float> x = make_x(int(R), K, 21);
        std::vector<testing_util::quant_weight> q;
        for (size_t e = 0; e < rows.size() + 1; e++)
            q.push_back(fp4 ? testing_util::random_mxfp4(N, K, uint32_t(31 + e))
                            : testing_util::random_fp8_block(N, K, 32, 32, uint32_t(31 + e)));
        dev_buf xd(x.size() * 4);
        cudaMemcpy(xd.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
        std::vector<std::unique_ptr<dev_buf>> wd, sd, yd;
        for (const auto &qq : q) {
            wd.push_back(std::make_unique<dev_buf>(qq.w.size()));
            sd.push_back(std::make_unique<dev_buf>(qq.scale.size()));
            cudaMemcpy(wd.back()->p, qq.w.data(), qq.w.size(), cudaMemcpyHostToDevice);
            cudaMemcpy(sd.back()->p, qq.scale.data(), qq.scale.size(), cudaMemcpyHostToDevice);
        }
        for (bool round : {false, true}) {
            cuda::gemm_fp8_grouped_args a;
            a.x = static_cast<const float *>(xd.p), a.R = R, a.K = K, a.act_block = act, a.N = N, a.fp4 = fp4,
            a.round_bf16 = round;
            // Group e: expert e over its rows; the last group: another weight over expert 3's rows.
            std::vector<int64_t> row0;
            for (size_t e = 0, r0 = 0; e < rows.size(); r0 += size_t(rows[e]), e++) row0.push_back(int64_t(r0));
            std::vector<std::pair<int64_t, int64_t>> spans;
            for (size_t e = 0; e < rows.size(); e++) spans.push_back({row0[e], rows[e]});
            spans.push_back({row0[3], rows[3]});
            yd.clear();
            for (size_t g = 0; g < spans.size(); g++) {
                yd.push_back(std::make_unique<dev_buf>(size_t(spans[g].second) * N * 4));
                cudaMemset(yd.back()->p, 0xff, size_t(spans[g].second) * N * 4);
                a.groups.push_back({spans[g].first, spans[g].second, static_cast<const uint8_t *>(wd[g]->p),
                                    static_cast<const uint8_t *>(sd[g]->p), static_cast<float *>(yd[g]->p)});
            }
            dev_buf ws(cuda::gemm_fp8_grouped_workspace_bytes(a));
            const Status st = cuda::run_gemm_fp8_grouped(dev_, a, ws.p, 0);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            for (size_t g = 0; g < spans.size(); g++) {
                const auto [r0, n] = spans[g];
                if (n == 0) continue;
                const std::string what = std::string(fp4 ? "grouped mxfp4" : "grouped fp8") + (round ? " bf16" : "") + " tiles of " +
                                         tile_rows + " rows, group " + std::to_string(g) + " rows " + std::to_string(n);
                std::vector<float> y(size_t(n) * N);
                cudaMemcpy(y.data(), yd[g]->p, y.size() * 4, cudaMemcpyDeviceToHost);
                std::vector<float> xq(x.begin() + r0 * K, x.begin() + (r0 + n) * K), ref(size_t(n) * N);
                cpu::fake_quant_fp8_ue8m0(xq.data(), n, K, act);
                cpu::matmul_nt(xq.data(), q[g].dequant.data(), ref.data(), n, N, K);
                if (round) {  // within half a bf16 ulp of the unrounded product's tolerance
                    double maxref = 0;
                    for (float r : ref) maxref = std::max(maxref, std::fabs(double(r)));
                    for (size_t i = 0; i < y.size(); i++) {
                        uint32_t u;
                        std::memcpy(&u, &y[i], 4);
                        ASSERT_EQ(u & 0xffffu, 0u) << what << ": y[" << i << "] not a bf16 value";
                        ASSERT_LE(std::fabs(y[i] - ref[i]), std::ldexp(std::fabs(ref[i]), -8) + 1e-4 * maxref)
                            << what << ": y[" << i << "]";
                    }
                    continue;
                }
                std::vector<int> all(static_cast<size_t>(n), 0);
                for (int i = 0; i < n; i++) all[size_t(i)] = i;
                compare_rows(y, ref, all, N, what);
                // The same rows as one product on the same kernel: the same bits.
                spec one{fp4, int(n), N, K, 32, act};
                one.kernel = cuda::gemm_fp8_kernel::WGMMA;
                const std::vector<float> alone =
                    gpu_case(dev_, one, q[g], std::vector<float>(x.begin() + r0 * K, x.begin() + (r0 + n) * K)).run();
                EXPECT_EQ(std::memcmp(alone.data(), y.data(), y.size() * 4), 0) << what << ": differs from the rows run alone";
            }
        }
    }
}

TEST_F(CudaGemmFp8, rejects_unsupported_shapes) {
    cuda::gemm_fp8_args a;
    a.M = 4, a.N = 8, a.K = 40;
    EXPECT_EQ(cuda::run_gemm_fp8(dev_, a, nullptr, 0).code(), status_code::NOT_SUPPORTED);
    a.K = 64, a.act_block = 64;
    EXPECT_EQ(cuda::run_gemm_fp8(dev_, a, nullptr, 0).code(), status_code::NOT_SUPPORTED);
    a.act_block = 128;  // K % act_block != 0
    EXPECT_EQ(cuda::run_gemm_fp8(dev_, a, nullptr, 0).code(), status_code::NOT_SUPPORTED);
    a.act_block = 32, a.block_out = 16;
    EXPECT_EQ(cuda::run_gemm_fp8(dev_, a, nullptr, 0).code(), status_code::NOT_SUPPORTED);
    a.block_out = 32;  // null pointers
    EXPECT_EQ(cuda::run_gemm_fp8(dev_, a, nullptr, 0).code(), status_code::INVALID_ARGUMENT);
    cuda::gemm_fp8_grouped_args g;  // a group's rows past x's end; a FP8 block not a power of two
    dev_buf x(64 * 4 * 4), w(64 * 64), y(64 * 64 * 4);
    g.x = static_cast<const float *>(x.p), g.R = 4, g.K = 64, g.N = 64;
    g.groups.push_back({2, 3, static_cast<const uint8_t *>(w.p), static_cast<const uint8_t *>(w.p), static_cast<float *>(y.p)});
    const status_code want = cuda::gemm_fp8_kernel_usable(dev_, cuda::gemm_fp8_kernel::WGMMA) ? status_code::INVALID_ARGUMENT
                                                                                              : status_code::NOT_SUPPORTED;
    EXPECT_EQ(cuda::run_gemm_fp8_grouped(dev_, g, y.p, 0).code(), want);
    g.groups[0].row0 = 0, g.block_out = 96;
    EXPECT_EQ(cuda::run_gemm_fp8_grouped(dev_, g, y.p, 0).code(), status_code::NOT_SUPPORTED);
}

}  // namespace
