// GPU NVFP4 W4A4 decode GEMV (backend/cuda/nvfp4_gemv.cu) against the CPU reference
// (backend/cpu nvfp4_w4a4_linear: the producer's activation fake quantization, then an fp64 dot
// product with the dequantized weight), at V4.1 routed-expert shapes (six experts' w1 + w3
// 2304 x 5120 in one launch, their w2 5120 x 2304 in another, M 1 and 16) and tiny ragged ones.
//
// Weights are random codes with random E4M3 block scales (mostly 2 .. 448 as ModelOpt's
// 448 * blockamax / amax makes them, some small, subnormal and zero; never the NaN codes 0x7f /
// 0xff), dequantized here as model::nvfp4_dequantize defines it (e2m1 * fp32(e4m3 * ws2), in
// that order; model/nvfp4.cpp itself needs libfmt, which this static binary does not link).
// Activations are bf16 values with some blocks scaled by 1e-6 and 1e3 (dynamic range inside a
// row, the E4M3 scale's saturation at 448, and a tiny input_scale case).
//
// Tolerance: relative Frobenius error <= 1e-5 per matrix and every element within 1e-4 of the
// max |ref|. Both sides multiply exactly representable values exactly (the quantized x is
// bit-equal to the CPU's, checked below; code * scale is exact in fp16) and differ only in the
// summation (fp32 on the GPU in 128-k tensor-core chunks, fp64 on the CPU) and in the CPU
// rounding each weight to fp32 (2^-24 relative, random sign): expected ~1e-7, so 1e-5 fails on
// any real fault (one wrong code, scale or token is ~1e-2). Outputs are poisoned with NaN before
// each run, so an element the kernel skips fails; each plan runs twice (the split-K counters
// must be left ready for a replay) and the two outputs must be bit-equal.
//
// Also prints an informational bandwidth line: the format's own bytes (0.5 B per weight + 1/16 B
// of scale) over the time of one launch (x quantization included), as a fraction of the
// device-to-device copy rate measured in the same run (bytes read + written).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "backend/cpu/quant_ops.h"
#include "backend/cuda/nvfp4_gemv.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

using testing_util::nvfp4_weight;
using testing_util::random_nvfp4;

using dev_buf = testing_util::device_buffer;

// bf16 rows N(0, 1), with every 7th 16-block scaled by 1e-6 and every 11th by 1e3.
std::vector<float> random_rows(int M, int K, uint32_t seed) {
    std::vector<float> x = testing_util::random_normal(size_t(M) * K, seed);
    for (int m = 0; m < M; m++)
        for (int b = 0; b < K / 16; b++) {
            const float f = (m + b) % 7 == 3 ? 1e-6f : (m + b) % 11 == 5 ? 1e3f : 1.0f;
            for (int k = b * 16; k < b * 16 + 16; k++) x[size_t(m) * K + k] = round_bf16(x[size_t(m) * K + k] * f);
        }
    return x;
}

struct compare_result {
    double rel = 0, max_abs_over_max = 0;
};

compare_result compare(const std::vector<float> &got, const std::vector<float> &ref, const std::string &what) {
    compare_result r;
    double num = 0, den = 0, maxref = 0, maxd = 0;
    for (float v : ref) maxref = std::max(maxref, std::fabs(double(v)));
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) {
            ADD_FAILURE() << what << ": element " << i << " not written (NaN poison)";
            return {1, 1};
        }
        const double d = double(got[i]) - ref[i];
        num += d * d, den += double(ref[i]) * ref[i];
        maxd = std::max(maxd, std::fabs(d));
        if (std::fabs(d) > 1e-4 * maxref && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " " << got[i] << " vs " << ref[i];
    }
    r.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    r.max_abs_over_max = maxref > 0 ? maxd / maxref : maxd;
    EXPECT_LE(r.rel, 1e-5) << what;
    return r;
}

// The workspace's quantized x (nvfp4_gemv.cu: [M][K / 8] groups of fp16 [k0 k2 k4 k6 k1 k3 k5
// k7], then M floats rowmul): every element must be the CPU's fake-quantized value times
// 2^14 / rowmul, exactly, down to 2^-30 of the row's largest (below that fp16 may round).
void check_quantized_x(const void *ws, size_t x_offset, const std::vector<float> &x, int M, int K, float input_scale,
                       const std::string &what) {
    std::vector<float> xq = x;
    cpu::nvfp4_fake_quant_act(xq.data(), M, K, input_scale, /*out_bf16=*/true);
    std::vector<uint16_t> h(size_t(M) * K);
    std::vector<float> rowmul(M);
    const char *base = static_cast<const char *>(ws) + x_offset;
    ASSERT_EQ(cudaMemcpy(h.data(), base, h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(rowmul.data(), base + (size_t(M) * K * 2 + 255) / 256 * 256, size_t(M) * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    // Within each group of 8, stored slot j holds k = {0, 2, 4, 6, 1, 3, 5, 7}[j]; so k sits in
    // slot {0, 4, 1, 5, 2, 6, 3, 7}[k] (the H200 run showed the test had the inverse).
    static const int slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    size_t differ = 0, checked = 0;
    for (int m = 0; m < M; m++) {
        float rmax = 0;
        for (int k = 0; k < K; k++) rmax = std::max(rmax, std::fabs(xq[size_t(m) * K + k]));
        // The rule the kernel states: rowmul is the power of two <= the row's largest |xq|.
        if (rmax > 0) {
            EXPECT_TRUE(rowmul[size_t(m)] <= rmax && rmax < 2 * rowmul[size_t(m)]) << what << " row " << m;
        }
        for (int k = 0; k < K; k++) {
            const float v = xq[size_t(m) * K + k];
            if (std::fabs(v) < rmax * 0x1p-30f) continue;
            const float got = f16_to_f32(h[size_t(m) * K + size_t(k / 8) * 8 + size_t(slot[k % 8])]);
            checked++;
            if (got != v / rowmul[size_t(m)] * 16384.0f && differ++ < 5)
                ADD_FAILURE() << what << ": quantized x row " << m << " k " << k << ": " << got << " vs CPU "
                              << v / rowmul[size_t(m)] * 16384.0f;
        }
    }
    EXPECT_EQ(differ, 0u) << what << ": quantized x elements differing from the CPU's (of " << checked << ")";
}

class CudaNvfp4Gemv : public ::testing::Test {
protected:
    void SetUp() override {
        auto d = cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
        dev_ = d.value();
    }
    cuda::device_info dev_;

    struct spec {
        const nvfp4_weight *w;
        int M;
        int x_id;  // matrices with the same x_id (and M, K) share one x buffer
    };

    // One plan, one batch, run twice; every matrix checked against the CPU.
    void run_batch(const std::vector<spec> &specs, const std::string &name) {
        std::vector<std::unique_ptr<dev_buf>> bufs;
        auto up = [&](const void *src, size_t n) {
            bufs.push_back(std::make_unique<dev_buf>(n));
            cudaMemcpy(bufs.back()->p, src, n, cudaMemcpyHostToDevice);
            return bufs.back()->p;
        };
        std::vector<std::vector<float>> xs(specs.size()), refs(specs.size());
        std::vector<const float *> dx(specs.size());
        std::vector<cuda::nvfp4_matrix> mats;
        for (size_t i = 0; i < specs.size(); i++) {
            const spec &s = specs[i];
            const nvfp4_weight &w = *s.w;
            size_t same = i;
            for (size_t k = 0; k < i; k++)
                if (specs[k].x_id == s.x_id) same = k;
            if (same == i) {
                xs[i] = random_rows(s.M, w.K, uint32_t(1000 + s.x_id));
                dx[i] = static_cast<const float *>(up(xs[i].data(), xs[i].size() * 4));
            } else {
                xs[i] = xs[same], dx[i] = dx[same];
            }
            refs[i].resize(size_t(s.M) * w.N);
            cpu::nvfp4_w4a4_linear(xs[i].data(), s.M, w.dequant.data(), w.N, w.K, w.input_scale, refs[i].data());
            cuda::nvfp4_matrix m;
            m.w = static_cast<const uint8_t *>(up(w.codes.data(), w.codes.size()));
            m.scale = static_cast<const uint8_t *>(up(w.scales.data(), w.scales.size()));
            m.weight_scale_2 = w.ws2, m.input_scale = w.input_scale;
            m.N = w.N, m.K = w.K, m.M = s.M, m.x = dx[i];
            bufs.push_back(std::make_unique<dev_buf>(refs[i].size() * 4));
            m.y = bufs.back()->as<float>();
            mats.push_back(m);
        }
        auto plan = cuda::plan_nvfp4_gemv(dev_, mats);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        dev_buf ws(std::max<size_t>(plan->workspace_bytes, 1));
        cudaMemset(ws.p, 0, std::max<size_t>(plan->workspace_bytes, 1));
        std::vector<std::vector<float>> first(specs.size());
        double worst = 0;
        for (int rep = 0; rep < 2; rep++) {
            for (const auto &m : mats) cudaMemset(m.y, 0xff, size_t(m.M) * m.N * 4);  // NaN poison
            Status st = cuda::run_nvfp4_gemv(*plan, ws.p, 0);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            for (size_t i = 0; i < specs.size(); i++) {
                std::vector<float> got(refs[i].size());
                cudaMemcpy(got.data(), mats[i].y, got.size() * 4, cudaMemcpyDeviceToHost);
                const std::string what = name + " matrix " + std::to_string(i) + " (M" + std::to_string(specs[i].M) + " N" +
                                         std::to_string(mats[i].N) + " K" + std::to_string(mats[i].K) + " ksplit " +
                                         std::to_string(plan->ksplit[i]) + ") rep " + std::to_string(rep);
                worst = std::max(worst, compare(got, refs[i], what).rel);
                if (rep == 0) first[i] = got;
                else EXPECT_EQ(std::memcmp(got.data(), first[i].data(), got.size() * 4), 0) << what << ": replay differs";
            }
        }
        for (size_t i = 0; i < specs.size(); i++) {
            bool seen = false;
            for (size_t k = 0; k < i; k++) seen |= plan->x_offset[k] == plan->x_offset[i];
            if (!seen)
                check_quantized_x(ws.p, plan->x_offset[i], xs[i], specs[i].M, specs[i].w->K, specs[i].w->input_scale,
                                  name + " matrix " + std::to_string(i));
        }
        const int max_ks = *std::max_element(plan->ksplit.begin(), plan->ksplit.end());
        std::printf("[ nvfp4   ] %-44s %2zu matrices  max ksplit %2d  worst rel err %.3g\n", name.c_str(), specs.size(), max_ks,
                    worst);
    }
};

TEST_F(CudaNvfp4Gemv, tiny_ragged_and_split_k_shapes) {
    const nvfp4_weight a = random_nvfp4(16, 32, 1e-2f, 2e-3f, 1), b = random_nvfp4(37, 96, 3e-3f, 1.5e-3f, 2),
                       c = random_nvfp4(100, 160, 5e-4f, 4e-3f, 3), d = random_nvfp4(24, 288, 2e-2f, 1e-4f, 4),
                       e = random_nvfp4(130, 1056, 7e-4f, 1.6e-3f, 5);
    run_batch({{&a, 1, 0}}, "16x32 M1");
    run_batch({{&b, 3, 1}}, "37x96 M3 (ragged N, partial chunk)");
    run_batch({{&c, 9, 2}}, "100x160 M9 (two token tiles)");
    run_batch({{&d, 16, 3}}, "24x288 M16 (input_scale 1e-4: E4M3 saturates)");
    run_batch({{&e, 5, 4}}, "130x1056 M5");
    // One matrix alone: few tiles, so K is split across warps (the last-arriving slice sums).
    const nvfp4_weight g1 = random_nvfp4(2304, 5120, 3e-5f, 1.7e-3f, 6), g2 = random_nvfp4(5120, 2304, 4e-5f, 6e-3f, 7);
    run_batch({{&g1, 3, 5}}, "single w1 2304x5120 M3 (split K)");
    run_batch({{&g2, 1, 6}}, "single w2 5120x2304 M1 (split K)");
    // Mixed M and shared x in one batch.
    run_batch({{&a, 2, 10}, {&b, 7, 11}, {&c, 7, 12}, {&e, 16, 13}}, "mixed tiny batch");
}

// The routed experts of one V4.1 layer at decode: w1 and w3 of six experts (one launch; w1 and
// w3 of an expert share x and input_scale, as model/weights checks at load; experts' input
// scales differ), then their w2 (each expert its own x, the SwiGLU output rows).
TEST_F(CudaNvfp4Gemv, v41_six_experts) {
    constexpr int D = 5120, I = 2304, E = 6;
    std::vector<nvfp4_weight> w13, w2;
    for (int e = 0; e < E; e++) {
        const float ws2 = 3e-5f * (1.0f + 0.1f * e), is13 = 1.7e-3f * (1.0f + 0.05f * e), is2 = 4e-4f * (1.0f + 0.3f * e);
        w13.push_back(random_nvfp4(I, D, ws2, is13, uint32_t(100 + e)));       // w1
        w13.push_back(random_nvfp4(I, D, ws2, is13, uint32_t(200 + e)));       // w3
        w2.push_back(random_nvfp4(D, I, 4e-5f * (1.0f + 0.1f * e), is2, uint32_t(300 + e)));
    }
    for (int M : {1, 16}) {
        std::vector<spec> up, down;
        // M = 1: every expert reads the one token row (different input scales: separate
        // quantizations of one x). M = 16: each expert its own gathered rows.
        for (int e = 0; e < E; e++) {
            up.push_back({&w13[size_t(2 * e)], M, M == 1 ? 0 : e});
            up.push_back({&w13[size_t(2 * e + 1)], M, M == 1 ? 0 : e});
            down.push_back({&w2[size_t(e)], M, 100 + e});
        }
        run_batch(up, "v41 6 experts w1+w3 M" + std::to_string(M));
        run_batch(down, "v41 6 experts w2 M" + std::to_string(M));
    }
}

TEST_F(CudaNvfp4Gemv, rejects_bad_input) {
    cuda::nvfp4_matrix m;
    dev_buf w(4096), y(4096);
    m.w = w.as<uint8_t>(), m.scale = w.as<uint8_t>(), m.x = y.as<float>(), m.y = y.as<float>();
    m.weight_scale_2 = 1, m.input_scale = 1, m.N = 8, m.K = 48, m.M = 1;
    EXPECT_EQ(cuda::plan_nvfp4_gemv(dev_, {m}).status().code(), status_code::NOT_SUPPORTED);  // K % 32
    m.K = 64, m.M = 17;
    EXPECT_EQ(cuda::plan_nvfp4_gemv(dev_, {m}).status().code(), status_code::NOT_SUPPORTED);  // M > 16
    m.M = 1, m.input_scale = 0;
    EXPECT_EQ(cuda::plan_nvfp4_gemv(dev_, {m}).status().code(), status_code::INVALID_ARGUMENT);
    m.input_scale = 1, m.weight_scale_2 = std::nanf("");
    EXPECT_EQ(cuda::plan_nvfp4_gemv(dev_, {m}).status().code(), status_code::INVALID_ARGUMENT);
    m.weight_scale_2 = 1, m.w = w.as<uint8_t>() + 8;  // misaligned codes
    EXPECT_EQ(cuda::plan_nvfp4_gemv(dev_, {m}).status().code(), status_code::INVALID_ARGUMENT);
    m.w = w.as<uint8_t>();
    EXPECT_TRUE(cuda::plan_nvfp4_gemv(dev_, {m}).is_ok());
}

// ---- informational bandwidth -------------------------------------------------------------------

// Times one launch over `nmat` matrices N x K (M rows, one shared x), with COPIES copies of the
// weights rotating so no launch finds its weights in L2 (decode streams every weight once per
// token), all captured in one CUDA graph; median of the replays per launch.
void bench(const cuda::device_info &dev, const char *name, int nmat, int N, int K, int M, double copy_bw) {
    constexpr int COPIES = 4, REPLAYS = 15;
    const nvfp4_weight w = random_nvfp4(N, K, 3e-5f, 1.7e-3f, 77);
    dev_buf codes(w.codes.size() * size_t(nmat) * COPIES), scales(w.scales.size() * size_t(nmat) * COPIES);
    for (int i = 0; i < nmat * COPIES; i++) {
        cudaMemcpy(codes.as<uint8_t>() + w.codes.size() * i, w.codes.data(), w.codes.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(scales.as<uint8_t>() + w.scales.size() * i, w.scales.data(), w.scales.size(), cudaMemcpyHostToDevice);
    }
    const std::vector<float> x = random_rows(M, K, 5);
    dev_buf dx(x.size() * 4), dy(size_t(M) * N * nmat * 4);
    cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    std::vector<cuda::nvfp4_gemv_plan> plans;
    for (int c = 0; c < COPIES; c++) {
        std::vector<cuda::nvfp4_matrix> mats;
        for (int i = 0; i < nmat; i++) {
            cuda::nvfp4_matrix m;
            m.w = codes.as<uint8_t>() + w.codes.size() * (size_t(c) * nmat + i);
            m.scale = scales.as<uint8_t>() + w.scales.size() * (size_t(c) * nmat + i);
            m.weight_scale_2 = w.ws2, m.input_scale = w.input_scale;
            m.N = N, m.K = K, m.M = M, m.x = dx.as<float>(), m.y = dy.as<float>() + size_t(M) * N * i;
            mats.push_back(m);
        }
        auto p = cuda::plan_nvfp4_gemv(dev, mats);
        ASSERT_TRUE(p.is_ok()) << p.status().to_string();
        plans.push_back(p.value());
    }
    size_t ws_bytes = 1;
    for (const auto &p : plans) ws_bytes = std::max(ws_bytes, p.workspace_bytes);
    const auto ws = testing_util::zeroed_workspaces(COPIES, ws_bytes);
    const double ms = testing_util::graph_median_ms(COPIES, REPLAYS, [&](cudaStream_t s, int c) {
        return cuda::run_nvfp4_gemv(plans[size_t(c)], ws[size_t(c)]->p, s).is_ok();
    });
    ASSERT_GT(ms, 0) << name << ": graph capture or replay failed";
    const double us = ms * 1e3;
    const double bytes = double(nmat) * N * double(K) * (0.5 + 1.0 / 16.0);
    const double gbps = bytes / (us * 1e-6) / 1e9;
    std::printf("[ nvfp4 bw] %-28s M%-2d %6.1f MB  %7.2f us  %6.0f GB/s  = %4.1f%% of copy %.0f GB/s\n", name, M,
                bytes / 1e6, us, gbps, 100.0 * gbps * 1e9 / copy_bw, copy_bw / 1e9);
}

TEST_F(CudaNvfp4Gemv, bandwidth_informational) {
    const double copy_bw = testing_util::copy_bandwidth();
    for (int M : {1, 16}) {
        bench(dev_, "v41 6 experts w1+w3", 12, 2304, 5120, M, copy_bw);
        bench(dev_, "v41 6 experts w2", 6, 5120, 2304, M, copy_bw);
    }
}

}  // namespace
