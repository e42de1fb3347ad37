// GPU decode GEMV (backend/cuda/gemv.cu) against the CPU reference (backend/cpu matmul_nt on the
// dequantized weight), at V4.1 / V4 shapes, with odd sizes for the tails.
// Tolerance: relative Frobenius error <= 1e-5 and every element within 1e-4 of max|ref|: the
// kernel sums exact products of the weights and a 22-bit (fp16 hi + lo) x in fp32, the reference
// in fp64; the order and x's last bits differ. Outputs are poisoned with NaN before each run, so
// an element the kernel skips fails the check.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <memory>
#include <tuple>
#include <utility>

#include "backend/cpu/ops.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv.cuh"
#include "core/dtype.h"
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
    void run_batch(const std::vector<spec> &specs, const cuda::gemv_tuning &tuning = {}) {
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
        auto plan = cuda::plan_gemv(dev_, mats, tuning);
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

// The synthesized EXL3 model's widths (dim 128, moe_inter 384): K = 128 is half an MXFP4 stage and
// K = 384 one and a half; eight experts' products in one launch, as the MoE runs them.
TEST_F(CudaGemv, synth_wide_shapes) {
    for (int act : {0, 32})
        for (int M : {1, 5, 16}) {
            run_batch({{false, M, 384, 128, 32, act}, {false, M, 384, 128, 32, act}});  // shared w1 + w3
            run_batch({{false, M, 128, 384, 32, act}});                                // shared w2
            std::vector<spec> w13, w2;
            for (int e = 0; e < 8; e++) w13.push_back({true, M, 384, 128, 32, act}), w2.push_back({true, M, 128, 384, 32, act});
            run_batch(w13);
            run_batch(w2);
        }
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

// round_bf16_out (official numerics' bf16 linears) must leave exactly the bits of today's path:
// the same plan run without it, then round_bf16_inplace; and those equal core round_bf16 of the
// unrounded output on the host (the independent reference for the rounding itself). Both the
// direct store (K 256: one slice on any device) and the split-K last-slice sum (N 512, K 5120:
// 32 tiles, always sliced) are covered, FP8 and MXFP4, M 1 and 16, both activation modes.
TEST_F(CudaGemv, fused_bf16_rounding_is_bit_identical) {
    struct rcase {
        bool fp4;
        int M, N, K, act_block;
        bool split;
    };
    std::vector<rcase> cases;
    for (int M : {1, 16})
        for (int act : {32, 0}) {
            cases.push_back({false, M, 2048, 256, act, false});
            cases.push_back({false, M, 512, 5120, act, true});
            cases.push_back({true, M, 2304, 256, act, false});
            cases.push_back({true, M, 512, 5120, act, true});
        }
    for (const rcase &c : cases) {
        const std::string what = std::string(c.fp4 ? "mxfp4" : "fp8") + " M" + std::to_string(c.M) + " N" +
                                 std::to_string(c.N) + " K" + std::to_string(c.K) + " act " + std::to_string(c.act_block);
        auto q = c.fp4 ? testing_util::random_mxfp4(c.N, c.K, uint32_t(c.N + 11 * c.K))
                       : testing_util::random_fp8_block(c.N, c.K, 32, 32, uint32_t(c.N + 5 * c.K));
        auto x = testing_util::random_normal(size_t(c.M) * c.K, uint32_t(c.M * 7 + c.K));
        const size_t ny = size_t(c.M) * c.N;
        dev_buf w(q.w.size()), sc(q.scale.size()), dx(x.size() * 4), y0(ny * 4), y1(ny * 4);
        cudaMemcpy(w.p, q.w.data(), q.w.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(sc.p, q.scale.data(), q.scale.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
        cuda::gemv_matrix m;
        m.w = w.as<uint8_t>(), m.scale = sc.as<uint8_t>(), m.fp4 = c.fp4, m.block_out = m.block_in = 32;
        m.N = c.N, m.K = c.K, m.M = c.M, m.x = dx.as<float>(), m.act_block = c.act_block;
        std::vector<float> plain(ny), fused(ny), today(ny);
        for (int fuse = 0; fuse < 2; fuse++) {
            m.y = (fuse ? y1 : y0).as<float>();
            m.round_bf16_out = fuse == 1;
            auto plan = cuda::plan_gemv(dev_, {m});
            ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
            ASSERT_EQ(plan->ksplit[0] > 1, c.split) << what << ": ksplit " << plan->ksplit[0];
            dev_buf ws(std::max<size_t>(plan->workspace_bytes, 1));
            cudaMemset(ws.p, 0, std::max<size_t>(plan->workspace_bytes, 1));
            for (int rep = 0; rep < 2; rep++) {  // the second run reuses the split-K counters
                cudaMemset(m.y, 0xff, ny * 4);    // NaN poison
                ASSERT_TRUE(cuda::run_gemv(*plan, ws.p, 0).is_ok());
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                if (fuse) {
                    cudaMemcpy(fused.data(), m.y, ny * 4, cudaMemcpyDeviceToHost);
                } else {
                    cudaMemcpy(plain.data(), m.y, ny * 4, cudaMemcpyDeviceToHost);
                    ASSERT_TRUE(cuda::round_bf16_inplace(m.y, int64_t(ny), 0).is_ok());
                    cudaMemcpy(today.data(), m.y, ny * 4, cudaMemcpyDeviceToHost);
                }
            }
        }
        size_t diff = 0, unchanged = 0;
        for (size_t i = 0; i < ny; i++) {
            ASSERT_TRUE(std::isfinite(fused[i])) << what << ": element " << i << " not written (NaN poison)";
            const uint32_t a = std::bit_cast<uint32_t>(fused[i]), b = std::bit_cast<uint32_t>(today[i]);
            const uint32_t h = std::bit_cast<uint32_t>(ds41rt::round_bf16(plain[i]));
            if ((a != b || a != h) && diff++ < 5)
                ADD_FAILURE() << what << ": element " << i << " fused " << std::hexfloat << fused[i] << " vs GEMV + round "
                              << today[i] << " vs host round " << ds41rt::round_bf16(plain[i]);
            unchanged += fused[i] == plain[i];
        }
        EXPECT_EQ(diff, 0u) << what;
        // Random fp32 sums are almost never bf16 already: rounding that did nothing would show here.
        EXPECT_LT(unchanged, ny / 10 + 1) << what;
        std::printf("[ fused round ] %s ksplit %s: %zu / %zu outputs differ from GEMV + round_bf16_inplace\n",
                    what.c_str(), c.split ? "yes" : "no", diff, ny);
    }
}

// The launch tunables the bench sweeps (gemv_tuning): thinner / more K slices and a capped grid
// whose warps walk many items each must still give every output within the reference tolerance,
// at the decode shapes, including a batch spanning two launches.
TEST_F(CudaGemv, tuned_plans_match_reference) {
    for (cuda::gemv_tuning t : {cuda::gemv_tuning{4.0f, 4, 1, false}, cuda::gemv_tuning{0.5f, 16, 2, true},
                                cuda::gemv_tuning{2.0f, 8, 0, true}}) {
        SCOPED_TRACE(std::to_string(t.waves) + " waves, min_kb " + std::to_string(t.min_kb) + ", blocks/SM " +
                     std::to_string(t.blocks_per_sm) + (t.l2_hint ? ", L2 hint" : ""));
        for (int M : {1, 16}) {
            run_batch({{false, M, 1280, 5120, 32, 32}, {false, M, 512, 5120, 32, 32}}, t);  // wq_a + wkv
            run_batch({{false, M, 32768, 1280, 32, 32}}, t);                                // wq_b
            run_batch({{true, M, 5120, 2304, 32, 32}, {true, M, 5120, 2304, 32, 32}}, t);  // experts w2
        }
        std::vector<spec> many;
        for (int e = 0; e < 26; e++) many.push_back({e % 2 == 0, 1 + e % 3, 96 + 16 * e, 1024, 32, e % 3 ? 32 : 0});
        run_batch(many, t);
    }
}

// A capped grid (warps walking several items, prefetching the next one's head) changes which
// warp runs an item, and the L2 hint only how the bytes are fetched, never the sums: with the K
// slicing held equal (one slice per tile), the bits equal the default one-warp-per-item launch.
TEST_F(CudaGemv, grid_stride_and_l2_hint_are_bit_identical) {
    for (bool fp4 : {false, true})
        for (int M : {1, 16}) {
            const int N = 16384, K = 1024;  // 1024 tiles: more than a one-block-per-SM grid has warps
            auto q = fp4 ? testing_util::random_mxfp4(N, K, 7u) : testing_util::random_fp8_block(N, K, 32, 32, 7u);
            auto x = testing_util::random_normal(size_t(M) * K, 9u);
            dev_buf w(q.w.size()), sc(q.scale.size()), dx(x.size() * 4), dy(size_t(M) * N * 4);
            cudaMemcpy(w.p, q.w.data(), q.w.size(), cudaMemcpyHostToDevice);
            cudaMemcpy(sc.p, q.scale.data(), q.scale.size(), cudaMemcpyHostToDevice);
            cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
            cuda::gemv_matrix m;
            m.w = w.as<uint8_t>(), m.scale = sc.as<uint8_t>(), m.fp4 = fp4;
            m.N = N, m.K = K, m.M = M, m.x = dx.as<float>(), m.y = dy.as<float>(), m.act_block = 32;
            std::vector<float> got[4];
            for (int variant = 0; variant < 4; variant++) {
                const int capped = variant & 1;
                cuda::gemv_tuning t;
                t.min_kb = K / 32;  // one slice per tile in every plan
                t.blocks_per_sm = capped;
                t.l2_hint = variant >= 2;
                auto plan = cuda::plan_gemv(dev_, {m}, t);
                ASSERT_TRUE(plan.is_ok());
                ASSERT_EQ(plan->ksplit[0], 1);
                if (capped) {
                    ASSERT_LT(plan->max_blocks * 4, N / 16) << "the capped grid must make warps walk items";
                }
                dev_buf ws(std::max<size_t>(plan->workspace_bytes, 1));
                cudaMemset(ws.p, 0, std::max<size_t>(plan->workspace_bytes, 1));
                cudaMemset(dy.p, 0xff, size_t(M) * N * 4);
                ASSERT_TRUE(cuda::run_gemv(*plan, ws.p, 0).is_ok());
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                got[variant].resize(size_t(M) * N);
                cudaMemcpy(got[variant].data(), dy.p, got[variant].size() * 4, cudaMemcpyDeviceToHost);
            }
            for (int variant = 0; variant < 4; variant++) {
                size_t diff = 0;
                for (size_t i = 0; i < got[0].size(); i++) {
                    ASSERT_TRUE(std::isfinite(got[variant][i])) << "element " << i << " not written (NaN poison)";
                    diff += std::bit_cast<uint32_t>(got[0][i]) != std::bit_cast<uint32_t>(got[variant][i]);
                }
                EXPECT_EQ(diff, 0u) << (fp4 ? "mxfp4" : "fp8") << " M" << M << " variant " << variant;
            }
        }
}

// gemv_tuning::counters_reserve: plans of different layouts take turns in one workspace that was
// zeroed once (the engine's GEMV workspace, no memset between launches); each run's bits equal a
// run of the same plan in a fresh zeroed workspace, and its output is fully written.
TEST_F(CudaGemv, counters_reserve_lets_plans_share_one_workspace) {
    struct one {
        int M, N, K;
        testing_util::quant_weight q;
        std::vector<float> x;
        std::unique_ptr<dev_buf> w, sc, dx, dy;
        cuda::gemv_plan plan;
        std::vector<float> fresh;
    };
    std::vector<one> ps;
    for (auto [M, N, K] : {std::tuple{1, 2048, 5120}, std::tuple{4, 512, 1024}, std::tuple{16, 4096, 2048}}) {
        one o{M, N, K, testing_util::random_fp8_block(N, K, 32, 32, uint32_t(N + K)), testing_util::random_normal(size_t(M) * K, 3u)};
        o.w = std::make_unique<dev_buf>(o.q.w.size()), o.sc = std::make_unique<dev_buf>(o.q.scale.size());
        o.dx = std::make_unique<dev_buf>(o.x.size() * 4), o.dy = std::make_unique<dev_buf>(size_t(M) * N * 4);
        cudaMemcpy(o.w->p, o.q.w.data(), o.q.w.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(o.sc->p, o.q.scale.data(), o.q.scale.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(o.dx->p, o.x.data(), o.x.size() * 4, cudaMemcpyHostToDevice);
        cuda::gemv_matrix m;
        m.w = o.w->as<uint8_t>(), m.scale = o.sc->as<uint8_t>();
        m.N = N, m.K = K, m.M = M, m.x = o.dx->as<float>(), m.y = o.dy->as<float>(), m.act_block = 32;
        cuda::gemv_tuning t;
        t.counters_reserve = 64 * 1024;
        auto plan = cuda::plan_gemv(dev_, {m}, t);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        ASSERT_LE(plan->counters_bytes, t.counters_reserve);
        ASSERT_GE(plan->x_offset[0], t.counters_reserve);
        o.plan = plan.value();
        ps.push_back(std::move(o));
    }
    ASSERT_GT(ps[0].plan.ksplit[0], 1) << "the first plan must use split-K counters";
    auto run = [&](one &o, void *ws) {
        cudaMemset(o.dy->p, 0xff, size_t(o.M) * o.N * 4);  // NaN poison
        EXPECT_TRUE(cuda::run_gemv(o.plan, ws, 0).is_ok());
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> got(size_t(o.M) * o.N);
        cudaMemcpy(got.data(), o.dy->p, got.size() * 4, cudaMemcpyDeviceToHost);
        return got;
    };
    size_t big = 0;
    for (one &o : ps) {
        dev_buf ws(o.plan.workspace_bytes);
        cudaMemset(ws.p, 0, o.plan.workspace_bytes);
        o.fresh = run(o, ws.p);
        big = std::max(big, o.plan.workspace_bytes);
    }
    dev_buf shared(big);
    cudaMemset(shared.p, 0, big);
    for (int round = 0; round < 3; round++)
        for (one &o : ps) {
            const std::vector<float> got = run(o, shared.p);
            size_t diff = 0;
            for (size_t i = 0; i < got.size(); i++) {
                ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << " not written";
                diff += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(o.fresh[i]);
            }
            EXPECT_EQ(diff, 0u) << "M" << o.M << " N" << o.N << " K" << o.K << " round " << round;
        }
}

// Row strides (gemv_matrix::ldx / ldy): G matrices reading their columns of one wide x and
// writing their columns of one wide y (a grouped projection at decode) give the bits of the same
// matrices over contiguous copies, in both numerics and both weight formats; y's pad columns,
// which no matrix owns, keep their NaN poison. Strides the kernels cannot take are refused.
TEST_F(CudaGemv, row_strides_equal_contiguous_rows) {
    const int M = 5, N = 256, K = 1024, G = 3, LDX = G * K + 4, LDY = G * N + 8;
    for (const auto &[fp4, act] : {std::pair{false, 0}, std::pair{false, 32}, std::pair{true, 32}}) {
        const std::vector<float> wide_x = testing_util::random_normal(size_t(M) * LDX, 17);
        dev_buf xw(wide_x.size() * 4), yw(size_t(M) * LDY * 4), xc(size_t(G) * M * K * 4), yc(size_t(G) * M * N * 4);
        cudaMemcpy(xw.p, wide_x.data(), wide_x.size() * 4, cudaMemcpyHostToDevice);
        std::vector<float> packed(size_t(G) * M * K);  // group g's rows, contiguous
        for (int g = 0; g < G; g++)
            for (int m = 0; m < M; m++)
                std::copy_n(wide_x.begin() + size_t(m) * LDX + size_t(g) * K, K, packed.begin() + (size_t(g) * M + m) * K);
        cudaMemcpy(xc.p, packed.data(), packed.size() * 4, cudaMemcpyHostToDevice);
        std::vector<testing_util::quant_weight> qs;
        std::vector<std::unique_ptr<dev_buf>> bufs;
        std::vector<cuda::gemv_matrix> strided, contiguous;
        for (int g = 0; g < G; g++) {
            qs.push_back(fp4 ? testing_util::random_mxfp4(N, K, uint32_t(g + 1)) : testing_util::random_fp8_block(N, K, 32, 32, uint32_t(g + 1)));
            for (const auto *v : {&qs.back().w, &qs.back().scale}) {
                bufs.push_back(std::make_unique<dev_buf>(v->size()));
                cudaMemcpy(bufs.back()->p, v->data(), v->size(), cudaMemcpyHostToDevice);
            }
            cuda::gemv_matrix m;
            m.w = bufs[bufs.size() - 2]->as<uint8_t>(), m.scale = bufs.back()->as<uint8_t>();
            m.fp4 = fp4, m.N = N, m.K = K, m.M = M, m.act_block = act;
            m.x = xc.as<float>() + size_t(g) * M * K, m.y = yc.as<float>() + size_t(g) * M * N;
            contiguous.push_back(m);
            m.x = xw.as<float>() + size_t(g) * K, m.y = yw.as<float>() + size_t(g) * N, m.ldx = LDX, m.ldy = LDY;
            strided.push_back(m);
        }
        cudaMemset(yw.p, 0xff, size_t(M) * LDY * 4);
        for (const auto *mats : {&contiguous, &strided}) {
            auto plan = cuda::plan_gemv(dev_, *mats);
            ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
            dev_buf ws(std::max<size_t>(plan->workspace_bytes, 1));
            cudaMemset(ws.p, 0, std::max<size_t>(plan->workspace_bytes, 1));
            ASSERT_TRUE(cuda::run_gemv(*plan, ws.p, 0).is_ok());
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
        std::vector<float> got(size_t(M) * LDY), want(size_t(G) * M * N);
        cudaMemcpy(got.data(), yw.p, got.size() * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(want.data(), yc.p, want.size() * 4, cudaMemcpyDeviceToHost);
        size_t bad = 0;
        for (int m = 0; m < M; m++)
            for (int c = 0; c < LDY; c++) {
                const float v = got[size_t(m) * LDY + c];
                const bool pad = c >= G * N;
                const float w = pad ? v : want[(size_t(c / N) * M + m) * N + c % N];
                const bool ok = pad ? std::isnan(v) : std::bit_cast<uint32_t>(v) == std::bit_cast<uint32_t>(w);
                if (!ok && bad++ < 5) ADD_FAILURE() << (fp4 ? "mxfp4" : "fp8") << " act " << act << " row " << m << " column " << c << ": " << v << " vs " << w;
            }
        EXPECT_EQ(bad, 0u);
    }
    cuda::gemv_matrix m;
    m.N = 64, m.K = 256, m.M = 2, m.act_block = 32, m.ldx = 255;  // below K
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::INVALID_ARGUMENT);
    m.ldx = 258;  // not a multiple of 4
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::INVALID_ARGUMENT);
    m.ldx = 0, m.ldy = 63;  // below N
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}).status().code(), status_code::INVALID_ARGUMENT);
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
    m.act_block = 32;
    cuda::gemv_tuning bad;
    bad.waves = 0.0f;
    EXPECT_EQ(cuda::plan_gemv(dev_, {m}, bad).status().code(), status_code::INVALID_ARGUMENT);
}

// Host-only (no GPU needed): how the tunables shape the plan. The resident-block count comes from
// the CUDA occupancy query (1 without a device), so only relations that hold for any count are
// checked; the hand-made device_info stands in for an H200's 132 SMs.
TEST(CudaGemvPlan, tuning_shapes_the_k_slicing) {
    cuda::device_info dev;
    dev.sm_count = 132;
    cuda::gemv_matrix m;
    m.w = m.scale = reinterpret_cast<const uint8_t *>(uintptr_t(256));
    m.x = reinterpret_cast<const float *>(uintptr_t(256));
    m.y = reinterpret_cast<float *>(uintptr_t(512));
    m.N = 512, m.K = 5120, m.act_block = 32;  // wkv: 32 tiles, 160 k blocks
    const cuda::gemv_tuning def;
    EXPECT_EQ(def.waves, 1.0f);  // the kept default (today's plan): one wave, 8-block slices, no cap
    EXPECT_EQ(def.min_kb, 8);
    EXPECT_EQ(def.blocks_per_sm, 0);
    EXPECT_FALSE(def.l2_hint);
    auto base = cuda::plan_gemv(dev, {m});
    ASSERT_TRUE(base.is_ok());
    EXPECT_EQ(base->max_blocks, 0);
    EXPECT_GT(base->ksplit[0], 1);  // 32 tiles never fill 132 SMs: always sliced
    EXPECT_LE(base->ksplit[0], 160 / 8);
    int prev = 0;
    for (float waves : {0.5f, 1.0f, 2.0f, 4.0f, 64.0f}) {
        cuda::gemv_tuning t;
        t.waves = waves, t.min_kb = 4;
        auto p = cuda::plan_gemv(dev, {m}, t);
        ASSERT_TRUE(p.is_ok());
        EXPECT_GE(p->ksplit[0], prev) << waves << " waves";  // more waves, never fewer slices
        EXPECT_LE(p->ksplit[0], 160 / 4);
        prev = p->ksplit[0];
    }
    EXPECT_EQ(prev, 40);  // 64 waves: as thin as min_kb allows
    cuda::gemv_tuning capped;
    capped.blocks_per_sm = 2;
    auto c = cuda::plan_gemv(dev, {m}, capped);
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(c->max_blocks, 264);
    m.K = 256;  // 8 k blocks: one slice whatever the tuning
    for (float waves : {1.0f, 64.0f}) {
        cuda::gemv_tuning t;
        t.waves = waves;
        EXPECT_EQ(cuda::plan_gemv(dev, {m}, t)->ksplit[0], 1);
    }
    for (cuda::gemv_tuning bad : {cuda::gemv_tuning{0.0f, 8, 0, false}, cuda::gemv_tuning{1.0f, 0, 0, false},
                                   cuda::gemv_tuning{1.0f, 8, -1, false}})
        EXPECT_EQ(cuda::plan_gemv(dev, {m}, bad).status().code(), status_code::INVALID_ARGUMENT);
}

}  // namespace
