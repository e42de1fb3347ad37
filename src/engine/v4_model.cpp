// DeepSeek V4 Flash: the text forward pass on the CPU reference ops.
//
// Layout of this file, in the order a token meets it: weights, per-sequence state, mHC (hc_pre /
// hc_post with Sinkhorn, hc_head), attention (window, compressors, lightning indexer, sparse
// attention with sink, grouped output), MoE (hash / learned routing), and the step driver.
// Formulas cite shared/specs/deepseek-v4-flash.md; the numerics are those of HF transformers'
// deepseek_v4 (transformers 5.24.0, modeling_deepseek_v4.py), the oracle of the TRANSFORMERS
// mode. Every place where transformers departs from DeepSeek's reference is marked
// "transformers deviation" with what the reference does instead:
//   1. no FP8 QAT simulation of the window KV nope dims (spec 3.4) nor of compressed entries (3.5);
//   2. no Hadamard rotation and no FP4 simulation of indexer queries / keys (3.5, 3.8);
//   3. the per-head q RMS norm runs in fp32 (the reference computes it in bf16, spec 2.1);
//   4. routing weights get +1e-20 in the renormalisation denominator (3.9), always renormalised;
//   5. the routing weight multiplies the expert's w2 OUTPUT (the reference scales before w2, 3.9);
//   6. the indexer score is relu(q.k) * 1/sqrt(d_I) times (w * 1/sqrt(n_I)), head-summed in fp32.
//
// OFFICIAL numerics (engine.h) follow DeepSeek's reference inference code instead (spec 2.1-2.3,
// section 3): bf16 rounding at every point the reference holds a bf16 tensor, FP8 activation
// quantization (block 128, ue8m0) before the FP8 / FP4 linears, the cache quantizations
// (1)/(2) above, the bf16 q norm (3), routing weights without the epsilon and applied before w2
// (4)/(5), the bf16 indexer score (6), and the kernel's sparse attention (online softmax over
// blocks of 64 indices, P cast to bf16 before P.V, fp32 denominator). Each such place is marked
// "OFFICIAL".
//
// transformers 5.24.0 DOES clamp the shared expert (DeepseekV4MLP clamps gate <= limit and up to
// [-limit, limit]), in agreement with the spec 3.9; the "unclamped shared expert" of spec 7 /
// transformers issue #46018 does not apply to this version. We clamp.
#include "engine/v4_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "backend/cpu/numerics.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/routed.h"
#include "backend/cpu/swiglu.h"
#include "core/threads.h"
#include "engine/attention_row.h"
#include "engine/cpu_engine.h"
#include "engine/mhc.h"
#include "engine/output_projection.h"
#include "engine/rope.h"
#include "engine/topk.h"
#include "engine/v4_steps.h"
#include "experts/routed_experts.h"

namespace ds41rt::engine {

namespace cpu = backend::cpu;
using cpu::expert_numerics;
using cpu::lin;
using cpu::linear_numerics;
using cpu::round_bf16_if;
using cpu::swiglu_expert;

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// ---- weights ------------------------------------------------------------------------------------

struct compressor_weights {
    Tensor wkv, wgate, ape, norm;  // [c*d, D], [c*d, D], [m, c*d], [d]  (c = 2 with overlap)
};

struct layer_weights {
    Tensor attn_norm, ffn_norm;
    Tensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    Tensor attn_sink, wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b;
    compressor_weights comp;        // ratio > 0 (CSA and HCA)
    compressor_weights icomp;       // CSA: the indexer's own compressor
    Tensor i_wq_b, i_weights_proj;  // CSA
    Tensor gate_w, gate_bias;       // gate_bias: learned-routing layers only
    std::vector<int32_t> tid2eid;   // hash layers: [vocab, n_activated_experts]
    Tensor sw1, sw2, sw3;  // routed experts: experts::routed_experts
};

struct model_weights {
    Tensor embed, head, norm, hc_head_fn, hc_head_base, hc_head_scale;
    std::vector<layer_weights> layers;
};

Status load_weights(const model::model_config &c, const weight_source &src, model_weights *w) {
    auto get = [&](const std::string &name, Tensor *out) { return fetch_weight(src, name, out); };
    auto expect = [&](const Tensor &t, const std::string &name, std::initializer_list<int64_t> shape) -> Status {
        if (t.shape() != shape_t(shape))
            return Status::invalid_argument(name + ": shape " + shape_str(t.shape()) + ", expected " +
                                            shape_str(shape_t(shape)));
        return Status::ok();
    };
    const int64_t D = c.dim, hc = c.hc_mult;
    DS41RT_RETURN_IF_ERROR(get("embed.weight", &w->embed));
    DS41RT_RETURN_IF_ERROR(get("head.weight", &w->head));
    DS41RT_RETURN_IF_ERROR(get("norm.weight", &w->norm));
    DS41RT_RETURN_IF_ERROR(get("hc_head_fn", &w->hc_head_fn));
    DS41RT_RETURN_IF_ERROR(get("hc_head_base", &w->hc_head_base));
    DS41RT_RETURN_IF_ERROR(get("hc_head_scale", &w->hc_head_scale));
    DS41RT_RETURN_IF_ERROR(expect(w->embed, "embed.weight", {c.vocab_size, D}));
    DS41RT_RETURN_IF_ERROR(expect(w->head, "head.weight", {c.vocab_size, D}));
    DS41RT_RETURN_IF_ERROR(expect(w->hc_head_fn, "hc_head_fn", {hc, hc * D}));
    w->layers.resize(size_t(c.n_layers));
    for (int l = 0; l < c.n_layers; l++) {
        layer_weights &L = w->layers[size_t(l)];
        const std::string p = "layers." + std::to_string(l) + ".";
        const std::pair<const char *, Tensor *> common[] = {
            {"attn_norm.weight", &L.attn_norm}, {"ffn_norm.weight", &L.ffn_norm},
            {"hc_attn_fn", &L.hc_attn_fn},      {"hc_attn_base", &L.hc_attn_base},
            {"hc_attn_scale", &L.hc_attn_scale}, {"hc_ffn_fn", &L.hc_ffn_fn},
            {"hc_ffn_base", &L.hc_ffn_base},    {"hc_ffn_scale", &L.hc_ffn_scale},
            {"attn.attn_sink", &L.attn_sink},   {"attn.wq_a.weight", &L.wq_a},
            {"attn.q_norm.weight", &L.q_norm},  {"attn.wq_b.weight", &L.wq_b},
            {"attn.wkv.weight", &L.wkv},        {"attn.kv_norm.weight", &L.kv_norm},
            {"attn.wo_a.weight", &L.wo_a},      {"attn.wo_b.weight", &L.wo_b},
            {"ffn.gate.weight", &L.gate_w},
        };
        for (auto &[name, t] : common) DS41RT_RETURN_IF_ERROR(get(p + name, t));
        auto load_comp = [&](const std::string &cp, compressor_weights *cw) -> Status {
            DS41RT_RETURN_IF_ERROR(get(cp + "wkv.weight", &cw->wkv));
            DS41RT_RETURN_IF_ERROR(get(cp + "wgate.weight", &cw->wgate));
            DS41RT_RETURN_IF_ERROR(get(cp + "ape", &cw->ape));
            DS41RT_RETURN_IF_ERROR(get(cp + "norm.weight", &cw->norm));
            return Status::ok();
        };
        if (c.ratio(l) > 0) {
            DS41RT_RETURN_IF_ERROR(load_comp(p + "attn.compressor.", &L.comp));
            const int64_t cd = (c.is_index_source(l) ? 2 : 1) * int64_t(c.head_dim);
            DS41RT_RETURN_IF_ERROR(expect(L.comp.wkv, p + "attn.compressor.wkv.weight", {cd, D}));
            DS41RT_RETURN_IF_ERROR(expect(L.comp.ape, p + "attn.compressor.ape", {int64_t(c.ratio(l)), cd}));
        }
        if (c.is_index_source(l)) {
            DS41RT_RETURN_IF_ERROR(load_comp(p + "attn.indexer.compressor.", &L.icomp));
            DS41RT_RETURN_IF_ERROR(get(p + "attn.indexer.wq_b.weight", &L.i_wq_b));
            DS41RT_RETURN_IF_ERROR(get(p + "attn.indexer.weights_proj.weight", &L.i_weights_proj));
            DS41RT_RETURN_IF_ERROR(expect(L.icomp.wkv, p + "attn.indexer.compressor.wkv.weight",
                                          {2 * int64_t(c.index_head_dim), D}));
        }
        if (l < c.n_hash_layers) {
            Tensor t;
            DS41RT_RETURN_IF_ERROR(get(p + "ffn.gate.tid2eid", &t));
            DS41RT_RETURN_IF_ERROR(expect(t, p + "ffn.gate.tid2eid", {c.vocab_size, int64_t(c.n_activated_experts)}));
            L.tid2eid.resize(size_t(t.numel()));
            for (int64_t i = 0; i < t.numel(); i++) {
                const float v = t.f()[i];
                if (!(v >= 0 && v < float(c.n_routed_experts)) || v != std::floor(v))
                    return Status::invalid_argument(p + "ffn.gate.tid2eid: entry " + std::to_string(i) +
                                                    " is not an expert id");
                L.tid2eid[size_t(i)] = int32_t(v);
            }
        } else {
            DS41RT_RETURN_IF_ERROR(get(p + "ffn.gate.bias", &L.gate_bias));
        }
        if (c.n_shared_experts > 0) {
            DS41RT_RETURN_IF_ERROR(get(p + "ffn.shared_experts.w1.weight", &L.sw1));
            DS41RT_RETURN_IF_ERROR(get(p + "ffn.shared_experts.w2.weight", &L.sw2));
            DS41RT_RETURN_IF_ERROR(get(p + "ffn.shared_experts.w3.weight", &L.sw3));
        }
    }
    return Status::ok();
}

// ---- per-sequence state (spec 4) ----------------------------------------------------------------

// One compressor's running state: its open windows (engine/v4_steps) and the entries emitted.
struct comp_state : v4::compressor_buffer {
    std::vector<float> entries;  // [n_entries, d]: normed, RoPE'd
    int64_t n_entries = 0;
};

struct layer_state {
    std::vector<float> ring;      // [window, head_dim]
    std::vector<int64_t> ring_pos;  // [window], -1 = empty
    comp_state comp, icomp;
};

struct sequence_state {
    int64_t len = 0;
    std::vector<layer_state> layers;
};

class v4_engine final : public cpu_engine<sequence_state> {
public:
    v4_engine(model::model_config c, model_weights w, std::unique_ptr<experts::routed_experts> ex, engine_options opt)
        : c_(std::move(c)), w_(std::move(w)), experts_(std::move(ex)), opt_(std::move(opt)), rope_main_(make_rope_table(c_, false)),
          rope_compress_(make_rope_table(c_, true)) {}

    const model::model_config &config() const override { return c_; }

    sequence_state new_state() const override {
        sequence_state s;
        s.layers.resize(size_t(c_.n_layers));
        for (auto &ls : s.layers) {
            ls.ring.assign(size_t(c_.window) * size_t(c_.head_dim), 0.0f);
            ls.ring_pos.assign(size_t(c_.window), -1);
        }
        return s;
    }

private:
    // ---- numerics (engine/numerics.h) -----------------------------------------------------------
    // Every call site names its linear's class from spec 2.1: FP8 (wq_a, wq_b, wkv, wo_b, shared
    // experts, indexer wq_b), FP4 (routed experts), BF16 (wo_a, indexer weights_proj), F32
    // (compressor wkv / wgate, gate, head, hc_*_fn). In TRANSFORMERS numerics all are fp32.
    static constexpr int64_t KV_QAT_BLOCK = 64;  // FP8 QAT of the nope dims (spec 3.4, 3.5)
    static constexpr int64_t FP4_QAT_BLOCK = 32;  // FP4 QAT of indexer q / keys (spec 2.1)

    void rb(float *p, int64_t n) const { round_bf16_if(official_, p, n); }

    void linear(const float *x, const Tensor &w, float *y, int64_t m, int64_t n, int64_t k, lin kind) const {
        linear(x, w.f(), y, m, n, k, kind);
    }
    void linear(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k, lin kind) const {
        linear_numerics(official_, c_.fp8_block_in, x, w, y, m, n, k, kind);
    }

    // RMSNorm: bf16(w_fp32 * x_hat) under OFFICIAL.
    void norm(float *x, const Tensor &w, int64_t rows, int64_t dim) const {
        cpu::rms_norm(x, w.f(), x, rows, dim, c_.norm_eps);
        rb(x, rows * dim);
    }

    // ---- mHC (spec 3.3; engine/mhc.h) -------------------------------------------------------
    // TRANSFORMERS normalizes the streams before the mix projection, OFFICIAL folds the RMS in
    // after it, as the reference does.
    void project(const std::vector<float> &X, int64_t S, const Tensor &fn, int64_t n_out, float *m) const {
        hc_project(X.data(), S, int64_t(c_.hc_mult) * c_.dim, fn, n_out, c_.norm_eps, official_, m);
    }

    hc_mixes mixes_at(const std::vector<float> &X, int64_t S, const Tensor &fn, const Tensor &scale,
                      const Tensor &base) const {
        const int hc = c_.hc_mult;
        const int64_t n_mix = int64_t(2 + hc) * hc;
        std::vector<float> m(S * n_mix);
        project(X, S, fn, n_mix, m.data());
        return hc_split_sinkhorn(m.data(), S, hc, scale.f(), base.f(), c_.hc_eps, c_.hc_sinkhorn_iters);
    }

    // x = sum_j pre_j X_j, bf16 under OFFICIAL.
    void collapse(const std::vector<float> &X, const std::vector<float> &pre, int64_t S, float *x) const {
        hc_collapse(X.data(), pre.data(), S, c_.hc_mult, c_.dim, x);
        rb(x, S * c_.dim);
    }

    // The streams after a sublayer: post * y + comb^T X, bf16 under OFFICIAL.
    void expand(std::vector<float> &X, const float *y, const hc_mixes &mx, int64_t S) const {
        hc_expand(X.data(), y, mx, S, c_.hc_mult, c_.dim);
        rb(X.data(), S * c_.hc_mult * c_.dim);
    }

    // hc_head (spec 3.10): pre = sigmoid(mix * scale + base) + eps, collapse.
    void hc_head(const std::vector<float> &X, int64_t S, float *x) const {
        const int hc = c_.hc_mult;
        std::vector<float> m(S * hc), pre(S * hc);
        project(X, S, w_.hc_head_fn, hc, m.data());
        const float sc = w_.hc_head_scale.f()[0], *b = w_.hc_head_base.f();
        for (int64_t s = 0; s < S; s++)
            for (int j = 0; j < hc; j++)
                pre[size_t(s * hc + j)] = cpu::sigmoid(m[size_t(s * hc + j)] * sc + b[j]) + c_.hc_eps;
        collapse(X, pre, S, x);
    }

    // ---- attention (spec 3.4-3.8) ----------------------------------------------------------------
    const rope_table &rope_for(int layer) const { return c_.ratio(layer) > 0 ? rope_compress_ : rope_main_; }

    // Rotates the last rope_head_dim channels of n rows of width dim, one position per row.
    void rope(float *x, int64_t n, int64_t dim, const int64_t *pos, const rope_table &t, bool inverse) const {
        rope_rows(x, n, dim, pos, t, inverse);
        rb(x, n * dim);  // OFFICIAL: fp32 rotation written back into the bf16 tensor
    }

    // OFFICIAL indexer q / key quantization (spec 2.1, 3.5, 3.8): rotate_activation (Hadamard,
    // scale d^-0.5, fp32 inside, bf16 out), then the FP4 QAT sim in blocks of 32.
    void rotate_fp4(float *x, int64_t rows, int64_t d) const {
        cpu::rotate_fake_quant_fp4_ue8m0(x, rows, d, FP4_QAT_BLOCK);
    }

    // A compressor (spec 3.5): projects the chunk's tokens, closes every window that completes,
    // and appends one entry per closed window to st.entries: pooled per channel by a softmax over
    // the window's tokens of (gate + ape[p mod m]), RMS-normed, RoPE'd at position w*m with the
    // compress table. With overlap (CSA) the 2m slots are the previous window's Ca half and this
    // window's Cb half; the first window of a sequence has no previous one (weight 0).
    // transformers deviation (1)/(2): no FP8 sim of the nope dims (main compressor) and no
    // Hadamard + FP4 sim (indexer compressor, `rotate`) on the emitted entries.
    // OFFICIAL: entry = norm(bf16(pooled)), RoPE, then the main compressor's FP8 QAT on its nope
    // dims [:d - rope] (block 64) or the indexer's Hadamard over all d + FP4 QAT (block 32).
    void compress(const compressor_weights &cw, comp_state &st, const float *x, int64_t S, int64_t d, int ratio,
                  bool overlap, bool rotate) const {
        const int64_t D = c_.dim, cd = (overlap ? 2 : 1) * d;
        std::vector<float> kv(S * cd), gate(S * cd);
        cpu::matmul_nt(x, cw.wkv.f(), kv.data(), S, cd, D);
        cpu::matmul_nt(x, cw.wgate.f(), gate.data(), S, cd, D);
        int64_t groups = 0;
        std::vector<float> latent = v4::compress_pool(st, kv.data(), gate.data(), S, d, ratio, overlap, cw.ape.f(), &groups);
        if (groups == 0) return;
        rb(latent.data(), groups * d);
        norm(latent.data(), cw.norm, groups, d);
        std::vector<int64_t> pos(groups);
        for (int64_t g = 0; g < groups; g++) pos[size_t(g)] = (st.n_entries + g) * ratio;
        rope(latent.data(), groups, d, pos.data(), rope_compress_, false);
        if (official_) {
            if (rotate)
                rotate_fp4(latent.data(), groups, d);
            else
                cpu::fake_quant_fp8_ue8m0_cols(latent.data(), groups, d, d - c_.rope_head_dim, KV_QAT_BLOCK);
        }
        st.entries.insert(st.entries.end(), latent.begin(), latent.end());
        st.n_entries += groups;
    }

    // The lightning indexer of a CSA layer (spec 3.8): runs its own overlap compressor at
    // index_head_dim, then selects per query the top index_topk visible entries by
    // score[t] = sum_h relu(qI[h] . KI[t]) / sqrt(d_I) * w[h] / sqrt(n_I).
    // transformers deviation (2): qI is not Hadamard-rotated nor FP4-simulated.
    // transformers deviation (6): fp32 scoring with the two scales applied separately.
    std::vector<std::vector<int32_t>> indexer(const layer_weights &L, int layer, layer_state &ls, const float *x,
                                              const float *qr, int64_t p0, int64_t S) const {
        const int ratio = c_.ratio(layer);
        const int64_t ihd = c_.index_head_dim, ih = c_.index_n_heads;
        compress(L.icomp, ls.icomp, x, S, ihd, ratio, true, true);
        const int64_t T = ls.icomp.n_entries;
        std::vector<std::vector<int32_t>> topk(static_cast<size_t>(S));
        if (T == 0) return topk;

        std::vector<float> q(S * ih * ihd), w(S * ih);
        linear(qr, L.i_wq_b, q.data(), S, ih * ihd, c_.q_lora_rank, lin::FP8);
        std::vector<int64_t> qpos(S * ih);
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < ih; h++) qpos[size_t(s * ih + h)] = p0 + s;
        rope(q.data(), S * ih, ihd, qpos.data(), rope_compress_, false);
        if (official_) rotate_fp4(q.data(), S * ih, ihd);
        linear(x, L.i_weights_proj, w.data(), S, ih, c_.dim, lin::BF16);
        const float qk_scale = 1.0f / std::sqrt(float(ihd)), head_scale = 1.0f / std::sqrt(float(ih));
        if (official_)  // weights_proj(x) * (d_I^-0.5 * n_I^-0.5), a bf16 tensor times a scalar
            for (int64_t i = 0; i < S * ih; i++) w[size_t(i)] = round_bf16(w[size_t(i)] * (qk_scale * head_scale));
        const float *keys = ls.icomp.entries.data();

        parallel_for(S, [&](int64_t s0, int64_t s1) {
            std::vector<float> scores(T);
            for (int64_t s = s0; s < s1; s++) {
                const int64_t visible = (p0 + s + 1) / ratio;
                for (int64_t t = 0; t < T; t++) {
                    if (t >= visible) {
                        scores[size_t(t)] = NEG_INF;
                        continue;
                    }
                    const float *kt = keys + t * ihd;
                    float acc = 0;
                    for (int64_t h = 0; h < ih; h++) {
                        const float *qh = q.data() + (s * ih + h) * ihd;
                        float dot = 0;
                        for (int64_t dd = 0; dd < ihd; dd++) dot += qh[dd] * kt[dd];
                        if (official_)  // OFFICIAL: bf16 einsum output, relu, bf16 product with w
                            acc += round_bf16(std::max(round_bf16(dot), 0.0f) * w[size_t(s * ih + h)]);
                        else
                            acc += (std::max(dot, 0.0f) * qk_scale) * (w[size_t(s * ih + h)] * head_scale);
                    }
                    scores[size_t(t)] = official_ ? round_bf16(acc) : acc;  // OFFICIAL: bf16 head sum
                }
                const int64_t k = std::min<int64_t>(c_.index_topk, T);
                if (official_) {
                    // bf16 scores tie often (relu zeros, coarse grid): ties go to the lower index.
                    for (int64_t t : top_indices_ordered(scores.data(), T, k)) topk[size_t(s)].push_back(int32_t(t));
                } else {
                    for (int64_t t : top_indices(scores.data(), T, k)) topk[size_t(s)].push_back(int32_t(t));
                }
            }
        });
        return topk;
    }

    void attention(const layer_weights &L, int layer, layer_state &ls, const float *x, int64_t p0, int64_t S,
                   float *out) const {
        const int64_t D = c_.dim, H = c_.n_heads, hd = c_.head_dim, W = c_.window;
        const int ratio = c_.ratio(layer);
        const bool csa = ratio > 0 && c_.is_index_source(layer);
        const rope_table &rt = rope_for(layer);
        std::vector<int64_t> pos(S), hpos(S * H);
        for (int64_t s = 0; s < S; s++) {
            pos[size_t(s)] = p0 + s;
            for (int64_t h = 0; h < H; h++) hpos[size_t(s * H + h)] = p0 + s;
        }

        // q = rope(rms_unweighted_per_head(wq_b(q_norm(wq_a(x))))); kv = rope(kv_norm(wkv(x))).
        std::vector<float> qr(S * c_.q_lora_rank), q(S * H * hd), kv(S * hd);
        linear(x, L.wq_a, qr.data(), S, c_.q_lora_rank, D, lin::FP8);
        norm(qr.data(), L.q_norm, S, c_.q_lora_rank);
        linear(qr.data(), L.wq_b, q.data(), S, H * hd, c_.q_lora_rank, lin::FP8);
        // transformers deviation (3): the per-head q norm in fp32 (reference, OFFICIAL: bf16).
        if (official_)
            cpu::rms_norm_unweighted_bf16(q.data(), S * H, hd, c_.norm_eps);
        else
            cpu::rms_norm(q.data(), nullptr, q.data(), S * H, hd, c_.norm_eps);
        rope(q.data(), S * H, hd, hpos.data(), rt, false);
        linear(x, L.wkv, kv.data(), S, hd, D, lin::FP8);
        norm(kv.data(), L.kv_norm, S, hd);
        rope(kv.data(), S, hd, pos.data(), rt, false);
        // transformers deviation (1): no FP8 QAT sim of kv[..., :nope] (block 64); OFFICIAL does
        // it after RoPE, the rope dims stay bf16.
        if (official_) cpu::fake_quant_fp8_ue8m0_cols(kv.data(), S, hd, hd - c_.rope_head_dim, KV_QAT_BLOCK);

        // Window keys: ring rows older than this chunk, then the chunk's own rows.
        std::vector<const float *> wkeys;
        std::vector<int64_t> wpos;
        for (int64_t slot = 0; slot < W; slot++)
            if (ls.ring_pos[size_t(slot)] >= 0 && ls.ring_pos[size_t(slot)] < p0) {
                wkeys.push_back(ls.ring.data() + slot * hd);
                wpos.push_back(ls.ring_pos[size_t(slot)]);
            }
        for (int64_t s = 0; s < S; s++) {
            wkeys.push_back(kv.data() + s * hd);
            wpos.push_back(p0 + s);
        }

        // Compressed branch: entries closed by this chunk are emitted before attention; query p
        // sees entries w < (p+1)/m: all of them (HCA) or the indexer's selection (CSA).
        std::vector<std::vector<int32_t>> topk;
        if (ratio > 0) {
            compress(L.comp, ls.comp, x, S, hd, ratio, csa, false);
            if (csa) topk = indexer(L, layer, ls, x, qr.data(), p0, S);
        }
        const float *centries = ls.comp.entries.data();

        // Attention with a per-head sink in the denominator (spec 3.4, eager_attention_forward).
        std::vector<float> o(S * H * hd);
        const float scale = 1.0f / std::sqrt(float(hd));
        const float *sink = L.attn_sink.f();
        // OFFICIAL: the reference's index list per query is [window | compressed]: the window part
        // chronological, -1-padded to its width (min(S, W) for a prefill from 0, W otherwise),
        // then the compressed entries; the kernel walks it in blocks of 64 (engine/attention_row). The padding
        // matters only in that it shifts the later entries' block boundaries.
        const int64_t wwidth = p0 == 0 ? std::min(S, W) : W;
        if (official_) {  // chronological window keys
            std::vector<size_t> order(wkeys.size());
            std::iota(order.begin(), order.end(), size_t(0));
            std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return wpos[a] < wpos[b]; });
            std::vector<const float *> k2;
            std::vector<int64_t> p2;
            for (size_t i : order) {
                k2.push_back(wkeys[i]);
                p2.push_back(wpos[i]);
            }
            wkeys.swap(k2);
            wpos.swap(p2);
        }
        parallel_for(S * H, [&](int64_t r0, int64_t r1) {
            std::vector<const float *> keys;
            attn_scratch scratch;
            for (int64_t r = r0; r < r1; r++) {
                const int64_t s = r / H, h = r % H, p = p0 + s;
                keys.clear();
                for (size_t i = 0; i < wkeys.size(); i++)
                    if (wpos[i] <= p && wpos[i] > p - W) keys.push_back(wkeys[i]);
                if (official_)
                    while (int64_t(keys.size()) < wwidth) keys.push_back(nullptr);
                if (csa) {
                    for (int32_t e : topk[size_t(s)]) keys.push_back(centries + e * hd);
                } else if (ratio > 0) {
                    const int64_t visible = std::min<int64_t>((p + 1) / ratio, ls.comp.n_entries);
                    for (int64_t e = 0; e < visible; e++) keys.push_back(centries + e * hd);
                }
                attend_row(q.data() + r * hd, keys, sink[h], scale, hd, official_, scratch, o.data() + r * hd);
            }
        });

        // Remember the window (after attention: the chunk's own rows were already visible).
        for (int64_t s = 0; s < S; s++) {
            const int64_t slot = (p0 + s) % W;
            std::copy(kv.data() + s * hd, kv.data() + (s + 1) * hd, ls.ring.data() + slot * hd);
            ls.ring_pos[size_t(slot)] = p0 + s;
        }

        // Inverse RoPE at the query position, then the grouped output projection.
        rope(o.data(), S * H, hd, hpos.data(), rt, true);
        grouped_output_projection(o.data(), S, H * hd, c_.o_groups, c_.o_lora_rank, L.wo_a, L.wo_b, D, official_,
                                  c_.fp8_block_in, out);
    }

    // ---- MoE (spec 3.9; transformers DeepseekV4SparseMoeBlock) ---------------------------------
    // Routed and shared experts (engine/expert.h). transformers deviation (5): the routing weight
    // scales w2's output (reference, OFFICIAL: the SwiGLU output before w2, in fp32).
    expert_numerics expert_nm(lin kind) const {
        expert_numerics nm;
        nm.official = official_;
        nm.act_block = c_.fp8_block_in;
        nm.kind = kind;
        nm.swiglu_limit = c_.swiglu_limit;
        nm.weight_after_w2 = !official_;
        return nm;
    }

    Status moe(const layer_weights &L, int layer, const float *x, const std::vector<int32_t> &tokens, int64_t S,
               float *out) const {
        const int64_t D = c_.dim, E = c_.n_routed_experts;
        const bool hash = layer < c_.n_hash_layers;
        std::vector<float> logits(S * E);
        cpu::matmul_nt(x, L.gate_w.f(), logits.data(), S, E, D);
        const cpu::route_table rt = v4::route(c_, logits.data(), S, hash ? L.tid2eid.data() : nullptr,
                                              hash ? nullptr : L.gate_bias.f(), tokens.data(), official_);
        // fp32 accumulator: the routed experts (local or remote, summed per row in increasing
        // expert id; TP partials in rank order), then the shared one; one rounding.
        // The shared expert runs while a remote layer's ranks work (start .. finish).
        std::vector<float> acc(S * D);
        DS41RT_RETURN_IF_ERROR(experts_->start(layer, expert_nm(lin::FP4), x, rt));
        if (c_.n_shared_experts > 0) {
            std::vector<float> sh(S * D);
            swiglu_expert(expert_nm(lin::FP8), L.sw1, L.sw2, L.sw3, x, S, D, nullptr, sh.data());
            DS41RT_RETURN_IF_ERROR(experts_->finish(acc.data()));
            for (int64_t i = 0; i < S * D; i++) out[i] = acc[size_t(i)] + sh[size_t(i)];
        } else {
            DS41RT_RETURN_IF_ERROR(experts_->finish(acc.data()));
            std::copy(acc.begin(), acc.end(), out);
        }
        rb(out, S * D);  // OFFICIAL: fp32 sum, bf16 MoE output
        return Status::ok();
    }

    // ---- one sequence chunk through the whole model (spec 3.1-3.10) ---------------------------
    Status forward(sequence_state &st, const std::vector<int32_t> &tokens, int64_t keep, float *logits) const override {
        const int64_t S = int64_t(tokens.size()), D = c_.dim, p0 = st.len;
        const int hc = c_.hc_mult;

        std::vector<float> X(S * hc * D);  // residual streams [S, hc, D], all equal to the embedding
        for (int64_t s = 0; s < S; s++)
            for (int j = 0; j < hc; j++)
                std::copy(w_.embed.f() + int64_t(tokens[size_t(s)]) * D, w_.embed.f() + (int64_t(tokens[size_t(s)]) + 1) * D,
                          X.data() + (s * hc + j) * D);
        rb(X.data(), S * hc * D);  // OFFICIAL: bf16 embedding (a no-op for bf16-stored tables)

        std::vector<float> x(S * D), y(S * D);
        for (int l = 0; l < c_.n_layers; l++) {
            const layer_weights &L = w_.layers[size_t(l)];
            layer_state &ls = st.layers[size_t(l)];

            hc_mixes am = mixes_at(X, S, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base);
            collapse(X, am.pre, S, x.data());
            norm(x.data(), L.attn_norm, S, D);
            attention(L, l, ls, x.data(), p0, S, y.data());
            expand(X, y.data(), am, S);

            hc_mixes fm = mixes_at(X, S, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base);
            collapse(X, fm.pre, S, x.data());
            norm(x.data(), L.ffn_norm, S, D);
            DS41RT_RETURN_IF_ERROR(moe(L, l, x.data(), tokens, S, y.data()));
            expand(X, y.data(), fm, S);
        }
        hc_head(X, S, x.data());
        norm(x.data(), w_.norm, S, D);
        linear(x.data() + (S - keep) * D, w_.head, logits, keep, c_.vocab_size, D, lin::F32);  // rows independent
        st.len += S;
        return Status::ok();
    }

    model::model_config c_;
    model_weights w_;
    std::unique_ptr<experts::routed_experts> experts_;
    engine_options opt_;
    bool official_ = opt_.mode == numerics::OFFICIAL;
    rope_table rope_main_, rope_compress_;
};

}  // namespace

Result<std::unique_ptr<engine>> make_v4_engine(const model::model_config &c, const weight_source &w,
                                               const engine_options &opt) {
    if (c.model_arch != model::arch::V4) return Status::invalid_argument("make_v4_engine: config is not deepseek_v4");
    model_weights mw;
    DS41RT_RETURN_IF_ERROR(load_weights(c, w, &mw));
    auto ex = experts::open(c, w, opt.remote);
    if (!ex) return ex.status();
    return std::unique_ptr<engine>(new v4_engine(c, std::move(mw), std::move(ex.value()), opt));
}

}  // namespace ds41rt::engine
