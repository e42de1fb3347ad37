// DeepSeek V4.1 Flash: the text forward pass on the CPU reference ops.
//
// Layout of this file, in the order a token meets it: weights, per-sequence state, the mHC
// hyper-connection helpers, Engram, attention (window, compressor, indexer, sparse attention,
// grouped output), MoE, and the step driver. Every formula cites the spec section it follows;
// where transformers and DeepSeek's reference differ, the TRANSFORMERS numerics follow
// transformers (spec section 10.2) and the difference is named.
//
// Deliberate deviation from DeepSeek's reference decode path (spec 4.5, 10.2 row 6): the
// reference republishes a KV source's index keys only on calls where a group closes, so its
// single-token decode at even positions scores against stale keys. We publish every source's
// running key cache on every call, the semantics training and prefill see (and transformers,
// vLLM, llama.cpp implement).
#include "engine/v41_model.h"

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
#include "engine/engram_hash.h"
#include "engine/mhc.h"
#include "engine/output_projection.h"
#include "engine/rope.h"
#include "engine/v41_steps.h"
#include "experts/routed_experts.h"

namespace ds41rt::engine {

namespace cpu = backend::cpu;
using cpu::expert_numerics;
using cpu::lin;
using cpu::linear_numerics;
using cpu::round_bf16_if;
using cpu::swiglu_expert;

namespace {

// ---- weights ------------------------------------------------------------------------------------
// Resolved once at load, as fp32 (dequantized from whatever the checkpoint stores).

struct layer_weights {
    Tensor attn_norm, ffn_norm;
    Tensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
    Tensor attn_sink, wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b;
    Tensor c_wkv, c_wgate, c_norm;                 // KV sources
    Tensor i_wk, i_k_norm, i_wq_b, i_weights_proj;  // index sources (wk, k_norm on KV sources)
    Tensor e_table, e_wkv, e_q, e_k;                // Engram layers
    Tensor gate_w, gate_bias;  // routed experts: experts::routed_experts
    Tensor sw1, sw2, sw3;
};

struct model_weights {
    Tensor embed, head, norm;
    std::vector<layer_weights> layers;
};

Status load_weights(const model::model_config &c, const weight_source &src, model_weights *w) {
    auto get = [&](const std::string &name, Tensor *out) { return fetch_weight(src, name, out); };
    DS41RT_RETURN_IF_ERROR(get("embed.weight", &w->embed));
    DS41RT_RETURN_IF_ERROR(get("head.weight", &w->head));
    DS41RT_RETURN_IF_ERROR(get("norm.weight", &w->norm));
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
            {"ffn.gate.weight", &L.gate_w},     {"ffn.gate.bias", &L.gate_bias},
            {"ffn.shared_experts.w1.weight", &L.sw1}, {"ffn.shared_experts.w2.weight", &L.sw2},
            {"ffn.shared_experts.w3.weight", &L.sw3},
        };
        for (auto &[name, t] : common) DS41RT_RETURN_IF_ERROR(get(p + name, t));
        if (c.is_kv_source(l)) {
            DS41RT_RETURN_IF_ERROR(get(p + "attn.compressor.wkv.weight", &L.c_wkv));
            DS41RT_RETURN_IF_ERROR(get(p + "attn.compressor.norm.weight", &L.c_norm));
            if (c.ratio(l) > 1) DS41RT_RETURN_IF_ERROR(get(p + "attn.compressor.wgate.weight", &L.c_wgate));
            DS41RT_RETURN_IF_ERROR(get(p + "attn.indexer.wk.weight", &L.i_wk));
            DS41RT_RETURN_IF_ERROR(get(p + "attn.indexer.k_norm.weight", &L.i_k_norm));
        }
        if (c.is_index_source(l)) {
            DS41RT_RETURN_IF_ERROR(get(p + "attn.indexer.wq_b.weight", &L.i_wq_b));
            DS41RT_RETURN_IF_ERROR(get(p + "attn.indexer.weights_proj.weight", &L.i_weights_proj));
        }
        if (c.has_engram(l)) {
            DS41RT_RETURN_IF_ERROR(get(p + "engram.embed.weight", &L.e_table));
            DS41RT_RETURN_IF_ERROR(get(p + "engram.wkv.weight", &L.e_wkv));
            DS41RT_RETURN_IF_ERROR(get(p + "engram.q_weight", &L.e_q));
            DS41RT_RETURN_IF_ERROR(get(p + "engram.k_weight", &L.e_k));
        }
    }
    return Status::ok();
}

// ---- per-sequence state -------------------------------------------------------------------------
// The window ring holds the last `window` KV rows of every layer (tagged with their positions);
// a KV source holds its partial compression group and every entry and index key emitted so far.

struct source_state {
    std::vector<float> buf_kv, buf_gate;  // [n_buf, head_dim] pending tokens of an open group
    int64_t n_buf = 0;
    std::vector<float> entries;           // [n_entries, head_dim]: RoPE'd, FP4-simulated
    std::vector<float> index_keys;        // [n_entries, index_head_dim]
    int64_t n_entries = 0;
};

struct sequence_state {
    int64_t len = 0;
    std::vector<std::vector<float>> ring;       // per layer [window, head_dim]
    std::vector<std::vector<int64_t>> ring_pos;  // per layer [window], -1 = empty
    std::map<int, source_state> sources;        // by KV-source layer
    std::vector<int64_t> engram_history;        // compressed id per position
};

// What one forward hands down the layer stack (spec 4.5): the latest index selection per query
// and the candidate mask of the candidate source.
struct shared_state {
    bool has_topk = false;
    std::vector<std::vector<int32_t>> topk;     // per query: selected compressed entries
    bool has_candidates = false;
    std::vector<std::vector<uint8_t>> candidates;  // per query [T]
};

class v41_engine final : public cpu_engine<sequence_state> {
public:
    v41_engine(model::model_config c, model_weights w, std::unique_ptr<experts::routed_experts> ex, engram_hasher h,
               bool has_engram, engine_options opt)
        : c_(std::move(c)), w_(std::move(w)), experts_(std::move(ex)), hasher_(std::move(h)), has_engram_(has_engram),
          opt_(std::move(opt)),
          rope_main_(make_rope_table(c_, false)), rope_compress_(make_rope_table(c_, true)) {}

    const model::model_config &config() const override { return c_; }

    sequence_state new_state() const override {
        sequence_state s;
        s.ring.assign(c_.n_layers, std::vector<float>(size_t(c_.window) * size_t(c_.head_dim), 0.0f));
        s.ring_pos.assign(c_.n_layers, std::vector<int64_t>(size_t(c_.window), -1));
        for (int l = 0; l < c_.n_layers; l++)
            if (c_.is_kv_source(l)) s.sources[l] = source_state{};
        return s;
    }

private:
    // ---- mHC (spec 4.2; engine/mhc.h) -------------------------------------------------------
    // TRANSFORMERS normalizes the streams before the mix projection, OFFICIAL folds the RMS in
    // after it, as the reference does.
    hc_mixes mixes_at(const std::vector<float> &X, int64_t S, const Tensor &fn, const Tensor &scale,
                      const Tensor &base) const {
        const int hc = c_.hc_mult;
        const int64_t n_mix = int64_t(2 + hc) * hc;
        std::vector<float> m(S * n_mix);
        hc_project(X.data(), S, int64_t(hc) * c_.dim, fn, n_mix, c_.norm_eps, official_, m.data());
        return hc_split_sinkhorn(m.data(), S, hc, scale.f(), base.f(), c_.hc_eps, c_.hc_sinkhorn_iters);
    }

    // x = bf16(sum_j pre_j X_j) (OFFICIAL rounds; TRANSFORMERS keeps fp32).
    void collapse(const std::vector<float> &X, const std::vector<float> &pre, int64_t S, float *x) const {
        hc_collapse(X.data(), pre.data(), S, c_.hc_mult, c_.dim, x);
        rb(x, S * c_.dim);
    }

    // The streams after a sublayer: post * y + comb^T X, bf16 under OFFICIAL.
    void expand(std::vector<float> &X, const float *y, const hc_mixes &mx, int64_t S) const {
        hc_expand(X.data(), y, mx, S, c_.hc_mult, c_.dim);
        rb(X.data(), S * c_.hc_mult * c_.dim);
    }

    // ---- Engram (spec 4.9) ---------------------------------------------------------------------
    void engram(const layer_weights &L, int k, sequence_state &st, int64_t p0, int64_t S, std::vector<float> &X) const {
        const int hc = c_.hc_mult;
        const int64_t D = c_.dim, ehd = c_.engram_head_dim, ncols = hasher_.n_cols();
        const int64_t in_w = ncols * ehd, out_w = int64_t(hc + 1) * D;
        std::vector<float> rows(S * in_w), kv(S * out_w);
        std::vector<int64_t> ids(ncols);
        for (int64_t s = 0; s < S; s++) {
            hasher_.hash(st.engram_history, p0 + s, k, ids.data());
            for (int64_t col = 0; col < ncols; col++) {
                const float *src = L.e_table.f() + ids[size_t(col)] * ehd;
                std::copy(src, src + ehd, rows.data() + s * in_w + col * ehd);
            }
        }
        linear(rows.data(), L.e_wkv, kv.data(), S, out_w, in_w, lin::FP8);
        v41::engram_gate(X.data(), kv.data(), L.e_q.f(), L.e_k.f(), S, hc, D, c_.norm_eps, official_);
    }

    // ---- attention (spec 4.3-4.8) ----------------------------------------------------------------
    const rope_table &rope_for(int layer) const { return c_.ratio(layer) > 0 ? rope_compress_ : rope_main_; }

    // Rotates the last rope_head_dim channels of n rows of width dim, one position per row.
    void rope(float *x, int64_t n, int64_t dim, const int64_t *pos, const rope_table &t, bool inverse) const {
        rope_rows(x, n, dim, pos, t, inverse);
        rb(x, n * dim);  // OFFICIAL: fp32 rotation written back into the bf16 tensor
    }

    // ---- numerics ----------------------------------------------------------------------------
    // OFFICIAL rounds to bf16 where DeepSeek's reference does (its default dtype is bf16) and
    // quantizes activations per 32 channels to FP8 before FP8/FP4 matmuls; TRANSFORMERS (fp32)
    // does neither. Every call site names its linear's class from the spec (section 3).
    void rb(float *p, int64_t n) const { round_bf16_if(official_, p, n); }

    // y[m, n] = x[m, k] . w[n, k]^T with the numerics of the weight's class (engine/numerics.h).
    void linear(const float *x, const Tensor &w, float *y, int64_t m, int64_t n, int64_t k, lin kind) const {
        linear(x, w.f(), y, m, n, k, kind);
    }
    void linear(const float *x, const float *w, float *y, int64_t m, int64_t n, int64_t k, lin kind) const {
        linear_numerics(official_, c_.fp8_block_in, x, w, y, m, n, k, kind);
    }

    void norm(float *x, const Tensor &w, int64_t rows, int64_t dim) const {
        cpu::rms_norm(x, w.f(), x, rows, dim, c_.norm_eps);
        rb(x, rows * dim);
    }

    // The compressor of a KV source (spec 4.4): returns the pre-RoPE latents of the groups that
    // complete in this call and the position of the first one's first token.
    std::vector<float> compress(const layer_weights &L, int layer, source_state &src, const float *x, int64_t S,
                                int64_t *first_pos) const {
        const int ratio = c_.ratio(layer);
        const int64_t D = c_.dim, hd = c_.head_dim;
        *first_pos = src.n_entries * ratio;
        std::vector<float> kv(S * hd);
        if (ratio == 1) {  // bf16 projection, no pooling
            linear(x, L.c_wkv, kv.data(), S, hd, D, lin::BF16);
            norm(kv.data(), L.c_norm, S, hd);
            return kv;
        }
        linear(x, L.c_wkv, kv.data(), S, hd, D, lin::F32);  // ratio 2 pools in fp32
        std::vector<float> gate(S * hd);
        linear(x, L.c_wgate, gate.data(), S, hd, D, lin::F32);
        src.buf_kv.insert(src.buf_kv.end(), kv.begin(), kv.end());
        src.buf_gate.insert(src.buf_gate.end(), gate.begin(), gate.end());
        src.n_buf += S;
        const int64_t groups = src.n_buf / ratio;
        std::vector<float> latent(groups * hd);
        v41::compress_pool(src.buf_kv.data(), src.buf_gate.data(), groups, ratio, hd, latent.data());
        const size_t used = size_t(groups * ratio * hd);
        src.buf_kv.erase(src.buf_kv.begin(), src.buf_kv.begin() + long(used));
        src.buf_gate.erase(src.buf_gate.begin(), src.buf_gate.begin() + long(used));
        src.n_buf -= groups * ratio;
        rb(latent.data(), groups * hd);
        norm(latent.data(), L.c_norm, groups, hd);
        return latent;
    }

    // The lightning indexer of an index source (spec 4.6, 4.7). Publishes index keys (owners),
    // then the top-k selection per query (and, at the candidate source, the candidate mask).
    void indexer(const layer_weights &L, int layer, sequence_state &st, const float *x, const float *qr,
                 const std::vector<float> &latent, int64_t n_latent, int64_t first_pos, int64_t p0, int64_t S,
                 shared_state &sh) const {
        const int ratio = c_.ratio(layer);
        const int64_t ihd = c_.index_head_dim, ih = c_.index_n_heads, hd = c_.head_dim;
        source_state &src = st.sources.at(c_.kv_source_for(layer));
        if (c_.is_kv_source(layer) && n_latent > 0) {
            std::vector<float> k(n_latent * ihd);
            linear(latent.data(), L.i_wk, k.data(), n_latent, ihd, hd, lin::BF16);
            norm(k.data(), L.i_k_norm, n_latent, ihd);
            std::vector<int64_t> pos(n_latent);
            for (int64_t g = 0; g < n_latent; g++) pos[size_t(g)] = first_pos + ratio * g;
            rope(k.data(), n_latent, ihd, pos.data(), rope_compress_, false);
            if (ihd % 32 == 0) cpu::fake_quant_fp4_ue8m0(k.data(), n_latent, ihd, 32);
            src.index_keys.insert(src.index_keys.end(), k.begin(), k.end());
        }
        const int64_t T = int64_t(src.index_keys.size()) / ihd;
        if (T == 0) return;  // nothing to select yet; earlier selections stay published

        std::vector<float> q(S * ih * ihd), w(S * ih);
        linear(qr, L.i_wq_b, q.data(), S, ih * ihd, c_.q_lora_rank, lin::FP8);
        std::vector<int64_t> qpos(S * ih);
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < ih; h++) qpos[size_t(s * ih + h)] = p0 + s;
        rope(q.data(), S * ih, ihd, qpos.data(), rope_compress_, false);
        if (ihd % 32 == 0) cpu::fake_quant_fp4_ue8m0(q.data(), S * ih, ihd, 32);
        linear(x, L.i_weights_proj, w.data(), S, ih, c_.dim, lin::BF16);
        std::vector<float> scores(S * T);
        v41::index_scores(q.data(), src.index_keys.data(), w.data(), S, T, ih, ihd, p0, ratio, official_, scores.data());

        if (layer == c_.candidate_source_layer) {
            sh.has_candidates = true;
            sh.candidates = v41::candidate_mask(c_, scores.data(), S, T, p0, ratio, official_);
        } else if (c_.candidate_source_layer >= 0 && layer > c_.candidate_source_layer && sh.has_candidates) {
            v41::apply_candidate_mask(sh.candidates, S, T, scores.data());
        }

        const int64_t k = std::min<int64_t>(c_.index_topk, T);
        sh.has_topk = true;
        sh.topk.assign(size_t(S), {});
        for (int64_t s = 0; s < S; s++)
            for (int64_t t : v41::select_top(scores.data() + s * T, T, k, official_)) sh.topk[size_t(s)].push_back(int32_t(t));
    }

    void attention(const layer_weights &L, int layer, sequence_state &st, const float *x, int64_t p0, int64_t S,
                   shared_state &sh, float *out) const {
        const int64_t D = c_.dim, H = c_.n_heads, hd = c_.head_dim, W = c_.window;
        const rope_table &rt = rope_for(layer);
        std::vector<int64_t> pos(S), hpos(S * H);
        for (int64_t s = 0; s < S; s++) {
            pos[size_t(s)] = p0 + s;
            for (int64_t h = 0; h < H; h++) hpos[size_t(s * H + h)] = p0 + s;
        }

        std::vector<float> qr(S * c_.q_lora_rank), q(S * H * hd), kv(S * hd);
        linear(x, L.wq_a, qr.data(), S, c_.q_lora_rank, D, lin::FP8);
        norm(qr.data(), L.q_norm, S, c_.q_lora_rank);
        linear(qr.data(), L.wq_b, q.data(), S, H * hd, c_.q_lora_rank, lin::FP8);
        rope(q.data(), S * H, hd, hpos.data(), rt, false);
        linear(x, L.wkv, kv.data(), S, hd, D, lin::FP8);
        norm(kv.data(), L.kv_norm, S, hd);
        rope(kv.data(), S, hd, pos.data(), rt, false);
        if (hd % 32 == 0) cpu::fake_quant_fp8_ue8m0(kv.data(), S, hd, 32);  // window-KV cache QAT

        // Window keys in chronological order (so a prefill and a decode sum in the same order):
        // ring rows older than this chunk, then the chunk's own rows.
        std::vector<const float *> wkeys;
        std::vector<int64_t> wpos;
        auto &ring = st.ring[size_t(layer)];
        auto &rpos = st.ring_pos[size_t(layer)];
        for (int64_t q = std::max<int64_t>(0, p0 - W); q < p0; q++)
            if (rpos[size_t(q % W)] == q) {
                wkeys.push_back(ring.data() + (q % W) * hd);
                wpos.push_back(q);
            }
        for (int64_t s = 0; s < S; s++) {
            wkeys.push_back(kv.data() + s * hd);
            wpos.push_back(p0 + s);
        }

        // Compressed branch.
        const float *centries = nullptr;
        if (c_.ratio(layer) > 0) {
            source_state &src = st.sources.at(c_.kv_source_for(layer));
            std::vector<float> latent;
            int64_t first_pos = 0, n_latent = 0;
            if (c_.is_kv_source(layer)) {
                latent = compress(L, layer, src, x, S, &first_pos);
                n_latent = int64_t(latent.size()) / hd;
            }
            if (c_.is_index_source(layer)) indexer(L, layer, st, x, qr.data(), latent, n_latent, first_pos, p0, S, sh);
            if (n_latent > 0) {
                std::vector<int64_t> lpos(n_latent);
                for (int64_t g = 0; g < n_latent; g++) lpos[size_t(g)] = first_pos + c_.ratio(layer) * g;
                rope(latent.data(), n_latent, hd, lpos.data(), rope_compress_, false);
                if (hd % 16 == 0) cpu::fake_quant_fp4_e4m3(latent.data(), n_latent, hd, 16);
                src.entries.insert(src.entries.end(), latent.begin(), latent.end());
                src.n_entries += n_latent;
            }
            if (src.n_entries > 0) centries = src.entries.data();
        }

        // Sparse attention with a per-head sink in the denominator (spec 3, sparse_attn).
        std::vector<float> o(S * H * hd);
        const float scale = 1.0f / std::sqrt(float(hd));
        const float *sink = L.attn_sink.f();
        parallel_for(S * H, [&](int64_t r0, int64_t r1) {
            std::vector<const float *> keys;
            attn_scratch scratch;
            for (int64_t r = r0; r < r1; r++) {
                const int64_t s = r / H, h = r % H, p = p0 + s;
                keys.clear();
                for (size_t i = 0; i < wkeys.size(); i++)
                    if (wpos[i] <= p && wpos[i] > p - W) keys.push_back(wkeys[i]);
                if (official_)  // the reference's index list keeps the window's width; -1 pads it
                    while (int64_t(keys.size()) < W) keys.push_back(nullptr);
                if (centries && sh.has_topk)
                    for (int32_t e : sh.topk[size_t(s)]) keys.push_back(centries + e * hd);
                attend_row(q.data() + r * hd, keys, sink[h], scale, hd, official_, scratch, o.data() + r * hd);
            }
        });

        // Remember the window (after attention: the chunk's own rows were already visible).
        for (int64_t s = 0; s < S; s++) {
            const int64_t slot = (p0 + s) % W;
            std::copy(kv.data() + s * hd, kv.data() + (s + 1) * hd, ring.data() + slot * hd);
            rpos[size_t(slot)] = p0 + s;
        }

        // Inverse RoPE at the query position, then the grouped output projection.
        rope(o.data(), S * H, hd, hpos.data(), rt, true);
        grouped_output_projection(o.data(), S, H * hd, c_.o_groups, c_.o_lora_rank, L.wo_a, L.wo_b, D, official_,
                                  c_.fp8_block_in, out);
    }

    // ---- MoE (spec 4.10) ----------------------------------------------------------------------
    expert_numerics expert_nm(lin kind) const {
        expert_numerics nm;
        nm.official = official_;
        nm.act_block = c_.fp8_block_in;
        nm.kind = kind;
        nm.swiglu_limit = c_.swiglu_limit;
        return nm;
    }

    Status moe(const layer_weights &L, int layer, const float *x, int64_t S, float *out) const {
        const int64_t D = c_.dim;
        std::vector<float> logits(S * c_.n_routed_experts);
        cpu::matmul_nt(x, L.gate_w.f(), logits.data(), S, c_.n_routed_experts, D);
        const cpu::route_table rt = v41::route(c_, logits.data(), L.gate_bias.f(), S);
        // fp32 accumulator: the routed experts (local or remote, summed per row in increasing
        // expert id; TP partials in rank order), then the shared one; one rounding.
        // The shared expert runs while a remote layer's ranks work (start .. finish).
        std::vector<float> acc(S * D);
        DS41RT_RETURN_IF_ERROR(experts_->start(layer, expert_nm(lin::FP4), x, rt));
        std::vector<float> sh(S * D);
        swiglu_expert(expert_nm(lin::FP8), L.sw1, L.sw2, L.sw3, x, S, D, nullptr, sh.data());
        DS41RT_RETURN_IF_ERROR(experts_->finish(acc.data()));
        for (int64_t i = 0; i < S * D; i++) out[i] = acc[size_t(i)] + sh[size_t(i)];
        rb(out, S * D);
        return Status::ok();
    }

    // ---- one sequence chunk through the whole model (spec 4.1) ---------------------------------
    Status forward(sequence_state &st, const std::vector<int32_t> &tokens, int64_t keep, float *logits) const override {
        const int64_t S = int64_t(tokens.size()), D = c_.dim, p0 = st.len;
        const int hc = c_.hc_mult;
        if (has_engram_)
            for (int32_t t : tokens) st.engram_history.push_back(hasher_.compressed(t));

        std::vector<float> X(S * hc * D);  // residual streams [S, hc, D]
        for (int64_t s = 0; s < S; s++)
            for (int j = 0; j < hc; j++)
                std::copy(w_.embed.f() + int64_t(tokens[size_t(s)]) * D, w_.embed.f() + (int64_t(tokens[size_t(s)]) + 1) * D,
                          X.data() + (s * hc + j) * D);
        std::vector<float> pre_mix(S * hc, 0.0f);  // one-hot: the first site reads stream 0
        for (int64_t s = 0; s < S; s++) pre_mix[size_t(s * hc)] = 1.0f;

        shared_state sh;
        std::vector<float> x(S * D), y(S * D);
        int engram_k = 0;
        for (int l = 0; l < c_.n_layers; l++) {
            const layer_weights &L = w_.layers[size_t(l)];
            if (c_.has_engram(l)) engram(L, engram_k++, st, p0, S, X);

            hc_mixes am = mixes_at(X, S, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base);
            collapse(X, pre_mix, S, x.data());
            norm(x.data(), L.attn_norm, S, D);
            attention(L, l, st, x.data(), p0, S, sh, y.data());
            expand(X, y.data(), am, S);

            hc_mixes fm = mixes_at(X, S, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base);
            collapse(X, am.pre, S, x.data());
            norm(x.data(), L.ffn_norm, S, D);
            DS41RT_RETURN_IF_ERROR(moe(L, l, x.data(), S, y.data()));
            expand(X, y.data(), fm, S);
            pre_mix = std::move(fm.pre);
        }
        collapse(X, pre_mix, S, x.data());
        norm(x.data(), w_.norm, S, D);
        cpu::matmul_nt(x.data() + (S - keep) * D, w_.head.f(), logits, keep, c_.vocab_size, D);  // rows independent
        st.len += S;
        return Status::ok();
    }

    model::model_config c_;
    model_weights w_;
    std::unique_ptr<experts::routed_experts> experts_;
    engram_hasher hasher_;
    bool has_engram_;
    engine_options opt_;
    bool official_ = opt_.mode == numerics::OFFICIAL;
    rope_table rope_main_, rope_compress_;
};

}  // namespace

Result<std::unique_ptr<engine>> make_v41_engine(const model::model_config &c, const weight_source &w,
                                                const engram_tables &tables, const engine_options &opt) {
    model_weights mw;
    DS41RT_RETURN_IF_ERROR(load_weights(c, w, &mw));
    engram_hasher h;
    const bool has_engram = !c.engram_layer_ids.empty();
    if (has_engram) {
        auto r = engram_hasher::make(c, tables.token_map, tables.multipliers);
        if (!r) return r.status();
        h = std::move(r.value());
    }
    auto ex = experts::open(c, w, opt.remote);
    if (!ex) return ex.status();
    return std::unique_ptr<engine>(new v41_engine(c, std::move(mw), std::move(ex.value()), std::move(h), has_engram, opt));
}

}  // namespace ds41rt::engine
