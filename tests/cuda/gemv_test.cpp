// GPU decode GEMV (backend/cuda/gemv.cu) against the CPU reference (backend/cpu matmul_nt on the
// dequantized weight), at V4.1 / V4 shapes, with odd sizes for the tails.
// Tolerance: relative Frobenius error <= 1e-5 and every element within 1e-4 of max|ref|: both
// sides sum in fp32, only the order differs. Outputs are poisoned with NaN before each run, so
// an element the kernel skips fails the check.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cuda/gemv.cuh"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
    ~dev_buf() { cudaFree(p); }
    template <typename T> T *as() const { return static_cast<T *>(p); }
};

void compare(const std::vector<float> &got, const std::vector<float> &ref, const std::string &what) {
    double num = 0, den = 0, maxref = 0;
    for (size_t i = 0; i < ref.size(); i++) maxref = std::max(maxref, std::fabs(double(ref[i])));
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " not written (NaN poison)";
        double d = double(got[i]) - ref[i];
        num += d * d;
        den += double(ref[i]) * ref[i];
        if (std::fabs(d) > 1e-4 * maxref && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " " << got[i] << " vs " << ref[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-5) << what;
}

class CudaGemv : public ::testing::Test {
protected:
    void SetUp() override {
        auto d = cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
        dev_ = d.value();
    }
    cuda::device_info dev_;

    void run(bool fp4, int M, int N, int K, int block) {
        const std::string what = std::string(fp4 ? "mxfp4" : "fp8") + " M" + std::to_string(M) + " N" +
                                 std::to_string(N) + " K" + std::to_string(K) + " b" + std::to_string(block);
        auto q = fp4 ? testing_util::random_mxfp4(N, K, uint32_t(N * 7 + K))
                     : testing_util::random_fp8_block(N, K, block, block, uint32_t(N * 3 + K));
        auto x = testing_util::random_normal(size_t(M) * K, uint32_t(M + K));
        std::vector<float> ref(size_t(M) * N), got(size_t(M) * N);
        cpu::matmul_nt(x.data(), q.dequant.data(), ref.data(), M, N, K);
        dev_buf dw(q.w.size()), ds(q.scale.size()), dx(x.size() * 4), dy(got.size() * 4);
        cudaMemcpy(dw.p, q.w.data(), q.w.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(ds.p, q.scale.data(), q.scale.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
        cudaMemset(dy.p, 0xff, got.size() * 4);  // NaN poison
        cuda::gemv_params p;
        p.w = dw.as<uint8_t>();
        p.scale = ds.as<uint8_t>();
        p.x = dx.as<float>();
        p.y = dy.as<float>();
        p.M = M, p.N = N, p.K = K, p.block_out = block, p.block_in = block;
        Status st = fp4 ? cuda::gemv_mxfp4(dev_, p, 0) : cuda::gemv_fp8_block(dev_, p, 0);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cudaMemcpy(got.data(), dy.p, got.size() * 4, cudaMemcpyDeviceToHost);
        compare(got, ref, what);
    }
};

TEST_F(CudaGemv, fp8_block32_v41_shapes) {
    for (int M : {1, 3, 4, 7}) {
        run(false, M, 1280, 5120, 32);  // wq_a
        run(false, M, 512, 5120, 32);   // wkv
        run(false, M, 5120, 8192, 32);  // wo_b
    }
    run(false, 1, 32768, 1280, 32);     // wq_b
    run(false, 2, 1001, 1056, 32);      // ragged N, K not a multiple of 512
}

TEST_F(CudaGemv, fp8_block128_v4_shapes) {
    run(false, 1, 1024, 4096, 128);
    run(false, 5, 4096, 2048, 128);
}

TEST_F(CudaGemv, mxfp4_expert_shapes) {
    for (int M : {1, 2, 4, 6}) {
        run(true, M, 2304, 5120, 32);  // V4.1 w1 / w3
        run(true, M, 5120, 2304, 32);  // V4.1 w2
    }
    run(true, 1, 2048, 4096, 32);      // V4 w1
    run(true, 3, 999, 1088, 32);       // ragged
}

TEST_F(CudaGemv, rejects_unsupported_shapes) {
    cuda::gemv_params p;
    p.M = 1, p.N = 8, p.K = 40;
    EXPECT_EQ(cuda::gemv_mxfp4(dev_, p, 0).code(), status_code::NOT_SUPPORTED);
    p.K = 24;
    EXPECT_EQ(cuda::gemv_fp8_block(dev_, p, 0).code(), status_code::NOT_SUPPORTED);
}

}  // namespace
