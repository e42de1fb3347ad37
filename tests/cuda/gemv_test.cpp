// GPU decode GEMV (backend/cuda/gemv.cu) against the CPU reference (backend/cpu matmul_nt on the
// dequantized weight), at V4.1 / V4 shapes, with odd sizes for the tails.
// Tolerance: relative Frobenius error <= 1e-5 and every element within 1e-4 of max|ref|: the
// kernel sums exact products of the weights and a 22-bit (fp16 hi + lo) x in fp32, the reference
// in fp64; the order and x's last bits differ. Outputs are poisoned with NaN before each run, so
// an element the kernel skips fails the check.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <memory>

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

    struct spec {
        bool fp4;
        int M, N, K, block;
        int act_block = 0;  // official numerics when non-zero
    };

    // Runs all specs as one batch (one plan, one run) and checks each against the CPU reference.
    void run_batch(const std::vector<spec> &specs) {
        std::vector<testing_util::quant_weight> qs;
        std::vector<std::vector<float>> xs, refs;
        std::vector<std::unique_ptr<dev_buf>> bufs;
        std::vector<cuda::gemv_matrix> mats;
        for (const spec &s : specs) {
            qs.push_back(s.fp4 ? testing_util::random_mxfp4(s.N, s.K, uint32_t(s.N * 7 + s.K))
                               : testing_util::random_fp8_block(s.N, s.K, s.block, s.block, uint32_t(s.N * 3 + s.K)));
            xs.push_back(testing_util::random_normal(size_t(s.M) * s.K, uint32_t(s.M + s.K)));
            refs.emplace_back(size_t(s.M) * s.N);
            std::vector<float> xq = xs.back();
            if (s.act_block) cpu::fake_quant_fp8_ue8m0(xq.data(), s.M, s.K, s.act_block);
            cpu::matmul_nt(xq.data(), qs.back().dequant.data(), refs.back().data(), s.M, s.N, s.K);
            auto up = [&](const void *src, size_t n) {
                bufs.push_back(std::make_unique<dev_buf>(n));
                cudaMemcpy(bufs.back()->p, src, n, cudaMemcpyHostToDevice);
                return bufs.back()->p;
            };
            cuda::gemv_matrix m;
            m.w = static_cast<const uint8_t *>(up(qs.back().w.data(), qs.back().w.size()));
            m.scale = static_cast<const uint8_t *>(up(qs.back().scale.data(), qs.back().scale.size()));
            m.x = static_cast<const float *>(up(xs.back().data(), xs.back().size() * 4));
            bufs.push_back(std::make_unique<dev_buf>(refs.back().size() * 4));
            cudaMemset(bufs.back()->p, 0xff, refs.back().size() * 4);  // NaN poison
            m.y = bufs.back()->as<float>();
            m.fp4 = s.fp4, m.block_out = s.block, m.block_in = s.block;
            m.M = s.M, m.N = s.N, m.K = s.K, m.act_block = s.act_block;
            mats.push_back(m);
        }
        auto plan = cuda::plan_gemv(dev_, mats);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        dev_buf ws(std::max<size_t>(plan->workspace_bytes, 1));
        cudaMemset(ws.p, 0, std::max<size_t>(plan->workspace_bytes, 1));
        // Twice: the second run proves the split-K counters were left ready for a replay.
        for (int rep = 0; rep < 2; rep++) {
            for (const auto &m : mats) cudaMemset(m.y, 0xff, size_t(m.M) * m.N * 4);
            Status st = cuda::run_gemv(*plan, ws.p, 0);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            for (size_t i = 0; i < specs.size(); i++) {
                const spec &s = specs[i];
                int ks = 0;  // the plan lists matrices in launch order
                for (size_t k = 0; k < plan->mats.size(); k++)
                    if (plan->mats[k].y == mats[i].y) ks = plan->ksplit[k];
                std::vector<float> got(refs[i].size());
                cudaMemcpy(got.data(), mats[i].y, got.size() * 4, cudaMemcpyDeviceToHost);
                compare(got, refs[i],
                        std::string(s.fp4 ? "mxfp4" : "fp8") + " M" + std::to_string(s.M) + " N" + std::to_string(s.N) +
                            " K" + std::to_string(s.K) + " b" + std::to_string(s.block) + " act " + std::to_string(s.act_block) +
                            " ksplit " + std::to_string(ks) + " rep " + std::to_string(rep));
            }
        }
    }
    void run(bool fp4, int M, int N, int K, int block) { run_batch({{fp4, M, N, K, block}}); }
};

TEST_F(CudaGemv, fp8_block32_v41_shapes) {
    for (int M : {1, 3, 8, 9, 16}) {
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
    run(false, 12, 1000, 384, 128);     // ragged N, partial last k block
}

TEST_F(CudaGemv, mxfp4_expert_shapes) {
    for (int M : {1, 2, 6, 11}) {
        run(true, M, 2304, 5120, 32);  // V4.1 w1 / w3
        run(true, M, 5120, 2304, 32);  // V4.1 w2
    }
    run(true, 1, 2048, 4096, 32);      // V4 w1
    run(true, 3, 999, 1088, 32);       // ragged
}

// Official numerics: x quantized to E4M3 per 32 (V4.1) or 128 (V4) channels first, the tensor
// cores take the FP8 weight bytes as stored and MXFP4 as E4M3 codes.
TEST_F(CudaGemv, official_numerics_fp8_activations) {
    for (int M : {1, 5, 13}) {
        run_batch({{false, M, 1280, 5120, 32, 32}});   // wq_a
        run_batch({{true, M, 2304, 5120, 32, 32}});    // expert w1
        run_batch({{true, M, 5120, 2304, 32, 32}});    // expert w2
    }
    run_batch({{false, 3, 4096, 2048, 128, 128}, {true, 3, 2048, 4096, 32, 128}});  // V4 blocks
    run_batch({{false, 2, 1001, 1056, 32, 32}, {true, 2, 999, 1088, 32, 32}});      // ragged
}

// One launch over matrices of both formats and different token counts: the selected experts of
// a layer next to the shared expert, as the decode step runs them.
TEST_F(CudaGemv, mixed_batch_in_one_launch) {
    std::vector<spec> specs;
    for (int e = 0; e < 6; e++) specs.push_back({true, 1 + e % 3, 2304, 5120, 32});
    specs.push_back({false, 4, 2304, 5120, 32});
    specs.push_back({false, 4, 512, 5120, 32});
    for (int e = 0; e < 20; e++) specs.push_back({true, 1, 96, 256, 32});  // more than one launch's jobs
    specs.push_back({true, 4, 2304, 5120, 32, 32});  // official numerics in the same plan
    specs.push_back({false, 4, 512, 5120, 32, 32});
    run_batch(specs);
}

TEST_F(CudaGemv, rejects_unsupported_shapes) {
    cuda::gemv_matrix m;
    m.M = 1, m.N = 8, m.K = 40;
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::NOT_SUPPORTED);
    m.K = 64, m.M = 17;
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::NOT_SUPPORTED);
    m.M = 1, m.block_in = 16;
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::NOT_SUPPORTED);
    m.block_in = 32, m.act_block = 48;
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::NOT_SUPPORTED);
}

}  // namespace
