#include "dist/worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "dist/expert_bytes.h"
#include "model/expert_slice.h"
#include "model/weights.h"
#ifdef DS41RT_HAVE_CUDA
#include "dist/cuda/gpu_experts.h"
#endif

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
        auto it = std::find(lp.ranks.begin(), lp.ranks.end(), rank);
        if (it == lp.ranks.end()) continue;
        layer_slice ls;
        ls.tp = lp.tp();
        ls.tp_rank = int(it - lp.ranks.begin());
        auto sl = tp_slice(c.moe_inter_dim, ls.tp, ls.tp_rank, align);
        if (!sl) return Status(sl.status().code(), "worker: layer " + std::to_string(lp.layer) + ": " + sl.status().message());
        ls.slice = *sl;
        const std::string p = "layers." + std::to_string(lp.layer) + ".ffn.experts.";
        if (device >= 0) {
#ifdef DS41RT_HAVE_CUDA
            if (!wk->gpu_) {
                auto g = gpu_experts::make(device);
                if (!g) return Status(g.status().code(), "worker: GPU " + std::to_string(device) + ": " + g.status().message());
                wk->gpu_ = std::move(g.value());
            }
            std::vector<std::array<model::mxfp4_slice, 3>> slices(size_t(c.n_routed_experts));
            for (int e = 0; e < c.n_routed_experts; e++) {
                const std::string ep = p + std::to_string(e) + ".";
                const std::pair<const char *, model::slice_axis> parts[] = {
                    {"w1.weight", model::slice_axis::OUT}, {"w2.weight", model::slice_axis::IN}, {"w3.weight", model::slice_axis::OUT}};
                for (int i = 0; i < 3; i++) {
                    auto t = model::expert_slice_mxfp4(w, ep + parts[i].first, parts[i].second, ls.slice.begin, ls.slice.end);
                    if (!t) return Status(t.status().code(), "worker: " + t.status().message());
                    slices[size_t(e)][size_t(i)] = std::move(t.value());
                }
            }
            DS41RT_RETURN_IF_ERROR(wk->gpu_->add_layer(lp.layer, c.dim, c.swiglu_limit, std::move(slices)));
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
        } else {
            out = handle(*in, &close_after);
        }
        if (!ch->send(out, after_ms(30000))) break;
        if (close_after) break;
    }
    spdlog::info("worker {}: connection from {} ended", rank_, ch->peer());
    ch->close();
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
