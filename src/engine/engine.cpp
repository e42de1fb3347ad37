// engine::open: reads the checkpoint through the model room's catalog and builds the forward
// pass of its architecture.
#include "engine/engine.h"

#include <filesystem>

#include "engine/v41_model.h"
#ifdef DS41RT_HAVE_CUDA
#include "engine/cuda/v41_gpu.h"
#include "engine/cuda/v4_gpu.h"
#endif
#include "engine/v4_model.h"
#include "io/safetensors.h"
#include "model/dummy_weights.h"
#include "model/weights.h"

namespace ds41rt::engine {

namespace {

// The Engram hash tables that do not live in the checkpoint (spec 4.9): the compressed token
// map (built offline from the tokenizer) and, for non-released configs, the multipliers.
// File: DIR/engram_token_map.safetensors with engram.token_map [vocab] and optionally
// engram.multipliers [engram layers, max_ngram], both I64.
Result<engram_tables> load_engram_tables(const std::string &dir) {
    const std::string path = dir + "/engram_token_map.safetensors";
    if (!std::filesystem::exists(path))
        return Status::not_found(path + ": the Engram layers need the compressed token map");
    auto f = io::safetensors_file::open(path);
    if (!f) return f.status();
    engram_tables t;
    auto read_i64 = [&](const std::string &name, std::vector<int64_t> *out, bool required) -> Status {
        auto r = f.value()->get(name);
        if (!r) return required ? r.status() : Status::ok();
        if (r->type() != dtype::I64) return Status::corruption(path + ": " + name + " must be I64");
        out->assign(r->data<int64_t>(), r->data<int64_t>() + r->numel());
        return Status::ok();
    };
    DS41RT_RETURN_IF_ERROR(read_i64("engram.token_map", &t.token_map, true));
    DS41RT_RETURN_IF_ERROR(read_i64("engram.multipliers", &t.multipliers, false));
    return t;
}

}  // namespace

Result<std::unique_ptr<engine>> engine::open(const std::string &dir, const engine_options &opt) {
    auto opened = model::weights::open(dir);
    if (!opened) return opened.status();
    std::shared_ptr<model::weights> w(std::move(opened.value()));
    DS41RT_RETURN_IF_ERROR(w->check());
    weight_source src = [w](const std::string &name) { return w->f32(name); };
    const model::model_config &c = w->config();
    switch (c.model_arch) {
    case model::arch::V41: {
        engram_tables tables;
        if (!c.engram_layer_ids.empty()) {
            auto t = load_engram_tables(dir);
            if (!t) return t.status();
            tables = std::move(t.value());
        }
        if (opt.backend == backend_kind::CUDA) {
#ifdef DS41RT_HAVE_CUDA
            auto m = gpu::device_model::make(w, opt.mode == numerics::OFFICIAL);
            if (!m) return m.status();
            return gpu::make_v41_gpu_engine(std::move(m.value()), tables, opt);
#else
            return Status::not_supported("this build has no CUDA backend (built without nvcc)");
#endif
        }
        return make_v41_engine(c, src, tables, opt);
    }
    case model::arch::V4:
        if (opt.backend == backend_kind::CUDA) {
#ifdef DS41RT_HAVE_CUDA
            auto m = gpu::device_model::make(w, opt.mode == numerics::OFFICIAL);
            if (!m) return m.status();
            return gpu::make_v4_gpu_engine(std::move(m.value()), opt);
#else
            return Status::not_supported("this build has no CUDA backend (built without nvcc)");
#endif
        }
        return make_v4_engine(c, src, opt);
    }
    return Status::internal("unknown architecture");
}

Result<std::unique_ptr<engine>> engine::open_dummy(const model::model_config &c, int layers, uint64_t seed,
                                                   const engine_options &opt) {
    if (opt.backend != backend_kind::CUDA)
        return Status::not_supported("dummy weights are generated on the GPU: use the CUDA backend");
#ifdef DS41RT_HAVE_CUDA
    auto plan = model::plan_dummy_weights(c, layers);
    if (!plan) return plan.status();
    model::model_config cut = c;
    cut.n_layers = plan->layers;
    // The compressed token map is built offline from the tokenizer; any map into the compressed
    // vocabulary exercises the hash the same way.
    engram_tables tables;
    if (!c.engram_layer_ids.empty()) {
        tables.token_map.resize(size_t(c.vocab_size));
        for (int64_t t = 0; t < c.vocab_size; t++)
            tables.token_map[size_t(t)] = t % std::max<int64_t>(1, c.engram_compressed_vocab_size);
    }
    auto m = gpu::device_model::make_dummy(cut, std::move(plan.value()), seed, opt.mode == numerics::OFFICIAL);
    if (!m) return m.status();
    if (c.model_arch == model::arch::V4) return gpu::make_v4_gpu_engine(std::move(m.value()), opt);
    return gpu::make_v41_gpu_engine(std::move(m.value()), tables, opt);
#else
    (void)layers;
    (void)seed;
    return Status::not_supported("this build has no CUDA backend (built without nvcc)");
#endif
}

}  // namespace ds41rt::engine
