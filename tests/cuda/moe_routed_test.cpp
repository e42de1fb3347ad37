// GPU routed-expert decode routed from device memory (backend/cuda/moe_routed.cu) against the
// host-planned decode (backend/cuda/moe_decode.cu, run_moe_decode) on the same routes, bit for
// bit, and against the CPU loop every placement runs (backend/cpu routed_expert_sum) at the
// tolerances of moe_decode_test / nvfp4_moe_decode_test (they say why):
//  - MXFP4 reference numerics: relative error per row <= 1e-5;
//  - MXFP4 official numerics: per row <= 5e-3 and >= 90% of elements bit-equal to the CPU;
//  - NVFP4 W4A4: every row <= 2e-2, the median row <= 1e-3.
// Shapes: V4.1 (D 5120, I 2304, 384 experts of which 8 are held and the rest null, K 6), V4
// (D 4096, I 2048, 256 experts, 6 held, official activation blocks of 128) and the V4.1 fixture (D 64, I 32, 8 experts all held, K 2, where B = 16 puts more than 8 rows on an
// expert: the GEMVs' second token tile), B = 1, 4, 16, both numerics, MXFP4 and NVFP4, the route
// weight before and after w2, the clamps 10 and 2. Routes as the router makes them (K distinct
// experts per row, positive weights) with an expert repeated across rows and, for B > 1, one -1
// id (a dropped pick: no contribution). For run_moe_decode, which takes no -1, the dropped pick becomes
// a zero-weight route to an expert the step already reads (adds +-0 to its row; the step's
// expert count, and with it the GEMVs' K slicing, stays the same; the test checks the token
// tiles stay the same too).
// Outputs and every intermediate buffer are poisoned with NaN before each run; each plan runs
// twice and the replay must be bit-equal. Also: the not-held error path (an id of an expert not
// held, one past the table, a negative one), the too-many-routes-to-one-expert error, a CUDA graph captured
// once and replayed with new routes written into device memory, and an informational bandwidth
// line at V4.1 with all 384 experts resident (never asserted). Without a GPU: the group kernel's
// arithmetic (moe_grouping.h) against plan_moe_decode's host sort, and with dropped routes
// against a std::stable_sort of the kept ones.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "backend/cpu/routed.h"
#include "backend/cuda/collapse_norm.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_grouping.h"
#include "backend/cuda/moe_routed.cuh"
#include "core/dtype.h"
#include "core/threads.h"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

struct dev_buf {
    void *p = nullptr;
    size_t n = 0;
    explicit dev_buf(size_t bytes) : n(bytes) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess); }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
    template <typename T> T *as() const { return static_cast<T *>(p); }
    template <typename T> void put(const std::vector<T> &v) {
        ASSERT_EQ(v.size() * sizeof(T), n);
        ASSERT_EQ(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    }
    template <typename T> std::vector<T> get() const {
        std::vector<T> v(n / sizeof(T));
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
        return v;
    }
};

// One layer's experts on the GPU (a few held, the rest null) and dequantized for the CPU.
struct layer_set {
    int D = 0, I = 0, E = 0;
    std::vector<uint32_t> held;
    std::vector<cpu::expert_weights> cpu;  // [E], empty where not held
    std::vector<std::unique_ptr<dev_buf>> mem;
    cuda::moe_layer layer;  // numerics fields set per case
};

const uint8_t *upload(layer_set &s, const std::vector<uint8_t> &v) {
    s.mem.push_back(std::make_unique<dev_buf>(v.size()));
    s.mem.back()->put(v);
    return s.mem.back()->as<uint8_t>();
}

Tensor to_tensor(const std::vector<float> &v, int N, int Kd) {
    Tensor t = Tensor::f32({N, Kd});
    std::copy(v.begin(), v.end(), t.f());
    return t;
}

// MXFP4 with scales 2^-10 .. 2^-7 (moe_decode_test's ranges: the clamp at 10 bites rarely, the
// one at 2 on ~30% of gate / up values for x ~ N(0, 4^2)).
testing_util::quant_weight random_fp4(int N, int Kd, uint32_t seed) {
    std::mt19937 rng(seed);
    testing_util::quant_weight q;
    q.w.resize(size_t(N) * Kd / 2);
    for (auto &b : q.w) b = uint8_t(rng());
    q.scale.resize(size_t(N) * Kd / 32);
    for (auto &s : q.scale) s = uint8_t(117 + rng() % 4);
    q.dequant.resize(size_t(N) * Kd);
    parallel_for(N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++)
            for (int k = 0; k < Kd; k++)
                q.dequant[size_t(n) * Kd + k] = e2m1_to_f32(e2m1_unpack(q.w.data() + size_t(n) * Kd / 2, size_t(k))) *
                                                e8m0_to_f32(q.scale[size_t(n) * (Kd / 32) + size_t(k / 32)]);
    });
    return q;
}

std::vector<uint32_t> spread(int E, int pool) {
    std::vector<uint32_t> ids;
    for (int j = 0; j < pool; j++) ids.push_back(uint32_t(pool == E ? j : j * (E - 1) / (pool - 1)));
    return ids;
}

layer_set *make_mxfp4(int D, int I, int E, int pool, uint32_t seed) {
    auto *s = new layer_set;
    s->D = D, s->I = I, s->E = E, s->held = spread(E, pool);
    s->cpu.resize(size_t(E));
    s->layer.D = D, s->layer.I = I;
    s->layer.experts.resize(size_t(E));
    for (uint32_t e : s->held) {
        auto w1 = random_fp4(I, D, seed + 1000 + e), w3 = random_fp4(I, D, seed + 2000 + e), w2 = random_fp4(D, I, seed + 3000 + e);
        cuda::moe_expert &g = s->layer.experts[e];
        g.w1 = upload(*s, w1.w), g.w1_scale = upload(*s, w1.scale);
        g.w3 = upload(*s, w3.w), g.w3_scale = upload(*s, w3.scale);
        g.w2 = upload(*s, w2.w), g.w2_scale = upload(*s, w2.scale);
        s->cpu[e].w1 = to_tensor(w1.dequant, I, D), s->cpu[e].w3 = to_tensor(w3.dequant, I, D);
        s->cpu[e].w2 = to_tensor(w2.dequant, D, I);
    }
    return s;
}

// NVFP4 with nvfp4_moe_decode_test's per-expert scalars (w1 and w3 sharing theirs).
layer_set *make_nvfp4(int D, int I, int E, int pool, uint32_t seed) {
    auto *s = new layer_set;
    s->D = D, s->I = I, s->E = E, s->held = spread(E, pool);
    s->cpu.resize(size_t(E));
    s->layer.D = D, s->layer.I = I;
    s->layer.nvfp4_experts.resize(size_t(E));
    int j = 0;
    for (uint32_t e : s->held) {
        const float ws13 = 3e-5f * (1.0f + 0.1f * j), is13 = 7e-3f * (1.0f + 0.05f * j);
        const float ws2 = 3e-5f * (1.0f + 0.07f * j), is2 = 1e-2f * (1.0f + 0.2f * j);
        j++;
        auto w1 = testing_util::random_nvfp4(I, D, ws13, is13, seed + 1000 + e);
        auto w3 = testing_util::random_nvfp4(I, D, ws13, is13, seed + 2000 + e);
        auto w2 = testing_util::random_nvfp4(D, I, ws2, is2, seed + 3000 + e);
        cuda::moe_nvfp4_expert &g = s->layer.nvfp4_experts[e];
        g.w1 = upload(*s, w1.codes), g.w1_scale = upload(*s, w1.scales);
        g.w3 = upload(*s, w3.codes), g.w3_scale = upload(*s, w3.scales);
        g.w2 = upload(*s, w2.codes), g.w2_scale = upload(*s, w2.scales);
        g.w13_weight_scale_2 = ws13, g.w13_input_scale = is13, g.w2_weight_scale_2 = ws2, g.w2_input_scale = is2;
        cpu::expert_weights &c = s->cpu[e];
        c.w1 = to_tensor(w1.dequant, I, D), c.w3 = to_tensor(w3.dequant, I, D), c.w2 = to_tensor(w2.dequant, D, I);
        c.w13_input_scale = is13, c.w2_input_scale = is2;
    }
    return s;
}

struct routing {
    std::vector<int32_t> ids;  // [B, K]
    std::vector<float> w;
};

// K distinct held experts per row, positive weights summing to 1.5; row 1 shares row 0's first
// expert (when B > 1); `drop` sets row 0's last pick to -1 with a nonzero weight (must be ignored).
routing make_routes(const layer_set &s, int B, int K, uint32_t seed, bool drop) {
    std::mt19937 rng(seed);
    routing r;
    for (int b = 0; b < B; b++) {
        std::vector<uint32_t> p = s.held;
        std::shuffle(p.begin(), p.end(), rng);
        if (b == 1) {
            const uint32_t shared = uint32_t(r.ids[0]);
            std::iter_swap(p.begin(), std::find(p.begin(), p.end(), shared));
        }
        float sum = 0;
        std::vector<float> w(K);
        for (auto &v : w) sum += v = 0.05f + float(rng() % 1000) / 1000.0f;
        for (int k = 0; k < K; k++) r.ids.push_back(int32_t(p[size_t(k)])), r.w.push_back(w[size_t(k)] / sum * 1.5f);
    }
    if (drop) r.ids[size_t(K - 1)] = -1, r.w[size_t(K - 1)] = 0.7f;
    return r;
}

int token_tiles(const std::vector<cuda::moe_route> &routes) {
    std::vector<int> count(4096, 0);
    int most = 0;
    for (const auto &r : routes) most = std::max(most, ++count[r.expert]);
    return most > 8 ? 2 : 1;
}

// The routes run_moe_decode takes: each -1 becomes a zero-weight route to the step's least
// used expert (same expert count, same token tiles).
std::vector<cuda::moe_route> decode_routes(const routing &r) {
    std::vector<cuda::moe_route> out, valid;
    for (size_t i = 0; i < r.ids.size(); i++)
        if (r.ids[i] >= 0) valid.push_back({uint32_t(r.ids[i]), r.w[i]});
    for (size_t i = 0; i < r.ids.size(); i++) {
        if (r.ids[i] >= 0) {
            out.push_back({uint32_t(r.ids[i]), r.w[i]});
            continue;
        }
        uint32_t best = valid[0].expert;
        size_t best_n = SIZE_MAX;
        for (const auto &v : valid) {
            const size_t n = size_t(std::count_if(out.begin(), out.end(), [&](const cuda::moe_route &o) { return o.expert == v.expert; })) +
                             size_t(std::count_if(r.ids.begin() + long(i), r.ids.end(), [&](int32_t id) { return id == int32_t(v.expert); }));
            if (n < best_n) best_n = n, best = v.expert;
        }
        out.push_back({best, 0.0f});
    }
    return out;
}

cpu::route_table to_table(const routing &r, int B, int K) { return cpu::route_table_from(r.ids.data(), r.w.data(), B, K); }

double row_rel(const float *got, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        const double d = double(got[i]) - ref[i];
        num += d * d, den += double(ref[i]) * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

size_t bit_diff(const std::vector<float> &a, const std::vector<float> &b) {
    size_t n = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++) n += std::memcmp(&a[i], &b[i], 4) != 0;
    return n + std::max(a.size(), b.size()) - std::min(a.size(), b.size());
}

std::unique_ptr<layer_set> g_v41, g_v41_nvfp4, g_small, g_small_nvfp4, g_wide;

class MoeRouted : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (!cuda::query_device()) return;
        g_v41.reset(make_mxfp4(5120, 2304, 384, 8, 0));
        g_v41_nvfp4.reset(make_nvfp4(5120, 2304, 384, 8, 100));
        g_small.reset(make_mxfp4(64, 32, 8, 8, 200));
        g_small_nvfp4.reset(make_nvfp4(64, 32, 8, 8, 300));
        g_wide.reset(make_mxfp4(128, 384, 8, 8, 400));
    }
    static void TearDownTestSuite() {
        g_v41.reset(), g_v41_nvfp4.reset(), g_small.reset(), g_small_nvfp4.reset(), g_wide.reset();
    }
    void SetUp() override {
        auto d = cuda::query_device();
        if (!d) GTEST_SKIP() << d.status().to_string();
        dev_ = d.value();
    }
    cuda::device_info dev_;

    // A workspace as run_moe_routed wants it (zeroed once), with everything but the error words
    // and the split-K counters poisoned: 0xff bytes (NaN floats, -1 ints).
    static std::unique_ptr<dev_buf> workspace(const cuda::moe_routed_plan &p) {
        auto ws = std::make_unique<dev_buf>(p.workspace_bytes);
        poison_workspace(p, ws->p);
        return ws;
    }
    static void poison_workspace(const cuda::moe_routed_plan &p, void *ws) {
        char *c = static_cast<char *>(ws);
        ASSERT_EQ(cudaMemset(c, 0xff, p.workspace_bytes), cudaSuccess);
        ASSERT_EQ(cudaMemset(c + p.off_routing, 0, 16), cudaSuccess);  // the error words
        ASSERT_EQ(cudaMemset(c + p.off_counters_up, 0, p.off_partials_up - p.off_counters_up), cudaSuccess);
    }

    // run_moe_routed twice on NaN-poisoned out and intermediates; the replay must be bit-equal.
    std::vector<float> run_routed(const cuda::moe_layer &layer, int B, int K, const std::vector<float> &x, const routing &r,
                                  Status *error = nullptr) {
        auto plan = cuda::plan_moe_routed(dev_, layer, B, K);
        EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
        if (!plan.is_ok()) return {};
        const cuda::moe_routed_plan &p = plan.value();
        dev_buf dx(x.size() * 4), dout(x.size() * 4), dids(r.ids.size() * 4), dw(r.w.size() * 4);
        dx.put(x), dids.put(r.ids), dw.put(r.w);
        auto ws = workspace(p);
        std::vector<float> first;
        for (int rep = 0; rep < 2; rep++) {
            if (rep) poison_workspace(p, ws->p);
            EXPECT_EQ(cudaMemset(dout.p, 0xff, dout.n), cudaSuccess);
            Status st = cuda::run_moe_routed(p, dx.as<float>(), dids.as<int32_t>(), dw.as<float>(), dout.as<float>(), ws->p, 0);
            EXPECT_TRUE(st.is_ok()) << st.to_string();
            std::vector<float> got = dout.get<float>();
            // The stream-ordered flag (the NCCL worker's status word) agrees with the error word.
            dev_buf word(4);
            word.put(std::vector<int32_t>{0});
            EXPECT_TRUE(cuda::moe_routed_flag_error(p, ws->p, word.as<int32_t>(), 4, 0).is_ok());
            const int32_t flagged = word.get<int32_t>()[0];
            Status err = cuda::moe_routed_error(p, ws->p, 0);
            EXPECT_EQ(flagged, err.is_ok() ? 0 : 4) << err.to_string();
            if (error) *error = err;
            else EXPECT_TRUE(err.is_ok()) << err.to_string();
            if (rep) {
                EXPECT_EQ(bit_diff(got, first), 0u) << "the replay differs from the first run";
            }
            first = got;
        }
        return first;
    }

    std::vector<float> run_decode(const cuda::moe_layer &layer, int B, int K, const std::vector<float> &x,
                                  const std::vector<cuda::moe_route> &routes) {
        const int R = B * K;
        dev_buf dx(x.size() * 4), dout(x.size() * 4), dbuf(cuda::moe_buffer_bytes(layer.D, layer.I, R));
        dx.put(x);
        const cuda::moe_buffers buf = cuda::moe_buffers_at(dbuf.p, layer.D, layer.I, R);
        auto plan = cuda::plan_moe_decode(dev_, layer, buf, dx.as<float>(), dout.as<float>(), routes, B, K);
        EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
        if (!plan.is_ok()) return {};
        dev_buf ws(plan->workspace_bytes);
        EXPECT_EQ(cudaMemset(ws.p, 0, ws.n), cudaSuccess);
        EXPECT_EQ(cudaMemset(dout.p, 0xff, dout.n), cudaSuccess);
        Status st = cuda::run_moe_decode(plan.value(), ws.p, 0);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return dout.get<float>();
    }

    // One case: routed vs run_moe_decode (bits) vs the CPU (tolerance).
    void check_case(const layer_set &s, bool nvfp4, int act_block, int B, int K, float limit, bool after, uint32_t seed) {
        cuda::moe_layer layer = s.layer;
        layer.act_block = nvfp4 ? 0 : act_block, layer.swiglu_limit = limit, layer.weight_after_w2 = after;
        // At B = 1 the dropped pick's stand-in for run_moe_decode would repeat an expert in the
        // row, which plan_moe_decode refuses at B = 1 (see MoeRoutedGrouping): no -1 there.
        const routing r = make_routes(s, B, K, seed, B > 1);
        std::vector<float> x = testing_util::random_normal(size_t(B) * s.D, seed + 7);
        for (auto &v : x) v *= nvfp4 ? 2.0f : 4.0f;
        const std::string what = std::string(nvfp4 ? "nvfp4" : act_block ? "official" : "reference") + " D" +
                                 std::to_string(s.D) + " B" + std::to_string(B) + " K" + std::to_string(K) + " limit " +
                                 std::to_string(int(limit)) + (after ? " weight after w2" : " weight before w2");
        const std::vector<float> got = run_routed(layer, B, K, x, r);
        ASSERT_EQ(got.size(), x.size()) << what;
        for (size_t i = 0; i < got.size(); i++)
            ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " not written (NaN poison)";

        const std::vector<cuda::moe_route> dr = decode_routes(r);
        std::vector<cuda::moe_route> valid;
        for (size_t i = 0; i < r.ids.size(); i++)
            if (r.ids[i] >= 0) valid.push_back({uint32_t(r.ids[i]), r.w[i]});
        ASSERT_EQ(token_tiles(dr), token_tiles(valid)) << what << ": the stand-in route changed the GEMVs' token tiles";
        const std::vector<float> dec = run_decode(layer, B, K, x, dr);
        const size_t bits = bit_diff(got, dec);
        EXPECT_EQ(bits, 0u) << what << ": outputs differing from run_moe_decode's";

        cpu::expert_numerics nm;
        nm.official = !nvfp4 && act_block != 0, nm.act_block = act_block ? act_block : 32, nm.kind = cpu::lin::FP4;
        nm.swiglu_limit = limit, nm.weight_after_w2 = after;
        std::vector<float> ref(got.size());
        Status st = cpu::routed_expert_sum(nm, s.cpu, x.data(), s.D, to_table(r, B, K), ref.data());
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        std::vector<double> rows;
        for (int b = 0; b < B; b++) rows.push_back(row_rel(got.data() + size_t(b) * s.D, ref.data() + size_t(b) * s.D, s.D));
        const double worst = *std::max_element(rows.begin(), rows.end());
        std::vector<double> sorted = rows;
        std::sort(sorted.begin(), sorted.end());
        const double median = sorted[sorted.size() / 2];
        size_t same = 0;
        for (size_t i = 0; i < got.size(); i++) same += got[i] == ref[i];
        const double equal = double(same) / double(got.size());
        if (nvfp4) {
            EXPECT_LE(worst, 2e-2) << what;
            EXPECT_LE(median, 1e-3) << what;
        } else if (act_block) {
            EXPECT_LE(worst, 5e-3) << what;
            EXPECT_GE(equal, 0.9) << what << ": elements bit-equal to the CPU";
        } else {
            EXPECT_LE(worst, 1e-5) << what;
        }
        std::printf("[ moe routed ] %-52s vs run_moe_decode: %zu bits differ; vs CPU: max row rel %.3g, median %.3g, "
                    "equal %.4f\n",
                    what.c_str(), bits, worst, median, equal);
    }
};

TEST_F(MoeRouted, mxfp4_v41_shapes_match_moe_decode_and_cpu) {
    for (int B : {1, 4, 16})
        for (int act : {0, 32}) check_case(*g_v41, false, act, B, 6, B == 4 ? 2.0f : 10.0f, false, uint32_t(B * 13 + act));
    check_case(*g_v41, false, 32, 4, 6, 10.0f, true, 91);
    check_case(*g_v41, false, 0, 4, 6, 10.0f, true, 92);
}

TEST_F(MoeRouted, nvfp4_v41_shapes_match_moe_decode_and_cpu) {
    for (int B : {1, 4, 16}) check_case(*g_v41_nvfp4, true, 0, B, 6, B == 4 ? 2.0f : 10.0f, false, uint32_t(B * 17));
    check_case(*g_v41_nvfp4, true, 0, 4, 6, 10.0f, true, 93);
}

// The fixture's shapes: 8 experts, top-2; B = 16 gives experts more than 8 rows.
TEST_F(MoeRouted, fixture_shapes_match_moe_decode_and_cpu) {
    for (int B : {1, 4, 16})
        for (bool after : {false, true}) {
            check_case(*g_small, false, 0, B, 2, 2.0f, after, uint32_t(B * 7 + after));
            check_case(*g_small, false, 32, B, 2, 2.0f, after, uint32_t(B * 7 + after + 100));
            check_case(*g_small_nvfp4, true, 0, B, 2, 2.0f, after, uint32_t(B * 7 + after + 200));
        }
}

// The synthesized EXL3 model's widths (dim 128, moe_inter 384: w1 / w3 K = 128 is half an MXFP4
// stage, w2 K = 384 one and a half, with the scales in the ring).
TEST_F(MoeRouted, synth_wide_shapes_match_moe_decode_and_cpu) {
    for (int B : {1, 4, 16})
        for (int act : {0, 32}) check_case(*g_wide, false, act, B, 2, 2.0f, false, uint32_t(B * 5 + act + 500));
}

// V4 Flash's routed experts (256, MXFP4 w1 / w3 [2048, 4096], w2 [4096, 2048]; official
// activation blocks of 128), six held, B = 4 and 16, the weight before and after w2.
TEST_F(MoeRouted, v4_shapes_activation_block_128) {
    std::unique_ptr<layer_set> v4(make_mxfp4(4096, 2048, 256, 6, 400));
    for (int B : {4, 16})
        for (bool after : {false, true}) {
            check_case(*v4, false, 128, B, 6, 10.0f, after, uint32_t(500 + B + after));
            check_case(*v4, false, 0, B, 6, 10.0f, after, uint32_t(600 + B + after));
        }
}

// x's split made by its producer (rms_norm_split here, hc_collapse_norm in the engine's decode
// step), given to run_moe_routed: at B = 1 the up GEMV reads it instead of the routed split, and
// the output must be the bits of the run that splits x itself (V4.1's activation blocks of 32 and
// V4's of 128); a plan of more rows ignores it. Each run on a NaN-poisoned output and workspace.
TEST_F(MoeRouted, producer_split_gives_the_same_bits) {
    std::unique_ptr<layer_set> v4(make_mxfp4(4096, 2048, 256, 6, 401));
    struct one_case {
        const layer_set *s;
        int act, B;
    };
    for (const one_case &c : {one_case{g_v41.get(), 32, 1}, one_case{v4.get(), 128, 1}, one_case{g_v41.get(), 32, 4}}) {
        const int D = c.s->D;
        cuda::moe_layer layer = c.s->layer;
        layer.act_block = c.act, layer.swiglu_limit = 10.0f, layer.weight_after_w2 = false;
        const std::string what = "D " + std::to_string(D) + " act_block " + std::to_string(c.act) + " B " + std::to_string(c.B);
        const routing r = make_routes(*c.s, c.B, 6, uint32_t(700 + c.act + c.B), false);
        std::vector<float> x = testing_util::random_normal(size_t(c.B) * D, uint32_t(710 + c.B));
        for (auto &v : x) v *= 4.0f;
        dev_buf dx(x.size() * 4), dy(x.size() * 4), dxs(x.size()), dsx(size_t(D / 32) * 16 * 4);
        dx.put(x);
        // Poisoned first: the scales of rows past B must never reach an output.
        ASSERT_EQ(cudaMemset(dxs.p, 0xff, dxs.n), cudaSuccess);
        ASSERT_EQ(cudaMemset(dsx.p, 0xff, dsx.n), cudaSuccess);
        cuda::gemv_split sp{dxs.as<uint8_t>(), dsx.as<float>()};
        ASSERT_TRUE(cuda::rms_norm_split(dx.as<float>(), nullptr, dy.as<float>(), c.B, D, false, 1e-6f, &sp, c.act, 0).is_ok());
        auto plan = cuda::plan_moe_routed(dev_, layer, c.B, 6);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        dev_buf dids(r.ids.size() * 4), dw(r.w.size() * 4), dout(x.size() * 4);
        dids.put(r.ids), dw.put(r.w);
        auto ws = workspace(plan.value());
        std::vector<float> out[2];
        for (int given = 0; given < 2; given++) {
            poison_workspace(plan.value(), ws->p);
            ASSERT_EQ(cudaMemset(dout.p, 0xff, dout.n), cudaSuccess);
            ASSERT_TRUE(cuda::run_moe_routed(plan.value(), dy.as<float>(), dids.as<int32_t>(), dw.as<float>(),
                                             dout.as<float>(), ws->p, 0, given ? &sp : nullptr)
                            .is_ok());
            out[given] = dout.get<float>();
            ASSERT_TRUE(cuda::moe_routed_error(plan.value(), ws->p, 0).is_ok());
        }
        for (size_t i = 0; i < out[0].size(); i++) ASSERT_TRUE(std::isfinite(out[0][i])) << what << ": element " << i;
        EXPECT_EQ(bit_diff(out[1], out[0]), 0u) << what << ": outputs differing with the producer's split";
    }
}

// An id of an expert not held, past the table or negative (other than -1): no contribution, and
// the error word names it once; the output equals the run with that route dropped.
TEST_F(MoeRouted, not_held_expert_sets_the_error) {
    const layer_set &s = *g_v41;
    cuda::moe_layer layer = s.layer;
    layer.act_block = 32, layer.swiglu_limit = 10.0f;
    const int B = 4, K = 6;
    std::vector<float> x = testing_util::random_normal(size_t(B) * s.D, 5);
    for (auto &v : x) v *= 4.0f;
    const routing ok = make_routes(s, B, K, 55, true);
    for (int32_t bad : {1, 384, 100000, -7}) {
        ASSERT_EQ(std::count(s.held.begin(), s.held.end(), uint32_t(1)), 0);
        routing r = ok;
        r.ids[size_t(2 * K + 3)] = bad;
        routing dropped = ok;
        dropped.ids[size_t(2 * K + 3)] = -1;
        Status err;
        const std::vector<float> got = run_routed(layer, B, K, x, r, &err);
        EXPECT_EQ(err.code(), status_code::INVALID_ARGUMENT) << err.to_string();
        EXPECT_NE(err.to_string().find("expert " + std::to_string(bad) + ","), std::string::npos) << err.to_string();
        const std::vector<float> want = run_routed(layer, B, K, x, dropped);
        EXPECT_EQ(bit_diff(got, want), 0u) << "id " << bad;
    }
    // The error word is cleared by reading it.
    auto plan = cuda::plan_moe_routed(dev_, layer, B, K);
    ASSERT_TRUE(plan.is_ok());
    auto ws = workspace(plan.value());
    EXPECT_TRUE(cuda::moe_routed_error(plan.value(), ws->p, 0).is_ok());
}

// More routes to one expert in a step than the plan's GEMVs take (rows listing it twice): 32 at
// B = 16 (limit 16), 12 at B = 4 (limit 8). The step writes zeros and reports NOT_SUPPORTED
// naming the expert.
TEST_F(MoeRouted, too_many_routes_to_one_expert) {
    const layer_set &s = *g_small;
    for (auto [B, K] : {std::pair{16, 2}, std::pair{4, 3}}) {
        routing r;
        r.ids.assign(size_t(B * K), 3);
        r.w.assign(size_t(B * K), 0.5f);
        std::vector<float> x = testing_util::random_normal(size_t(B) * s.D, 6);
        Status err;
        const std::vector<float> got = run_routed(s.layer, B, K, x, r, &err);
        EXPECT_EQ(err.code(), status_code::NOT_SUPPORTED) << err.to_string();
        EXPECT_NE(err.to_string().find("expert 3 "), std::string::npos) << err.to_string();
        ASSERT_EQ(got.size(), x.size());
        for (float v : got) ASSERT_EQ(v, 0.0f);
    }
}

TEST_F(MoeRouted, rejects_bad_shapes) {
    cuda::moe_layer layer = g_small->layer;
    EXPECT_EQ(cuda::plan_moe_routed(dev_, layer, 17, 2).status().code(), status_code::NOT_SUPPORTED);
    EXPECT_EQ(cuda::plan_moe_routed(dev_, layer, 16, 9).status().code(), status_code::NOT_SUPPORTED);
    layer.act_block = 64;
    EXPECT_EQ(cuda::plan_moe_routed(dev_, layer, 1, 2).status().code(), status_code::NOT_SUPPORTED);
    cuda::moe_layer empty;
    empty.D = 64, empty.I = 32;
    EXPECT_EQ(cuda::plan_moe_routed(dev_, empty, 1, 2).status().code(), status_code::INVALID_ARGUMENT);
    cuda::moe_layer misaligned = g_small->layer;
    misaligned.experts[2].w3 += 8;
    auto bad = cuda::plan_moe_routed(dev_, misaligned, 1, 2);
    EXPECT_EQ(bad.status().code(), status_code::INVALID_ARGUMENT);
    EXPECT_NE(bad.status().to_string().find("expert 2:"), std::string::npos) << bad.status().to_string();
    cuda::moe_layer scalar = g_small_nvfp4->layer;
    scalar.nvfp4_experts[5].w2_input_scale = 0;
    EXPECT_EQ(cuda::plan_moe_routed(dev_, scalar, 1, 2).status().code(), status_code::INVALID_ARGUMENT);
}

// run_moe_routed captured once into a CUDA graph; new routes (and x) written into the same device
// buffers between replays: each replay must equal an eager run on the new routes, bit for bit.
// The three routings select different numbers of experts (routing 1: every row repeats row 0's
// first five), so the K slicing changes inside the graph.
TEST_F(MoeRouted, graph_replays_new_routes) {
    for (bool nvfp4 : {false, true}) {
        const layer_set &s = nvfp4 ? *g_v41_nvfp4 : *g_v41;
        cuda::moe_layer layer = s.layer;
        layer.act_block = nvfp4 ? 0 : 32, layer.swiglu_limit = 10.0f;
        const int B = 4, K = 6;
        auto plan = cuda::plan_moe_routed(dev_, layer, B, K);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        const cuda::moe_routed_plan &p = plan.value();
        dev_buf dx(size_t(B) * s.D * 4), dout(size_t(B) * s.D * 4), dids(size_t(B * K) * 4), dw(size_t(B * K) * 4);
        auto ws = workspace(p);
        std::vector<float> x0 = testing_util::random_normal(size_t(B) * s.D, 8);
        dx.put(x0);
        dids.put(make_routes(s, B, K, 1, false).ids), dw.put(make_routes(s, B, K, 1, false).w);
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        ASSERT_TRUE(cuda::run_moe_routed(p, dx.as<float>(), dids.as<int32_t>(), dw.as<float>(), dout.as<float>(), ws->p, stream).is_ok());
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int t = 0; t < 3; t++) {
            routing r = make_routes(s, B, K, uint32_t(40 + t), t == 0);
            if (t == 1)  // heavy overlap: rows 1.. take row 0's first five picks and one more of row 0's
                for (int b = 1; b < B; b++)
                    for (int k = 0; k < K; k++) r.ids[size_t(b * K + k)] = r.ids[size_t(k == K - 1 ? b : k)];
            std::vector<float> x = testing_util::random_normal(size_t(B) * s.D, uint32_t(60 + t));
            for (auto &v : x) v *= 4.0f;
            dx.put(x), dids.put(r.ids), dw.put(r.w);
            ASSERT_EQ(cudaMemset(dout.p, 0xff, dout.n), cudaSuccess);
            // The copies and the memset ran on the legacy stream, which a non-blocking stream
            // does not wait for.
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
            const std::vector<float> replay = dout.get<float>();
            EXPECT_TRUE(cuda::moe_routed_error(p, ws->p, stream).is_ok());
            const std::vector<float> eager = run_routed(layer, B, K, x, r);
            const size_t bits = bit_diff(replay, eager);
            EXPECT_EQ(bits, 0u) << (nvfp4 ? "nvfp4" : "mxfp4") << " routing " << t;
            size_t nan = 0;
            for (float v : replay) nan += !std::isfinite(v);
            EXPECT_EQ(nan, 0u);
            std::printf("[ moe routed ] graph replay %s routing %d: %zu bits differ from an eager run\n", nvfp4 ? "nvfp4" : "mxfp4",
                        t, bits);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(stream);
    }
}

// Informational, never asserted: one layer's routed experts with all 384 V4.1 experts resident
// (7.2 GB of MXFP4 filled on the device by cudaMemset: timing does not depend on values),
// uniform random top-6 routes per row, a different routing in each of STEPS steps (so no expert
// stays in L2 between uses), all steps captured in one graph with their own ids / weights
// buffers. Bytes = the selected experts' weights and scales + the small buffers, against a
// device-to-device copy (read + write) measured here, as moe_decode_test and gemv_bench count.
TEST_F(MoeRouted, bandwidth_informational) {
    constexpr int D = 5120, I = 2304, E = 384, K = 6, STEPS = 8;
    const size_t w13 = size_t(I) * D / 2, s13 = size_t(I) * D / 32, w2b = size_t(D) * I / 2, s2b = size_t(D) * I / 32;
    const size_t per_expert = 2 * (w13 + s13) + w2b + s2b;
    dev_buf all(per_expert * E);
    ASSERT_EQ(cudaMemset(all.p, 0x35, per_expert * E), cudaSuccess);  // codes +-1.5 / 3, scales 2^-74: finite
    cuda::moe_layer layer;
    layer.D = D, layer.I = I, layer.swiglu_limit = 10.0f, layer.act_block = 32;
    layer.experts.resize(E);
    for (int e = 0; e < E; e++) {
        const uint8_t *b = all.as<uint8_t>() + per_expert * size_t(e);
        cuda::moe_expert &x = layer.experts[size_t(e)];
        x.w1 = b, x.w1_scale = b + w13, x.w3 = b + w13 + s13, x.w3_scale = b + 2 * w13 + s13;
        x.w2 = b + 2 * (w13 + s13), x.w2_scale = x.w2 + w2b;
    }
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
    for (int B : {1, 16}) {
        auto plan = cuda::plan_moe_routed(dev_, layer, B, K);
        ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
        const cuda::moe_routed_plan &p = plan.value();
        auto ws = workspace(p);
        auto xs = testing_util::random_normal(size_t(B) * D, 3);
        dev_buf dx(xs.size() * 4), dout(xs.size() * 4);
        dx.put(xs);
        std::vector<std::unique_ptr<dev_buf>> ids, wts;
        double experts = 0;
        for (int st = 0; st < STEPS; st++) {
            std::vector<int32_t> id;
            std::vector<float> w;
            for (int b = 0; b < B; b++) {
                std::vector<int32_t> perm(E);
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng);
                for (int k = 0; k < K; k++) id.push_back(perm[size_t(k)]), w.push_back(0.25f);
            }
            std::vector<int32_t> distinct = id;
            std::sort(distinct.begin(), distinct.end());
            experts += double(std::unique(distinct.begin(), distinct.end()) - distinct.begin());
            ids.push_back(std::make_unique<dev_buf>(id.size() * 4)), ids.back()->put(id);
            wts.push_back(std::make_unique<dev_buf>(w.size() * 4)), wts.back()->put(w);
        }
        cudaStream_t stream;
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads and the workspace poison
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        for (int st = 0; st < STEPS; st++)
            ASSERT_TRUE(cuda::run_moe_routed(p, dx.as<float>(), ids[size_t(st)]->as<int32_t>(), wts[size_t(st)]->as<float>(),
                                             dout.as<float>(), ws->p, stream).is_ok());
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        std::vector<float> ms;
        for (int rep = 0; rep < 25; rep++) {
            cudaEventRecord(e0, stream);
            cudaGraphLaunch(exec, stream);
            cudaEventRecord(e1, stream);
            cudaEventSynchronize(e1);
            float t;
            cudaEventElapsedTime(&t, e0, e1);
            if (rep >= 5) ms.push_back(t / STEPS);
        }
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        EXPECT_TRUE(cuda::moe_routed_error(p, ws->p, stream).is_ok());
        std::sort(ms.begin(), ms.end());
        const double us = ms[ms.size() / 2] * 1e3;
        const double bytes = experts / STEPS * double(per_expert) + double(B * K) * (2.0 * D + 3.0 * I + D) * 4.0;
        std::printf("[ moe routed ] v41 layer decode official B=%-2d experts read %5.1f  %8.1f us per step (graph)  %6.0f GB/s  "
                    "%3.0f%% of copy %4.0f GB/s\n",
                    B, experts / STEPS, us, bytes / (us * 1e-6) / 1e9, 100 * bytes / (us * 1e-6) / copy_bw, copy_bw / 1e9);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cudaStreamDestroy(stream);
    }
}

// ---- the grouping on the host (no GPU): moe_grouping.h against plan_moe_decode ----------------

struct host_grouping {
    std::vector<int> slot_route, slot_job, slot_pos_in_job;  // by slot
    std::vector<int> job_expert, job_off, job_rows;          // by job
    std::vector<std::vector<int>> row_slots;                 // by row, in list order
};

// What the group kernel computes, by moe_grouping.h's two phases over every route.
host_grouping group_on_host(const std::vector<int> &e, int B, int K) {
    const int R = B * K;
    std::vector<cuda::route_group> g(R);
    std::vector<int> first(R), rank(R);
    for (int t = 0; t < R; t++) {
        if (e[size_t(t)] >= 0) g[size_t(t)] = cuda::group_route(e.data(), R, t);
        first[size_t(t)] = e[size_t(t)] >= 0 && g[size_t(t)].first;
        rank[size_t(t)] = g[size_t(t)].rank;
    }
    host_grouping h;
    const int slots = int(std::count_if(e.begin(), e.end(), [](int v) { return v >= 0; }));
    const int jobs = int(std::count(first.begin(), first.end(), 1));
    h.slot_route.assign(size_t(slots), -1), h.slot_job.assign(size_t(slots), -1), h.slot_pos_in_job.assign(size_t(slots), -1);
    h.job_expert.assign(size_t(jobs), -1), h.job_off.assign(size_t(jobs), -1), h.job_rows.assign(size_t(jobs), -1);
    h.row_slots.assign(size_t(B), std::vector<int>(size_t(K), -1));
    for (int t = 0; t < R; t++) {
        if (e[size_t(t)] < 0) continue;
        const cuda::route_place pl = cuda::place_route(e.data(), first.data(), rank.data(), R, K, t);
        const cuda::route_group &q = g[size_t(t)];
        EXPECT_LT(q.rank, slots);
        EXPECT_LT(pl.job, jobs);
        if (q.rank >= slots || pl.job >= jobs) continue;
        EXPECT_EQ(h.slot_route[size_t(q.rank)], -1) << "two routes in slot " << q.rank;
        h.slot_route[size_t(q.rank)] = t, h.slot_job[size_t(q.rank)] = pl.job, h.slot_pos_in_job[size_t(q.rank)] = q.rank - q.off;
        h.row_slots[size_t(t / K)][size_t(pl.pos)] = q.rank;
        if (q.first) h.job_expert[size_t(pl.job)] = e[size_t(t)], h.job_off[size_t(pl.job)] = q.off, h.job_rows[size_t(pl.job)] = q.rows;
    }
    for (auto &row : h.row_slots) row.erase(std::remove(row.begin(), row.end(), -1), row.end());
    return h;
}

cuda::moe_layer fake_layer(int E) {
    cuda::moe_layer layer;
    layer.D = 5120, layer.I = 2304, layer.act_block = 32;
    layer.experts.resize(size_t(E));
    for (int e = 0; e < E; e++) {
        const uint8_t *b = reinterpret_cast<const uint8_t *>(uintptr_t(e + 1) << 30);  // never dereferenced
        layer.experts[size_t(e)] = {b, b + 1, b + 2, b + 3, b + 4, b + 5};
    }
    return layer;
}

// Routes with every id kept: the slots, jobs and row lists equal plan_moe_decode's (its slot
// order, its matrices' M, its row_slot CSR). Rows repeat experts across rows (a small pool) and,
// in one case, within a row.
TEST(MoeRoutedGrouping, equals_plan_moe_decode) {
    cuda::device_info dev;
    dev.sm_count = 132;  // plan_gemv only sizes launches here
    const int E = 384, K = 6;
    const cuda::moe_layer layer = fake_layer(E);
    std::mt19937 rng(3);
    for (int B : {1, 2, 4, 9, 16})
        for (int pool : {6, 12, 384})
            for (bool repeat_in_row : {false, true}) {
                // At most 16 routes to one expert; at B = 1 plan_moe_decode refuses a repeated id
                // (its experts share x in place, and plan_gemv wants one M per shared x).
                if (repeat_in_row && B != 2) continue;
                std::vector<cuda::moe_route> routes;
                std::vector<int> ids;
                for (int b = 0; b < B; b++) {
                    std::vector<int> p(E);
                    std::iota(p.begin(), p.end(), 0);
                    std::shuffle(p.begin(), p.begin() + pool, rng);
                    for (int k = 0; k < K; k++) {
                        const int id = repeat_in_row && k == 3 ? p[0] : p[size_t(k % pool)];
                        ids.push_back(id), routes.push_back({uint32_t(id), float(b * K + k)});
                    }
                }
                const int R = B * K;
                const cuda::moe_buffers buf = cuda::moe_buffers_at(reinterpret_cast<void *>(uintptr_t(1) << 40), 5120, 2304, R);
                auto plan = cuda::plan_moe_decode(dev, layer, buf, reinterpret_cast<const float *>(uintptr_t(1) << 12),
                                                  reinterpret_cast<float *>(uintptr_t(1) << 13), routes, B, K);
                ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
                const cuda::moe_decode_plan &p = plan.value();
                const host_grouping h = group_on_host(ids, B, K);
                const std::string what = "B " + std::to_string(B) + " pool " + std::to_string(pool) + (repeat_in_row ? " repeat" : "");
                ASSERT_EQ(int(h.slot_route.size()), R) << what;
                for (int s = 0; s < R; s++) {
                    EXPECT_EQ(h.slot_route[size_t(s)], int(p.slot_weight[size_t(s)])) << what << " slot " << s;
                    EXPECT_EQ(h.slot_route[size_t(s)] / K, p.slot_row[size_t(s)]) << what << " slot " << s;
                }
                EXPECT_EQ(int(h.job_expert.size()), p.experts_read) << what;
                ASSERT_EQ(p.down.mats.size(), h.job_expert.size()) << what;
                for (size_t u = 0; u < h.job_expert.size(); u++) {
                    // plan_moe_decode's w2 matrices: one per selected expert, in increasing id, over its slot rows.
                    const cuda::gemv_matrix &m = p.down.mats[u];
                    EXPECT_EQ(m.w, layer.experts[size_t(h.job_expert[u])].w2) << what << " job " << u;
                    EXPECT_EQ(m.x, buf.h + size_t(h.job_off[u]) * 2304) << what << " job " << u;
                    EXPECT_EQ(m.M, h.job_rows[u]) << what << " job " << u;
                    for (int j = 0; j < h.job_rows[u]; j++) {
                        EXPECT_EQ(h.slot_job[size_t(h.job_off[u] + j)], int(u));
                        EXPECT_EQ(h.slot_pos_in_job[size_t(h.job_off[u] + j)], j);
                    }
                }
                for (int b = 0; b < B; b++) {
                    const std::vector<int> want(p.row_slot.begin() + p.row_off[size_t(b)], p.row_slot.begin() + p.row_off[size_t(b) + 1]);
                    EXPECT_EQ(h.row_slots[size_t(b)], want) << what << " row " << b;
                }
            }
}

// With dropped routes (-1): the kept routes' slots are a stable sort of them by expert, rows list
// only their kept routes, in increasing slot.
TEST(MoeRoutedGrouping, dropped_routes_take_no_slot) {
    std::mt19937 rng(4);
    for (int B : {1, 4, 16}) {
        const int K = 6, R = B * K;
        std::vector<int> ids(R);
        for (auto &v : ids) v = rng() % 5 == 0 ? -1 : int(rng() % 24);
        ids[0] = -1;
        const host_grouping h = group_on_host(ids, B, K);
        std::vector<int> kept;
        for (int t = 0; t < R; t++)
            if (ids[size_t(t)] >= 0) kept.push_back(t);
        std::stable_sort(kept.begin(), kept.end(), [&](int a, int b) { return ids[size_t(a)] < ids[size_t(b)]; });
        EXPECT_EQ(h.slot_route, kept) << "B " << B;
        for (int b = 0; b < B; b++) {
            std::vector<int> want;
            for (int s = 0; s < int(kept.size()); s++)
                if (kept[size_t(s)] / K == b) want.push_back(s);
            EXPECT_EQ(h.row_slots[size_t(b)], want) << "B " << B << " row " << b;
        }
        std::vector<int> experts;
        for (int t : kept) experts.push_back(ids[size_t(t)]);
        experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
        EXPECT_EQ(h.job_expert, experts) << "B " << B;
    }
}

}  // namespace
