// engine/cuda v4_compressor (V4's compressor windows on the device) against engine/v4_steps
// compress_pool, the host code the CPU engine runs: two sequences fed the same random projected
// rows in different chunkings (1-row decode steps, short and long chunks, a 300-row prefill),
// at V4 Flash's shapes: CSA's overlapping windows (ratio 4, d 512 main and 128 indexer) and
// HCA's (ratio 128, d 512). Every call's window counts must be the host's, and every latent within
// 2^-20 * (slots) * max |kv| of it: the fp32 steps are the host's in its order; only exp differs
// (fp64-rounded on the device, glibc's expf on the host: an ulp in ~6e-4 of arguments,
// backend/cuda/compressor.cu), so a latent moves by a few ulps of its terms. Bit mismatches are
// printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "backend/cuda/device_info.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/v4_compressor.h"
#include "engine/v4_steps.h"
#include "model/weights.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

struct shape_case {
    int64_t d;
    int ratio;
    bool overlap;
};

class V4Compressor : public ::testing::TestWithParam<shape_case> {};

TEST_P(V4Compressor, WindowsPoolAsTheHostDoes) {
    if (auto d = backend::cuda::query_device(0); !d) GTEST_SKIP() << d.status().to_string();
    auto w = model::weights::open((fs::path(DS41RT_FIXTURES_DIR) / "deepseek-v4-flash-quant").string());
    ASSERT_TRUE(w) << w.status().to_string();
    auto mr = engine::gpu::device_model::make(std::shared_ptr<model::weights>(std::move(w.value())), false);
    ASSERT_TRUE(mr) << mr.status().to_string();
    const engine::gpu::device_model &m = *mr.value();

    const shape_case c = GetParam();
    const int64_t cd = (c.overlap ? 2 : 1) * c.d;
    std::mt19937 rng(uint32_t(c.d * 7 + c.ratio));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> ape(size_t(c.ratio * cd));
    for (float &v : ape) v = 0.5f * nd(rng);
    auto ape_d = m.upload_temp(ape.data(), ape.size() * sizeof(float));
    ASSERT_TRUE(ape_d);
    engine::gpu::v4_compressor_shape sh;
    sh.d = c.d;
    sh.ratio = c.ratio;
    sh.overlap = c.overlap;
    sh.ape = ape_d->f();

    // Per call, the rows of sequences 0 and 1 (0 = absent from the call).
    const std::vector<std::pair<int64_t, int64_t>> calls = {{5, 300}, {1, 1}, {1, 0}, {3, 1}, {16, 7}, {1, 1},
                                                            {7, 2},   {300, 1}, {1, 16}, {2, 3}, {1, 1}};
    engine::v4::compressor_buffer host[2];
    engine::gpu::v4_open_windows dev[2];
    int64_t windows = 0, bits = 0;
    double worst = 0;  // |d| / (slots * max |kv|)
    for (const auto &[n0, n1] : calls) {
        const int64_t n[2] = {n0, n1};
        std::vector<engine::gpu::v4_open_windows *> st;
        std::vector<int64_t> off, cnt;
        std::vector<int> who;
        int64_t S = 0;
        for (int i = 0; i < 2; i++)
            if (n[i] > 0) st.push_back(&dev[i]), off.push_back(S), cnt.push_back(n[i]), who.push_back(i), S += n[i];
        std::vector<float> kv(size_t(S * cd)), gate(size_t(S * cd));
        for (float &v : kv) v = nd(rng);
        for (float &v : gate) v = 2.0f * nd(rng);
        float kmax = 0;
        for (float v : kv) kmax = std::max(kmax, std::fabs(v));
        auto kv_d = m.upload_temp(kv.data(), kv.size() * sizeof(float));
        auto gate_d = m.upload_temp(gate.data(), gate.size() * sizeof(float));
        ASSERT_TRUE(kv_d && gate_d);
        engine::gpu::dtemp lat;
        std::vector<int64_t> groups;
        Status s = engine::gpu::v4_compress_pool(m, sh, st, kv_d->f(), gate_d->f(), off, cnt, &lat, &groups);
        ASSERT_TRUE(s) << s.to_string();
        std::vector<float> want;
        for (size_t j = 0; j < who.size(); j++) {
            int64_t g = 0;
            std::vector<float> l = engine::v4::compress_pool(host[who[j]], kv.data() + off[j] * cd, gate.data() + off[j] * cd,
                                                     cnt[j], c.d, c.ratio, c.overlap, ape.data(), &g);
            ASSERT_EQ(groups[j], g) << "sequence " << who[j];
            want.insert(want.end(), l.begin(), l.end());
        }
        if (want.empty()) continue;
        std::vector<float> got = m.download_f32(lat.f(), int64_t(want.size()), &s);
        ASSERT_TRUE(s) << s.to_string();
        const double slots = (c.overlap ? 2.0 : 1.0) * c.ratio;
        for (size_t i = 0; i < want.size(); i++) {
            ASSERT_TRUE(std::isfinite(got[i])) << "latent element " << i;
            const double d = std::fabs(double(got[i]) - want[i]) / (slots * kmax);
            worst = std::max(worst, d);
            bits += got[i] != want[i];
            EXPECT_LE(d, 0x1p-20) << "element " << i << ": " << got[i] << " vs " << want[i];
        }
        windows += int64_t(want.size()) / c.d;
    }
    std::printf("[ v4 compressor ] d %lld ratio %d%s: %lld windows, max |d| / (slots max|kv|) %.3g, %lld of %lld "
                "elements not bit-equal\n",
                (long long)c.d, c.ratio, c.overlap ? " overlap" : "", (long long)windows, worst, (long long)bits,
                (long long)(windows * c.d));
    EXPECT_GT(windows, 0);
}

INSTANTIATE_TEST_SUITE_P(V4Flash, V4Compressor,
                         ::testing::Values(shape_case{512, 4, true}, shape_case{128, 4, true}, shape_case{512, 128, false}),
                         [](const ::testing::TestParamInfo<shape_case> &i) {
                             return "d" + std::to_string(i.param.d) + "_ratio" + std::to_string(i.param.ratio);
                         });

}  // namespace
}  // namespace ds41rt
