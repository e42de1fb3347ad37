// GPU routed-expert decode (backend/cuda/moe_decode.cu) against the CPU loop every placement
// runs (backend/cpu routed_expert_sum), at V4.1 shapes: 16 held experts of real size (MXFP4
// w1 / w3 [2304, 5120], w2 [5120, 2304], random codes and scales), B = 1, 4, 16 rows with 6
// routes each (top-6 of the held experts), both numerics modes, the V4.1 clamp (10) and a tight
// clamp (2) that bites on a good share of gate / up values, weights before w2 (V4.1) and after
// (transformers' V4).
//
// Tolerances:
//  - reference numerics: relative error per output row <= 1e-5. Everything is fp32; the GEMV
//    sums in a different order than the CPU's fp64 dot products (<= 1e-5, gemv_test), SwiGLU
//    and the combine add a few fp32 roundings (the combine's order is the CPU's).
//  - official numerics: the GPU rounds at exactly the CPU's points (bf16 gate / up / h / expert
//    output, E4M3 h per 32 channels), so a difference enters only where a GEMV sum that differs
//    from the CPU's in its last fp32 bits lands on the other side of a bf16 or E4M3 rounding
//    boundary. A flipped bf16 is 2^-8 of one element; a flipped E4M3 code of h is up to 2^-3
//    of one of 2304 inputs of w2, about 0.125 * |h_i| / ||h|| (up to ~3e-3) of that expert's
//    output. Bound asserted per row: 5e-3, and at least 90% of the output elements bit-equal to
//    the CPU's (a misplaced rounding point leaves almost none equal). Sized with a CPU emulation
//    of the GPU's arithmetic (these shapes and value ranges, B = 4, both clamps, weight before /
//    after w2): with fp32 sums per 32-k block, worst row 4.1e-5 and 99.95% of elements equal;
//    with each k32 MMA keeping only 14 bits below its largest product (DeepSeek-V3's reading of
//    Hopper FP8 tensor cores, pessimistic: gemv_test's 1e-5 would fail there), worst row 1.8e-3
//    and 47-60% equal; 18 bits: 7.5e-4 and 93-99%; 21 bits and up: as fp32. Reference numerics
//    in the same emulation: worst row 4.4e-7. The stage test below then proves
//    each step separately: GEMV outputs within 2e-5 per row of the CPU given the GPU's inputs, h
//    equal to the CPU's SwiGLU of the GPU's gate / up (but for last-bit flips of expf, then one
//    bf16 ulp), and the combine bit-equal to the CPU's fp32 order over the GPU's expert outputs.
// Outputs and intermediate buffers are poisoned with NaN, so an element not written fails.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include "backend/cpu/numerics.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/routed.h"
#include "backend/cuda/moe_decode.cuh"
#include "core/dtype.h"
#include "core/threads.h"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

constexpr int D = 5120, I = 2304, E = 384, K = 6, POOL = 16;

struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
    ~dev_buf() { cudaFree(p); }
    template <typename T> T *as() const { return static_cast<T *>(p); }
};

// MXFP4 [N, Kd] with scales 2^-10 .. 2^-7: weight rms ~ 0.013 (E2M1 codes rms 2.9), so w1 x and
// w3 x of x ~ N(0, 4^2) come out near N(0, 3.8^2): the clamp at 10 bites on ~1% of values, the
// tight clamp at 2 on ~30%.
struct fp4_matrix {
    std::vector<uint8_t> w, scale;
    Tensor dequant;
};

fp4_matrix random_fp4(int N, int Kd, uint32_t seed) {
    std::mt19937 rng(seed);
    fp4_matrix m;
    m.w.resize(size_t(N) * Kd / 2);
    for (auto &b : m.w) b = uint8_t(rng());
    m.scale.resize(size_t(N) * Kd / 32);
    for (auto &s : m.scale) s = uint8_t(117 + rng() % 4);
    m.dequant = Tensor::f32({N, Kd});
    float *f = m.dequant.f();
    parallel_for(N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++)
            for (int k = 0; k < Kd; k++)
                f[size_t(n) * Kd + k] = e2m1_to_f32(e2m1_unpack(m.w.data() + size_t(n) * Kd / 2, size_t(k))) *
                                        e8m0_to_f32(m.scale[size_t(n) * (Kd / 32) + size_t(k / 32)]);
    });
    return m;
}

struct expert_set {
    std::vector<uint32_t> ids;                  // the held experts, spread over 0..383
    std::vector<cpu::expert_weights> cpu;       // [E], empty where not held
    std::vector<std::unique_ptr<dev_buf>> mem;
    cuda::moe_layer layer;                      // numerics fields set per test
};

expert_set *g_set = nullptr;

void upload(expert_set &s, const std::vector<uint8_t> &v, const uint8_t *&dst) {
    s.mem.push_back(std::make_unique<dev_buf>(v.size()));
    cudaMemcpy(s.mem.back()->p, v.data(), v.size(), cudaMemcpyHostToDevice);
    dst = s.mem.back()->as<uint8_t>();
}

// `pool` held experts of [I, D] spread over the layer's n experts (both ends held), on the GPU
// and dequantized.
expert_set *make_set(int Dm, int Im, int n, int pool, uint32_t seed) {
    auto *s = new expert_set;
    s->cpu.resize(size_t(n));
    s->layer.D = Dm, s->layer.I = Im;
    s->layer.experts.resize(size_t(n));
    for (int j = 0; j < pool; j++) {
        const uint32_t e = uint32_t(j * (n - 1) / (pool - 1));
        s->ids.push_back(e);
        fp4_matrix w1 = random_fp4(Im, Dm, seed + 1000 + e), w3 = random_fp4(Im, Dm, seed + 2000 + e),
                   w2 = random_fp4(Dm, Im, seed + 3000 + e);
        cuda::moe_expert &g = s->layer.experts[e];
        upload(*s, w1.w, g.w1), upload(*s, w1.scale, g.w1_scale);
        upload(*s, w3.w, g.w3), upload(*s, w3.scale, g.w3_scale);
        upload(*s, w2.w, g.w2), upload(*s, w2.scale, g.w2_scale);
        s->cpu[e] = {w1.dequant, w2.dequant, w3.dequant};
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

// Routes like the router's: K distinct experts of the held pool per row, positive weights
// summing to the route scale 1.5.
std::vector<cuda::moe_route> random_routes(const std::vector<uint32_t> &pool, int B, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<cuda::moe_route> r;
    for (int b = 0; b < B; b++) {
        std::vector<uint32_t> p = pool;
        std::shuffle(p.begin(), p.end(), rng);
        std::vector<float> w(K);
        float sum = 0;
        for (auto &v : w) sum += v = 0.05f + float(rng() % 1000) / 1000.0f;
        for (int k = 0; k < K; k++) r.push_back({p[size_t(k)], w[size_t(k)] / sum * 1.5f});
    }
    return r;
}

cpu::route_table to_table(const std::vector<cuda::moe_route> &routes, int B) {
    cpu::route_table t;
    for (int b = 0; b <= B; b++) t.offsets.push_back(uint32_t(b * K));
    for (const auto &r : routes) t.routes.push_back({r.expert, r.weight});
    return t;
}

class CudaMoeDecode : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (!cuda::query_device()) return;
        g_set = make_set(D, I, E, POOL, 0);
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

    struct run_result {
        std::vector<float> out, ref, x;
        std::vector<cuda::moe_route> routes;
        cuda::moe_decode_plan plan;
        std::vector<float> gate, up, h, ye;  // the GPU's intermediate buffers, [R, *]
        int D = 0;
    };

    // One step on the GPU (run twice: the GEMV counters must be ready for a replay) and on the CPU.
    run_result step(int B, bool official, float limit, bool after, uint32_t seed) {
        return step_on(*g_set, 32, B, official, limit, after, seed);
    }
    // act_block: the official numerics' activation block (V4.1 32, V4 128).
    run_result step_on(const expert_set &set, int act_block, int B, bool official, float limit, bool after,
                       uint32_t seed) {
        run_result r;
        const int D = set.layer.D, I = set.layer.I;  // this set's shapes
        cuda::moe_layer layer = set.layer;
        layer.act_block = official ? act_block : 0, layer.swiglu_limit = limit, layer.weight_after_w2 = after;
        r.routes = random_routes(set.ids, B, seed);
        r.x = testing_util::random_normal(size_t(B) * D, seed + 7);
        for (auto &v : r.x) v *= 4.0f;
        const int R = B * K;
        dev_buf dx(r.x.size() * 4), dout(r.x.size() * 4), dbuf(cuda::moe_buffer_bytes(D, I, R));
        cudaMemcpy(dx.p, r.x.data(), r.x.size() * 4, cudaMemcpyHostToDevice);
        const cuda::moe_buffers buf = cuda::moe_buffers_at(dbuf.p, D, I, R);
        auto plan = cuda::plan_moe_decode(dev_, layer, buf, dx.as<float>(), dout.as<float>(), r.routes, B, K);
        EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
        if (!plan.is_ok()) return r;
        r.plan = plan.value();
        dev_buf ws(r.plan.workspace_bytes);
        cudaMemset(ws.p, 0, r.plan.workspace_bytes);
        r.out.resize(size_t(B) * D);
        for (int rep = 0; rep < 2; rep++) {
            cudaMemset(dout.p, 0xff, r.out.size() * 4);  // NaN poison
            cudaMemset(dbuf.p, 0xff, cuda::moe_buffer_bytes(D, I, R));
            Status st = cuda::run_moe_decode(r.plan, ws.p, 0);
            EXPECT_TRUE(st.is_ok()) << st.to_string();
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            std::vector<float> got(r.out.size());
            cudaMemcpy(got.data(), dout.p, got.size() * 4, cudaMemcpyDeviceToHost);
            if (rep == 1) {
                size_t differ = 0;
                for (size_t i = 0; i < got.size(); i++) differ += std::memcmp(&got[i], &r.out[i], 4) != 0;
                EXPECT_EQ(differ, 0u) << "the replay's output differs from the first run's";
            }
            r.out = got;
        }
        auto down = [&](const float *p, size_t n) {
            std::vector<float> v(n);
            cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost);
            return v;
        };
        r.gate = down(buf.gate, size_t(R) * I), r.up = down(buf.up, size_t(R) * I);
        r.h = down(buf.h, size_t(R) * I), r.ye = down(buf.ye, size_t(R) * D);

        cpu::expert_numerics nm;
        nm.official = official, nm.act_block = act_block, nm.kind = cpu::lin::FP4;
        nm.swiglu_limit = limit, nm.weight_after_w2 = after;
        r.ref.resize(r.out.size());
        Status st = cpu::routed_expert_sum(nm, set.cpu, r.x.data(), D, to_table(r.routes, B), r.ref.data());
        r.D = D;
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return r;
    }

    // Per-row relative error against the CPU; returns the largest.
    double check(const run_result &r, int B, double tol, const std::string &what, double min_equal = 0) {
        double worst = 0;
        const int D = r.D;
        if (r.out.size() != size_t(B) * D) return 1;  // the step already failed
        for (int b = 0; b < B; b++) {
            for (int d = 0; d < D; d++)
                if (!std::isfinite(r.out[size_t(b) * D + d])) {
                    ADD_FAILURE() << what << ": row " << b << " element " << d << " not written (NaN poison)";
                    return 1;
                }
            const double e = row_rel(r.out.data() + size_t(b) * D, r.ref.data() + size_t(b) * D, D);
            EXPECT_LE(e, tol) << what << " row " << b;
            worst = std::max(worst, e);
        }
        size_t same = 0;
        for (size_t i = 0; i < r.out.size(); i++) same += r.out[i] == r.ref[i];
        EXPECT_GE(double(same), min_equal * double(r.out.size())) << what << ": elements bit-equal to the CPU";
        std::printf("[ moe     ] %-44s experts read %2d  max row rel err %.3g  elements equal %.4f\n", what.c_str(),
                    r.plan.experts_read, worst, double(same) / double(r.out.size()));
        return worst;
    }
};

TEST_F(CudaMoeDecode, reference_numerics_v41_shapes) {
    for (int B : {1, 4, 16})
        for (float limit : {10.0f, 2.0f}) {
            run_result r = step(B, false, limit, false, uint32_t(B * 31 + int(limit)));
            check(r, B, 1e-5, "reference B" + std::to_string(B) + " limit " + std::to_string(int(limit)));
        }
    run_result r = step(4, false, 10.0f, true, 77);  // transformers' V4: weight after w2
    check(r, 4, 1e-5, "reference B4 weight after w2");
}

TEST_F(CudaMoeDecode, official_numerics_v41_shapes) {
    for (int B : {1, 4, 16})
        for (float limit : {10.0f, 2.0f}) {
            run_result r = step(B, true, limit, false, uint32_t(B * 17 + int(limit)));
            check(r, B, 5e-3, "official B" + std::to_string(B) + " limit " + std::to_string(int(limit)), 0.9);
        }
    run_result r = step(4, true, 10.0f, true, 78);
    check(r, 4, 5e-3, "official B4 weight after w2", 0.9);
}

// V4 Flash's routed experts (256 of them, MXFP4 w1 / w3 [2048, 4096], w2 [4096, 2048]; official
// activation blocks of 128; transformers' V4 applies the weight after w2), six held, B = 4.
TEST_F(CudaMoeDecode, v4_shapes_activation_block_128) {
    std::unique_ptr<expert_set> v4(make_set(4096, 2048, 256, 6, 50000));
    for (bool after : {false, true}) {
        run_result r = step_on(*v4, 128, 4, false, 10.0f, after, 41);
        check(r, 4, 1e-5, std::string("v4 reference B4") + (after ? " weight after w2" : ""));
        r = step_on(*v4, 128, 4, true, 10.0f, after, 42);
        check(r, 4, 5e-3, std::string("v4 official B4") + (after ? " weight after w2" : ""), 0.9);
    }
}

// Official numerics, stage by stage, each stage fed the GPU's own inputs: isolates the GPU's
// arithmetic from the amplification of rounding-boundary flips in the end-to-end comparison.
TEST_F(CudaMoeDecode, official_numerics_stages) {
    const int B = 4, R = B * K;
    const float limit = 2.0f;
    run_result r = step(B, true, limit, false, 99);
    const cuda::moe_decode_plan &p = r.plan;
    ASSERT_EQ(int(p.slot_row.size()), R);
    const std::vector<uint32_t> &slot_expert = p.slot_expert;
    for (int s = 1; s < R; s++) ASSERT_LE(slot_expert[size_t(s - 1)], slot_expert[size_t(s)]) << "slots sorted by expert";
    double worst_gu = 0, worst_ye = 0;
    size_t h_flips = 0, clamped = 0;
    for (int s = 0; s < R; s++) {
        const cpu::expert_weights &w = g_set->cpu[slot_expert[size_t(s)]];
        // gate / up: GEMV of the FP8-quantized x row (unrounded fp32 in the buffers).
        std::vector<float> xq(r.x.begin() + size_t(p.slot_row[size_t(s)]) * D, r.x.begin() + size_t(p.slot_row[size_t(s)] + 1) * D);
        cpu::fake_quant_fp8_ue8m0(xq.data(), 1, D, 32);
        std::vector<float> g(I), u(I);
        cpu::matmul_nt(xq.data(), w.w1.f(), g.data(), 1, I, D);
        cpu::matmul_nt(xq.data(), w.w3.f(), u.data(), 1, I, D);
        worst_gu = std::max({worst_gu, row_rel(&r.gate[size_t(s) * I], g.data(), I), row_rel(&r.up[size_t(s) * I], u.data(), I)});
        // h: the CPU's SwiGLU (swiglu.cpp's expression) of the GPU's gate / up.
        for (int i = 0; i < I; i++) {
            float gv = round_bf16(r.gate[size_t(s) * I + i]), uv = round_bf16(r.up[size_t(s) * I + i]);
            clamped += (gv > limit) + (std::fabs(uv) > limit);
            uv = std::clamp(uv, -limit, limit);
            gv = std::min(gv, limit);
            const float h = round_bf16(p.slot_weight[size_t(s)] * (cpu::silu(gv) * uv));
            const float got = r.h[size_t(s) * I + i];
            if (got != h) {
                h_flips++;
                EXPECT_LE(std::fabs(got - h), std::ldexp(std::fabs(h), -7)) << "h slot " << s << " i " << i;
            }
        }
        // ye: GEMV of the FP8-quantized GPU h.
        std::vector<float> hq(r.h.begin() + size_t(s) * I, r.h.begin() + size_t(s + 1) * I), y(D);
        cpu::fake_quant_fp8_ue8m0(hq.data(), 1, I, 32);
        cpu::matmul_nt(hq.data(), w.w2.f(), y.data(), 1, D, I);
        worst_ye = std::max(worst_ye, row_rel(&r.ye[size_t(s) * D], y.data(), D));
    }
    EXPECT_LE(worst_gu, 2e-5);  // the GEMV's 1e-5 (gemv_test, whole matrices), per row with margin
    EXPECT_LE(worst_ye, 2e-5);
    EXPECT_LE(double(h_flips), 1e-3 * R * I);
    // Combine: bit-equal to the CPU's fp32 sum in increasing expert id over the GPU's outputs.
    size_t diff = 0;
    for (int b = 0; b < B; b++)
        for (int d = 0; d < D; d++) {
            float acc = 0;
            for (int s = 0; s < R; s++)
                if (p.slot_row[size_t(s)] == b) acc += round_bf16(r.ye[size_t(s) * D + d]);
            diff += std::memcmp(&acc, &r.out[size_t(b) * D + d], 4) != 0;
        }
    EXPECT_EQ(diff, 0u);
    EXPECT_GT(double(clamped), 0.05 * 2 * R * I) << "the tight clamp should bite";
    std::printf("[ moe     ] official stages: gate/up rel %.3g, w2 rel %.3g, h bf16 flips %zu of %d, combine mismatches %zu, "
                "clamped %.1f%% of gate/up\n",
                worst_gu, worst_ye, h_flips, R * I, diff, 100.0 * double(clamped) / (2.0 * R * I));
}

// Host side of the plan, without a GPU (plan_gemv only sizes launches): a fabricated layer of
// 384 experts at V4.1 shapes, the grouping checked against the routes themselves.
cuda::moe_layer fake_layer() {
    cuda::moe_layer layer;
    layer.D = D, layer.I = I, layer.act_block = 32, layer.swiglu_limit = 10.0f;
    layer.experts.resize(E);
    for (int e = 0; e < E; e++) {
        const uint8_t *b = reinterpret_cast<const uint8_t *>(uintptr_t(e + 1) << 30);  // never dereferenced
        layer.experts[size_t(e)] = {b, b + 1, b + 2, b + 3, b + 4, b + 5};
    }
    return layer;
}

cuda::device_info fake_device() {
    cuda::device_info dev;
    dev.sm_count = 132, dev.l2_bytes = 60 << 20, dev.cc_major = 9;
    return dev;
}

TEST(MoeDecodePlan, groups_routes_by_expert_and_keeps_the_cpu_order) {
    const cuda::moe_layer layer = fake_layer();
    const float *x = reinterpret_cast<const float *>(uintptr_t(1) << 12);
    float *out = reinterpret_cast<float *>(uintptr_t(1) << 13);
    std::mt19937 rng(11);
    for (int B : {1, 4, 16}) {
        const int R = B * K;
        const cuda::moe_buffers buf = cuda::moe_buffers_at(reinterpret_cast<void *>(uintptr_t(1) << 40), D, I, R);
        std::vector<cuda::moe_route> routes;
        for (int b = 0; b < B; b++) {
            std::vector<uint32_t> ids(E);
            std::iota(ids.begin(), ids.end(), 0u);
            std::shuffle(ids.begin(), ids.end(), rng);
            if (b == 1) ids[0] = routes[0].expert;  // an expert shared by rows 0 and 1
            for (int k = 0; k < K; k++) routes.push_back({ids[size_t(k)], float(b * K + k)});  // weight = route index
        }
        auto plan = cuda::plan_moe_decode(fake_device(), layer, buf, x, out, routes, B, K);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        const cuda::moe_decode_plan &p = plan.value();
        std::vector<uint32_t> distinct;
        for (const auto &r : routes) distinct.push_back(r.expert);
        std::sort(distinct.begin(), distinct.end());
        distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
        EXPECT_EQ(p.experts_read, int(distinct.size()));
        ASSERT_EQ(p.up.mats.size(), 2 * distinct.size());
        ASSERT_EQ(p.down.mats.size(), distinct.size());
        // Every route owns one slot; slots run in (expert, row) order.
        std::vector<int> seen(size_t(R), 0);
        for (int s = 0; s < R; s++) {
            const int idx = int(p.slot_weight[size_t(s)]);
            ASSERT_TRUE(idx >= 0 && idx < R);
            seen[size_t(idx)]++;
            EXPECT_EQ(p.slot_row[size_t(s)], idx / K);
            EXPECT_EQ(p.slot_expert[size_t(s)], routes[size_t(idx)].expert);
            if (s > 0) {
                EXPECT_TRUE(std::make_pair(p.slot_expert[size_t(s - 1)], p.slot_row[size_t(s - 1)]) <
                            std::make_pair(p.slot_expert[size_t(s)], p.slot_row[size_t(s)]));
            }
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), R);
        // Each row sums its own routes, in increasing expert id (routed_expert_sum's order).
        for (int b = 0; b < B; b++) {
            ASSERT_EQ(p.row_off[size_t(b + 1)] - p.row_off[size_t(b)], K);
            for (int j = p.row_off[size_t(b)]; j < p.row_off[size_t(b + 1)]; j++) {
                const int s = p.row_slot[size_t(j)];
                EXPECT_EQ(p.slot_row[size_t(s)], b);
                if (j > p.row_off[size_t(b)]) {
                    EXPECT_LT(p.slot_expert[size_t(p.row_slot[size_t(j - 1)])], p.slot_expert[size_t(s)]);
                }
            }
        }
        // One w1, w3 and w2 matrix per selected expert, over exactly its slot rows.
        for (const cuda::gemv_matrix &m : p.down.mats) {
            const int s0 = int((m.x - buf.h) / I);
            const uint32_t e = p.slot_expert[size_t(s0)];
            EXPECT_TRUE(s0 == 0 || p.slot_expert[size_t(s0 - 1)] != e);
            EXPECT_EQ(int(std::count(p.slot_expert.begin(), p.slot_expert.end(), e)), m.M);
            EXPECT_EQ(m.w, layer.experts[e].w2);
            EXPECT_EQ(m.y, buf.ye + size_t(s0) * D);
            EXPECT_EQ(m.N, D);
            EXPECT_EQ(m.K, I);
            EXPECT_EQ(m.act_block, 32);
        }
        int w1s = 0, w3s = 0;
        for (const cuda::gemv_matrix &m : p.up.mats) {
            const uint32_t e = uint32_t((reinterpret_cast<uintptr_t>(m.w) >> 30) - 1);  // fake_layer's pointers
            const int s0 = int(std::find(p.slot_expert.begin(), p.slot_expert.end(), e) - p.slot_expert.begin());
            ASSERT_LT(s0, R);
            // One row: the experts read x in place (no gather).
            EXPECT_EQ(m.x, B == 1 ? x : buf.xg + size_t(s0) * D);
            EXPECT_EQ(int(std::count(p.slot_expert.begin(), p.slot_expert.end(), e)), m.M);
            w1s += m.w == layer.experts[e].w1 && m.y == buf.gate + size_t(s0) * I;
            w3s += m.w == layer.experts[e].w3 && m.y == buf.up + size_t(s0) * I;
        }
        EXPECT_EQ(w1s, p.experts_read);
        EXPECT_EQ(w3s, p.experts_read);
        EXPECT_GE(p.down_offset, p.up.workspace_bytes);
        EXPECT_GE(p.workspace_bytes, p.down_offset + p.down.workspace_bytes);
    }
}

TEST(MoeDecodePlan, rejects_bad_routes) {
    const cuda::moe_layer layer = fake_layer();
    cuda::moe_layer partial = layer;
    partial.experts[1] = {};  // not held here (a worker's share)
    const cuda::moe_buffers buf = cuda::moe_buffers_at(reinterpret_cast<void *>(uintptr_t(1) << 40), D, I, 2 * K);
    const float *x = reinterpret_cast<const float *>(uintptr_t(1) << 12);
    float *out = reinterpret_cast<float *>(uintptr_t(1) << 13);
    std::vector<cuda::moe_route> routes;
    for (int k = 0; k < K; k++) routes.push_back({uint32_t(10 * k), 0.25f});
    EXPECT_TRUE(cuda::plan_moe_decode(fake_device(), partial, buf, x, out, routes, 1, K).is_ok());
    routes[3].expert = 1;
    auto bad = cuda::plan_moe_decode(fake_device(), partial, buf, x, out, routes, 1, K);
    EXPECT_EQ(bad.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(bad.status().to_string().find("routes to expert 1,"), std::string::npos) << bad.status().to_string();
    routes[3].expert = 384;  // outside the layer
    EXPECT_EQ(cuda::plan_moe_decode(fake_device(), layer, buf, x, out, routes, 1, K).status().code(), status_code::INVALID_ARGUMENT);
    routes[3].expert = 30;
    EXPECT_EQ(cuda::plan_moe_decode(fake_device(), layer, buf, x, out, routes, 17, K).status().code(), status_code::NOT_SUPPORTED);
    EXPECT_EQ(cuda::plan_moe_decode(fake_device(), layer, buf, x, out, routes, 2, K).status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_EQ(cuda::plan_moe_decode(fake_device(), layer, buf, x, reinterpret_cast<float *>(const_cast<float *>(x)), routes, 1, K)
                  .status().code(), status_code::INVALID_ARGUMENT);
    // 17 routes to one expert in a step (a row listing it twice) exceed the GEMV's 16 rows.
    std::vector<cuda::moe_route> same(size_t(16) * 2, {7, 0.5f});
    const cuda::moe_buffers buf32 = cuda::moe_buffers_at(reinterpret_cast<void *>(uintptr_t(1) << 40), D, I, 32);
    EXPECT_EQ(cuda::plan_moe_decode(fake_device(), layer, buf32, x, out, same, 16, 2).status().code(), status_code::NOT_SUPPORTED);
}

// Informational, never asserted: one layer's routed-expert decode with all 384 experts of a
// V4.1 layer resident (7.2 GB, byte patterns: timing does not depend on values), uniform random
// top-6 routing per row, a different routing in each of STEPS steps so no expert stays in L2
// between uses. Graph: all steps captured once and replayed (the GPU time of a step). Eager:
// plan + launches per step from the host, what this first version's decode step pays while
// the routing comes back to the host (host planning and launch latency included).
TEST_F(CudaMoeDecode, layer_decode_timing_informational) {
    constexpr int STEPS = 8;
    const size_t w13 = size_t(I) * D / 2, s13 = size_t(I) * D / 32, w2b = size_t(D) * I / 2, s2b = size_t(D) * I / 32;
    const size_t per_expert = 2 * (w13 + s13) + w2b + s2b;
    dev_buf all(per_expert * E);
    ASSERT_NE(all.p, nullptr);
    cudaMemset(all.p, 0x35, per_expert * E);  // codes +-1.5 / 3, scales 2^-74: finite everywhere
    cuda::moe_layer layer;
    layer.D = D, layer.I = I, layer.swiglu_limit = 10.0f;
    layer.experts.resize(E);
    for (int e = 0; e < E; e++) {
        const uint8_t *b = all.as<uint8_t>() + per_expert * size_t(e);
        cuda::moe_expert &x = layer.experts[size_t(e)];
        x.w1 = b, x.w1_scale = b + w13, x.w3 = b + w13 + s13, x.w3_scale = b + 2 * w13 + s13;
        x.w2 = b + 2 * (w13 + s13), x.w2_scale = x.w2 + w2b;
    }
    // Copy bandwidth (read + write), as gemv_bench measures it.
    double copy_bw = 0;
    {
        const size_t n = size_t(1) << 30;
        dev_buf a(n), c(n);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        std::vector<float> ms;
        for (int i = 0; i < 10; i++) {
            cudaEventRecord(e0);
            cudaMemcpyAsync(c.p, a.p, n, cudaMemcpyDeviceToDevice);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float t;
            cudaEventElapsedTime(&t, e0, e1);
            if (i >= 2) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        copy_bw = 2.0 * double(n) / (ms[ms.size() / 2] * 1e-3);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    std::mt19937 rng(5);
    for (int act : {32, 0})
        for (int B : {1, 4, 16}) {
            layer.act_block = act;
            const int R = B * K;
            auto x = testing_util::random_normal(size_t(B) * D, 3);
            dev_buf dx(x.size() * 4), dout(x.size() * 4), dbuf(cuda::moe_buffer_bytes(D, I, R));
            cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
            const cuda::moe_buffers buf = cuda::moe_buffers_at(dbuf.p, D, I, R);
            std::vector<std::vector<cuda::moe_route>> routings;
            std::vector<cuda::moe_decode_plan> plans;
            double plan_us = 0, experts = 0;
            size_t ws_bytes = 1;
            for (int st = 0; st < STEPS; st++) {
                std::vector<cuda::moe_route> routes;
                for (int b = 0; b < B; b++) {
                    std::vector<uint32_t> ids(E);
                    for (int e = 0; e < E; e++) ids[size_t(e)] = uint32_t(e);
                    std::shuffle(ids.begin(), ids.end(), rng);
                    for (int k = 0; k < K; k++) routes.push_back({ids[size_t(k)], 0.25f});
                }
                const auto t0 = std::chrono::steady_clock::now();
                auto plan = cuda::plan_moe_decode(dev_, layer, buf, dx.as<float>(), dout.as<float>(), routes, B, K);
                plan_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
                ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
                experts += plan->experts_read;
                ws_bytes = std::max(ws_bytes, plan->workspace_bytes);
                routings.push_back(routes);
                plans.push_back(std::move(plan.value()));
            }
            // One workspace per step in the graph (each plan's counters where its layout puts
            // them); the eager loop reuses one and zeroes it per step, as a live decode would.
            std::vector<std::unique_ptr<dev_buf>> ws;
            for (int st = 0; st < STEPS; st++) {
                ws.push_back(std::make_unique<dev_buf>(ws_bytes));
                cudaMemset(ws.back()->p, 0, ws_bytes);
            }
            cudaStream_t stream;
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            // Graph: the steps' launches captured once (a step's GPU time, no host in the loop).
            ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
            for (int st = 0; st < STEPS; st++)
                ASSERT_TRUE(cuda::run_moe_decode(plans[size_t(st)], ws[size_t(st)]->p, stream).is_ok());
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
            ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
            std::vector<float> graph_ms, eager_ms;
            for (int rep = 0; rep < 25; rep++) {
                cudaEventRecord(e0, stream);
                cudaGraphLaunch(exec, stream);
                cudaEventRecord(e1, stream);
                cudaEventSynchronize(e1);
                float t;
                cudaEventElapsedTime(&t, e0, e1);
                if (rep >= 5) graph_ms.push_back(t / STEPS);
            }
            // Eager: plan on the host and launch, step after step (the routing known on the host).
            for (int rep = 0; rep < 10; rep++) {
                cudaEventRecord(e0, stream);
                for (int st = 0; st < STEPS; st++) {
                    auto plan = cuda::plan_moe_decode(dev_, layer, buf, dx.as<float>(), dout.as<float>(),
                                                      routings[size_t(st)], B, K);
                    ASSERT_TRUE(plan.is_ok());
                    ASSERT_TRUE(cuda::reset_moe_workspace(plan.value(), ws[0]->p, stream).is_ok());
                    ASSERT_TRUE(cuda::run_moe_decode(plan.value(), ws[0]->p, stream).is_ok());
                }
                cudaEventRecord(e1, stream);
                cudaEventSynchronize(e1);
                float t;
                cudaEventElapsedTime(&t, e0, e1);
                if (rep >= 2) eager_ms.push_back(t / STEPS);
            }
            ASSERT_EQ(cudaGetLastError(), cudaSuccess);
            std::sort(graph_ms.begin(), graph_ms.end());
            std::sort(eager_ms.begin(), eager_ms.end());
            const double us = graph_ms[graph_ms.size() / 2] * 1e3, eager_us = eager_ms[eager_ms.size() / 2] * 1e3;
            const double bytes = experts / STEPS * double(per_expert) + double(R) * (2.0 * D + 3.0 * I + D) * 4.0;
            std::printf("[ moe     ] v41 MoE layer decode %s B=%-2d experts read %5.1f  %8.1f us graph (%6.0f GB/s, %3.0f%% of copy "
                        "%4.0f GB/s)  %8.1f us eager incl. host plan %.1f us\n",
                        act ? "official " : "reference", B, experts / STEPS, us, bytes / (us * 1e-6) / 1e9,
                        100 * bytes / (us * 1e-6) / copy_bw, copy_bw / 1e9, eager_us, plan_us / STEPS);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            cudaEventDestroy(e0), cudaEventDestroy(e1);
            cudaStreamDestroy(stream);
        }
}

}  // namespace
