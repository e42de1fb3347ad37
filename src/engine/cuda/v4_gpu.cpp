// DeepSeek V4 Flash on the GPU: the forward pass of engine/v4_model.cpp with its tensor ops on
// the device, step for step in the same order and with the same rounding points, so the CPU
// reference is this engine's oracle (tests/cuda_engine). Built as engine/cuda/v41_gpu.cpp is:
// weights as the checkpoint stores them (device_model), all sequences of a step as one set of
// rows (step_rows): the row-wise ops (projections, norms, mHC, RoPE, QAT, attention, MoE) over
// every row at once, the state-owning steps (window pooling, index scores and selection,
// window ring) sequence by sequence, each as one launch over all sequences where it can be.
//
// Sequence state: the window ring of every layer, the compressors' open windows
// (v4_compressor: the rows of windows not yet closed, pooled on the device when they close) and
// the compressed entries / index keys live on the device, the rings and the entries in the
// engine's page_pool (a ring a page; a compressor's entries a page per PAGE_TOKENS tokens): fp32
// rows, but for OFFICIAL's index keys, FP4 records (they are FP4-quantized there, so exactly),
// and OFFICIAL's window rows and entries as FP8 + bf16-tail records (DS41RT_PACKED_KV=0: fp32).
//
// What runs on the host, on rows brought back (a synchronisation): TRANSFORMERS' index scores
// (torch's tie order has no GPU twin; OFFICIAL's top-k and the picked entries of the attention
// key lists stay on the device, key_lists.h).
// The router (v4_steps route()'s twin on the device: hash layers via tid2eid, the biased top-k
// for the rest) and the routed experts (routed_decode) keep the routes on the device. Decode
// steps of up to 16 rows replay CUDA graphs of their fixed-shape pieces as v41_gpu does.
// Differences from v4_model.cpp in arithmetic (all fp32 summation order): the GEMV / dense
// products, the index-score dots (fp64 on the device, a sequential fp32 sum on the host) and
// the gate logits (fp32 on the device, fp64 sums on the host).
#include "engine/cuda/v4_gpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/indexer.cuh"
#include "backend/cuda/mhc.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/router.cuh"
#include "backend/cuda/topk.cuh"
#include "backend/cpu/ops.h"
#include "engine/cpu_engine.h"
#include "engine/cuda/gpu_engine.h"
#include "engine/cuda/key_lists.h"
#include "engine/cuda/page_pool.h"
#include "engine/cuda/paged_rows.h"
#include "engine/cuda/section_timer.h"
#include "engine/cuda/side_branch.h"
#include "engine/cuda/routed_decode.h"
#include "engine/cuda/routed_prefill.h"
#include "engine/cuda/step_bufs.h"
#include "engine/cuda/step_rows.h"
#include "engine/cuda/v4_compressor.h"
#include "engine/rope.h"
#include "engine/topk.h"
#include "engine/v4_steps.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;
using backend::cpu::lin;

namespace {

constexpr int64_t KV_QAT_BLOCK = 64;   // FP8 QAT of the nope dims (spec 3.4, 3.5)
constexpr int64_t FP4_QAT_BLOCK = 32;  // FP4 QAT of indexer q / keys (spec 2.1)

// ---- weights on the device -------------------------------------------------------------------

struct compressor_dev {
    dlinear wkv, wgate;          // [c*d, D]
    const float *norm = nullptr;  // [d]
    const float *ape = nullptr;   // [m, c*d]
};

struct layer_dev {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
    const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
    const float *attn_sink = nullptr, *q_norm = nullptr, *kv_norm = nullptr;
    dlinear wq_a, wq_b, wkv, wo_a, wo_b;
    compressor_dev comp;   // ratio > 0 (CSA and HCA)
    compressor_dev icomp;  // CSA: the indexer's own compressor
    dlinear i_wq_b, i_weights_proj;
    dlinear gate_w;
    const float *gate_bias = nullptr;  // learned-routing layers: [E]
    const int32_t *tid2eid = nullptr;  // hash layers: [vocab, n_activated_experts]
    dlinear sw1, sw2, sw3;
    cuda::moe_layer moe;
};

// ---- sequence state ----------------------------------------------------------------------------


// One compressor's state in one sequence: the main compressor's entries are attention keys
// (key_store, fp32 rows), the indexer's are its keys (index_key_store: under OFFICIAL, where they
// are FP4-quantized after the Hadamard rotation, FP4 + E8M0 records, 68 bytes against 512).
template <class Store>
struct comp_state {
    v4_open_windows open;  // the rows of the windows not yet closed
    Store entries;         // normed, RoPE'd (and QAT'd under OFFICIAL) entries
};
using comp_seq = comp_state<key_store>;
using icomp_seq = comp_state<index_key_store>;

struct seq_dev {
    int64_t len = 0;
    std::vector<window_ring> ring;      // per layer, made by the sequence's first step (rings())
    std::vector<comp_seq> comp;    // per layer (used where ratio > 0)
    std::vector<icomp_seq> icomp;  // per layer (used where CSA)
};

// One sequence's indexer picks for the rows of a step: on the device (OFFICIAL: [n, k] and
// counts, read where the key lists are built) or on the host (TRANSFORMERS).
struct seq_picks {
    std::vector<std::vector<int32_t>> host;
    const int32_t *idx = nullptr, *cnt = nullptr;
    int k = 0;
};

using step_rows = gpu::step_rows<seq_dev>;

class v4_gpu final : public gpu_engine<seq_dev> {
public:
    v4_gpu(std::unique_ptr<device_model> m, bool profile)
        : m_(std::move(m)), pages_(std::make_unique<page_pool>(m_->stream())), c_(m_->config()), official_(m_->official()),
          prof_(profile), products_(profile) {
        m_->set_product_timer(&products_);
        if (const char *e = std::getenv("DS41RT_DEVICE_KEY_LISTS")) device_key_lists_ = std::string(e) != "0";
        if (const char *e = std::getenv("DS41RT_PACKED_INDEX_KEYS")) packed_keys_ = std::string(e) != "0";
        if (const char *e = std::getenv("DS41RT_PACKED_KV")) packed_kv_ = std::string(e) != "0";
    }
    // The sequences' device state is freed on the model's stream, which must outlive it.
    ~v4_gpu() override { clear_sequences(); }

    Status load() {
        auto &m = *m_;
        auto lin_ = [&](const std::string &n, dlinear *out) { return m.linear(n).move_to(out); };
        auto vec_ = [&](const std::string &n, const float **out) { return m.vec(n).move_to(out); };
        auto host_ = [&](const std::string &n, Tensor *out) { return m.host_f32(n).move_to(out); };
        const int64_t D = c_.dim, hc = c_.hc_mult;
        auto emb = m.bf16_table("embed.weight");
        if (!emb) return emb.status();
        embed_ = emb.value();
        DS41RT_RETURN_IF_ERROR(lin_("head.weight", &head_));
        DS41RT_RETURN_IF_ERROR(vec_("norm.weight", &norm_));
        DS41RT_RETURN_IF_ERROR(vec_("hc_head_fn", &hc_head_fn_));
        DS41RT_RETURN_IF_ERROR(vec_("hc_head_base", &hc_head_base_));
        DS41RT_RETURN_IF_ERROR(vec_("hc_head_scale", &hc_head_scale_));
        auto hfs = m.shape("hc_head_fn");
        if (!hfs) return hfs.status();
        if (hfs.value() != shape_t{hc, hc * D})
            return Status::invalid_argument("hc_head_fn: shape " + shape_str(hfs.value()) + ", expected " +
                                            shape_str(shape_t{hc, hc * D}));
        auto hbs = m.shape("hc_head_base"), hss = m.shape("hc_head_scale");
        if (!hbs) return hbs.status();
        if (!hss) return hss.status();
        if (shape_numel(hbs.value()) != hc || shape_numel(hss.value()) < 1)
            return Status::invalid_argument("hc_head_base / hc_head_scale: expected [" + std::to_string(hc) + "] / [1]");
        const rope_table rm = make_rope_table(c_, false), rc = make_rope_table(c_, true);
        n_pairs_ = rm.n_pairs;
        auto f1 = m.upload(rm.inv_freq.data(), rm.inv_freq.size() * sizeof(float));
        auto f2 = m.upload(rc.inv_freq.data(), rc.inv_freq.size() * sizeof(float));
        if (!f1) return f1.status();
        if (!f2) return f2.status();
        inv_main_ = static_cast<const float *>(f1.value());
        inv_compress_ = static_cast<const float *>(f2.value());

        layers_.resize(size_t(c_.n_layers));
        for (int l = 0; l < c_.n_layers; l++) {
            layer_dev &L = layers_[size_t(l)];
            const std::string p = "layers." + std::to_string(l) + ".";
            const std::pair<const char *, const float **> vecs[] = {
                {"attn_norm.weight", &L.attn_norm}, {"ffn_norm.weight", &L.ffn_norm},
                {"hc_attn_fn", &L.hc_attn_fn},      {"hc_attn_base", &L.hc_attn_base},
                {"hc_attn_scale", &L.hc_attn_scale}, {"hc_ffn_fn", &L.hc_ffn_fn},
                {"hc_ffn_base", &L.hc_ffn_base},    {"hc_ffn_scale", &L.hc_ffn_scale},
                {"attn.attn_sink", &L.attn_sink},   {"attn.q_norm.weight", &L.q_norm},
                {"attn.kv_norm.weight", &L.kv_norm},
            };
            for (auto &[n, out] : vecs) DS41RT_RETURN_IF_ERROR(vec_(p + n, out));
            const std::pair<const char *, dlinear *> lins[] = {
                {"attn.wq_a.weight", &L.wq_a}, {"attn.wq_b.weight", &L.wq_b}, {"attn.wkv.weight", &L.wkv},
                {"attn.wo_a.weight", &L.wo_a}, {"attn.wo_b.weight", &L.wo_b}, {"ffn.gate.weight", &L.gate_w},
            };
            for (auto &[n, out] : lins) DS41RT_RETURN_IF_ERROR(lin_(p + n, out));
            auto load_comp = [&](const std::string &cp, int64_t d, bool overlap, compressor_dev *cw) -> Status {
                DS41RT_RETURN_IF_ERROR(lin_(cp + "wkv.weight", &cw->wkv));
                DS41RT_RETURN_IF_ERROR(lin_(cp + "wgate.weight", &cw->wgate));
                DS41RT_RETURN_IF_ERROR(vec_(cp + "norm.weight", &cw->norm));
                Tensor ape;
                DS41RT_RETURN_IF_ERROR(host_(cp + "ape", &ape));
                const int64_t cd = (overlap ? 2 : 1) * d;
                if (cw->wkv.N != cd || cw->wkv.K != D || cw->wgate.N != cd || cw->wgate.K != D)
                    return Status::invalid_argument(cp + "wkv.weight / wgate.weight: expected [" + std::to_string(cd) +
                                                    ", " + std::to_string(D) + "]");
                if (ape.shape() != shape_t{int64_t(c_.ratio(l)), cd})
                    return Status::invalid_argument(cp + "ape: shape " + shape_str(ape.shape()) + ", expected " +
                                                    shape_str(shape_t{int64_t(c_.ratio(l)), cd}));
                auto up = m_->upload(ape.f(), size_t(ape.numel()) * sizeof(float));
                if (!up) return up.status();
                cw->ape = static_cast<const float *>(up.value());
                return Status::ok();
            };
            const bool csa = c_.ratio(l) > 0 && c_.is_index_source(l);
            if (c_.ratio(l) > 0) DS41RT_RETURN_IF_ERROR(load_comp(p + "attn.compressor.", c_.head_dim, csa, &L.comp));
            if (csa) {
                DS41RT_RETURN_IF_ERROR(load_comp(p + "attn.indexer.compressor.", c_.index_head_dim, true, &L.icomp));
                DS41RT_RETURN_IF_ERROR(lin_(p + "attn.indexer.wq_b.weight", &L.i_wq_b));
                DS41RT_RETURN_IF_ERROR(lin_(p + "attn.indexer.weights_proj.weight", &L.i_weights_proj));
            }
            if (l < c_.n_hash_layers) {
                Tensor t;
                DS41RT_RETURN_IF_ERROR(host_(p + "ffn.gate.tid2eid", &t));
                if (t.shape() != shape_t{c_.vocab_size, int64_t(c_.n_activated_experts)})
                    return Status::invalid_argument(p + "ffn.gate.tid2eid: shape " + shape_str(t.shape()));
                std::vector<int32_t> ids(static_cast<size_t>(t.numel()));
                for (int64_t i = 0; i < t.numel(); i++) {
                    const float v = t.f()[i];
                    if (!(v >= 0 && v < float(c_.n_routed_experts)) || v != std::floor(v))
                        return Status::invalid_argument(p + "ffn.gate.tid2eid: entry " + std::to_string(i) +
                                                        " is not an expert id");
                    ids[size_t(i)] = int32_t(v);
                }
                auto up = m_->upload(ids.data(), ids.size() * sizeof(int32_t));
                if (!up) return up.status();
                L.tid2eid = static_cast<const int32_t *>(up.value());
            } else {
                Tensor bias;
                DS41RT_RETURN_IF_ERROR(host_(p + "ffn.gate.bias", &bias));
                if (bias.numel() != c_.n_routed_experts)
                    return Status::invalid_argument(p + "ffn.gate.bias: shape " + shape_str(bias.shape()));
                DS41RT_RETURN_IF_ERROR(vec_(p + "ffn.gate.bias", &L.gate_bias));
            }
            if (c_.n_shared_experts > 0) {
                DS41RT_RETURN_IF_ERROR(lin_(p + "ffn.shared_experts.w1.weight", &L.sw1));
                DS41RT_RETURN_IF_ERROR(lin_(p + "ffn.shared_experts.w2.weight", &L.sw2));
                DS41RT_RETURN_IF_ERROR(lin_(p + "ffn.shared_experts.w3.weight", &L.sw3));
            }
            // Routed experts: the MoE decode kernels read MXFP4 (the official storage).
            // transformers deviation (5) of v4_model: the routing weight scales w2's output.
            L.moe.D = int(c_.dim);
            L.moe.I = c_.moe_inter_dim;
            L.moe.act_block = official_ ? c_.fp8_block_in : 0;
            L.moe.swiglu_limit = c_.swiglu_limit;
            L.moe.weight_after_w2 = !official_;
            L.moe.experts.resize(size_t(c_.n_routed_experts));
            for (int e = 0; e < c_.n_routed_experts; e++) {
                const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
                dlinear w1, w2, w3;
                DS41RT_RETURN_IF_ERROR(lin_(ep + "w1.weight", &w1));
                DS41RT_RETURN_IF_ERROR(lin_(ep + "w2.weight", &w2));
                DS41RT_RETURN_IF_ERROR(lin_(ep + "w3.weight", &w3));
                if (w1.k != dlinear::kind::MXFP4 || w2.k != dlinear::kind::MXFP4 || w3.k != dlinear::kind::MXFP4)
                    return Status::not_supported(ep + "w1.weight: the GPU routed experts read MXFP4 (the official "
                                                      "storage); this checkpoint stores them otherwise");
                L.moe.experts[size_t(e)] = {w1.w, w1.scale, w3.w, w3.scale, w2.w, w2.scale};
            }
        }
        return Status::ok();
    }

    const model::model_config &config() const override { return c_; }
    std::vector<op_time> op_times() const override { return prof_.times(); }
    std::vector<op_time> product_times() const override { return products_.times(); }
    void reset_op_times() override { prof_.reset(), products_.reset(); }
    void set_profile(bool on) override { prof_.set_on(on), products_.set_on(on); }
    void set_cuda_graphs(bool on) override { buckets_.set_on(on); }

    // A sequence's stores, empty: its pages come as it grows (the rings with its first step).
    seq_dev new_state() const override {
        seq_dev s;
        s.comp.resize(size_t(c_.n_layers));
        s.icomp.resize(size_t(c_.n_layers));
        for (int l = 0; l < c_.n_layers; l++) {
            const int64_t page_rows = std::max<int64_t>(1, PAGE_TOKENS / std::max(1, c_.ratio(l)));
            s.comp[size_t(l)].entries = key_store(pages_.get(), c_.head_dim, kv_format(), page_rows);
            s.icomp[size_t(l)].entries = index_key_store(pages_.get(), c_.index_head_dim,
                                                         official_ && packed_keys_ && c_.index_head_dim % 32 == 0, page_rows);
        }
        return s;
    }

private:
    cudaStream_t st() const { return m_->stream(); }
    void begin(const char *section) const { prof_.begin(section, st()); }
    void end() const { prof_.end(st()); }
    float eps() const { return c_.norm_eps; }

    // RMSNorm: bf16(w_fp32 * x_hat) under OFFICIAL.
    Status norm(float *x, const float *w, int64_t rows, int64_t dim) const {
        return cuda::rms_norm_rows(x, w, x, rows, dim, eps(), official_, st());
    }
    // OFFICIAL: the fp32 rotation written back into the bf16 tensor.
    Status rope(float *x, int64_t rows, int64_t dim, const int64_t *pos, int64_t per_pos, const float *inv,
                bool inverse) const {
        return cuda::rope_tail_rows(x, rows, dim, pos, per_pos, inv, n_pairs_, inverse, official_, st());
    }
    const float *inv_for(int layer) const { return c_.ratio(layer) > 0 ? inv_compress_ : inv_main_; }



    // ---- mHC (spec 3.3): V4's classic sites, pre / post / comb computed and used at one site ----

    // hc_head (spec 3.10): pre = sigmoid(mix * scale + base) + eps, then the collapse of the streams
    // into x, all on the device (the step's only synchronisation stays its logits).
    Status hc_head(const float *X, int64_t S, float *x) const {
        const int hc = c_.hc_mult;
        dtemp mm = m_->temp_f32(S * hc), pre = m_->temp_f32(S * hc);
        DS41RT_RETURN_IF_ERROR(cuda::hc_project(X, S, int64_t(hc) * c_.dim, hc_head_fn_, hc, eps(), official_, mm.f(), st()));
        DS41RT_RETURN_IF_ERROR(cuda::hc_pre(mm.f(), S, hc, hc, hc_head_scale_, hc_head_base_, c_.hc_eps, pre.f(), st()));
        return cuda::hc_collapse(X, pre.f(), S, hc, c_.dim, official_, x, st());
    }

    // ---- a compressor (spec 3.5; v4_model compress()) over the step's rows ----
    // The projections of every row in one launch; the windows that close pooled on the device
    // (v4_compressor); then the emitted entries of all sequences together through the norm, RoPE
    // at position w*m and, OFFICIAL, the main compressor's FP8 QAT of its nope dims or the
    // indexer's Hadamard + FP4 QAT (`rotate`); each joins its sequence's entries.
    // cs[i]: sequence i's compressor state.
    template <class Store>
    Status compress(const compressor_dev &cw, const std::vector<comp_state<Store> *> &cs, const step_rows &B, const float *x,
                    int64_t d, int ratio, bool overlap, bool rotate) const {
        const int64_t S = B.rows, cd = (overlap ? 2 : 1) * d;
        dtemp kv = m_->temp_f32(S * cd), gate = m_->temp_f32(S * cd);
        DS41RT_RETURN_IF_ERROR(m_->run_linears({{&cw.wkv, x, kv.f()}, {&cw.wgate, x, gate.f()}}, S, lin::F32));
        std::vector<v4_open_windows *> open;
        for (comp_state<Store> *c : cs) open.push_back(&c->open);
        v4_compressor_shape shape;
        shape.d = d;
        shape.ratio = ratio;
        shape.overlap = overlap;
        shape.ape = cw.ape;
        dtemp lt;
        std::vector<int64_t> groups;
        DS41RT_RETURN_IF_ERROR(v4_compress_pool(*m_, shape, open, kv.f(), gate.f(), B.off, B.n, &lt, &groups));
        std::vector<int64_t> pos;
        for (size_t i = 0; i < B.seq.size(); i++)
            for (int64_t g = 0; g < groups[i]; g++) pos.push_back((cs[i]->entries.n() + g) * ratio);
        const int64_t G = int64_t(pos.size());
        if (G == 0) return Status::ok();
        auto pos_d = m_->upload_temp(pos.data(), pos.size() * sizeof(int64_t));
        if (!pos_d) return pos_d.status();
        float *e = lt.f();
        if (official_) DS41RT_RETURN_IF_ERROR(cuda::round_bf16_inplace(e, G * d, st()));
        DS41RT_RETURN_IF_ERROR(norm(e, cw.norm, G, d));
        DS41RT_RETURN_IF_ERROR(rope(e, G, d, pos_d->as<int64_t>(), 1, inv_compress_, false));
        if (official_) {
            if (rotate)
                DS41RT_RETURN_IF_ERROR(cuda::rotate_fake_quant_fp4_ue8m0(e, G, d, FP4_QAT_BLOCK, st()));
            else
                DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp8_ue8m0_cols(e, G, d, d - c_.rope_head_dim, KV_QAT_BLOCK, st()));
        }
        for (size_t i = 0, g0 = 0; i < B.seq.size(); g0 += size_t(groups[i]), i++)
            DS41RT_RETURN_IF_ERROR(cs[i]->entries.append(*m_, e + int64_t(g0) * d, groups[i]));
        return Status::ok();
    }

    // ---- the lightning indexer of a CSA layer (spec 3.8; v4_model indexer()) ----
    // Its own overlap compressor at index_head_dim (run by the caller), then per query the top
    // index_topk visible entries by score. The projections run over all rows of the step, the
    // scores and selections per sequence (each has its own keys). qr: [S, q_lora_rank]. picks[i]:
    // sequence i's picks; OFFICIAL's stay on the device, in idx and cnt.
    Status indexer(const layer_dev &L, int layer, const step_rows &B, const float *x, const float *qr,
                   std::vector<seq_picks> *picks, dtemp &idx, dtemp &cnt) const {
        const int ratio = c_.ratio(layer);
        const int64_t ihd = c_.index_head_dim, ih = c_.index_n_heads, S = B.rows;
        const size_t nseq = B.seq.size();
        std::vector<int64_t> T(nseq), k(nseq);
        int64_t kmax = 0;
        for (size_t i = 0; i < nseq; i++) {
            (*picks)[i].host.assign(size_t(B.n[i]), {});
            T[i] = B.seq[i]->icomp[size_t(layer)].entries.n();
            k[i] = std::min<int64_t>(c_.index_topk, T[i]);
            kmax = std::max(kmax, k[i]);
        }
        if (kmax == 0) return Status::ok();  // no sequence has an entry to select yet

        dtemp q = m_->temp_f32(S * ih * ihd), w = m_->temp_f32(S * ih);
        DS41RT_RETURN_IF_ERROR(m_->run_linear(L.i_wq_b, qr, q.f(), S, lin::FP8));
        DS41RT_RETURN_IF_ERROR(rope(q.f(), S * ih, ihd, B.pos_d, ih, inv_compress_, false));
        if (official_) DS41RT_RETURN_IF_ERROR(cuda::rotate_fake_quant_fp4_ue8m0(q.f(), S * ih, ihd, FP4_QAT_BLOCK, st()));
        DS41RT_RETURN_IF_ERROR(m_->run_linear(L.i_weights_proj, x, w.f(), S, lin::BF16));

        // The kernel's two numerics branches are V4's: TRANSFORMERS (relu(dot) * qk_scale) *
        // (w * head_scale) in fp32; OFFICIAL bf16(w * (qk_scale * head_scale)) first, then the
        // bf16 einsum / relu / product and the bf16 head sum.
        std::vector<int64_t> score_off(nseq + 1, 0);
        for (size_t i = 0; i < nseq; i++) score_off[i + 1] = score_off[i] + B.n[i] * T[i];
        dtemp scores_d = m_->temp_f32(std::max<int64_t>(score_off[nseq], 1));
        // OFFICIAL: lower-index ties, so the selection runs on the device and the picks stay there
        // (sequence i's [n, k_i] picks at row offset off[i] of a [S, kmax] block).
        if (official_) {
            idx = m_->temp(size_t(S * kmax) * sizeof(int32_t));
            cnt = m_->temp(size_t(S) * sizeof(int32_t));
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cnt.as<void>(), 0, size_t(S) * sizeof(int32_t), st()));
        }
        for (size_t i = 0; i < nseq; i++) {
            if (T[i] == 0) continue;
            const int64_t o = B.off[i], n = B.n[i];
            cuda::index_score_params ip;
            ip.S = n;
            ip.T = T[i];
            ip.ih = int(ih);
            ip.ihd = int(ihd);
            ip.p0 = B.p0[i];
            ip.ratio = ratio;
            ip.qk_scale = 1.0f / std::sqrt(float(ihd));
            ip.head_scale = 1.0f / std::sqrt(float(ih));
            ip.official = official_;
            float *sc = scores_d.f() + score_off[i];
            DS41RT_RETURN_IF_ERROR(cuda::index_scores(q.f() + o * ih * ihd, B.seq[i]->icomp[size_t(layer)].entries.keys(),
                                                      w.f() + o * ih, ip, sc, st()));
            if (official_)
                DS41RT_RETURN_IF_ERROR(cuda::topk_lower_index(sc, n, T[i], T[i], int(k[i]), idx.as<int32_t>() + o * kmax,
                                                              cnt.as<int32_t>() + o, st()));
        }
        if (official_) {
            for (size_t i = 0; i < nseq; i++)
                if (T[i] > 0) (*picks)[i] = {{}, idx.as<int32_t>() + B.off[i] * kmax, cnt.as<int32_t>() + B.off[i], int(k[i])};
            return Status::ok();
        }
        // TRANSFORMERS: torch's tie order has no GPU twin; the scores come back for the host's top-k.
        Status s;
        std::vector<float> scores = m_->download_f32(scores_d.f(), score_off[nseq], &s);
        DS41RT_RETURN_IF_ERROR(s);
        for (size_t i = 0; i < nseq; i++)
            for (int64_t r = 0; r < B.n[i] && T[i] > 0; r++)
                for (int64_t t : top_indices(scores.data() + score_off[i] + r * T[i], T[i], k[i]))
                    (*picks)[i].host[size_t(r)].push_back(int32_t(t));
        return Status::ok();
    }

    // ---- attention (spec 3.4-3.8), in three parts: the projections (fixed shapes), the core
    // (per-sequence state, lists of varying length) and the output projection (fixed shapes) ----
    Status attn_qkv(const layer_dev &L, int layer, const step_bufs &b, const cuda::gemv_split &xsplit) const {
        const int64_t H = c_.n_heads, hd = c_.head_dim, qlr = c_.q_lora_rank, S = b.S;
        const int64_t *pos_d = b.pos.as<int64_t>();
        const float *inv = inv_for(layer), *x = b.x.f();
        const dtemp &qr = b.qr, &q = b.q, &kv = b.kv;
        begin("attn.qkv");
        // q = rope(rms_unweighted_per_head(wq_b(q_norm(wq_a(x))))); kv = rope(kv_norm(wkv(x))).
        DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.wq_a, x, qr.f(), xsplit}, {&L.wkv, x, kv.f(), xsplit}}, S, lin::FP8));
        // q_norm with wq_b's split (b.xs is free again: wq_a and wkv have read it).
        auto qsplit = m_->rms_norm_split(qr.f(), L.q_norm, S, qlr, b.xs.as<uint8_t>(), b.sx.f());
        if (!qsplit) return qsplit.status();
        DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.wq_b, qr.f(), q.f(), *qsplit}}, S, lin::FP8));
        // transformers deviation (3): the per-head q norm in fp32 (OFFICIAL: bf16 arithmetic).
        if (official_)
            DS41RT_RETURN_IF_ERROR(cuda::rms_norm_unweighted_bf16_rows(q.f(), S * H, hd, eps(), st()));
        else
            DS41RT_RETURN_IF_ERROR(cuda::rms_norm_rows(q.f(), nullptr, q.f(), S * H, hd, eps(), false, st()));
        DS41RT_RETURN_IF_ERROR(rope(q.f(), S * H, hd, pos_d, H, inv, false));
        DS41RT_RETURN_IF_ERROR(norm(kv.f(), L.kv_norm, S, hd));
        DS41RT_RETURN_IF_ERROR(rope(kv.f(), S, hd, pos_d, 1, inv, false));
        // transformers deviation (1): OFFICIAL's FP8 QAT of the nope dims after RoPE (block 64).
        if (official_)
            DS41RT_RETURN_IF_ERROR(
                cuda::fake_quant_fp8_ue8m0_cols(kv.f(), S, hd, hd - c_.rope_head_dim, KV_QAT_BLOCK, st()));
        end();
        return Status::ok();
    }

    Status attn_core(const layer_dev &L, int layer, const step_rows &B, const step_bufs &b) const {
        const int64_t H = c_.n_heads, hd = c_.head_dim, W = c_.window, S = B.rows;
        const int ratio = c_.ratio(layer);
        const bool csa = ratio > 0 && c_.is_index_source(layer);
        const float *x = b.x.f();
        const dtemp &qr = b.qr, &q = b.q, &kv = b.kv, &o = b.o;

        // Compressed branch, sequence by sequence: entries closed by this chunk are emitted
        // before attention; CSA queries see the indexer's selection, HCA queries every visible entry.
        std::vector<seq_picks> picks(B.seq.size());
        dtemp pick_idx, pick_cnt;
        if (ratio > 0) {
            begin("attn.compress+index");
            std::vector<comp_seq *> mains;
            std::vector<icomp_seq *> indexes;
            for (seq_dev *sq : B.seq) {
                mains.push_back(&sq->comp[size_t(layer)]);
                indexes.push_back(&sq->icomp[size_t(layer)]);
            }
            DS41RT_RETURN_IF_ERROR(compress(L.comp, mains, B, x, hd, ratio, csa, false));
            if (csa) {
                DS41RT_RETURN_IF_ERROR(compress(L.icomp, indexes, B, x, c_.index_head_dim, ratio, true, true));
                DS41RT_RETURN_IF_ERROR(indexer(L, layer, B, x, qr.f(), &picks, pick_idx, pick_cnt));
            }
            end();
        }
        begin("attn.core");

        // Key lists (key_lists.h): the window, OFFICIAL's pads up to the reference's window width
        // (min(n, W) for a prefill from 0, W otherwise), then the compressed entries: CSA the
        // indexer's picks, HCA every visible entry.
        key_lists lists(S, device_key_lists_);
        for (size_t i = 0; i < B.seq.size(); i++) {
            const int64_t p0 = B.p0[i], o = B.off[i], n = B.n[i];
            const key_store &ent = B.seq[i]->comp[size_t(layer)].entries;
            const cuda::key_rows_ref host = ent.host_ref();
            lists.add_window(B.seq[i]->ring[size_t(layer)], W, hd, p0, o, n, kv.f() + o * hd,
                             official_ ? (p0 == 0 ? std::min(n, W) : W) : 0);
            if (csa && picks[i].idx) {  // a sequence with no entries yet has no picks (counts 0)
                DS41RT_RETURN_IF_ERROR(lists.add_device_picks(o, n, picks[i].idx, picks[i].cnt, picks[i].k, ent.ref()));
            } else if (csa) {
                for (int64_t s = 0; s < n && !picks[i].host.empty(); s++)
                    for (int32_t e : picks[i].host[size_t(s)]) lists.row(o + s).push_back(host.at(e));
            } else if (ratio > 0) {
                for (int64_t s = 0; s < n; s++) {
                    const int64_t visible = std::min<int64_t>((p0 + s + 1) / ratio, ent.n());
                    for (int64_t e = 0; e < visible; e++) lists.row(o + s).push_back(host.at(e));
                }
            }
        }
        int64_t Lmax = 0;
        auto keys_d = lists.upload(*m_, &Lmax);
        if (!keys_d) return keys_d.status();

        cuda::attention_batch ab;
        ab.q = q.f();
        ab.keys = keys_d->as<const float *const>();
        ab.sink = L.attn_sink;
        ab.scale = 1.0f / std::sqrt(float(hd));
        ab.R = int(S);
        ab.H = int(H);
        ab.L = int(Lmax);
        ab.hd = int(hd);
        ab.official = official_;
        ab.out = o.f();
        DS41RT_RETURN_IF_ERROR(cuda::run_attention(ab, st()));

        // Remember the window (after attention: the chunk's rows were visible to it).
        std::vector<window_store> stores;
        for (size_t i = 0; i < B.seq.size(); i++)
            stores.push_back({&B.seq[i]->ring[size_t(layer)], B.p0[i], B.n[i], kv.f() + B.off[i] * hd});
        DS41RT_RETURN_IF_ERROR(store_windows(*m_, stores, W, hd));
        end();
        return Status::ok();
    }

    // Inverse RoPE at the query position, then the grouped output projection (wo_a per group in
    // the BF16 class, wo_b FP8), as engine/output_projection does on the host: o -> y.
    Status attn_out(const layer_dev &L, int layer, const step_bufs &b) const {
        const int64_t H = c_.n_heads, hd = c_.head_dim, S = b.S;
        begin("attn.out");
        DS41RT_RETURN_IF_ERROR(rope(b.o.f(), S * H, hd, b.pos.as<int64_t>(), H, inv_for(layer), true));
        DS41RT_RETURN_IF_ERROR(
            m_->grouped_output(L.wo_a, L.wo_b, b.o.f(), S, H * hd, c_.o_groups, c_.o_lora_rank, b.y.f()));
        end();
        return Status::ok();
    }

    // Whether a layer's MoE runs without the host at S rows (so it can be part of a graph):
    // at decode sizes (the router and routed_decode keep the routes on the device).
    bool moe_on_device(const layer_dev &, int64_t S) const { return S <= cuda::MOE_MAX_ROWS; }

    // ---- MoE (spec 3.9; v4_model moe()) ----
    // The router on the device (v4_steps route()'s twin: hash layers take tid2eid[token], the
    // others the biased top-k; weights renormalised, with +1e-20 except in OFFICIAL), then the
    // routed experts from those device routes in chunks of 16 rows (routed_decode).
    struct moe_out {
        dtemp routed, shared;  // [S, D]; shared empty without a shared expert
    };
    // The MoE of x: the routed sum and the shared expert's output, left for the caller to add
    // (hc_expand_sum adds them as it expands the streams).
    Status moe(const layer_dev &L, int layer, const float *x, const int32_t *tokens_d, int64_t S, moe_out *out,
               const cuda::gemv_split &xsplit) const {
        const int64_t D = c_.dim, E = c_.n_routed_experts, K = c_.n_activated_experts;
        // The shared expert's w1 / w3, SwiGLU and w2 into sh; on a side branch beside the router
        // and the routed experts when nothing on the main side runs a GEMV meanwhile (they share
        // the model's GEMV workspace): decode sizes and a dense gate, profiling off.
        dtemp sh;
        auto shared = [&]() -> Status {
            const int64_t I = L.sw1.N;
            dtemp g = m_->temp_f32(S * I), u = m_->temp_f32(S * I);
            DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.sw1, x, g.f(), xsplit}, {&L.sw3, x, u.f(), xsplit}}, S, lin::FP8));
            return m_->swiglu_w2(L.sw2, g.f(), u.f(), S, I, c_.swiglu_limit, sh.f());
        };
        const bool has_shared = c_.n_shared_experts > 0;
        const bool fork = has_shared && !prof_.on() && moe_on_device(L, S) && L.gate_w.k == dlinear::kind::DENSE;
        if (has_shared) sh = m_->temp_f32(S * D);
        side_scope branch(side_, *m_);
        if (fork) DS41RT_RETURN_IF_ERROR(branch.fork(shared));
        begin("moe.router");
        dtemp logits = m_->temp_f32(S * E);
        DS41RT_RETURN_IF_ERROR(m_->run_linear(L.gate_w, x, logits.f(), S, lin::F32));
        cuda::router_params rp;
        rp.route_scale = c_.route_scale;
        rp.norm_topk_prob = true;
        rp.n_experts = int(E);
        rp.k = int(K);
        rp.eps = !official_;
        dtemp ids = m_->temp(size_t(S * K) * sizeof(int32_t)), wts = m_->temp_f32(S * K);
        if (layer < c_.n_hash_layers)
            DS41RT_RETURN_IF_ERROR(cuda::route_hash(logits.f(), L.tid2eid, c_.vocab_size, tokens_d, S, rp,
                                                    ids.as<int32_t>(), wts.f(), st()));
        else
            DS41RT_RETURN_IF_ERROR(cuda::route_topk(logits.f(), L.gate_bias, S, rp, ids.as<int32_t>(), wts.f(), st()));
        end();
        begin("moe.routed");
        dtemp acc = m_->temp_f32(S * D);
        if (S > cuda::MOE_MAX_ROWS) {  // prefill: each expert once per 16 of its rows
            auto rt = routes_to_host(*m_, ids.as<int32_t>(), wts.f(), S, int(K));
            if (!rt) return rt.status();
            DS41RT_RETURN_IF_ERROR(routed_prefill(*m_, L.moe, x, S, rt.value(), int(K), acc.f()));
        } else {
            DS41RT_RETURN_IF_ERROR(routed_.run(*m_, layer, L.moe, x, ids.as<int32_t>(), wts.f(), S, int(K), acc.f(), xsplit));
        }
        end();
        // The shared expert (its sum with the routed one and that sum's rounding are the
        // caller's); without one, the routed sum alone is the output (OFFICIAL: bf16).
        begin("moe.shared");
        if (has_shared) {
            if (fork) DS41RT_RETURN_IF_ERROR(branch.join());
            else DS41RT_RETURN_IF_ERROR(shared());
        } else if (official_) {
            DS41RT_RETURN_IF_ERROR(cuda::round_bf16_inplace(acc.f(), S * D, st()));
        }
        end();
        *out = {std::move(acc), std::move(sh)};
        return Status::ok();
    }

    // ---- one step: every sequence's new tokens through the whole model (spec 3.1-3.10); gpu_engine
    // runs a step's inputs as one batch of rows through forward_rows ----
    const device_model &gpu_model() const override { return *m_; }

    // Decode steps (up to 16 rows) replay graphs of their fixed-shape pieces once a step of that
    // row count has run eagerly; profiling runs eagerly (section events are not graph nodes).
    step_bucket *bucket_for(int64_t S) const { return prof_.on() ? nullptr : buckets_.get(*m_, S, cuda::MOE_MAX_ROWS); }

    Status forward_rows(step_rows &B, const std::vector<int32_t> &tokens, float *logits) const override {
        const auto issue0 = std::chrono::steady_clock::now();
        const int64_t S = B.rows, D = c_.dim, V = c_.vocab_size;
        const int hc = c_.hc_mult;
        for (seq_dev *sq : B.seq)
            DS41RT_RETURN_IF_ERROR(make_rings(sq->ring, *pages_, c_.n_layers, c_.window, c_.head_dim, kv_format()));
        step_frame frame(*m_, bucket_for(S), S);
        const step_bufs &b = frame.bufs();

        begin("embed");
        const std::vector<int64_t> pos = B.positions();
        DS41RT_RETURN_IF_ERROR(m_->to_device(b.pos.as<void>(), pos.data(), pos.size() * sizeof(int64_t)));
        DS41RT_RETURN_IF_ERROR(m_->to_device(b.ids.as<void>(), tokens.data(), tokens.size() * sizeof(int32_t)));
        B.pos_d = b.pos.as<int64_t>();
        // The residual streams [S, hc, D], all equal to the (bf16) embedding.
        DS41RT_RETURN_IF_ERROR(cuda::embed_rows_bf16(embed_, V, D, b.ids.as<int32_t>(), S, hc, b.X.f(), st()));
        end();

        auto attn_site = [&](int l) -> Status {
            const layer_dev &L = layers_[size_t(l)];
            begin("mhc+norm");
            DS41RT_RETURN_IF_ERROR(m_->hc_mixes(b.X.f(), S, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, b.am));
            auto xsplit = m_->hc_collapse_norm(b.X.f(), b.am.pre.f(), S, L.attn_norm, b.x.f(), b.xs.as<uint8_t>(), b.sx.f());
            if (!xsplit) return xsplit.status();
            end();
            return attn_qkv(L, l, b, *xsplit);
        };
        bool site_ran = false;  // layer l's attention site ran in layer l - 1's last piece
        for (int l = 0; l < c_.n_layers; l++) {
            const layer_dev &L = layers_[size_t(l)];
            if (!site_ran) DS41RT_RETURN_IF_ERROR(frame.piece(size_t(2 * l), [&] { return attn_site(l); }));
            site_ran = false;
            DS41RT_RETURN_IF_ERROR(attn_core(L, l, B, b));
            auto ffn = [&]() -> Status {
                DS41RT_RETURN_IF_ERROR(attn_out(L, l, b));
                begin("mhc+norm");
                DS41RT_RETURN_IF_ERROR(
                    cuda::hc_expand(b.X.f(), b.y.f(), b.am.post.f(), b.am.comb.f(), S, hc, D, official_, st()));
                DS41RT_RETURN_IF_ERROR(m_->hc_mixes(b.X.f(), S, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, b.fm));
                auto xsplit = m_->hc_collapse_norm(b.X.f(), b.fm.pre.f(), S, L.ffn_norm, b.x.f(), b.xs.as<uint8_t>(), b.sx.f());
                if (!xsplit) return xsplit.status();
                end();
                moe_out mo;
                DS41RT_RETURN_IF_ERROR(moe(L, l, b.x.f(), b.ids.as<int32_t>(), S, &mo, *xsplit));
                begin("mhc+norm");
                DS41RT_RETURN_IF_ERROR(mo.shared.f() ? cuda::hc_expand_sum(b.X.f(), mo.routed.f(), mo.shared.f(), b.fm.post.f(),
                                                                         b.fm.comb.f(), S, hc, D, official_, st())
                                                     : cuda::hc_expand(b.X.f(), mo.routed.f(), b.fm.post.f(), b.fm.comb.f(),
                                                                       S, hc, D, official_, st()));
                end();
                return Status::ok();
            };
            if (!moe_on_device(L, S)) {
                DS41RT_RETURN_IF_ERROR(ffn());
                continue;
            }
            // The next layer's attention site in the same piece: one graph launch a layer, not two.
            site_ran = l + 1 < c_.n_layers;
            DS41RT_RETURN_IF_ERROR(frame.piece(size_t(2 * l + 1), [&]() -> Status {
                DS41RT_RETURN_IF_ERROR(ffn());
                return site_ran ? attn_site(l + 1) : Status::ok();
            }));
        }
        frame.done();
        begin("head");
        DS41RT_RETURN_IF_ERROR(hc_head(b.X.f(), S, b.x.f()));
        DS41RT_RETURN_IF_ERROR(norm(b.x.f(), norm_, S, D));
        const int64_t R = B.logits_rows();
        auto lg = m_->head_rows(head_, b.x.f(), S, B.all_logits ? nullptr : &B.out_rows);
        if (!lg) return lg.status();
        end();
        prof_.add_host("host.issue", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - issue0).count());
        // The routed experts' error words ride the step's one synchronisation (finish_rows').
        DS41RT_RETURN_IF_ERROR(routed_.stage_errors(*m_));
        DS41RT_RETURN_IF_ERROR(finish_rows(*m_, lg->f(), R, V, B.samples, &B.sampled, logits, prof_));
        DS41RT_RETURN_IF_ERROR(routed_.errors());
        prof_.collect();
        products_.collect();
        for (size_t i = 0; i < B.seq.size(); i++) B.seq[i]->len += B.n[i];
        return Status::ok();
    }

    std::unique_ptr<device_model> m_;
    // The sequences' state pages (after m_: given back to its stream before the stream goes).
    std::unique_ptr<page_pool> pages_;
    const model::model_config &c_;
    bool official_;
    bool device_key_lists_ = true;  // as v41_gpu's (DS41RT_DEVICE_KEY_LISTS=0: host-built windows)
    bool packed_keys_ = true;       // as v41_gpu's (DS41RT_PACKED_INDEX_KEYS=0: fp32 index keys)
    // The window rings and the main compressors' entries as FP8 + E8M0 per 64 records with a bf16
    // rope tail (kv_format), 592 bytes a row against 2048 (DS41RT_PACKED_KV=0: fp32 rows, for
    // comparing). The same logits (GpuVsCpu.PackedKvGivesTheBitsOfFp32Rows: 300 prompt positions
    // + 16 decode steps, 0 differ, H100 session 28); C1 at a 128-token context 2.44 -> 2.54 ms
    // (8 layers, H100), the price of decoding records, for 3.5x the context a pool holds.
    bool packed_kv_ = true;

    // OFFICIAL's window rows and entries are FP8-quantized per 64 on all but the rope dims after
    // RoPE has rounded every channel to bf16, so this record holds them exactly; TRANSFORMERS
    // keeps them unquantized (fp32 rows).
    cuda::key_format kv_format() const {
        const int64_t hd = c_.head_dim;
        return official_ && packed_kv_ && c_.rope_head_dim == cuda::KEY_BF16_TAIL && hd > cuda::KEY_BF16_TAIL &&
                       (hd - cuda::KEY_BF16_TAIL) % KV_QAT_BLOCK == 0 && KV_QAT_BLOCK == 64
                   ? cuda::key_format::FP8_UE8M0_64_BF16_TAIL
                   : cuda::key_format::F32;
    }
    const uint16_t *embed_ = nullptr;
    dlinear head_;
    const float *norm_ = nullptr, *hc_head_fn_ = nullptr, *inv_main_ = nullptr, *inv_compress_ = nullptr;
    const float *hc_head_base_ = nullptr, *hc_head_scale_ = nullptr;
    int n_pairs_ = 0;
    std::vector<layer_dev> layers_;
    mutable section_timer prof_;
    mutable section_timer products_;  // the weight products' times (device_model::set_product_timer)
    mutable side_branch side_;  // the shared expert's branch (moe)
    mutable step_buckets buckets_;
    mutable routed_decode routed_;
};

}  // namespace

Result<std::unique_ptr<engine>> make_v4_gpu_engine(std::unique_ptr<device_model> m, const engine_options &opt) {
    if (opt.remote.any_remote())
        return Status::not_supported("the GPU engine runs every expert layer locally (remote layers: CPU engine)");
    if (m->config().model_arch != model::arch::V4)
        return Status::invalid_argument("make_v4_gpu_engine: config is not deepseek_v4");
    auto e = std::make_unique<v4_gpu>(std::move(m), opt.profile);
    DS41RT_RETURN_IF_ERROR(e->load());
    return std::unique_ptr<engine>(std::move(e));
}

}  // namespace ds41rt::engine::gpu
