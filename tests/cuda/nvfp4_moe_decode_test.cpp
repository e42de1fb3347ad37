// GPU routed-expert decode over NVFP4 W4A4 experts (backend/cuda/moe_decode.cu with
// nvfp4_gemv) against the CPU's NVFP4 expert (backend/cpu nvfp4_w4a4_swiglu), summed per row in
// fp32 in increasing expert id, at V4.1 shapes: 8 held experts of real size (w1 / w3 [2304,
// 5120], w2 [5120, 2304], random codes and E4M3 scales, per-expert weight_scale_2 and
// input_scale, w1 and w3 sharing theirs), B = 1, 4, 16 rows with 6 routes each, the V4.1 clamp
// (10) and a tight one (2), the route weight after w2 (nvfp4_w4a4_swiglu's own form) and before
// (on h, before its W4A4 quantization: the V4.1 engine's form; the CPU side is then the same
// composition of nvfp4_w4a4_linear and the SwiGLU rounding points, checked equal to
// nvfp4_w4a4_swiglu where both apply).
//
// Tolerances. Stage by stage, each stage fed the GPU's own inputs: gate / up and the expert
// outputs within 2e-5 per row of nvfp4_w4a4_linear (nvfp4_gemv_test's 1e-5 per matrix, with
// margin for single rows); h equal to the CPU's SwiGLU of the GPU's gate / up but for last-bit
// differences of expf (then within one bf16 step; at most 0.1% of elements); the combine
// bit-equal to the CPU's fp32 sum over the GPU's expert outputs. End to end, a GEMV sum that
// differs from the CPU's in its last fp32 bits can land on the other side of a bf16 rounding of
// gate / up (~1 element per route): h moves by 2^-8 of one element, ~1e-4 of a row; rarely that
// also moves an E2M1 code of h (3 bits), up to ~1.4e-2 of that expert's output. Asserted: every
// row within 2e-2, the median row within 1e-3 (a misplaced rounding point or a wrong scale is
// far above both). Outputs and step buffers are poisoned with NaN; each plan runs twice and the
// replay must be bit-equal.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_ops.h"
#include "backend/cuda/moe_decode.cuh"
#include "core/dtype.h"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

constexpr int D = 5120, I = 2304, E = 384, K = 6, POOL = 8;

struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
    template <typename T> T *as() const { return static_cast<T *>(p); }
};

struct host_expert {
    testing_util::nvfp4_weight w1, w3, w2;
};

struct expert_set {
    std::vector<uint32_t> ids;           // held experts, spread over 0..383
    std::vector<int> slot;               // [E] index into host, -1 where not held
    std::vector<host_expert> host;
    std::vector<std::unique_ptr<dev_buf>> mem;
    cuda::moe_layer layer;
};

expert_set *g_set = nullptr;

const uint8_t *upload(expert_set &s, const std::vector<uint8_t> &v) {
    s.mem.push_back(std::make_unique<dev_buf>(v.size()));
    cudaMemcpy(s.mem.back()->p, v.data(), v.size(), cudaMemcpyHostToDevice);
    return s.mem.back()->as<uint8_t>();
}

// Weight rms ~0.013 (codes rms 2.9, scales mostly 2..448, ws2 3e-5), so gate / up of x ~ N(0,
// 2^2) come out near N(0, 1.9^2): the clamp at 10 rarely bites, the one at 2 often.
expert_set *make_set() {
    auto *s = new expert_set;
    s->slot.assign(E, -1);
    s->layer.D = D, s->layer.I = I;
    s->layer.nvfp4_experts.resize(E);
    for (int j = 0; j < POOL; j++) {
        const uint32_t e = uint32_t(j * (E - 1) / (POOL - 1));
        s->ids.push_back(e);
        s->slot[e] = j;
        const float ws13 = 3e-5f * (1.0f + 0.1f * j), is13 = 7e-3f * (1.0f + 0.05f * j);
        const float ws2 = 3e-5f * (1.0f + 0.07f * j), is2 = 1e-2f * (1.0f + 0.2f * j);
        host_expert h{testing_util::random_nvfp4(I, D, ws13, is13, 1000 + e), testing_util::random_nvfp4(I, D, ws13, is13, 2000 + e),
                      testing_util::random_nvfp4(D, I, ws2, is2, 3000 + e)};
        cuda::moe_nvfp4_expert &g = s->layer.nvfp4_experts[e];
        g.w1 = upload(*s, h.w1.codes), g.w1_scale = upload(*s, h.w1.scales);
        g.w3 = upload(*s, h.w3.codes), g.w3_scale = upload(*s, h.w3.scales);
        g.w2 = upload(*s, h.w2.codes), g.w2_scale = upload(*s, h.w2.scales);
        g.w13_weight_scale_2 = ws13, g.w13_input_scale = is13, g.w2_weight_scale_2 = ws2, g.w2_input_scale = is2;
        s->host.push_back(std::move(h));
    }
    return s;
}

double row_rel(const float *got, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        const double d = double(got[i]) - ref[i];
        num += d * d, den += double(ref[i]) * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

// The CPU's SwiGLU rounding points of nvfp4_w4a4_swiglu, with the route weight on h when
// `weight` is not 1 (the weight-before form).
float swiglu_h(float g, float u, float limit, float weight, bool before) {
    float gb = round_bf16(g), ub = round_bf16(u);
    if (limit > 0) gb = std::min(gb, limit), ub = std::clamp(ub, -limit, limit);
    float v = round_bf16(cpu::silu(gb)) * ub;
    if (before) v = weight * v;
    return round_bf16(v);
}

// One expert on one row, composed from the CPU's W4A4 linear.
std::vector<float> cpu_expert(const host_expert &w, const float *x, float limit, float weight, bool before) {
    std::vector<float> g(I), u(I), h(I), y(D);
    cpu::nvfp4_w4a4_linear(x, 1, w.w1.dequant.data(), I, D, w.w1.input_scale, g.data());
    cpu::nvfp4_w4a4_linear(x, 1, w.w3.dequant.data(), I, D, w.w3.input_scale, u.data());
    for (int i = 0; i < I; i++) h[size_t(i)] = swiglu_h(g[size_t(i)], u[size_t(i)], limit, weight, before);
    cpu::nvfp4_w4a4_linear(h.data(), 1, w.w2.dequant.data(), D, I, w.w2.input_scale, y.data());
    return y;
}

class CudaNvfp4MoeDecode : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (!cuda::query_device()) return;
        g_set = make_set();
    }
    static void TearDownTestSuite() {
        delete g_set;
        g_set = nullptr;
    }
    void SetUp() override {
        auto d = cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
        dev_ = d.value();
    }
    cuda::device_info dev_;

    void step(int B, float limit, bool after, uint32_t seed) {
        const std::string what = "nvfp4 moe B" + std::to_string(B) + " limit " + std::to_string(int(limit)) +
                                 (after ? " weight after w2" : " weight before w2");
        expert_set &set = *g_set;
        cuda::moe_layer layer = set.layer;
        layer.swiglu_limit = limit, layer.weight_after_w2 = after;
        std::mt19937 rng(seed);
        std::vector<cuda::moe_route> routes;
        for (int b = 0; b < B; b++) {
            std::vector<uint32_t> p = set.ids;
            std::shuffle(p.begin(), p.end(), rng);
            std::vector<float> w(K);
            float sum = 0;
            for (auto &v : w) sum += v = 0.05f + float(rng() % 1000) / 1000.0f;
            for (int k = 0; k < K; k++) routes.push_back({p[size_t(k)], w[size_t(k)] / sum * 1.5f});
        }
        std::vector<float> x = testing_util::random_normal(size_t(B) * D, seed + 7);
        for (auto &v : x) v = round_bf16(2.0f * v);
        const int R = B * K;
        dev_buf dx(x.size() * 4), dout(x.size() * 4), dbuf(cuda::moe_buffer_bytes(D, I, R));
        cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
        const cuda::moe_buffers buf = cuda::moe_buffers_at(dbuf.p, D, I, R);
        auto planr = cuda::plan_moe_decode(dev_, layer, buf, dx.as<float>(), dout.as<float>(), routes, B, K);
        ASSERT_TRUE(planr.is_ok()) << planr.status().to_string();
        const cuda::moe_decode_plan &p = planr.value();
        ASSERT_TRUE(p.nvfp4);
        dev_buf ws(p.workspace_bytes);
        cudaMemset(ws.p, 0, p.workspace_bytes);
        std::vector<float> out(x.size()), first;
        for (int rep = 0; rep < 2; rep++) {
            cudaMemset(dout.p, 0xff, out.size() * 4);  // NaN poison
            cudaMemset(dbuf.p, 0xff, cuda::moe_buffer_bytes(D, I, R));
            Status st = cuda::run_moe_decode(p, ws.p, 0);
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost);
            if (rep == 1) {
                EXPECT_EQ(std::memcmp(out.data(), first.data(), out.size() * 4), 0) << what << ": replay differs";
            }
            first = out;
        }
        for (size_t i = 0; i < out.size(); i++)
            ASSERT_TRUE(std::isfinite(out[i])) << what << ": element " << i << " not written (NaN poison)";
        auto down = [&](const float *ptr, size_t n) {
            std::vector<float> v(n);
            cudaMemcpy(v.data(), ptr, n * 4, cudaMemcpyDeviceToHost);
            return v;
        };
        const std::vector<float> gate = down(buf.gate, size_t(R) * I), up = down(buf.up, size_t(R) * I);
        const std::vector<float> h = down(buf.h, size_t(R) * I), ye = down(buf.ye, size_t(R) * D);

        // Stages, each from the GPU's own inputs.
        double worst_gu = 0, worst_ye = 0;
        size_t h_flips = 0, clamped = 0;
        for (int s = 0; s < R; s++) {
            const host_expert &w = set.host[size_t(set.slot[p.slot_expert[size_t(s)]])];
            const float *xr = x.data() + size_t(p.slot_row[size_t(s)]) * D;
            std::vector<float> g(I), u(I), y(D);
            cpu::nvfp4_w4a4_linear(xr, 1, w.w1.dequant.data(), I, D, w.w1.input_scale, g.data());
            cpu::nvfp4_w4a4_linear(xr, 1, w.w3.dequant.data(), I, D, w.w3.input_scale, u.data());
            worst_gu = std::max({worst_gu, row_rel(&gate[size_t(s) * I], g.data(), I), row_rel(&up[size_t(s) * I], u.data(), I)});
            for (int i = 0; i < I; i++) {
                const float gv = gate[size_t(s) * I + i], uv = up[size_t(s) * I + i];
                clamped += (round_bf16(gv) > limit) + (std::fabs(round_bf16(uv)) > limit);
                const float want = swiglu_h(gv, uv, limit, p.slot_weight[size_t(s)], !after);
                const float got = h[size_t(s) * I + i];
                if (got != want) {
                    h_flips++;
                    EXPECT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -7)) << what << " h slot " << s << " i " << i;
                }
            }
            cpu::nvfp4_w4a4_linear(&h[size_t(s) * I], 1, w.w2.dequant.data(), D, I, w.w2.input_scale, y.data());
            worst_ye = std::max(worst_ye, row_rel(&ye[size_t(s) * D], y.data(), D));
        }
        EXPECT_LE(worst_gu, 2e-5) << what;
        EXPECT_LE(worst_ye, 2e-5) << what;
        EXPECT_LE(double(h_flips), 1e-3 * R * I) << what;
        size_t combine_diff = 0;
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++) {
                float acc = 0;
                for (int s = 0; s < R; s++)  // slots are in increasing expert id
                    if (p.slot_row[size_t(s)] == b) {
                        // volatile: the GPU rounds the product and the sum separately; keep a
                        // -march=... host build from fusing them.
                        volatile float v = ye[size_t(s) * D + d];
                        if (after) v = v * p.slot_weight[size_t(s)];
                        acc = acc + v;
                    }
                combine_diff += std::memcmp(&acc, &out[size_t(b) * D + d], 4) != 0;
            }
        EXPECT_EQ(combine_diff, 0u) << what << ": combine differs from the CPU's fp32 sum in expert order";

        // End to end against the CPU's expert.
        std::vector<double> rows;
        for (int b = 0; b < B; b++) {
            std::vector<cuda::moe_route> mine(routes.begin() + b * K, routes.begin() + (b + 1) * K);
            std::sort(mine.begin(), mine.end(), [](const auto &a, const auto &c) { return a.expert < c.expert; });
            std::vector<float> acc(D, 0.0f);
            for (const auto &r : mine) {
                const host_expert &w = set.host[size_t(set.slot[r.expert])];
                const std::vector<float> y = cpu_expert(w, x.data() + size_t(b) * D, limit, r.weight, !after);
                for (int d = 0; d < D; d++) {
                    volatile float v = after ? y[size_t(d)] * r.weight : y[size_t(d)];
                    acc[size_t(d)] = acc[size_t(d)] + v;
                }
            }
            rows.push_back(row_rel(&out[size_t(b) * D], acc.data(), D));
            EXPECT_LE(rows.back(), 2e-2) << what << " row " << b;
        }
        std::vector<double> sorted = rows;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_LE(sorted[sorted.size() / 2], 1e-3) << what << ": median row";
        std::printf("[ nvfp4 moe] %-40s experts read %d  gate/up %.3g  w2 %.3g  h flips %zu/%d  clamped %.1f%%  "
                    "row rel err median %.3g max %.3g\n",
                    what.c_str(), p.experts_read, worst_gu, worst_ye, h_flips, R * I,
                    100.0 * double(clamped) / (2.0 * R * I), sorted[sorted.size() / 2], sorted.back());
    }
};

// The composition the tests use for the CPU side is the CPU's own NVFP4 expert where that
// applies (weight after w2): bit-equal to nvfp4_w4a4_swiglu.
TEST_F(CudaNvfp4MoeDecode, cpu_composition_is_nvfp4_w4a4_swiglu) {
    const host_expert &w = g_set->host[3];
    std::vector<float> x = testing_util::random_normal(D, 5);
    for (auto &v : x) v = round_bf16(2.0f * v);
    for (float limit : {10.0f, 2.0f}) {
        std::vector<float> ref(D);
        cpu::nvfp4_w4a4_swiglu(x.data(), 1, D, I, w.w1.dequant.data(), w.w3.dequant.data(), w.w2.dequant.data(),
                               w.w1.input_scale, w.w2.input_scale, limit, ref.data());
        const std::vector<float> mine = cpu_expert(w, x.data(), limit, 1.0f, false);
        EXPECT_EQ(std::memcmp(mine.data(), ref.data(), D * 4), 0) << "limit " << limit;
    }
}

TEST_F(CudaNvfp4MoeDecode, v41_shapes) {
    for (int B : {1, 4, 16}) step(B, 10.0f, false, uint32_t(B * 13 + 1));
    step(4, 2.0f, false, 61);
    step(4, 10.0f, true, 62);
    step(16, 2.0f, true, 63);
}

// Host side of an NVFP4 plan, without a GPU (the plans only size launches): a fabricated layer
// of 384 NVFP4 experts at V4.1 shapes, the grouping and each matrix's scalars checked against
// the routes and the layer.
TEST(Nvfp4MoeDecodePlan, groups_routes_and_carries_each_experts_scales) {
    cuda::moe_layer layer;
    layer.D = D, layer.I = I, layer.swiglu_limit = 10.0f;
    layer.nvfp4_experts.resize(E);
    for (int e = 0; e < E; e++) {
        const uint8_t *b = reinterpret_cast<const uint8_t *>(uintptr_t(e + 1) << 30);  // never dereferenced
        cuda::moe_nvfp4_expert &x = layer.nvfp4_experts[size_t(e)];
        x.w1 = b, x.w1_scale = b + 0x1000, x.w3 = b + 0x2000, x.w3_scale = b + 0x3000, x.w2 = b + 0x4000, x.w2_scale = b + 0x5000;
        x.w13_weight_scale_2 = 1.0f + e, x.w13_input_scale = 2.0f + e, x.w2_weight_scale_2 = 3.0f + e, x.w2_input_scale = 4.0f + e;
    }
    cuda::device_info dev;
    dev.sm_count = 132, dev.cc_major = 9;
    const float *x = reinterpret_cast<const float *>(uintptr_t(1) << 12);
    float *out = reinterpret_cast<float *>(uintptr_t(1) << 13);
    std::mt19937 rng(5);
    for (int B : {1, 16}) {
        const int R = B * K;
        const cuda::moe_buffers buf = cuda::moe_buffers_at(reinterpret_cast<void *>(uintptr_t(1) << 40), D, I, R);
        std::vector<cuda::moe_route> routes;
        for (int b = 0; b < B; b++)
            for (int k = 0; k < K; k++) routes.push_back({uint32_t((b * 7 + k * 61) % 64), 0.25f});
        auto plan = cuda::plan_moe_decode(dev, layer, buf, x, out, routes, B, K);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        const cuda::moe_decode_plan &p = plan.value();
        EXPECT_TRUE(p.nvfp4);
        EXPECT_TRUE(p.up.mats.empty() && p.down.mats.empty());
        ASSERT_EQ(p.up4.mats.size(), size_t(2 * p.experts_read));
        ASSERT_EQ(p.down4.mats.size(), size_t(p.experts_read));
        int slot = 0;
        for (int j = 0; j < p.experts_read; j++) {
            const cuda::nvfp4_matrix &w1 = p.up4.mats[size_t(2 * j)], &w3 = p.up4.mats[size_t(2 * j + 1)], &w2 = p.down4.mats[size_t(j)];
            const uint32_t e = p.slot_expert[size_t(slot)];
            const cuda::moe_nvfp4_expert &h = layer.nvfp4_experts[e];
            int rows = 0;
            for (const auto &r : routes) rows += r.expert == e;
            EXPECT_EQ(w1.M, rows);
            EXPECT_EQ(w2.M, rows);
            EXPECT_EQ(w1.w, h.w1);
            EXPECT_EQ(w3.w, h.w3);
            EXPECT_EQ(w2.w, h.w2);
            EXPECT_EQ(w1.scale, h.w1_scale);
            EXPECT_EQ(w3.scale, h.w3_scale);
            EXPECT_EQ(w2.scale, h.w2_scale);
            EXPECT_EQ(w1.input_scale, h.w13_input_scale);
            EXPECT_EQ(w3.input_scale, h.w13_input_scale);
            EXPECT_EQ(w1.weight_scale_2, h.w13_weight_scale_2);
            EXPECT_EQ(w3.weight_scale_2, h.w13_weight_scale_2);
            EXPECT_EQ(w2.input_scale, h.w2_input_scale);
            EXPECT_EQ(w2.weight_scale_2, h.w2_weight_scale_2);
            EXPECT_EQ(w1.x, B == 1 ? x : buf.xg + size_t(slot) * D);
            EXPECT_EQ(w1.y, buf.gate + size_t(slot) * I);
            EXPECT_EQ(w3.y, buf.up + size_t(slot) * I);
            EXPECT_EQ(w2.x, buf.h + size_t(slot) * I);
            EXPECT_EQ(w2.y, buf.ye + size_t(slot) * D);
            EXPECT_EQ(w1.N, I);
            EXPECT_EQ(w1.K, D);
            EXPECT_EQ(w2.N, D);
            EXPECT_EQ(w2.K, I);
            slot += rows;
        }
        EXPECT_EQ(slot, R);
        // w1 and w3 of an expert share one quantization of x; experts (other input scales) do not.
        for (int j = 0; j < p.experts_read; j++) {
            EXPECT_EQ(p.up4.x_offset[size_t(2 * j)], p.up4.x_offset[size_t(2 * j + 1)]);
            if (j > 0) {
                EXPECT_NE(p.up4.x_offset[size_t(2 * j)], p.up4.x_offset[size_t(2 * j - 2)]);
            }
        }
    }
    layer.nvfp4_experts[7].w2 = nullptr;  // not held here
    const cuda::moe_buffers buf = cuda::moe_buffers_at(reinterpret_cast<void *>(uintptr_t(1) << 40), D, I, K);
    std::vector<cuda::moe_route> routes;
    for (int k = 0; k < K; k++) routes.push_back({uint32_t(k + 5), 0.1f});
    EXPECT_EQ(cuda::plan_moe_decode(dev, layer, buf, x, out, routes, 1, K).status().code(), status_code::INVALID_ARGUMENT);
}

}  // namespace
