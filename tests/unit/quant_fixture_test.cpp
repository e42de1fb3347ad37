// Our NVFP4 and EXL3 loaders and CPU references against the real producers' outputs:
// tests/fixtures/quant-nvfp4 (nvidia-modelopt) and tests/fixtures/quant-exl3 (exllamav3), made on
// a CUDA machine by tools/fixtures/make_{nvfp4,exl3}_fixture.py (provenance.json in each).
// While those directories are absent the tests SKIP with a message: a skip is not evidence.
//
// Acceptance (issue 6): NVFP4 dequantized weights bit-identical to ModelOpt's; W4A4 layer outputs
// within 1e-2 relative of ModelOpt's fake-quant forward. EXL3 decoded weights bit-identical to
// exllamav3 (get_inner_weight_tensor: the trellis decode; get_weight_tensor adds fp16 rotations,
// so the rotated weight and the layer output are held to 1e-3 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "backend/cpu/quant_ops.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/exl3.h"
#include "model/nvfp4.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

// nullptr when the fixture directory is absent (the caller skips); a directory without the file
// means the producer failed on that part, which is a failure, not a skip (unless optional).
std::shared_ptr<io::safetensors_file> open_fixture(const std::string &dir, const std::string &file,
                                                   bool optional = false) {
    const fs::path p = fs::path(DS41RT_FIXTURES_DIR) / dir / file;
    if (!fs::exists(p)) {
        if (fs::exists(p.parent_path()) && !optional)
            ADD_FAILURE() << p << " missing: see " << dir << "/provenance.json notes for the producer's error";
        return nullptr;
    }
    auto f = io::safetensors_file::open(p.string());
    EXPECT_TRUE(f.is_ok()) << f.status().to_string();
    return f.is_ok() ? *f : nullptr;
}

std::vector<float> as_f32(const Tensor &t) {
    std::vector<float> v(size_t(t.numel()));
    to_f32(t.type(), t.raw(), v.data(), v.size());
    return v;
}

struct cmp {
    double cos = 0, rel_rms = 0;
};
cmp compare(const std::vector<float> &got, const std::vector<float> &want) {
    double gw = 0, gg = 0, ww = 0, d = 0;
    for (size_t i = 0; i < want.size(); i++) {
        gw += double(got[i]) * want[i];
        gg += double(got[i]) * got[i];
        ww += double(want[i]) * want[i];
        d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    }
    return {gw / std::sqrt(gg * ww + 1e-300), std::sqrt(d / (ww + 1e-300))};
}

model::nvfp4_linear nvfp4_of(const io::safetensors_file &f, const std::string &p, bool has_input_scale) {
    model::nvfp4_linear l;
    const Tensor w = *f.get(p + ".weight"), s = *f.get(p + ".weight_scale");
    l.out = w.dim(0);
    l.in = w.dim(1) * 2;
    l.codes = w.data<uint8_t>();
    l.scales = s.data<uint8_t>();
    l.weight_scale_2 = f.get(p + ".weight_scale_2")->data<float>()[0];
    l.input_scale = has_input_scale ? f.get(p + ".input_scale")->data<float>()[0] : 1.0f;
    return l;
}

TEST(quant_fixture, nvfp4_dequant_bit_identical_to_modelopt) {
    auto f = open_fixture("quant-nvfp4", "linears.safetensors");
    if (!f) GTEST_SKIP() << "tests/fixtures/quant-nvfp4 absent: run tools/fixtures/make_nvfp4_fixture.py on a GPU box";
    for (int i = 0; f->find("lin" + std::to_string(i) + ".weight"); i++) {
        const std::string p = "lin" + std::to_string(i);
        ASSERT_EQ(f->find(p + ".weight")->type, dtype::U8);
        ASSERT_EQ(f->find(p + ".weight_scale")->type, dtype::F8_E4M3);
        model::nvfp4_linear l = nvfp4_of(*f, p, false);
        ASSERT_TRUE(model::nvfp4_check(p, l).is_ok());
        std::vector<float> w(size_t(l.out * l.in));
        model::nvfp4_dequantize(l, w.data());
        const std::vector<float> want = as_f32(*f->get(p + ".dequant"));
        int64_t bits = 0, vals = 0;
        for (size_t k = 0; k < w.size(); k++) {
            bits += f32_bits(w[k]) == f32_bits(want[k]);
            vals += w[k] == want[k];
        }
        std::printf("    nvfp4 %s [%lld, %lld]: bit-identical %lld / %zu (equal values %lld)\n", p.c_str(),
                    (long long)l.out, (long long)l.in, (long long)bits, w.size(), (long long)vals);
        EXPECT_EQ(bits, int64_t(w.size()));
    }
}

TEST(quant_fixture, nvfp4_activation_quant_matches_modelopt) {
    auto f = open_fixture("quant-nvfp4", "act.safetensors");
    if (!f) GTEST_SKIP() << "tests/fixtures/quant-nvfp4 absent: run tools/fixtures/make_nvfp4_fixture.py on a GPU box";
    for (int i = 0; f->find("act" + std::to_string(i) + ".x"); i++) {
        const std::string p = "act" + std::to_string(i);
        const Tensor xt = *f->get(p + ".x");
        std::vector<float> x = as_f32(xt);
        const std::vector<float> want = as_f32(*f->get(p + ".y"));
        const float is = f->get(p + ".input_scale")->data<float>()[0];
        backend::cpu::nvfp4_fake_quant_act(x.data(), xt.dim(0), xt.dim(1), is, /*out_bf16=*/true);
        int64_t same = 0;
        for (size_t k = 0; k < x.size(); k++) same += x[k] == want[k];
        const cmp c = compare(x, want);
        std::printf("    nvfp4 %s: %lld / %zu identical, cos %.7f rel rms %.3g\n", p.c_str(), (long long)same, x.size(),
                    c.cos, c.rel_rms);
        // Ties may round differently (Triton's fp32 division); anything more is a definition bug.
        EXPECT_GE(double(same), 0.999 * double(x.size()));
    }
}

TEST(quant_fixture, nvfp4_moe_export_and_w4a4_forward) {
    auto f = open_fixture("quant-nvfp4", "moe.safetensors");
    if (!f) GTEST_SKIP() << "tests/fixtures/quant-nvfp4 absent: run tools/fixtures/make_nvfp4_fixture.py on a GPU box";
    for (int e = 0; f->find("moe." + std::to_string(e) + ".x"); e++) {
        const std::string p = "layers.0.ffn.experts." + std::to_string(e) + ".";
        std::map<std::string, std::vector<float>> w;
        std::map<std::string, model::nvfp4_linear> l;
        for (const char *n : {"w1", "w3", "w2"}) {
            l[n] = nvfp4_of(*f, p + n, true);
            ASSERT_TRUE(model::nvfp4_check(p + n, l[n]).is_ok());
            w[n].resize(size_t(l[n].out * l[n].in));
            model::nvfp4_dequantize(l[n], w[n].data());
            const std::vector<float> want = as_f32(*f->get(p + n + ".dequant"));
            int64_t same = 0;
            for (size_t k = 0; k < want.size(); k++) same += f32_bits(w[n][k]) == f32_bits(want[k]);
            EXPECT_EQ(same, int64_t(want.size())) << p << n;
        }
        // ModelOpt's export fuses the gate / up amax: the rule our loader enforces.
        EXPECT_EQ(l["w1"].weight_scale_2, l["w3"].weight_scale_2);
        EXPECT_EQ(l["w1"].input_scale, l["w3"].input_scale);

        const std::string m = "moe." + std::to_string(e) + ".";
        const Tensor xt = *f->get(m + "x");
        const std::vector<float> x = as_f32(xt);
        const int64_t rows = xt.dim(0), dim = xt.dim(1), inter = l["w1"].out;
        // Each W4A4 layer alone (the acceptance: layer outputs within 1e-2 of ModelOpt's
        // fake-quant reference): gate and up on x, down on the producer's own h.
        std::vector<float> g(size_t(rows * inter)), u(size_t(rows * inter)), yl(size_t(rows * dim)), y(size_t(rows * dim));
        backend::cpu::nvfp4_w4a4_linear(x.data(), rows, w["w1"].data(), inter, dim, l["w1"].input_scale, g.data());
        backend::cpu::nvfp4_w4a4_linear(x.data(), rows, w["w3"].data(), inter, dim, l["w3"].input_scale, u.data());
        const std::vector<float> h = as_f32(*f->get(m + "h"));
        backend::cpu::nvfp4_w4a4_linear(h.data(), rows, w["w2"].data(), dim, inter, l["w2"].input_scale, yl.data());
        const cmp cg = compare(g, as_f32(*f->get(m + "g"))), cu = compare(u, as_f32(*f->get(m + "u")));
        const cmp cl = compare(yl, as_f32(*f->get(m + "y")));
        // The whole expert: h is FP4-quantized again before w2, so bf16-level differences in g and
        // u (the producer's GEMMs write bf16, ours keep fp32) flip some of h's FP4 codes; one flip
        // moves an element by up to a code step. Reported, and bounded loosely.
        backend::cpu::nvfp4_w4a4_swiglu(x.data(), rows, dim, inter, w["w1"].data(), w["w3"].data(), w["w2"].data(),
                                        l["w1"].input_scale, l["w2"].input_scale, 10.0f, y.data());
        const cmp cy = compare(y, as_f32(*f->get(m + "y")));
        std::printf("    nvfp4 expert %d layers: w1 cos %.6f rel rms %.3g; w3 cos %.6f rel rms %.3g; w2 (on the producer's h) "
                    "cos %.6f rel rms %.3g; whole expert cos %.6f rel rms %.3g\n",
                    e, cg.cos, cg.rel_rms, cu.cos, cu.rel_rms, cl.cos, cl.rel_rms, cy.cos, cy.rel_rms);
        EXPECT_LT(cg.rel_rms, 1e-2);
        EXPECT_LT(cu.rel_rms, 1e-2);
        EXPECT_LT(cl.rel_rms, 1e-2);
        EXPECT_LT(cy.rel_rms, 1e-1);
        EXPECT_GT(cy.cos, 0.99);
    }
}

struct exl3_case {
    std::vector<uint16_t> trellis, suh, svh;
    model::exl3_linear l;
};

bool exl3_of(const io::safetensors_file &f, const std::string &p, exl3_case *c) {
    if (!f.find(p + ".trellis")) return false;
    const Tensor t = *f.get(p + ".trellis"), su = *f.get(p + ".suh"), sv = *f.get(p + ".svh");
    EXPECT_EQ(t.type(), dtype::I16);
    EXPECT_EQ(su.type(), dtype::F16);
    c->trellis.assign(t.data<uint16_t>(), t.data<uint16_t>() + t.numel());
    c->suh.assign(su.data<uint16_t>(), su.data<uint16_t>() + su.numel());
    c->svh.assign(sv.data<uint16_t>(), sv.data<uint16_t>() + sv.numel());
    c->l.in = t.dim(0) * 16;
    c->l.out = t.dim(1) * 16;
    c->l.k = int(t.dim(2) / 16);
    c->l.cb = f.find(p + ".mcg") ? model::exl3_codebook::MCG
              : f.find(p + ".mul1") ? model::exl3_codebook::MUL1 : model::exl3_codebook::INST3;
    c->l.trellis = c->trellis.data();
    c->l.suh = c->suh.data();
    c->l.svh = c->svh.data();
    return true;
}

void check_exl3(const io::safetensors_file &f, const std::string &p, int *bit_exact_cases) {
    exl3_case c;
    ASSERT_TRUE(exl3_of(f, p, &c)) << p;
    ASSERT_TRUE(model::exl3_check(p, c.l).is_ok());
    const int64_t n = c.l.in * c.l.out;
    std::vector<uint16_t> what(static_cast<size_t>(n));
    model::exl3_decode(c.l, what.data());
    const Tensor inner = *f.get(p + ".inner");
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += what[size_t(i)] == inner.data<uint16_t>()[i];
    std::vector<float> w(static_cast<size_t>(n));
    model::exl3_dequantize(c.l, w.data());
    const cmp cw = compare(w, as_f32(*f.get(p + ".weight")));
    std::printf("    exl3 %-12s K=%d %-5s: decode bit-identical %lld / %lld; weight rel rms %.3g", p.c_str(), c.l.k,
                model::exl3_codebook_name(c.l.cb), (long long)same, (long long)n, cw.rel_rms);
    EXPECT_EQ(same, n) << p;
    EXPECT_LT(cw.rel_rms, 1e-3) << p;
    *bit_exact_cases += same == n;
    if (f.find(p + ".x")) {
        const Tensor xt = *f.get(p + ".x");
        const std::vector<float> x = as_f32(xt);
        std::vector<float> whatf(static_cast<size_t>(n)), suh(c.suh.size()), svh(c.svh.size()),
            y(size_t(xt.dim(0) * c.l.out));
        for (int64_t i = 0; i < n; i++) whatf[size_t(i)] = f16_to_f32(what[size_t(i)]);
        for (size_t i = 0; i < suh.size(); i++) suh[i] = f16_to_f32(c.suh[i]);
        for (size_t i = 0; i < svh.size(); i++) svh[i] = f16_to_f32(c.svh[i]);
        backend::cpu::exl3_linear(x.data(), xt.dim(0), whatf.data(), c.l.in, c.l.out, suh.data(), svh.data(), y.data());
        const cmp cy = compare(y, as_f32(*f.get(p + ".y")));
        std::printf("; forward cos %.7f rel rms %.3g", cy.cos, cy.rel_rms);
        EXPECT_LT(cy.rel_rms, 1e-3) << p;
    }
    std::printf("\n");
}

TEST(quant_fixture, exl3_decode_bit_identical_to_exllamav3_every_k_and_codebook) {
    auto f = open_fixture("quant-exl3", "decode.safetensors");
    if (!f) GTEST_SKIP() << "tests/fixtures/quant-exl3 absent: run tools/fixtures/make_exl3_fixture.py on a GPU box";
    int exact = 0, cases = 0;
    for (int k = 1; k <= 8; k++)
        for (const char *cb : {"3inst", "mcg", "mul1"}) {
            const std::string p = "k" + std::to_string(k) + "_" + cb;
            ASSERT_TRUE(f->find(p + ".trellis")) << p << " missing from the fixture";
            check_exl3(*f, p, &exact);
            cases++;
        }
    check_exl3(*f, "k2_mcg_big", &exact);
    cases++;
    std::printf("    exl3: %d / %d (K, codebook) cases decode bit-identically\n", exact, cases);
}

TEST(quant_fixture, exl3_real_quantization) {
    auto f = open_fixture("quant-exl3", "quant.safetensors", /*optional=*/true);
    if (!f) GTEST_SKIP() << "tests/fixtures/quant-exl3/quant.safetensors absent (quantize_exl3 output)";
    int exact = 0;
    check_exl3(*f, "q", &exact);
}

}  // namespace
}  // namespace ds41rt
