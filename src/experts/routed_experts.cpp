#include "experts/routed_experts.h"

#include "experts/remote.h"

namespace ds41rt::experts {

Status nvfp4_input_scales(const weight_fn &src, const std::string &expert_prefix, backend::cpu::expert_weights *w) {
    float *dst[] = {&w->w13_input_scale, &w->w2_input_scale};
    const char *names[] = {"w1.input_scale", "w2.input_scale"};
    for (int i = 0; i < 2; i++) {
        auto t = src(expert_prefix + names[i]);
        if (!t) return t.status();
        if (t->numel() != 1) return Status::corruption(expert_prefix + names[i] + ": not a scalar");
        *dst[i] = t->f()[0];
    }
    return Status::ok();
}

bool remote_layout::any_remote() const {
    for (const auto &r : layer_ranks)
        if (!r.empty()) return true;
    return false;
}

transport_kind remote_layout::transport(int worker) const {
    return worker >= 0 && size_t(worker) < transports.size() ? transports[size_t(worker)] : transport_kind::TCP;
}

bool remote_layout::layer_nccl(int layer) const {
    if (layer < 0 || size_t(layer) >= layer_ranks.size() || layer_ranks[size_t(layer)].empty()) return false;
    for (int w : layer_ranks[size_t(layer)])
        if (transport(w) != transport_kind::NCCL) return false;
    return true;
}

namespace {

class placed_experts final : public routed_experts {
public:
    placed_experts(const model::model_config &c, remote_layout layout)
        : dim_(c.dim), layout_(std::move(layout)), local_(size_t(c.n_layers)) {
        if (layout_.any_remote()) remote_ = std::make_unique<remote_experts>(layout_, c.dim);
    }

    Status load_local(const model::model_config &c, const weight_fn &src) {
        for (int l = 0; l < c.n_layers; l++) {
            if (is_remote(l)) continue;
            auto &experts = local_[size_t(l)];
            experts.resize(size_t(c.n_routed_experts));
            const std::string p = "layers." + std::to_string(l) + ".ffn.experts.";
            for (int e = 0; e < c.n_routed_experts; e++) {
                const std::string ep = p + std::to_string(e) + ".";
                const std::pair<const char *, Tensor *> ws[] = {
                    {"w1.weight", &experts[size_t(e)].w1}, {"w2.weight", &experts[size_t(e)].w2},
                    {"w3.weight", &experts[size_t(e)].w3}};
                for (auto &[name, t] : ws) {
                    auto r = src(ep + name);
                    if (!r) return r.status();
                    *t = std::move(r.value());
                }
                if (c.routed_quant == model::expert_quant::NVFP4)
                    DS41RT_RETURN_IF_ERROR(nvfp4_input_scales(src, ep, &experts[size_t(e)]));
            }
        }
        return Status::ok();
    }

    Status start(int layer, const backend::cpu::expert_numerics &nm, const float *x,
                 const backend::cpu::route_table &rt) override {
        if (layer < 0 || layer >= int(local_.size())) return Status::internal("experts: no layer " + std::to_string(layer));
        pending_ = {layer, nm, x, &rt};
        if (is_remote(layer)) return remote_->start(layer, nm, x, rt);
        return Status::ok();
    }

    Status finish(float *acc) override {
        const pending p = pending_;
        pending_ = {};
        if (p.layer < 0) return Status::internal("experts: finish() without start()");
        if (is_remote(p.layer)) return remote_->finish(acc);
        return backend::cpu::routed_expert_sum(p.nm, local_[size_t(p.layer)], p.x, dim_, *p.rt, acc);
    }

private:
    bool is_remote(int l) const { return size_t(l) < layout_.layer_ranks.size() && !layout_.layer_ranks[size_t(l)].empty(); }

    struct pending {
        int layer = -1;
        backend::cpu::expert_numerics nm;
        const float *x = nullptr;
        const backend::cpu::route_table *rt = nullptr;
    };

    int64_t dim_;
    remote_layout layout_;
    pending pending_;
    std::vector<std::vector<backend::cpu::expert_weights>> local_;  // per layer; empty when remote
    std::unique_ptr<remote_experts> remote_;
};

}  // namespace

Result<std::unique_ptr<routed_experts>> open(const model::model_config &c, const weight_fn &src,
                                             const remote_layout &layout) {
    if (!layout.layer_ranks.empty() && int(layout.layer_ranks.size()) != c.n_layers)
        return Status::invalid_argument("experts: the placement has " + std::to_string(layout.layer_ranks.size()) +
                                        " layers, the model " + std::to_string(c.n_layers));
    for (const auto &ranks : layout.layer_ranks)
        for (int w : ranks)
            if (w < 0 || w >= int(layout.workers.size()))
                return Status::invalid_argument("experts: placement names worker " + std::to_string(w));
    auto e = std::make_unique<placed_experts>(c, layout);
    DS41RT_RETURN_IF_ERROR(e->load_local(c, src));
    return std::unique_ptr<routed_experts>(std::move(e));
}

}  // namespace ds41rt::experts
