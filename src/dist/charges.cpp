// Charging rules (see charges.h). Each constant names its source; everything else is shapes.
#include "dist/charges.h"

#include <algorithm>

namespace ds41rt::dist {

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
uint64_t round_up(uint64_t a, uint64_t b) { return ceil_div(a, b) * b; }

// One window-ring row. V4.1 (V4.1 spec 7): FP8 E4M3 over all head_dim channels plus an E8M0
// scale per 32 = 528 B. V4 (V4 spec 4, vLLM's packed form): FP8 nope + UE8M0 per 64 + BF16
// rope, padded to 8 bytes = 584 B.
uint64_t window_row_bytes(const model::model_config &c) {
    const uint64_t hd = uint64_t(c.head_dim);
    if (c.model_arch == model::arch::V41) return hd + hd / 32;
    const uint64_t nope = uint64_t(c.nope_head_dim()), rope = uint64_t(c.rope_head_dim);
    return round_up(nope + ceil_div(nope, 64) + 2 * rope, 8);
}

// One indexer key (both specs): FP4 E2M1 + E8M0 per 32 = 68 B at 128 channels.
uint64_t index_key_bytes(const model::model_config &c) {
    const uint64_t d = uint64_t(c.index_head_dim);
    return d / 2 + ceil_div(d, 32);
}

// Bytes one row of the remote-layer request carries (reference-system 1.6): the hidden row as
// FP8 E4M3 + UE8M0 per 32 for MXFP4 and EXL3 experts, BF16 for NVFP4 (W4A4 quantizes in-kernel
// from BF16), plus the 40-byte row descriptor and 12 bytes per route.
uint64_t request_row_bytes(const model::model_config &c, expert_format f) {
    const uint64_t dim = uint64_t(c.dim);
    const uint64_t hidden = f == expert_format::NVFP4 ? 2 * dim : dim + dim / 32;
    return hidden + 40 + 12 * uint64_t(c.n_activated_experts);
}
constexpr uint64_t FRAME_HEADER_BYTES = 128;  // reference-system 1.5

int smallest_ratio(const model::model_config &c) {
    int r = 0;
    for (int l = 0; l < c.n_layers; l++)
        if (c.ratio(l) > 0 && (r == 0 || c.ratio(l) < r)) r = c.ratio(l);
    return r;
}

}  // namespace

int64_t kv_tokens(int64_t context) { return int64_t(round_up(uint64_t(std::max<int64_t>(context, 1)), KV_PAGE_TOKENS)); }

layer_state layer_state_bytes(const model::model_config &c, int layer, int64_t tokens) {
    layer_state s;
    const uint64_t row = window_row_bytes(c);
    s.window = uint64_t(c.window) * row;
    if (!c.is_kv_source(layer)) return s;
    const uint64_t ratio = uint64_t(c.ratio(layer));
    const uint64_t entries = ceil_div(uint64_t(tokens), ratio);
    const uint64_t hd = uint64_t(c.head_dim);
    if (c.model_arch == model::arch::V41) {
        // V4.1 spec 7: a compressed entry is FP4 E2M1 + E4M3 per 16 (288 B), and every KV source
        // owns index keys; 3 ratio-2 sources + 1 ratio-1 source = 890 B per token. The ratio-2
        // compressor carries one pending token: kv and score states [ratio, head_dim] fp32 (4.4).
        s.compressed = entries * (hd / 2 + hd / 16);
        s.index_keys = entries * index_key_bytes(c);
        if (ratio > 1) s.carry = 2 * ratio * hd * 4;
        return s;
    }
    // V4 spec 4: every compressing layer owns its entries (584 B, the window-row format); CSA
    // (ratio 4) layers also own index keys and carry overlapping states 2 x [2m, 2d] for the main
    // (d = head_dim) and the indexer's compressor (d = index_head_dim); HCA 2 x [m, head_dim].
    s.compressed = entries * row;
    if (c.is_index_source(layer)) {
        s.index_keys = entries * index_key_bytes(c);
        s.carry = 2 * (2 * ratio) * (2 * hd) * 4 + 2 * (2 * ratio) * (2 * uint64_t(c.index_head_dim)) * 4;
    } else {
        s.carry = 2 * ratio * hd * 4;
    }
    return s;
}

uint64_t drafter_state_bytes(const model::model_config &c) {
    // V4.1 spec 7: 3 DSpark rings of 128 x 512 FP8 = 203 KB; V4 spec 4: the MTP layer's ring.
    return uint64_t(c.n_mtp_layers) * uint64_t(c.window) * window_row_bytes(c);
}

int64_t step_rows(const load_targets &t) {
    return std::max<int64_t>(t.prefill_batch, logit_rows(t));
}

int64_t logit_rows(const load_targets &t) { return int64_t(t.concurrency) * (1 + t.draft_tokens); }

uint64_t coordinator_workspace_bytes(const model::model_config &c, const load_targets &t) {
    const uint64_t dim = uint64_t(c.dim), heads = uint64_t(c.n_heads), hd = uint64_t(c.head_dim);
    const uint64_t inter = uint64_t(c.moe_inter_dim), topk = uint64_t(c.n_activated_experts);
    // Per row of the step, live at once inside one layer:
    const uint64_t resid = 2 * uint64_t(c.hc_mult) * dim * 4;  // mHC streams in and out, fp32
    const uint64_t x = 2 * dim * 4;                             // normed input, sublayer output
    const uint64_t q = (uint64_t(c.q_lora_rank) + heads * hd) * 2;
    const uint64_t attn = (heads * hd + uint64_t(c.o_groups) * c.o_lora_rank) * 2;
    const uint64_t scores = heads * (uint64_t(c.window) + uint64_t(c.index_topk)) * 4;  // <= window + top-k keys
    // Indexer: bf16 queries and fp32 scores over the visible compressed entries, streamed in
    // tiles of at most 65,536 entries per row (a top-k merge keeps the rest out of memory).
    const int r = smallest_ratio(c);
    const uint64_t visible = r > 0 ? uint64_t(kv_tokens(t.context)) / uint64_t(r) : 0;
    const uint64_t index = uint64_t(c.index_n_heads) * c.index_head_dim * 2 + std::min<uint64_t>(visible, 65536) * 4;
    const uint64_t moe = uint64_t(c.n_routed_experts) * 4 + topk * (2 * inter + dim) * 4 +
                         2 * inter * uint64_t(c.n_shared_experts) * 4;
    return uint64_t(step_rows(t)) * (resid + x + q + attn + scores + index + moe);
}

uint64_t logits_bytes(const model::model_config &c, const load_targets &t) {
    return uint64_t(logit_rows(t)) * uint64_t(c.vocab_size) * 4;
}

uint64_t coordinator_transport_bytes(const model::model_config &c, expert_format f, const load_targets &t, int tp) {
    const uint64_t rows = uint64_t(step_rows(t));
    const uint64_t send = rows * request_row_bytes(c, f) + FRAME_HEADER_BYTES;
    const uint64_t recv = uint64_t(tp) * (rows * uint64_t(c.dim) * 2 + FRAME_HEADER_BYTES);  // BF16 partials
    return 2 * (send + recv);  // two lanes: one fills while the other waits
}

uint64_t graph_bytes(const load_targets &t, double layer_share) {
    // One graph per power-of-two row bucket up to the decode-and-verify rows (prefill is not
    // captured). Calibration: the reference measured +74 MiB for a full C16 warm-up
    // (reference-system 3, "CUDA graphs"); C16 with 5 drafts needs 96 rows, 8 buckets (1..128),
    // so a full-step graph is charged 74 MiB / 8.
    uint64_t buckets = 1;
    for (int64_t b = 1; b < logit_rows(t); b *= 2) buckets++;
    const double bytes = double(buckets) * double(74 * MiB) / 8.0 * std::clamp(layer_share, 0.0, 1.0);
    return uint64_t(bytes + 0.5);
}

uint64_t request_bytes(const model::model_config &c, const load_targets &t) {
    // Per sampled row: the fp32 logit copy, sort keys and indices of the sampler (3 x 4 B per
    // vocabulary entry) and a grammar mask bit per entry; per request one snapshot of its window
    // rings (prefix reuse and rollback restore whole windows, V4.1 spec 7).
    const uint64_t vocab = uint64_t(c.vocab_size);
    const uint64_t rows = uint64_t(1 + t.draft_tokens);
    uint64_t snapshot = drafter_state_bytes(c);
    for (int l = 0; l < c.n_layers; l++) snapshot += layer_state_bytes(c, l, 0).window;
    return uint64_t(t.concurrency) * (rows * (vocab * 12 + ceil_div(vocab, 8)) + snapshot);
}

uint64_t worker_workspace_bytes(const model::model_config &c, const load_targets &t, int64_t width) {
    const uint64_t dim = uint64_t(c.dim), w = uint64_t(width), topk = uint64_t(c.n_activated_experts);
    // Per row: the dequantized BF16 input, per route the fp32 gate and up of the slice and the
    // BF16 product fed to w2, and the fp32 partial sum over routes.
    const uint64_t per_row = dim * 2 + topk * (2 * w * 4 + w * 2) + dim * 4;
    return uint64_t(step_rows(t)) * per_row;
}

uint64_t worker_transport_bytes(const model::model_config &c, expert_format f, const load_targets &t) {
    const uint64_t rows = uint64_t(step_rows(t));
    const uint64_t recv = rows * request_row_bytes(c, f) + FRAME_HEADER_BYTES;
    const uint64_t send = rows * uint64_t(c.dim) * 2 + FRAME_HEADER_BYTES;
    return 2 * (recv + send);
}

uint64_t runtime_bytes() {
    // A CUDA context on the H200 (torch 2.11, driver 580.159.04, 2026-11-30) measured 621 MiB
    // by cudaMemGetInfo; 1 GiB leaves room for our own kernels' module images, which CUDA's lazy
    // loading brings in on first use (request time, when nothing else may be allocated).
    return GiB;
}

uint64_t headroom_bytes(uint64_t dynamic_bytes, const load_targets &t) {
    return dynamic_bytes / 8 + uint64_t(t.concurrency) * 64 * MiB;
}

}  // namespace ds41rt::dist
