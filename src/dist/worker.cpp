#include "dist/worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "dist/expert_bytes.h"
#include "model/dummy_weights.h"
#include "model/expert_slice.h"
#include "model/weights.h"
#ifdef DS41RT_HAVE_CUDA
#include "dist/cuda/gpu_experts.h"
#endif
#ifdef DS41RT_HAVE_NCCL
#include "dist/cuda/nccl_worker.h"
#endif
#include "dist/nccl_wire.h"

namespace ds41rt::dist {

namespace {

// The CPU backend's pool takes one caller at a time (core/threads.h); several workers may share
// a process (tests), so the lock is the process's, not the worker's.
std::mutex &compute_mutex() {
    static std::mutex m;
    return m;
}

const char *arch_model_type(model::arch a) { return a == model::arch::V4 ? "deepseek_v4" : "deepseek_v41"; }

std::string layer_list(const std::vector<int> &ls) {
    std::string s;
    for (int l : ls) s += (s.empty() ? "" : ", ") + std::to_string(l);
    return "[" + s + "]";
}

}  // namespace

expert_worker::~expert_worker() = default;

Result<std::optional<expert_worker::layer_slice>> expert_worker::slice_of(const LayerPlacement &lp, int rank,
                                                                           const model::model_config &c, int align) {
    auto it = std::find(lp.ranks.begin(), lp.ranks.end(), rank);
    if (it == lp.ranks.end()) return std::optional<layer_slice>();
    layer_slice ls;
    ls.tp = lp.tp();
    ls.tp_rank = int(it - lp.ranks.begin());
    auto sl = tp_slice(c.moe_inter_dim, ls.tp, ls.tp_rank, align);
    if (!sl) return Status(sl.status().code(), "worker: layer " + std::to_string(lp.layer) + ": " + sl.status().message());
    ls.slice = *sl;
    return std::optional<layer_slice>(std::move(ls));
}

Result<std::unique_ptr<expert_worker>> expert_worker::load(const std::string &model_dir, const Plan &plan, int rank,
                                                           int device) {
    DS41RT_RETURN_IF_ERROR(validate(plan));
    if (rank < 0 || rank >= int(plan.workers.size()))
        return Status::invalid_argument("worker: --rank " + std::to_string(rank) + " is not a worker of the plan (" +
                                        std::to_string(plan.workers.size()) + " workers)");
    auto opened = model::weights::open(model_dir);
    if (!opened) return opened.status();
    model::weights &w = *opened.value();
    DS41RT_RETURN_IF_ERROR(w.check());
    std::unique_ptr<expert_worker> wk(new expert_worker());
    wk->cfg_ = w.config();
    wk->version_ = plan.version();
    wk->rank_ = rank;
    const model::model_config &c = wk->cfg_;
    if (plan.model_type != arch_model_type(c.model_arch))
        return Status::invalid_argument("worker: the plan is for " + plan.model_type + ", " + model_dir + " holds " +
                                        arch_model_type(c.model_arch));
    if (plan.num_layers != c.n_layers)
        return Status::invalid_argument("worker: the plan has " + std::to_string(plan.num_layers) + " layers, the model " +
                                        std::to_string(c.n_layers));
    // The planner cut the slices on the plan's format's blocks; cut the same way. A plan priced
    // for another publication would cut this checkpoint's blocks wrongly (an MXFP4 32-channel cut
    // splits an EXL3 rotation block): refuse it.
    auto format = parse_expert_format(plan.format);
    if (!format) return Status::invalid_argument("worker: plan: " + format.status().message());
    if (*format != c.routed_quant)
        return Status::invalid_argument("worker: the plan is for " + plan.format + " routed experts, " + model_dir +
                                        " holds " + std::string(model::expert_quant_name(c.routed_quant)) + " ones");
    const int align = expert_slice_align(c, *format);
    for (const LayerPlacement &lp : plan.layers) {
        if (!lp.remote) continue;
        auto held = slice_of(lp, rank, c, align);
        if (!held) return held.status();
        if (!*held) continue;  // not this rank's layer
        layer_slice ls = std::move(**held);
        const std::string p = "layers." + std::to_string(lp.layer) + ".ffn.experts.";
        if (device >= 0) {
#ifdef DS41RT_HAVE_CUDA
            if (!wk->gpu_) {
                auto g = gpu_experts::make(device);
                if (!g) return Status(g.status().code(), "worker: GPU " + std::to_string(device) + ": " + g.status().message());
                wk->gpu_ = std::move(g.value());
            }
            // Each expert's {w1, w2, w3} cut in the stored format, by `slice` (expert_slice_*).
            auto cut_all = [&](auto slice, auto &slices) -> Status {
                slices.resize(size_t(c.n_routed_experts));
                for (int e = 0; e < c.n_routed_experts; e++) {
                    const std::string ep = p + std::to_string(e) + ".";
                    const std::pair<const char *, model::slice_axis> parts[] = {
                        {"w1.weight", model::slice_axis::OUT}, {"w2.weight", model::slice_axis::IN}, {"w3.weight", model::slice_axis::OUT}};
                    for (int i = 0; i < 3; i++) {
                        auto t = slice(w, ep + parts[i].first, parts[i].second, ls.slice.begin, ls.slice.end);
                        if (!t) return Status(t.status().code(), "worker: " + t.status().message());
                        slices[size_t(e)][size_t(i)] = std::move(t.value());
                    }
                }
                return Status::ok();
            };
            const std::string at = "worker: layer " + std::to_string(lp.layer) + " on GPU " + std::to_string(device) + ": ";
            if (c.routed_quant == model::expert_quant::NVFP4) {
                std::vector<std::array<model::nvfp4_slice, 3>> slices;
                DS41RT_RETURN_IF_ERROR(cut_all(model::expert_slice_nvfp4, slices));
                if (Status st = wk->gpu_->add_nvfp4_layer(lp.layer, c.dim, c.swiglu_limit, std::move(slices)); !st)
                    return Status(st.code(), at + st.message());
            } else if (c.routed_quant == model::expert_quant::OFFICIAL) {
                std::vector<std::array<model::mxfp4_slice, 3>> slices;
                DS41RT_RETURN_IF_ERROR(cut_all(model::expert_slice_mxfp4, slices));
                if (Status st = wk->gpu_->add_layer(lp.layer, c.dim, c.swiglu_limit, std::move(slices)); !st)
                    return Status(st.code(), at + st.message());
            } else {
                std::vector<std::array<model::exl3_slice, 3>> slices;
                DS41RT_RETURN_IF_ERROR(cut_all(model::expert_slice_exl3, slices));
                if (Status st = wk->gpu_->add_exl3_layer(lp.layer, c.dim, c.swiglu_limit, std::move(slices)); !st)
                    return Status(st.code(), at + st.message());
            }
            wk->layers_[lp.layer] = std::move(ls);
            continue;
#else
            return Status::not_supported("worker: --device needs a build with CUDA");
#endif
        }
        ls.experts.resize(size_t(c.n_routed_experts));
        // w1 / w3 rows and w2 columns of the slice, cut in the stored format (only the slice is
        // decoded; bit-identical to cutting the decoded tensor, model/expert_slice.h).
        for (int e = 0; e < c.n_routed_experts; e++) {
            const std::string ep = p + std::to_string(e) + ".";
            auto &x = ls.experts[size_t(e)];
            const std::pair<const char *, model::slice_axis> parts[] = {
                {"w1.weight", model::slice_axis::OUT}, {"w2.weight", model::slice_axis::IN}, {"w3.weight", model::slice_axis::OUT}};
            Tensor *dst[] = {&x.w1, &x.w2, &x.w3};
            for (int i = 0; i < 3; i++) {
                auto t = model::expert_slice_f32(w, ep + parts[i].first, parts[i].second, ls.slice.begin, ls.slice.end);
                if (!t) return Status(t.status().code(), "worker: " + t.status().message());
                *dst[i] = std::move(t.value());
            }
            if (c.routed_quant == model::expert_quant::NVFP4) {
                // The activation scales are per tensor: every rank quantizes its rows as the
                // whole expert does, and a 16-aligned slice of h is whole quantization blocks.
                float *sc[] = {&x.w13_input_scale, &x.w2_input_scale};
                const char *names[] = {"w1.input_scale", "w2.input_scale"};
                for (int i = 0; i < 2; i++) {
                    auto t = w.f32(ep + names[i]);
                    if (!t) return Status(t.status().code(), "worker: " + t.status().message());
                    *sc[i] = t->f()[0];
                }
            }
        }
        wk->layers_[lp.layer] = std::move(ls);
    }
    if (wk->layers_.empty())
        return Status::invalid_argument("worker: the plan places no layer on worker " + std::to_string(rank));
    return wk;
}

Result<std::unique_ptr<expert_worker>> expert_worker::load_dummy(const model::model_config &c, const Plan &plan,
                                                                 int rank, int device, uint64_t seed) {
    DS41RT_RETURN_IF_ERROR(validate(plan));
    if (rank < 0 || rank >= int(plan.workers.size()))
        return Status::invalid_argument("worker: --rank " + std::to_string(rank) + " is not a worker of the plan (" +
                                        std::to_string(plan.workers.size()) + " workers)");
    if (device < 0) return Status::invalid_argument("worker: dummy weights are filled on a GPU: give --device");
    if (plan.model_type != arch_model_type(c.model_arch))
        return Status::invalid_argument("worker: the plan is for " + plan.model_type + ", the dummy model is " +
                                        arch_model_type(c.model_arch));
    // A plan over the first N layers (`ds41rt bench --layers N`) cuts the model as the
    // coordinator's dummy engine does; the fill's tensor ids do not depend on the cut.
    if (plan.num_layers > c.n_layers)
        return Status::invalid_argument("worker: the plan has " + std::to_string(plan.num_layers) + " layers, the model " +
                                        std::to_string(c.n_layers));
    auto pf = parse_expert_format(plan.format);
    if (!pf || pf.value() != c.routed_quant)
        return Status::invalid_argument("worker: the plan is for " + plan.format + " experts, the model's routed experts are " +
                                        model::expert_quant_name(c.routed_quant));
#ifndef DS41RT_HAVE_CUDA
    (void)seed;
    return Status::not_supported("worker: dummy weights need a build with CUDA");
#else
    const bool exl3 = c.routed_quant == model::expert_quant::EXL3, nvfp4 = c.routed_quant == model::expert_quant::NVFP4;
    auto dplan = model::plan_dummy_weights(c, plan.num_layers);
    if (!dplan) return dplan.status();
    std::map<std::string, const model::dummy_tensor *> by_name;
    for (const auto &t : dplan->tensors) by_name[t.entry.name] = &t;
    std::unique_ptr<expert_worker> wk(new expert_worker());
    wk->cfg_ = c;
    wk->cfg_.n_layers = plan.num_layers;
    wk->version_ = plan.version();
    wk->rank_ = rank;
    auto g = gpu_experts::make(device);
    if (!g) return Status(g.status().code(), "worker: GPU " + std::to_string(device) + ": " + g.status().message());
    wk->gpu_ = std::move(g.value());
    const int align = expert_slice_align(c, c.routed_quant);
    const model::storage_format stored = expert_storage(c.routed_quant);
    for (const LayerPlacement &lp : plan.layers) {
        if (!lp.remote) continue;
        auto held = slice_of(lp, rank, c, align);
        if (!held) return held.status();
        if (!*held) continue;  // not this rank's layer
        layer_slice ls = std::move(**held);
        std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> windows(size_t(c.n_routed_experts));
        const char *parts[3] = {"w1.weight", "w2.weight", "w3.weight"};
        for (int e = 0; e < c.n_routed_experts; e++)
            for (int i = 0; i < 3; i++) {
                const std::string name = "layers." + std::to_string(lp.layer) + ".ffn.experts." + std::to_string(e) + "." + parts[i];
                auto f = by_name.find(name);
                if (f == by_name.end()) return Status::not_found("worker: " + name + " is not in the dummy-weight plan");
                const model::dummy_tensor &t = *f->second;
                if (t.entry.format != stored || t.rule.init != model::dummy_init::NORMAL)
                    return Status::not_supported("worker: " + name + " is not an " + model::storage_format_name(stored) +
                                                 " tensor of normal values");
                backend::cpu::dummy_tensor_desc d;  // as engine/cuda/device_model fills the whole tensor
                d.name = t.entry.name.c_str();
                d.format = exl3    ? backend::cpu::dummy_format::EXL3
                           : nvfp4 ? backend::cpu::dummy_format::NVFP4
                                   : backend::cpu::dummy_format::MXFP4;
                if (t.input_amax > 0) d.input_amax = t.input_amax;
                if (t.exl3_bits > 0) d.exl3_bits = t.exl3_bits;
                d.exl3_code_rms = t.exl3_code_rms;
                d.rows = t.entry.shape.size() >= 2 ? t.entry.shape[0] : 1;
                d.cols = t.entry.shape.empty() ? 1 : t.entry.shape.back();
                d.block_out = t.block_out;
                d.block_in = t.block_in;
                d.dist = backend::cpu::dummy_dist::NORMAL;
                d.std = t.rule.std;
                d.id = t.id;
                if (i == 1) {  // w2 [D, I]: this rank's columns
                    d.col0 = ls.slice.begin;
                    d.ncols = ls.slice.width();
                } else {  // w1 / w3 [I, D]: this rank's rows
                    d.row0 = ls.slice.begin;
                    d.nrows = ls.slice.width();
                }
                windows[size_t(e)][size_t(i)] = d;
            }
        if (exl3)
            DS41RT_RETURN_IF_ERROR(wk->gpu_->add_dummy_exl3_layer(lp.layer, c.dim, c.swiglu_limit, windows, seed, c.exl3_cb));
        else if (nvfp4)
            DS41RT_RETURN_IF_ERROR(wk->gpu_->add_dummy_nvfp4_layer(lp.layer, c.dim, c.swiglu_limit, windows, seed));
        else
            DS41RT_RETURN_IF_ERROR(
                wk->gpu_->add_dummy_layer(lp.layer, c.dim, ls.slice.width(), c.swiglu_limit, windows, seed));
        wk->layers_[lp.layer] = std::move(ls);
    }
    if (wk->layers_.empty())
        return Status::invalid_argument("worker: the plan places no layer on worker " + std::to_string(rank));
    return wk;
#endif
}

std::vector<int> expert_worker::layers() const {
    std::vector<int> out;
    for (const auto &[l, s] : layers_) out.push_back(l);
    return out;
}

frame_bytes expert_worker::answer_request(const frame_bytes &in) {
    auto req = decode_request(in);
    frame_header h;
    if (auto hd = decode_header(in.data(), in.size())) h = *hd;  // echo what can be echoed
    h.executor = uint32_t(rank_);
    h.placement_version = version_;
    if (!req) return encode_error(h, req.status());
    const frame_header &rh = req->h;
    auto refuse = [&](Status st) {
        spdlog::warn("worker {}: request {} refused: {}", rank_, rh.request_id, st.message());
        return encode_error(h, st);
    };
    if (rh.placement_version != version_)
        return refuse(Status::unavailable("stale placement version: the request has " +
                                          std::to_string(rh.placement_version) + ", worker " + std::to_string(rank_) +
                                          " runs " + std::to_string(version_)));
    auto it = layers_.find(int(rh.layer));
    if (it == layers_.end())
        return refuse(Status::invalid_argument("wrong layer " + std::to_string(rh.layer) + ": worker " +
                                               std::to_string(rank_) + " holds layers " + layer_list(layers())));
    if (int64_t(rh.dim) != cfg_.dim)
        return refuse(Status::invalid_argument("hidden dim " + std::to_string(rh.dim) + " (the model's is " +
                                               std::to_string(cfg_.dim) + ")"));
    const layer_slice &ls = it->second;
    h.tp_rank = uint8_t(ls.tp_rank);
    h.tp = uint8_t(ls.tp);
    backend::cpu::expert_numerics nm;
    nm.official = rh.flags & FLAG_OFFICIAL;
    nm.weight_after_w2 = rh.flags & FLAG_WEIGHT_AFTER_W2;
    nm.act_block = cfg_.fp8_block_in;
    nm.kind = backend::cpu::lin::FP4;
    nm.swiglu_limit = cfg_.swiglu_limit;
    std::vector<float> partial(size_t(rh.rows) * rh.dim);
    Status st;
    {
        std::lock_guard<std::mutex> lk(compute_mutex());
#ifdef DS41RT_HAVE_CUDA
        if (gpu_)
            st = gpu_->run(int(rh.layer), nm, req->hidden.data(), int64_t(rh.rows), req->routes, partial.data());
        else
#endif
            st = backend::cpu::routed_expert_sum(nm, ls.experts, req->hidden.data(), rh.dim, req->routes, partial.data());
    }
    if (!st) return refuse(st);
    return encode_response(h, partial.data());
}

frame_bytes expert_worker::handle(const frame_bytes &in, bool *close_after) {
    *close_after = false;
    auto h = decode_header(in.data(), in.size());
    if (!h) {
        *close_after = true;
        frame_header e;
        e.executor = uint32_t(rank_);
        e.placement_version = version_;
        spdlog::warn("worker {}: frame refused, closing the connection: {}", rank_, h.status().message());
        return encode_error(e, h.status());
    }
    switch (h->kind) {
    case frame_kind::HELLO:
        // The coordinator compares and refuses; the log says so on this side too.
        if (h->placement_version != version_)
            spdlog::warn("worker {}: a coordinator with placement version {} connected (this worker runs {})", rank_,
                         h->placement_version, version_);
        return encode_hello(frame_kind::HELLO_REPLY, version_, uint32_t(rank_));
    case frame_kind::EXPERT_REQUEST: return answer_request(in);
    default: {
        frame_header e = *h;
        e.executor = uint32_t(rank_);
        e.placement_version = version_;
        return encode_error(e, Status::invalid_argument(std::string("a worker does not answer ") + frame_kind_name(h->kind)));
    }
    }
}

void expert_worker::serve_connection(std::unique_ptr<channel> ch, const std::atomic<bool> &stop) {
    spdlog::info("worker {}: connection from {}", rank_, ch->peer());
    while (!stop.load() && ch->is_open()) {
        if (!ch->wait_readable(after_ms(200))) continue;
        auto in = ch->recv(after_ms(30000));
        bool close_after = false;
        frame_bytes out;
        if (!in) {
            if (in.status().code() != status_code::CORRUPTION) break;  // closed or timed out: nothing to answer
            frame_header e;
            e.executor = uint32_t(rank_);
            e.placement_version = version_;
            spdlog::warn("worker {}: {}; closing the connection", rank_, in.status().message());
            out = encode_error(e, in.status());
            close_after = true;
        } else if (auto h = decode_header(in->data(), in->size()); h && h->kind == frame_kind::NCCL_BOOTSTRAP) {
            // The connection becomes the NCCL data path's control channel until the link ends.
            serve_nccl_link(*ch, *in, stop);
            break;
        } else {
            out = handle(*in, &close_after);
        }
        if (!ch->send(out, after_ms(30000))) break;
        if (close_after) break;
    }
    spdlog::info("worker {}: connection from {} ended", rank_, ch->peer());
    ch->close();
}

void expert_worker::serve_nccl_link(channel &ch, const frame_bytes &in, const std::atomic<bool> &stop) {
    frame_header e;
    e.executor = uint32_t(rank_);
    e.placement_version = version_;
    auto b = decode_nccl_bootstrap(in, version_);
    Status st = b.status();
    if (st && b->executor != uint32_t(rank_))
        st = Status::invalid_argument("NCCL bootstrap for worker " + std::to_string(b->executor) + ", this is worker " +
                                      std::to_string(rank_));
#ifdef DS41RT_HAVE_NCCL
    if (st && !gpu_) st = Status::not_supported("NCCL transport: this worker holds its slices on the CPU (start it with --device)");
#else
    if (st) st = Status::not_supported("NCCL transport: this build has no NCCL");
#endif
    if (!st) {
        spdlog::warn("worker {}: NCCL bootstrap refused: {}", rank_, st.message());
        (void)ch.send(encode_error(e, st), after_ms(5000));
        return;
    }
    frame_header r = e;
    r.kind = frame_kind::NCCL_BOOTSTRAP_REPLY;
    if (!ch.send(encode_frame(r, {}), after_ms(5000))) return;
#ifdef DS41RT_HAVE_NCCL
    nccl_worker_info info;
    info.placement_version = version_;
    info.executor = uint32_t(rank_);
    info.dim = cfg_.dim;
    for (const auto &[l, s] : layers_) info.layers[l] = {s.tp_rank, s.tp};
    info.numerics.act_block = cfg_.fp8_block_in;
    info.numerics.kind = backend::cpu::lin::FP4;
    info.numerics.swiglu_limit = cfg_.swiglu_limit;
    if (Status s = serve_nccl(ch, *b, *gpu_, info, compute_mutex(), stop); !s)
        spdlog::warn("worker {}: NCCL link to {} ended: {}", rank_, ch.peer(), s.message());
#endif
}

Status expert_worker::serve(tcp_listener &l, const std::atomic<bool> &stop) {
    std::vector<std::thread> conns;
    Status result = Status::ok();
    while (!stop.load()) {
        auto ch = l.accept(after_ms(200));
        if (!ch) {
            if (ch.status().code() == status_code::UNAVAILABLE) continue;  // the stop poll interval
            result = ch.status();
            break;
        }
        conns.emplace_back([this, c = std::move(ch.value()), &stop]() mutable { serve_connection(std::move(c), stop); });
    }
    for (auto &t : conns) t.join();
    return result;
}

}  // namespace ds41rt::dist
