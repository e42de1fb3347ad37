// DeepSeek V4.1 Flash on the GPU: the forward pass of engine/v41_model.cpp with every tensor
// op on the device, step for step in the same order and with the same rounding points, so the
// CPU reference is this engine's oracle (tests/cuda_engine).
//
// Weights are the checkpoint's stored bytes (device_model); sequence state lives on the device,
// in the engine's page_pool: the window ring of every layer (a page), and per KV source the
// compressed entries and the index keys (paged_rows: a page per PAGE_TOKENS tokens), packed as
// the model quantizes them (the rings FP8 records, the entries and index keys FP4 records, where
// the head dims are whole blocks of the formats'; else fp32 rows; DS41RT_PACKED_KV=0 /
// DS41RT_PACKED_INDEX_KEYS=0 keep fp32 rows), and
// the open compression group (a growing buffer of at most a group's rows). Activations are
// stream-ordered temporaries.
//
// A step runs the new tokens of all its sequences as one set of rows (step_rows): row-wise ops
// over every row, the state-owning steps (Engram history, compressor, indexer, window ring)
// sequence by sequence.
//
// The router, the indexer's top-k (OFFICIAL) and the routed experts of a decode step read and
// write device memory only (routed_decode; key_lists writes the picked entries into the attention
// lists on the device), so a decode step synchronises once, for its picks (device_sampling) or
// its logits rows. What still comes to the host: TRANSFORMERS' index scores (torch's tie order
// has no GPU twin), prefill's routes (MXFP4 prefill plans expert by expert on the host), EXL3
// layers' routes (exl3_moe plans on the host at every size; those layers' MoE is not part of the
// graphs) and remote layers' rows.
//
// Decode steps of up to 16 rows replay CUDA graphs of their fixed-shape pieces (step_bufs.h,
// step_graphs.h): per layer the output projection, the FFN site and the MoE, with the next layer's
// attention site (its Engram lookup where it has one, whose n-gram ids were hashed on the device at
// the step's start; mHC and projections) in the same graph; the attention core (compressor,
// indexer, key lists, attention, ring), whose lengths change every step, runs eagerly between the
// graphs.
#include "engine/cuda/v41_gpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "backend/cuda/exl3_moe.cuh"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/candidate_mask.cuh"
#include "backend/cuda/collapse_norm.cuh"
#include "backend/cuda/compressor.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/dense.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/engram.cuh"
#include "backend/cuda/engram_hash.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/kv_row.cuh"
#include "backend/cuda/indexer.cuh"
#include "backend/cuda/mhc.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/router.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/topk.cuh"
#include "engine/cpu_engine.h"
#include "engine/cuda/device_model.h"
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
#include "engine/engram_hash.h"
#include "engine/rope.h"
#include "engine/v41_steps.h"
#include "experts/remote.h"
#ifdef DS41RT_HAVE_NCCL
#include "experts/cuda/nccl_remote.h"
#endif

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;
using backend::cpu::lin;

namespace {

// Dummy weights keep this many rows of each Engram table (ids reduced modulo it): the gather's
// traffic per token is the same as with the full ~190 GB of tables, which no GPU holds.
constexpr int64_t DUMMY_ENGRAM_ROWS = int64_t(1) << 20;

// ---- weights on the device -------------------------------------------------------------------

struct layer_dev {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
    const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
    const float *attn_sink = nullptr, *q_norm = nullptr, *kv_norm = nullptr;
    dlinear wq_a, wq_b, wkv, wo_a, wo_b;
    const float *c_norm = nullptr;  // KV sources
    dlinear c_wkv, c_wgate;
    const float *i_k_norm = nullptr;
    dlinear i_wk, i_wq_b, i_weights_proj;
    const uint8_t *e_table = nullptr, *e_scale = nullptr;  // Engram layers
    int64_t e_rows = 0;
    dlinear e_wkv;
    const float *e_q = nullptr, *e_k = nullptr;
    dlinear gate_w;
    const float *gate_bias = nullptr;
    dlinear sw1, sw2, sw3;
    cuda::moe_layer moe;  // no experts when the layer is remote
    std::vector<cuda::exl3_expert_dev> exl3;  // EXL3 layers' routed experts (backend/cuda exl3_moe), by id
    bool remote = false;
};

// ---- sequence state on the device ------------------------------------------------------------


struct source_dev {
    dev_rows buf_kv, buf_gate;
    key_store entries;  // attention reads them through key_rows_ref: fp32 rows or FP4 records
    // The index keys: FP4 records (68 bytes a V4.1 key, not 512) where index_head_dim is a
    // multiple of 32 (the indexer then FP4-quantizes every key, so packing is exact), else fp32
    // rows (and with DS41RT_PACKED_INDEX_KEYS=0).
    index_key_store keys;
};

struct seq_dev {
    int64_t len = 0;
    std::vector<window_ring> ring;  // per layer, made by the sequence's first step (rings())
    std::map<int, source_dev> sources;
    // The compressed ids of the last max_ngram - 1 tokens (int32, oldest first; -1 before the
    // start): the Engram hash's history (backend/cuda engram_hash), made by the first step.
    pool_page engram_hist;
};

// What one forward hands down the layer stack (spec 4.5): the indexer's picks, on the device
// (OFFICIAL: [n, pick_k] and counts, read by the key lists there) or on the host (TRANSFORMERS).
struct shared_sel {
    bool has_topk = false;
    std::vector<std::vector<int32_t>> topk;  // TRANSFORMERS
    // OFFICIAL: this sequence's rows [n, pick_k] of picks and [n] counts, in a buffer that may hold
    // a whole step's rows (the batched selection; shared by the step's sequences).
    std::shared_ptr<dtemp> picks;
    const int32_t *pick_idx = nullptr, *pick_cnt = nullptr;
    int pick_k = 0;
    bool has_candidates = false;
    std::vector<std::vector<uint8_t>> candidates;  // TRANSFORMERS: on the host
    // OFFICIAL: this sequence's mask rows [n, cand_T] on the device, row stride cand_ld, in a
    // buffer that may hold a whole step's rows (as picks).
    std::shared_ptr<dtemp> cand_buf;
    const uint8_t *cand = nullptr;
    int64_t cand_T = 0, cand_ld = 0;
};

using step_rows = gpu::step_rows<seq_dev>;

class v41_gpu final : public gpu_engine<seq_dev> {
public:
    v41_gpu(std::unique_ptr<device_model> m, engram_hasher h, bool has_engram, bool profile,
            const experts::remote_layout &remote)
        : m_(std::move(m)), pages_(std::make_unique<page_pool>(m_->stream())), c_(m_->config()), hasher_(std::move(h)),
          has_engram_(has_engram),
          official_(m_->official()), layout_(remote), prof_(profile), products_(profile) {
        m_->set_product_timer(&products_);
        if (const char *e = std::getenv("DS41RT_BATCHED_SELECT")) batched_select_ = std::string(e) != "0";
        if (const char *e = std::getenv("DS41RT_DEVICE_KEY_LISTS")) device_key_lists_ = std::string(e) != "0";
        if (const char *e = std::getenv("DS41RT_PACKED_INDEX_KEYS")) packed_keys_ = std::string(e) != "0";
        if (const char *e = std::getenv("DS41RT_PACKED_KV")) packed_kv_ = std::string(e) != "0";
        if (layout_.any_remote()) remote_ = std::make_unique<experts::remote_experts>(layout_, c_.dim);
#ifdef DS41RT_HAVE_NCCL
        bool any_nccl = false;
        for (int l = 0; l < int(layout_.layer_ranks.size()); l++) any_nccl = any_nccl || layout_.layer_nccl(l);
        if (any_nccl) {
            // NCCL layers are graph pieces of the captured step; DS41RT_NCCL_GRAPHS=0 runs them
            // eagerly with a watched wait per layer (the comparison bench-remote makes).
            const char *g = std::getenv("DS41RT_NCCL_GRAPHS");
            nccl_graphs_ = !(g && std::string(g) == "0");
            nccl_ = std::make_unique<experts::nccl_remote>(layout_, c_.dim, m_->device().device);
            // A step's synchronisations also watch its NCCL exchanges (a replayed step has no
            // per-layer wait): a dead or stalled worker ends them with UNAVAILABLE, never a hang.
            m_->set_sync_watch({[n = nccl_.get()] { return n->waiting(); }, [n = nccl_.get()] { return n->drained(); }});
        }
#endif
    }
    // The sequences' device state is freed on the model's stream, which must outlive it.
    ~v41_gpu() override { clear_sequences(); }

    Status load() {
        auto &m = *m_;
        auto lin_ = [&](const std::string &n, dlinear *out) { return m.linear(n).move_to(out); };
        auto vec_ = [&](const std::string &n, const float **out) { return m.vec(n).move_to(out); };
        auto emb = m.bf16_table("embed.weight");
        if (!emb) return emb.status();
        embed_ = emb.value();
        DS41RT_RETURN_IF_ERROR(lin_("head.weight", &head_));
        DS41RT_RETURN_IF_ERROR(vec_("norm.weight", &norm_));
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
                {"ffn.shared_experts.w1.weight", &L.sw1}, {"ffn.shared_experts.w2.weight", &L.sw2},
                {"ffn.shared_experts.w3.weight", &L.sw3},
            };
            for (auto &[n, out] : lins) DS41RT_RETURN_IF_ERROR(lin_(p + n, out));
            DS41RT_RETURN_IF_ERROR(vec_(p + "ffn.gate.bias", &L.gate_bias));
            if (c_.is_kv_source(l)) {
                DS41RT_RETURN_IF_ERROR(lin_(p + "attn.compressor.wkv.weight", &L.c_wkv));
                DS41RT_RETURN_IF_ERROR(vec_(p + "attn.compressor.norm.weight", &L.c_norm));
                if (c_.ratio(l) > 1) DS41RT_RETURN_IF_ERROR(lin_(p + "attn.compressor.wgate.weight", &L.c_wgate));
                DS41RT_RETURN_IF_ERROR(lin_(p + "attn.indexer.wk.weight", &L.i_wk));
                DS41RT_RETURN_IF_ERROR(vec_(p + "attn.indexer.k_norm.weight", &L.i_k_norm));
            }
            if (c_.is_index_source(l)) {
                DS41RT_RETURN_IF_ERROR(lin_(p + "attn.indexer.wq_b.weight", &L.i_wq_b));
                DS41RT_RETURN_IF_ERROR(lin_(p + "attn.indexer.weights_proj.weight", &L.i_weights_proj));
            }
            if (c_.has_engram(l)) {
                DS41RT_RETURN_IF_ERROR(m.engram_table(p + "engram.embed.weight", DUMMY_ENGRAM_ROWS, &L.e_table,
                                                      &L.e_scale, &L.e_rows));
                DS41RT_RETURN_IF_ERROR(lin_(p + "engram.wkv.weight", &L.e_wkv));
                DS41RT_RETURN_IF_ERROR(vec_(p + "engram.q_weight", &L.e_q));
                DS41RT_RETURN_IF_ERROR(vec_(p + "engram.k_weight", &L.e_k));
            }
            // Routed experts through the MoE decode kernels: MXFP4 (the official storage) or NVFP4.
            L.moe.D = int(c_.dim);
            L.moe.I = c_.moe_inter_dim;
            L.moe.act_block = official_ ? c_.fp8_block_in : 0;
            L.moe.swiglu_limit = c_.swiglu_limit;
            L.remote = size_t(l) < layout_.layer_ranks.size() && !layout_.layer_ranks[size_t(l)].empty();
            if (!L.remote && c_.routed_quant == model::expert_quant::EXL3) {
                // EXL3 (exllamav3 trellis): the stored tiles, decoded inside the GEMV.
                L.exl3.resize(size_t(c_.n_routed_experts));
                for (int e = 0; e < c_.n_routed_experts; e++) {
                    const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
                    cuda::exl3_expert_dev &x3 = L.exl3[size_t(e)];
                    const std::pair<const char *, cuda::exl3_linear_dev *> ws[] = {
                        {"w1.weight", &x3.w1}, {"w2.weight", &x3.w2}, {"w3.weight", &x3.w3}};
                    for (auto &[n, out] : ws) {
                        auto r = m.exl3(ep + n);
                        if (!r) return r.status();
                        out->in = r->in, out->out = r->out, out->k = r->k;
                        out->cb = cuda::exl3_cb(int(r->cb));  // the same numbering (exllamav3's)
                        out->trellis = r->trellis, out->suh = r->suh, out->svh = r->svh;
                    }
                }
                continue;
            }
            if (!L.remote && c_.routed_quant == model::expert_quant::NVFP4) {
                // NVFP4 (ModelOpt W4A4): the bytes as published, the publication's numerics.
                L.moe.nvfp4_experts.resize(size_t(c_.n_routed_experts));
                for (int e = 0; e < c_.n_routed_experts; e++) {
                    const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
                    device_model::nvfp4_dev w[3];
                    const char *names[] = {"w1.weight", "w2.weight", "w3.weight"};
                    for (int i = 0; i < 3; i++) {
                        auto r = m.nvfp4(ep + names[i]);
                        if (!r) return r.status();
                        w[i] = r.value();
                    }
                    L.moe.nvfp4_experts[size_t(e)] = {w[0].codes, w[0].scales, w[2].codes, w[2].scales, w[1].codes,
                                                      w[1].scales, w[0].weight_scale_2, w[0].input_scale,
                                                      w[1].weight_scale_2, w[1].input_scale};
                }
                continue;
            }
            if (!L.remote) L.moe.experts.resize(size_t(c_.n_routed_experts));
            for (int e = 0; e < c_.n_routed_experts && !L.remote; e++) {
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
        return has_engram_ ? load_engram_tables() : Status::ok();
    }

    const model::model_config &config() const override { return c_; }
    std::vector<op_time> op_times() const override { return prof_.times(); }
    std::vector<op_time> product_times() const override { return products_.times(); }
    void reset_op_times() override { prof_.reset(), products_.reset(); }
    void set_profile(bool on) override { prof_.set_on(on), products_.set_on(on); }
    void set_cuda_graphs(bool on) override { buckets_.set_on(on); }

    // A sequence's stores, empty: its pages come as it grows (the rings with its first step).
    // The entries are FP4-quantized where head_dim is whole blocks of 16 (attn_core), the index
    // keys where index_head_dim is whole blocks of 32: stored packed, exactly. A page holds a
    // source's rows of PAGE_TOKENS tokens.
    seq_dev new_state() const override {
        seq_dev s;
        for (int l = 0; l < c_.n_layers; l++)
            if (c_.is_kv_source(l)) {
                source_dev &src = s.sources[l];
                const int64_t page_rows = std::max<int64_t>(1, PAGE_TOKENS / c_.ratio(l));
                src.buf_kv.width = src.buf_gate.width = c_.head_dim;
                src.entries = key_store(pages_.get(), c_.head_dim,
                                        packed_kv_ && c_.head_dim % 16 == 0 ? cuda::key_format::FP4_E4M3_16 : cuda::key_format::F32,
                                        page_rows);
                src.keys = index_key_store(pages_.get(), c_.index_head_dim, packed_keys_ && c_.index_head_dim % 32 == 0,
                                           page_rows);
            }
        return s;
    }

private:
    cudaStream_t st() const { return m_->stream(); }
    void begin(const char *section) const { prof_.begin(section, st()); }
    void end() const { prof_.end(st()); }
    float eps() const { return c_.norm_eps; }

    Status norm(float *x, const float *w, int64_t rows, int64_t dim) const {
        return cuda::rms_norm_rows(x, w, x, rows, dim, eps(), official_, st());
    }
    // A sublayer's input into b.x (device_model::hc_collapse_norm), with its GEMV split into
    // b.xs / b.sx when want_split: the split made, or none.
    Result<cuda::gemv_split> collapse_norm(const step_bufs &b, const float *pre, const float *w, bool want_split = true) const {
        return m_->hc_collapse_norm(b.X.f(), pre, b.S, w, b.x.f(), want_split ? b.xs.as<uint8_t>() : nullptr, b.sx.f());
    }
    // An mHC site's mixes of b.X into out, on the scope's side branch where the step may fork
    // (not when profiled: sections are events on one stream).
    Status site_mixes(side_scope &side, const step_bufs &b, const float *fn, const float *scale, const float *base,
                      const hc_mix_dev &out) const {
        auto mixes = [&] { return m_->hc_mixes(b.X.f(), b.S, fn, scale, base, out); };
        return prof_.on() ? mixes() : side.fork(mixes);
    }
    Status rope(float *x, int64_t rows, int64_t dim, const int64_t *pos, int64_t per_pos, const float *inv,
                bool inverse) const {
        return cuda::rope_tail_rows(x, rows, dim, pos, per_pos, inv, n_pairs_, inverse, official_, st());
    }
    const float *inv_for(int layer) const { return c_.ratio(layer) > 0 ? inv_compress_ : inv_main_; }



    // ---- mHC (spec 4.2) ----

    // ---- Engram (spec 4.9) ----
    // Engram layer l's lookup into the streams b.X, from the ids engram_ids() left in b.eids: no host
    // work, so it may be part of a graph.
    Status engram(const layer_dev &L, int l, const step_bufs &b) const {
        const int hc = c_.hc_mult;
        const int64_t D = c_.dim, ehd = c_.engram_head_dim, ncols = hasher_.n_cols(), S = b.S;
        const int64_t in_w = ncols * ehd, out_w = int64_t(hc + 1) * D;
        const int64_t k = std::find(c_.engram_layer_ids.begin(), c_.engram_layer_ids.end(), l) - c_.engram_layer_ids.begin();
        const int64_t *ids = b.eids.as<int64_t>() + k * S * ncols;
        begin("engram");
        dtemp rows = m_->temp_f32(S * in_w), kv = m_->temp_f32(S * out_w);
        DS41RT_RETURN_IF_ERROR(cuda::gather_rows_fp8_e8m0(L.e_table, L.e_scale, L.e_rows, ehd, ids, S * ncols, rows.f(), st()));
        DS41RT_RETURN_IF_ERROR(m_->run_linear(L.e_wkv, rows.f(), kv.f(), S, lin::FP8));
        cuda::engram_gate_params gp;
        gp.S = S;
        gp.hc = hc;
        gp.D = D;
        gp.eps = eps();
        gp.round_bf16 = official_;
        DS41RT_RETURN_IF_ERROR(cuda::engram_gate(b.X.f(), kv.f(), L.e_q, L.e_k, gp, st()));
        end();
        return Status::ok();
    }

    // Every Engram layer's n-gram ids of the step's rows into b.eids, hashed on the device from the
    // step's token ids (b.ids) and each sequence's history, which moves on past the step's tokens.
    Status engram_ids(const step_rows &B, const step_bufs &b) const {
        std::vector<cuda::engram_hash_row> rows(static_cast<size_t>(B.rows));
        for (size_t i = 0; i < B.seq.size(); i++)
            for (int64_t s = 0; s < B.n[i]; s++)
                rows[size_t(B.off[i] + s)] = {reinterpret_cast<int32_t *>(B.seq[i]->engram_hist.get()), int32_t(s),
                                              int32_t(B.n[i])};
        DS41RT_RETURN_IF_ERROR(m_->to_device(b.erows.as<void>(), rows.data(), rows.size() * sizeof(rows[0])));
        return cuda::engram_hash(engram_tables_, b.ids.as<int32_t>(), b.erows.as<cuda::engram_hash_row>(), int(B.rows),
                                 b.eids.as<int64_t>(), st());
    }

    // The hasher's tables on the device (engram_hash_tables), once, at load.
    Status load_engram_tables() {
        std::vector<int32_t> map(hasher_.token_map().begin(), hasher_.token_map().end());
        std::vector<int64_t> table_rows;
        for (int l : c_.engram_layer_ids) table_rows.push_back(m_->is_dummy() ? layers_[size_t(l)].e_rows : 0);
        cuda::engram_hash_tables &t = engram_tables_;
        auto put = [&](const auto &v, auto **out) -> Status {
            auto p = m_->upload(v.data(), v.size() * sizeof(v[0]));
            if (!p) return p.status();
            *out = static_cast<std::remove_pointer_t<decltype(out)>>(p.value());
            return Status::ok();
        };
        DS41RT_RETURN_IF_ERROR(put(map, &t.token_map));
        DS41RT_RETURN_IF_ERROR(put(hasher_.multipliers(), &t.mult));
        DS41RT_RETURN_IF_ERROR(put(hasher_.primes(), &t.primes));
        DS41RT_RETURN_IF_ERROR(put(hasher_.offsets(), &t.offsets));
        DS41RT_RETURN_IF_ERROR(put(table_rows, &t.table_rows));
        t.layers = hasher_.n_layers(), t.max_ngram = hasher_.max_ngram(), t.heads = hasher_.n_heads();
        t.pad = hasher_.pad();
        return Status::ok();
    }

    // ---- the step's row-wise projections of a compressed layer, every sequence's rows at once
    // (each weight read once a step, not once a sequence; a row's result does not depend on the
    // others'): the compressor's kv (normalized when ratio 1) and gate, the indexer's RoPE'd and
    // quantized q and its head weights. Empty where the layer has no such part. ----
    struct step_proj {
        dtemp kv, gate, q, w;
    };
    Result<step_proj> project_rows(const layer_dev &L, int layer, const step_bufs &b, const int64_t *pos_d) const {
        const int ratio = c_.ratio(layer);
        const int64_t hd = c_.head_dim, ihd = c_.index_head_dim, ih = c_.index_n_heads, S = b.S;
        const float *x = b.x.f();
        step_proj p;
        // The indexer's head weights (a BF16 product of x: no GEMV workspace) on the side branch,
        // beside the compressor's products and the indexer's q (at decode each of these small
        // launches leaves most of the GPU idle); joined before the weights are returned.
        side_scope wside(side_, *m_);
        auto head_weights = [&]() -> Status { return m_->run_linear(L.i_weights_proj, x, p.w.f(), S, lin::BF16); };
        if (c_.is_index_source(layer)) {
            p.w = m_->temp_f32(S * ih);
            if (!prof_.on()) DS41RT_RETURN_IF_ERROR(wside.fork(head_weights));
        }
        if (c_.is_kv_source(layer)) {
            p.kv = m_->temp_f32(S * hd);
            if (ratio == 1) {  // bf16 projection, no pooling
                DS41RT_RETURN_IF_ERROR(m_->run_linear(L.c_wkv, x, p.kv.f(), S, lin::BF16));
                DS41RT_RETURN_IF_ERROR(norm(p.kv.f(), L.c_norm, S, hd));
            } else {
                p.gate = m_->temp_f32(S * hd);
                DS41RT_RETURN_IF_ERROR(
                    m_->run_linears({{&L.c_wkv, x, p.kv.f()}, {&L.c_wgate, x, p.gate.f()}}, S, lin::F32));
            }
        }
        if (c_.is_index_source(layer)) {
            p.q = m_->temp_f32(S * ih * ihd);
            // qr's split as the attention site's q norm left it in b.xs for wq_b (attn_qkv; nothing
            // writes b.xs between it and here): no split launch of its own.
            const cuda::gemv_split qsplit = m_->norm_split_of(b.xs.as<uint8_t>(), b.sx.f(), S, c_.q_lora_rank);
            DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.i_wq_b, b.qr.f(), p.q.f(), qsplit}}, S, lin::FP8));
            DS41RT_RETURN_IF_ERROR(rope(p.q.f(), S * ih, ihd, pos_d, ih, inv_compress_, false));
            if (ihd % 32 == 0) DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp4_ue8m0(p.q.f(), S * ih, ihd, 32, st()));
            if (prof_.on()) DS41RT_RETURN_IF_ERROR(head_weights());
        }
        DS41RT_RETURN_IF_ERROR(wside.join());
        return p;
    }

    // ---- compressor of a KV source (spec 4.4): the latents of the groups completing here, from
    // the sequence's rows of the step's projections (kv, gate: [S, hd] at its rows) ----
    // appended: the rows are in buf_kv / buf_gate already (attn_core appends a step's rows of all
    // sequences in one launch).
    Result<dtemp> compress(const layer_dev &L, int layer, source_dev &src, const float *kv, const float *gate, int64_t S,
                           int64_t *n_latent, int64_t *first_pos, bool appended = false) const {
        const int ratio = c_.ratio(layer);
        const int64_t hd = c_.head_dim;
        *first_pos = src.entries.n() * ratio;
        if (ratio == 1) {  // the projection, normalized, is the latent
            dtemp latent = m_->temp_f32(S * hd);
            DS41RT_CUDA_RETURN_IF_ERROR(
                cudaMemcpyAsync(latent.f(), kv, size_t(S * hd) * sizeof(float), cudaMemcpyDeviceToDevice, st()));
            *n_latent = S;
            return latent;
        }
        if (!appended) {
            DS41RT_RETURN_IF_ERROR(m_->append(src.buf_kv, kv, S));
            DS41RT_RETURN_IF_ERROR(m_->append(src.buf_gate, gate, S));
        }
        const int64_t groups = src.buf_kv.rows / ratio, used = groups * ratio;
        *n_latent = groups;
        dtemp latent = m_->temp_f32(std::max<int64_t>(groups, 1) * hd);
        if (groups == 0) return latent;
        DS41RT_RETURN_IF_ERROR(
            cuda::compress_pool(src.buf_kv.buf.f(), src.buf_gate.buf.f(), groups, ratio, hd, official_, latent.f(), st()));
        // The open group's tokens (fewer than ratio, so no overlap) move to the front.
        const int64_t rest = src.buf_kv.rows - used;
        for (dev_rows *b : {&src.buf_kv, &src.buf_gate}) {
            if (rest > 0)
                DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b->buf.f(), b->buf.f() + used * hd, size_t(rest * hd) * sizeof(float),
                                                            cudaMemcpyDeviceToDevice, st()));
            b->rows = rest;
        }
        DS41RT_RETURN_IF_ERROR(norm(latent.f(), L.c_norm, groups, hd));
        return latent;
    }

    // ---- the lightning indexer of an index source (spec 4.6, 4.7) ----
    // q [S, ih, ihd] and w [S, ih]: the sequence's rows of the step's projections.
    // select = false: the keys only (attn_core then selects for the step's rows at once,
    // select_rows).
    Status indexer(const layer_dev &L, int layer, seq_dev &sq, const float *q, const float *w, const float *latent,
                   int64_t n_latent, int64_t first_pos, int64_t p0, int64_t S, shared_sel &sh, bool select = true) const {
        const int ratio = c_.ratio(layer);
        const int64_t ihd = c_.index_head_dim, ih = c_.index_n_heads, hd = c_.head_dim;
        source_dev &src = sq.sources.at(c_.kv_source_for(layer));
        if (c_.is_kv_source(layer) && n_latent > 0) {
            dtemp k = m_->temp_f32(n_latent * ihd);
            DS41RT_RETURN_IF_ERROR(m_->run_linear(L.i_wk, latent, k.f(), n_latent, lin::BF16));
            DS41RT_RETURN_IF_ERROR(norm(k.f(), L.i_k_norm, n_latent, ihd));
            std::vector<int64_t> lpos(static_cast<size_t>(n_latent));
            for (int64_t g = 0; g < n_latent; g++) lpos[size_t(g)] = first_pos + ratio * g;
            auto lp = m_->upload_temp(lpos.data(), lpos.size() * sizeof(int64_t));
            if (!lp) return lp.status();
            DS41RT_RETURN_IF_ERROR(rope(k.f(), n_latent, ihd, lp->as<int64_t>(), 1, inv_compress_, false));
            if (ihd % 32 == 0) DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp4_ue8m0(k.f(), n_latent, ihd, 32, st()));
            DS41RT_RETURN_IF_ERROR(src.keys.append(*m_, k.f(), n_latent));
        }
        (void)hd;
        const int64_t T = src.keys.n();
        if (T == 0 || !select) return Status::ok();  // nothing to select yet; earlier selections stay published

        cuda::index_score_params ip;
        ip.S = S;
        ip.T = T;
        ip.ih = int(ih);
        ip.ihd = int(ihd);
        ip.p0 = p0;
        ip.ratio = ratio;
        ip.qk_scale = 1.0f / std::sqrt(float(ihd));
        ip.head_scale = 1.0f / std::sqrt(float(ih));
        ip.official = official_;
        dtemp scores_d = m_->temp_f32(S * T);
        DS41RT_RETURN_IF_ERROR(cuda::index_scores(q, src.keys.keys(), w, ip, scores_d.f(), st()));
        const int64_t k = std::min<int64_t>(c_.index_topk, T);
        sh.has_topk = true;
        sh.topk.assign(size_t(S), {});
        if (official_) {
            // Lower-index ties: the selections run on the device; only the picks come back.
            if (layer == c_.candidate_source_layer) {
                cuda::candidate_params cp;
                cp.S = S;
                cp.T = T;
                cp.p0 = p0;
                cp.ratio = ratio;
                cp.block_size = c_.candidate_block_size;
                cp.topk_blocks = c_.candidate_topk_blocks;
                sh.cand_buf = std::make_shared<dtemp>(m_->temp(size_t(S * T)));
                sh.cand = sh.cand_buf->as<uint8_t>();
                sh.cand_T = sh.cand_ld = T;
                sh.has_candidates = true;
                DS41RT_RETURN_IF_ERROR(cuda::candidate_mask(scores_d.f(), cp, sh.cand_buf->as<uint8_t>(), st()));
            } else if (c_.candidate_source_layer >= 0 && layer > c_.candidate_source_layer && sh.has_candidates) {
                if (sh.cand_T != T || sh.cand_ld != T)
                    return Status::internal("layer " + std::to_string(layer) + " reads " + std::to_string(T) +
                                            " index keys, the candidate source " + std::to_string(sh.cand_T) +
                                            " (rows of " + std::to_string(sh.cand_ld) + ")");
                DS41RT_RETURN_IF_ERROR(cuda::apply_candidate_mask(scores_d.f(), sh.cand, S, T, st()));
            }
            sh.picks = std::make_shared<dtemp>(m_->temp(size_t(S * k + S) * sizeof(int32_t)));
            sh.pick_idx = sh.picks->as<int32_t>(), sh.pick_cnt = sh.pick_idx + S * k;
            sh.pick_k = int(k);
            return cuda::topk_lower_index(scores_d.f(), S, T, T, int(k), sh.picks->as<int32_t>(),
                                          sh.picks->as<int32_t>() + S * k, st());
        }
        // TRANSFORMERS: torch's tie order has no GPU twin; the scores come back for the host's top-k.
        Status s;
        std::vector<float> scores = m_->download_f32(scores_d.f(), S * T, &s);
        DS41RT_RETURN_IF_ERROR(s);
        if (layer == c_.candidate_source_layer) {
            sh.has_candidates = true;
            sh.candidates = v41::candidate_mask(c_, scores.data(), S, T, p0, ratio, official_);
        } else if (c_.candidate_source_layer >= 0 && layer > c_.candidate_source_layer && sh.has_candidates) {
            v41::apply_candidate_mask(sh.candidates, S, T, scores.data());
        }
        for (int64_t r = 0; r < S; r++)
            for (int64_t t : v41::select_top(scores.data() + r * T, T, k, official_)) sh.topk[size_t(r)].push_back(int32_t(t));
        return Status::ok();
    }

    // Whether a layer's selection runs for the step's rows at once (select_rows): OFFICIAL's device
    // top-k and a decode-sized step. DS41RT_BATCHED_SELECT=0 selects sequence by sequence (the
    // test that both give the same bits).
    bool select_batched(int layer, int64_t S) const {
        static_assert(cuda::CANDIDATE_ROWS_MAX >= cuda::INDEX_ROWS_MAX, "a batch's rows must fit the candidate tables");
        return batched_select_ && official_ && c_.is_index_source(layer) && S <= cuda::INDEX_ROWS_MAX;
    }

    // The indexer's selection for the rows of every sequence with index keys, in one scores launch
    // and one top-k (index_scores_rows: each row's picks and count are those of its sequence's own
    // indexer() call), with the candidate blocks made or applied for all of them at once
    // (candidate_mask_rows / apply_candidate_rows). Sequences without keys keep their earlier
    // selections, as in indexer().
    Status select_rows(int layer, const step_rows &B, const float *q, const float *w, std::vector<shared_sel> &shs) const {
        const int ratio = c_.ratio(layer);
        const int64_t ih = c_.index_n_heads, ihd = c_.index_head_dim;
        std::vector<cuda::index_row> rows;
        struct seq_rows {
            size_t i;
            int64_t r0, T;  // its first row in `rows`, its keys
        };
        std::vector<seq_rows> first;
        int64_t Tmax = 0;
        for (size_t i = 0; i < B.seq.size(); i++) {
            const source_dev &src = B.seq[i]->sources.at(c_.kv_source_for(layer));
            const int64_t T = src.keys.n();
            if (T == 0) continue;
            first.push_back({i, int64_t(rows.size()), T});
            for (int64_t s = 0; s < B.n[i]; s++) {
                const int64_t r = B.off[i] + s;
                rows.push_back({q + r * ih * ihd, w + r * ih, src.keys.keys(), T, (B.p0[i] + s + 1) / ratio});
            }
            Tmax = std::max(Tmax, T);
        }
        if (rows.empty()) return Status::ok();
        const int64_t R = int64_t(rows.size()), K = std::min<int64_t>(c_.index_topk, Tmax);
        cuda::index_score_params ip;
        ip.ih = int(ih);
        ip.ihd = int(ihd);
        ip.qk_scale = 1.0f / std::sqrt(float(ihd));
        ip.head_scale = 1.0f / std::sqrt(float(ih));
        ip.official = official_;
        dtemp scores = m_->temp_f32(R * Tmax);
        DS41RT_RETURN_IF_ERROR(cuda::index_scores_rows(rows.data(), int(R), ip, Tmax, scores.f(), st()));
        if (layer == c_.candidate_source_layer) {
            std::vector<cuda::candidate_row> cr;
            for (const cuda::index_row &r : rows) cr.push_back({r.T, r.visible});
            auto mask = std::make_shared<dtemp>(m_->temp(size_t(R * Tmax)));
            DS41RT_RETURN_IF_ERROR(cuda::candidate_mask_rows(scores.f(), Tmax, cr.data(), int(R), c_.candidate_block_size,
                                                             c_.candidate_topk_blocks, mask->as<uint8_t>(), st()));
            for (const seq_rows &q : first) {
                shared_sel &sh = shs[q.i];
                sh.cand_buf = mask;
                sh.cand = mask->as<uint8_t>() + q.r0 * Tmax;
                sh.cand_T = q.T, sh.cand_ld = Tmax;
                sh.has_candidates = true;
            }
        } else if (c_.candidate_source_layer >= 0 && layer > c_.candidate_source_layer) {
            std::vector<cuda::candidate_apply_row> ar(static_cast<size_t>(R));
            bool any = false;
            for (const seq_rows &q : first) {
                const shared_sel &sh = shs[q.i];
                if (!sh.has_candidates) continue;
                if (sh.cand_T != q.T)
                    return Status::internal("layer " + std::to_string(layer) + " reads " + std::to_string(q.T) +
                                            " index keys, the candidate source " + std::to_string(sh.cand_T));
                for (int64_t s = 0; s < B.n[q.i]; s++) ar[size_t(q.r0 + s)] = {sh.cand + s * sh.cand_ld, q.T};
                any = true;
            }
            if (any) DS41RT_RETURN_IF_ERROR(cuda::apply_candidate_rows(scores.f(), Tmax, ar.data(), int(R), st()));
        }
        auto picks = std::make_shared<dtemp>(m_->temp(size_t(R * K + R) * sizeof(int32_t)));
        const int32_t *idx = picks->as<int32_t>(), *cnt = idx + R * K;
        DS41RT_RETURN_IF_ERROR(
            cuda::topk_lower_index(scores.f(), R, Tmax, Tmax, int(K), picks->as<int32_t>(), picks->as<int32_t>() + R * K, st()));
        for (const seq_rows &q : first) {
            shared_sel &sh = shs[q.i];
            sh.has_topk = true;
            sh.topk.assign(size_t(B.n[q.i]), {});
            sh.picks = picks;
            sh.pick_idx = idx + q.r0 * K, sh.pick_cnt = cnt + q.r0;
            sh.pick_k = int(K);
        }
        return Status::ok();
    }

    // ---- attention (spec 4.3-4.8), in three parts: the projections (fixed shapes), the core
    // (per-sequence state, lists of varying length) and the output projection (fixed shapes) ----
    Status attn_qkv(const layer_dev &L, int layer, const step_bufs &b, const int64_t *pos_d,
                    const cuda::gemv_split &xsplit) const {
        const int64_t H = c_.n_heads, hd = c_.head_dim, qlr = c_.q_lora_rank, S = b.S;
        const float *inv = inv_for(layer), *x = b.x.f();
        begin("attn.qkv");
        DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.wq_a, x, b.qr.f(), xsplit}, {&L.wkv, x, b.kv.f(), xsplit}}, S, lin::FP8));
        // The window KV row (norm, RoPE and the FP8 fake quant, in one launch where a block holds
        // it) beside the q path: no GEMV; unprofiled steps only.
        auto kv_row = [&]() -> Status {
            if (hd % 32 == 0 && cuda::kv_row_fits(hd))
                return cuda::kv_norm_rope_quant(b.kv.f(), L.kv_norm, S, hd, eps(), official_, pos_d, inv, n_pairs_, 32, st());
            DS41RT_RETURN_IF_ERROR(norm(b.kv.f(), L.kv_norm, S, hd));
            DS41RT_RETURN_IF_ERROR(rope(b.kv.f(), S, hd, pos_d, 1, inv, false));
            if (hd % 32 == 0) DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp8_ue8m0(b.kv.f(), S, hd, 32, st()));
            return Status::ok();
        };
        side_scope kv_side(side_, *m_);
        if (!prof_.on()) DS41RT_RETURN_IF_ERROR(kv_side.fork(kv_row));
        // q_norm with wq_b's split (b.xs is free again: wq_a and wkv have read it).
        auto qsplit = m_->rms_norm_split(b.qr.f(), L.q_norm, S, qlr, b.xs.as<uint8_t>(), b.sx.f());
        if (!qsplit) return qsplit.status();
        DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.wq_b, b.qr.f(), b.q.f(), *qsplit}}, S, lin::FP8));
        DS41RT_RETURN_IF_ERROR(rope(b.q.f(), S * H, hd, pos_d, H, inv, false));
        if (prof_.on()) DS41RT_RETURN_IF_ERROR(kv_row());
        DS41RT_RETURN_IF_ERROR(kv_side.join());
        end();
        return Status::ok();
    }

    Status attn_core(const layer_dev &L, int layer, const step_rows &B, const step_bufs &b,
                     std::vector<shared_sel> &shs) const {
        const int64_t H = c_.n_heads, hd = c_.head_dim, W = c_.window, S = B.rows;
        const int64_t *pos_d = B.pos_d;
        const float *kvf = b.kv.f();

        // Compressed branch: the step's projections at once, then sequence by sequence (each has its
        // own compressor and entries).
        std::vector<const key_store *> centries(B.seq.size());  // the sequences' entries, where they have some
        if (c_.ratio(layer) > 0) {
            begin("attn.compress+index");
            auto proj = project_rows(L, layer, b, pos_d);
            if (!proj) return proj.status();
            const int64_t ih = c_.index_n_heads, ihd = c_.index_head_dim;
            // The step's rows join their sequences' open compression groups in one launch.
            const bool appended = c_.is_kv_source(layer) && c_.ratio(layer) > 1;
            if (appended) {
                std::vector<device_model::row_append> jobs;
                for (size_t i = 0; i < B.seq.size(); i++) {
                    source_dev &src = B.seq[i]->sources.at(c_.kv_source_for(layer));
                    jobs.push_back({&src.buf_kv, proj->kv.f() + B.off[i] * hd, B.n[i]});
                    jobs.push_back({&src.buf_gate, proj->gate.f() + B.off[i] * hd, B.n[i]});
                }
                DS41RT_RETURN_IF_ERROR(m_->append_rows(jobs));
            }
            const bool batched = select_batched(layer, S);
            for (size_t i = 0; i < B.seq.size(); i++) {
                seq_dev &sq = *B.seq[i];
                const int64_t o = B.off[i], n = B.n[i];
                source_dev &src = sq.sources.at(c_.kv_source_for(layer));
                int64_t n_latent = 0, first_pos = 0;
                dtemp latent;
                if (c_.is_kv_source(layer)) {
                    auto r = compress(L, layer, src, proj->kv.f() + o * hd, proj->gate.f() ? proj->gate.f() + o * hd : nullptr,
                                      n, &n_latent, &first_pos, appended);
                    if (!r) return r.status();
                    latent = std::move(r.value());
                }
                if (c_.is_index_source(layer))
                    DS41RT_RETURN_IF_ERROR(indexer(L, layer, sq, proj->q.f() + o * ih * ihd, proj->w.f() + o * ih, latent.f(),
                                                   n_latent, first_pos, B.p0[i], n, shs[i], !batched));
                if (n_latent > 0) {
                    std::vector<int64_t> lpos(static_cast<size_t>(n_latent));
                    for (int64_t g = 0; g < n_latent; g++) lpos[size_t(g)] = first_pos + c_.ratio(layer) * g;
                    auto lp = m_->upload_temp(lpos.data(), lpos.size() * sizeof(int64_t));
                    if (!lp) return lp.status();
                    DS41RT_RETURN_IF_ERROR(rope(latent.f(), n_latent, hd, lp->as<int64_t>(), 1, inv_compress_, false));
                    if (hd % 16 == 0)
                        DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp4_e4m3(latent.f(), n_latent, hd, 16, st()));
                    DS41RT_RETURN_IF_ERROR(src.entries.append(*m_, latent.f(), n_latent));
                }
                if (src.entries.n() > 0) centries[i] = &src.entries;
            }
            if (batched) DS41RT_RETURN_IF_ERROR(select_rows(layer, B, proj->q.f(), proj->w.f(), shs));
            end();
        }
        begin("attn.core");

        // Key lists (key_lists.h): the window, OFFICIAL's pads up to the window width, then the
        // selected compressed entries.
        key_lists lists(S, device_key_lists_);
        for (size_t i = 0; i < B.seq.size(); i++) {
            const int64_t o = B.off[i], n = B.n[i];
            lists.add_window(B.seq[i]->ring[size_t(layer)], W, hd, B.p0[i], o, n, kvf + o * hd, official_ ? W : 0);
            if (!centries[i] || !shs[i].has_topk) continue;
            if (shs[i].pick_k > 0) {
                DS41RT_RETURN_IF_ERROR(
                    lists.add_device_picks(o, n, shs[i].pick_idx, shs[i].pick_cnt, shs[i].pick_k, centries[i]->ref()));
                continue;
            }
            const cuda::key_rows_ref host = centries[i]->host_ref();
            for (int64_t s = 0; s < n; s++)
                for (int32_t e : shs[i].topk[size_t(s)]) lists.row(o + s).push_back(host.at(e));
        }
        int64_t Lmax = 0;
        auto keys_d = lists.upload(*m_, &Lmax);
        if (!keys_d) return keys_d.status();

        cuda::attention_batch ab;
        ab.q = b.q.f();
        ab.keys = keys_d->as<const float *const>();
        ab.sink = L.attn_sink;
        ab.scale = 1.0f / std::sqrt(float(hd));
        ab.R = int(S);
        ab.H = int(H);
        ab.L = int(Lmax);
        ab.hd = int(hd);
        ab.official = official_;
        ab.out = b.o.f();
        DS41RT_RETURN_IF_ERROR(cuda::run_attention(ab, st()));

        // Remember the window (after attention: the chunk's rows were visible to it).
        std::vector<window_store> stores;
        for (size_t i = 0; i < B.seq.size(); i++)
            stores.push_back({&B.seq[i]->ring[size_t(layer)], B.p0[i], B.n[i], kvf + B.off[i] * hd});
        DS41RT_RETURN_IF_ERROR(store_windows(*m_, stores, W, hd));
        end();
        return Status::ok();
    }

    // Inverse RoPE at the query position, then the grouped output projection: o -> y.
    Status attn_out(const layer_dev &L, int layer, const step_bufs &b, const int64_t *pos_d) const {
        const int64_t H = c_.n_heads, hd = c_.head_dim, S = b.S;
        begin("attn.out");
        DS41RT_RETURN_IF_ERROR(rope(b.o.f(), S * H, hd, pos_d, H, inv_for(layer), true));
        DS41RT_RETURN_IF_ERROR(
            m_->grouped_output(L.wo_a, L.wo_b, b.o.f(), S, H * hd, c_.o_groups, c_.o_lora_rank, b.y.f()));
        end();
        return Status::ok();
    }

    // ---- MoE (spec 4.10) ----
    struct moe_out {
        dtemp routed, shared;  // [S, D] each; the sublayer's output is their sum
    };
    // A layer on expert workers (experts/remote over TCP): the rows come to the host, every TP rank
    // gets the same request, and the shared expert runs on the GPU while they work; their partials
    // (added in FP32 in rank order) come back as the routed sum. ids, wts: the routes on the
    // device.
    Status moe_remote(const layer_dev &L, int layer, const float *x, int64_t S, const dtemp &ids, const dtemp &wts,
                      moe_out *out) const {
        const int64_t D = c_.dim;
        dtemp sh = m_->temp_f32(S * D), accd = m_->temp_f32(S * D);
#ifdef DS41RT_HAVE_NCCL
        // GPU workers over NCCL (experts/cuda/nccl_remote): x and the routes stay on the device, the
        // ranks' partials come back to the device and are added there in rank order; the shared
        // expert runs while the ranks work (the exchange is forked off the stream and joined back
        // by wait()).
        if (nccl_ && layout_.layer_nccl(layer)) {
            DS41RT_RETURN_IF_ERROR(nccl_->enqueue(layer, x, ids.as<int32_t>(), wts.f(), S, int(c_.n_activated_experts),
                                                  accd.f(), st()));
            DS41RT_RETURN_IF_ERROR(shared_expert(L, x, S, sh.f()));
            DS41RT_RETURN_IF_ERROR(nccl_->join(st()));
            // An eager step waits here, watching the workers: its later launches may grow a
            // workspace, and cudaFree waits for the whole device. A graphed step's exchanges are
            // watched by its synchronisation at the end (the sync watch).
            if (!graphed_) DS41RT_RETURN_IF_ERROR(nccl_->wait());
            end();
            *out = {std::move(accd), std::move(sh)};
            return Status::ok();
        }
#endif
        std::vector<float> xh(static_cast<size_t>(S * D)), acc(static_cast<size_t>(S * D));
        auto rtr = routes_to_host(ids, wts, S);
        if (!rtr) return rtr.status();
        const backend::cpu::route_table &rt = rtr.value();
        DS41RT_RETURN_IF_ERROR(m_->to_host(xh.data(), x, xh.size() * sizeof(float)));
        backend::cpu::expert_numerics nm;
        nm.official = official_;
        nm.act_block = c_.fp8_block_in;
        nm.kind = lin::FP4;
        nm.swiglu_limit = c_.swiglu_limit;
        DS41RT_RETURN_IF_ERROR(remote_->start(layer, nm, xh.data(), rt));
        DS41RT_RETURN_IF_ERROR(shared_expert(L, x, S, sh.f()));
        DS41RT_RETURN_IF_ERROR(remote_->finish(acc.data()));
        end();
        begin("moe.remote-combine");
        DS41RT_RETURN_IF_ERROR(m_->to_device(accd.f(), acc.data(), acc.size() * sizeof(float)));
        end();
        *out = {std::move(accd), std::move(sh)};
        return Status::ok();
    }

    // The shared expert of x [S, D] into sh [S, D] (its w2 output, rounded as its class rounds).
    // xsplit: x's GEMV split, when its producer made one.
    Status shared_expert(const layer_dev &L, const float *x, int64_t S, float *sh, const cuda::gemv_split &xsplit = {}) const {
        const int64_t I = L.sw1.N;
        dtemp g = m_->temp_f32(S * I), u = m_->temp_f32(S * I);
        DS41RT_RETURN_IF_ERROR(m_->run_linears({{&L.sw1, x, g.f(), xsplit}, {&L.sw3, x, u.f(), xsplit}}, S, lin::FP8));
        return m_->swiglu_w2(L.sw2, g.f(), u.f(), S, I, c_.swiglu_limit, sh);
    }

    // The router (spec 4.10) on the device: ids [S, K] int32 and weights [S, K] in pick order.
    Status route(const layer_dev &L, const float *x, int64_t S, dtemp *ids, dtemp *wts) const {
        const int64_t E = c_.n_routed_experts, K = c_.n_activated_experts;
        dtemp logits = m_->temp_f32(S * E);
        DS41RT_RETURN_IF_ERROR(m_->run_linear(L.gate_w, x, logits.f(), S, lin::F32));
        cuda::router_params rp;
        rp.gate_temp = c_.gate_temp;
        rp.route_scale = c_.route_scale;
        rp.norm_topk_prob = c_.norm_topk_prob;
        rp.n_experts = int(E);
        rp.k = int(K);
        *ids = m_->temp(size_t(S * K) * sizeof(int32_t));
        *wts = m_->temp_f32(S * K);
        return cuda::route_topk(logits.f(), L.gate_bias, S, rp, ids->as<int32_t>(), wts->f(), st());
    }

    Result<backend::cpu::route_table> routes_to_host(const dtemp &ids, const dtemp &wts, int64_t S) const {
        return gpu::routes_to_host(*m_, ids.as<int32_t>(), wts.f(), S, int(c_.n_activated_experts));
    }

    // Whether a layer's MoE runs without the host at S rows (so it can be part of a graph):
    // local experts at decode sizes (routed_decode reads the routes on the device).
    bool moe_on_device(const layer_dev &L, int64_t S) const { return !L.remote && S <= cuda::MOE_MAX_ROWS; }

    // The MoE of x [S, D]: the routed sum and the shared expert's output, left for the caller to add
    // (hc_expand_sum adds them as it expands the streams).
    Status moe(const layer_dev &L, int layer, const float *x, int64_t S, moe_out *out, const cuda::gemv_split &xsplit) const {
        const int64_t D = c_.dim, K = c_.n_activated_experts;
        begin("moe.router+shared");
        // The shared expert on a side branch, beside the router and the routed experts, when
        // nothing on the main side runs a GEMV meanwhile (they share the model's GEMV workspace):
        // local experts at decode sizes and a dense gate. Profiled steps keep one stream (their
        // sections are events on it).
        const bool fork = !prof_.on() && moe_on_device(L, S) && L.gate_w.k == dlinear::kind::DENSE;
        dtemp sh;
        side_scope branch(side_, *m_);
        if (fork) {
            sh = m_->temp_f32(S * D);
            DS41RT_RETURN_IF_ERROR(branch.fork([&] { return shared_expert(L, x, S, sh.f(), xsplit); }));
        }
        dtemp ids, wts;
        DS41RT_RETURN_IF_ERROR(route(L, x, S, &ids, &wts));
        if (L.remote) return moe_remote(L, layer, x, S, ids, wts, out);
        if (!fork) {
            sh = m_->temp_f32(S * D);
            DS41RT_RETURN_IF_ERROR(shared_expert(L, x, S, sh.f(), xsplit));
        }
        end();
        begin("moe.routed");
        // Routed experts: longer MXFP4 and NVFP4 inputs (prefill) expert by expert (routed_prefill,
        // routes planned on the host); decode sizes from the routes on the device in chunks of 16
        // rows, each selected expert read once a chunk, summed per row in increasing expert id.
        // EXL3 layers: decode sizes from the routes on the device (exl3_routed), longer inputs
        // through backend/cuda exl3_moe from the routes on the host.
        dtemp acc = m_->temp_f32(S * D);
        backend::cpu::expert_numerics nm;
        nm.official = official_;
        nm.act_block = c_.fp8_block_in;
        nm.swiglu_limit = c_.swiglu_limit;
        nm.weight_after_w2 = L.moe.weight_after_w2;
        if (!L.exl3.empty() && S <= cuda::MOE_MAX_ROWS) {
            DS41RT_RETURN_IF_ERROR(routed_.run_exl3(*m_, layer, L.exl3, nm, x, ids.as<int32_t>(), wts.f(), S, int(K), acc.f()));
        } else if (!L.exl3.empty()) {
            auto rt = routes_to_host(ids, wts, S);
            if (!rt) return rt.status();
            std::vector<dtemp> held;  // stream-ordered: freed after the work queued meanwhile
            auto scratch = [&](size_t bytes) -> Result<void *> {
                held.push_back(m_->temp(bytes));
                if (!held.back().as<void>())
                    return Status::resource_exhausted("EXL3 experts: no device memory for " + std::to_string(bytes) + " bytes");
                return held.back().as<void>();
            };
            DS41RT_RETURN_IF_ERROR(
                cuda::exl3_routed_sum(m_->device(), L.exl3, nm, x, D, rt.value(), acc.f(), scratch, st()));
        } else if (S > cuda::MOE_MAX_ROWS) {
            auto rt = routes_to_host(ids, wts, S);
            if (!rt) return rt.status();
            DS41RT_RETURN_IF_ERROR(routed_prefill(*m_, L.moe, x, S, rt.value(), int(c_.n_activated_experts), acc.f()));
        } else {
            DS41RT_RETURN_IF_ERROR(
                routed_.run(*m_, layer, L.moe, x, ids.as<int32_t>(), wts.f(), S, int(K), acc.f(), xsplit));
        }
        DS41RT_RETURN_IF_ERROR(branch.join());
        end();
        *out = {std::move(acc), std::move(sh)};
        return Status::ok();
    }

    // ---- one step: every sequence's new tokens through the whole model (spec 4.1); gpu_engine
    // runs a step's inputs as one batch of rows through forward_rows ----
    const device_model &gpu_model() const override { return *m_; }

    // Decode steps (up to the MoE decode kernels' 16 rows) replay graphs of their fixed-shape
    // pieces, once a step of that row count has run eagerly (which sizes the workspaces the
    // graphs then hold). Profiling runs eagerly: section events are not graph nodes. Remote layers
    // over TCP wait on the host, so a plan with any runs eagerly; NCCL layers are graph pieces
    // when enabled (their headers staged by the host each step), and graphs die with the links
    // they hold.
    step_bucket *bucket_for(int64_t S) const {
        if (prof_.on()) return nullptr;
        uint64_t links = 0;
        for (int l = 0; l < int(layout_.layer_ranks.size()); l++) {
            if (layout_.layer_ranks[size_t(l)].empty()) continue;
            if (!nccl_ || !nccl_graphs_ || !layout_.layer_nccl(l)) return nullptr;
        }
        if (nccl_) links = nccl_->generation();
        return buckets_.get(*m_, S, cuda::MOE_MAX_ROWS, links);
    }

    // A remote NCCL layer's exchange headers for this step (experts/cuda/nccl_remote stage()).
    Status stage_remote(int layer, int64_t S) const {
        if (!nccl_ || !layout_.layer_nccl(layer)) return Status::ok();
        backend::cpu::expert_numerics nm;
        nm.official = official_;
        return nccl_->stage(layer, nm, S, int(c_.n_activated_experts));
    }

    // The window rings of the step's sequences that have none yet (a sequence's first step): FP8
    // records where head_dim is whole blocks of 32 (attn_site's window row is FP8-quantized
    // there), else fp32 rows.
    // With Engram, the history page too (all -1: nothing before the start).
    Status rings(const step_rows &B) const {
        const auto fmt = packed_kv_ && c_.head_dim % 32 == 0 ? cuda::key_format::FP8_UE8M0_32 : cuda::key_format::F32;
        for (seq_dev *sq : B.seq) {
            DS41RT_RETURN_IF_ERROR(make_rings(sq->ring, *pages_, c_.n_layers, c_.window, c_.head_dim, fmt));
            if (!has_engram_ || sq->engram_hist.get()) continue;
            constexpr int64_t HIST_BYTES = cuda::ENGRAM_MAX_NGRAM * sizeof(int32_t);
            Result<uint8_t *> p = pages_->take(HIST_BYTES);
            if (!p) return p.status();
            sq->engram_hist = pool_page(pages_.get(), *p, HIST_BYTES);
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*p, 0xff, HIST_BYTES, st()));
        }
        return Status::ok();
    }

    Status forward_rows(step_rows &B, const std::vector<int32_t> &tokens, float *logits) const override {
        const auto issue0 = std::chrono::steady_clock::now();
        const int64_t S = B.rows, D = c_.dim, V = c_.vocab_size;
        const int hc = c_.hc_mult;
        DS41RT_RETURN_IF_ERROR(rings(B));

        if (nccl_) DS41RT_RETURN_IF_ERROR(nccl_->prepare(S));  // links up before any capture
        step_frame frame(*m_, bucket_for(S), S);
        const step_bufs &b = frame.bufs();
        graphed_ = frame.graphed();

        begin("embed");
        const std::vector<int64_t> pos = B.positions();
        DS41RT_RETURN_IF_ERROR(m_->to_device(b.pos.as<void>(), pos.data(), pos.size() * sizeof(int64_t)));
        DS41RT_RETURN_IF_ERROR(m_->to_device(b.ids.as<void>(), tokens.data(), tokens.size() * sizeof(int32_t)));
        B.pos_d = b.pos.as<int64_t>();
        DS41RT_RETURN_IF_ERROR(cuda::embed_rows_bf16(embed_, V, D, b.ids.as<int32_t>(), S, hc, b.X.f(), st()));
        if (has_engram_) DS41RT_RETURN_IF_ERROR(engram_ids(B, b));
        // The first site reads stream 0. A graphed step's buffers are its row count's, which the
        // bucket's first (eager) step filled: no upload at the start of every step.
        if (!graphed_) {
            std::vector<float> one_hot(static_cast<size_t>(S * hc), 0.0f);
            for (int64_t s = 0; s < S; s++) one_hot[size_t(s * hc)] = 1.0f;
            DS41RT_RETURN_IF_ERROR(m_->to_device(b.pre_mix.f(), one_hot.data(), one_hot.size() * sizeof(float)));
        }
        end();

        std::vector<shared_sel> shs(B.seq.size());
        // Layer l's attention site: its Engram lookup where it has one, its mixes and collapse, and
        // the projections. The collapse reads the previous site's pre mix (the first site's
        // one-hot), so this site's mixes are only needed at its expand: they run beside the collapse
        // and the projections.
        auto attn_site = [&](int l) -> Status {
            const layer_dev &L = layers_[size_t(l)];
            if (c_.has_engram(l)) DS41RT_RETURN_IF_ERROR(engram(L, l, b));
            begin("mhc+norm");
            side_scope mixes(mix_side_, *m_);
            DS41RT_RETURN_IF_ERROR(site_mixes(mixes, b, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, b.am));
            auto xsplit = collapse_norm(b, l == 0 ? b.pre_mix.f() : b.fm.pre.f(), L.attn_norm);
            if (!xsplit) return xsplit.status();
            end();
            DS41RT_RETURN_IF_ERROR(attn_qkv(L, l, b, b.pos.as<int64_t>(), *xsplit));
            return mixes.join();
        };
        bool site_ran = false;  // layer l's attention site ran in layer l - 1's last piece
        for (int l = 0; l < c_.n_layers; l++) {
            const layer_dev &L = layers_[size_t(l)];
            // A replayed step's host runs at most one remote exchange ahead (nccl_remote keep_up).
            if (nccl_ && graphed_)
                if (Status ks = nccl_->keep_up(1); !ks) return m_->drain_after(ks);
            if (!site_ran) DS41RT_RETURN_IF_ERROR(frame.piece(size_t(2 * l), [&] { return attn_site(l); }));
            site_ran = false;
            DS41RT_RETURN_IF_ERROR(attn_core(L, l, B, b, shs));
            // The output projection, the FFN site and the MoE: a graph when the routed experts run
            // from device routes (local layers at decode).
            auto ffn = [&]() -> Status {
                DS41RT_RETURN_IF_ERROR(attn_out(L, l, b, b.pos.as<int64_t>()));
                begin("mhc+norm");
                DS41RT_RETURN_IF_ERROR(
                    cuda::hc_expand(b.X.f(), b.y.f(), b.am.post.f(), b.am.comb.f(), S, hc, D, official_, st()));
                // The FFN site's mixes beside its collapse and the MoE, as at the attention site;
                // their pre mix is the next site's (the next layer's attention collapse, or the head's).
                side_scope mixes(mix_side_, *m_);
                DS41RT_RETURN_IF_ERROR(site_mixes(mixes, b, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, b.fm));
                auto xsplit = collapse_norm(b, b.am.pre.f(), L.ffn_norm);
                if (!xsplit) return xsplit.status();
                end();
                moe_out mo;
                DS41RT_RETURN_IF_ERROR(moe(L, l, b.x.f(), S, &mo, *xsplit));
                DS41RT_RETURN_IF_ERROR(mixes.join());
                begin("mhc+norm");
                DS41RT_RETURN_IF_ERROR(cuda::hc_expand_sum(b.X.f(), mo.routed.f(), mo.shared.f(), b.fm.post.f(),
                                                           b.fm.comb.f(), S, hc, D, official_, st()));
                end();
                return Status::ok();
            };
            if (L.remote) DS41RT_RETURN_IF_ERROR(stage_remote(l, S));
            const bool nccl_layer = L.remote && nccl_ && layout_.layer_nccl(l);
            if (!(moe_on_device(L, S) || nccl_layer)) {
                DS41RT_RETURN_IF_ERROR(ffn());
                continue;
            }
            // The next layer's attention site (with its Engram lookup) joins this piece: one graph
            // launch a layer, not two.
            site_ran = l + 1 < c_.n_layers;
            DS41RT_RETURN_IF_ERROR(frame.piece(size_t(2 * l + 1), [&]() -> Status {
                DS41RT_RETURN_IF_ERROR(ffn());
                return site_ran ? attn_site(l + 1) : Status::ok();
            }));
        }
        frame.done();
        begin("head");
        DS41RT_RETURN_IF_ERROR(collapse_norm(b, c_.n_layers > 0 ? b.fm.pre.f() : b.pre_mix.f(), norm_, false).status());
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
    engram_hasher hasher_;
    bool has_engram_;
    cuda::engram_hash_tables engram_tables_;  // hasher_'s tables on the device (load_engram_tables)
    bool official_;
    bool batched_select_ = true;  // select_batched
    // Window halves of the key lists written on the device (key_lists.h); DS41RT_DEVICE_KEY_LISTS=0:
    // built on the host, for comparing.
    bool device_key_lists_ = true;
    // Index keys stored as FP4 records (source_dev; DS41RT_PACKED_INDEX_KEYS=0: fp32 rows, for
    // comparing): 7.5x less memory, the same bits, and read faster than fp32 keys since the scores
    // kernel stages them a word at a time (H100, session 27: 72 us for one row over 65536 keys,
    // 83 for fp32 keys in session 24).
    bool packed_keys_ = true;
    // The window rings and the compressed entries stored as packed records (rings(), new_state;
    // DS41RT_PACKED_KV=0: fp32 rows, for comparing): the same bits
    // (GpuVsCpu.PackedKvGivesTheBitsOfFp32Rows), 3.9x / 7.1x less memory, and attention decodes
    // them as it stages them: a C1 step at a 128-token context 2.6% slower than over fp32 rows
    // (2.34 -> 2.40 ms at 8 layers, H100 session 27), where the records save little reading.
    bool packed_kv_ = true;
    const uint16_t *embed_ = nullptr;
    dlinear head_;
    const float *norm_ = nullptr, *inv_main_ = nullptr, *inv_compress_ = nullptr;
    int n_pairs_ = 0;
    std::vector<layer_dev> layers_;
    experts::remote_layout layout_;
    std::unique_ptr<experts::remote_experts> remote_;  // set when some layers are remote
    mutable bool graphed_ = false;  // this step's pieces are graphs (captured or replayed)
    bool nccl_graphs_ = false;      // NCCL layers may be graph pieces (unless DS41RT_NCCL_GRAPHS=0)
#ifdef DS41RT_HAVE_NCCL
    std::unique_ptr<experts::nccl_remote> nccl_;  // set when some layers are on NCCL workers
#else
    struct no_nccl {
        Status prepare(int64_t) { return Status::ok(); }
        Status keep_up(size_t) { return Status::ok(); }
        uint64_t generation() const { return 0; }
        Status stage(int, const backend::cpu::expert_numerics &, int64_t, int) { return Status::ok(); }
    };
    std::unique_ptr<no_nccl> nccl_;  // never set: no NCCL in this build
#endif
    mutable section_timer prof_;
    mutable section_timer products_;  // the weight products' times (device_model::set_product_timer)
    mutable side_branch side_;      // the shared expert's branch (moe); the kv row's (attention)
    mutable side_branch mix_side_;  // an mHC site's mixes, beside its collapse and sublayer
    mutable step_buckets buckets_;
    mutable routed_decode routed_;
};

}  // namespace

Result<std::unique_ptr<engine>> make_v41_gpu_engine(std::unique_ptr<device_model> m, const engram_tables &tables,
                                                    const engine_options &opt) {
    const model::model_config &c = m->config();
    engram_hasher h;
    const bool has_engram = !c.engram_layer_ids.empty();
    if (has_engram) {
        auto r = engram_hasher::make(c, tables.token_map, tables.multipliers);
        if (!r) return r.status();
        h = std::move(r.value());
    }
    auto e = std::make_unique<v41_gpu>(std::move(m), std::move(h), has_engram, opt.profile, opt.remote);
    DS41RT_RETURN_IF_ERROR(e->load());
    return std::unique_ptr<engine>(std::move(e));
}

}  // namespace ds41rt::engine::gpu
