#include "engine/cuda/step_bufs.h"

#include "backend/cuda/engram_hash.cuh"

namespace ds41rt::engine::gpu {

namespace {
// A decode piece's temporaries (S <= 16 rows) take a few MB; a capture that needs more takes the
// rest from the pool (graph memory nodes), which is correct, only slower.
constexpr size_t STEP_ARENA_BYTES = size_t(64) << 20;
}  // namespace

step_bufs make_step_bufs(const device_model &m, int64_t S) {
    const model::model_config &c = m.config();
    const int64_t D = c.dim, hc = c.hc_mult, H = c.n_heads, hd = c.head_dim;
    step_bufs b;
    b.S = S;
    b.X = m.temp_f32(S * hc * D);
    b.x = m.temp_f32(S * D);
    b.y = m.temp_f32(S * D);
    b.qr = m.temp_f32(S * c.q_lora_rank);
    b.q = m.temp_f32(S * H * hd);
    b.kv = m.temp_f32(S * hd);
    b.o = m.temp_f32(S * H * hd);
    b.am = m.hc_mix_buffers(S);
    b.fm = m.hc_mix_buffers(S);
    b.pre_mix = m.temp_f32(S * hc);
    if (S <= 16) {
        b.xs = m.temp(size_t(S * D));
        b.sx = m.temp_f32((D + 31) / 32 * 16);
    }
    b.pos = m.temp(size_t(S) * sizeof(int64_t));
    b.ids = m.temp(size_t(S) * sizeof(int32_t));
    if (!c.engram_layer_ids.empty()) {
        b.erows = m.temp(size_t(S) * sizeof(backend::cuda::engram_hash_row));
        b.eids = m.temp(c.engram_layer_ids.size() * size_t(S) * size_t(c.engram_max_ngram - 1) * size_t(c.engram_n_heads) *
                        sizeof(int64_t));
    }
    return b;
}

step_bucket *step_buckets::get(const device_model &m, int64_t S, int64_t max_rows, uint64_t links_gen) {
    if (!on_ || S > max_rows) return nullptr;
    if (!arena_) arena_ = make_device_arena(STEP_ARENA_BYTES);
    auto &slot = by_rows_[S];
    if (!slot) {
        slot = std::make_unique<step_bucket>(m.stream(), arena_);
        slot->b = make_step_bufs(m, S);
    }
    if (slot->ws_gen != m.workspace_generation() || slot->links_gen != links_gen) {
        slot->graphs.clear();
        slot->warm = false;
        slot->ws_gen = m.workspace_generation();
        slot->links_gen = links_gen;
    }
    return slot.get();
}

}  // namespace ds41rt::engine::gpu
