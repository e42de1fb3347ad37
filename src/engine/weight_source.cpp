#include "engine/weight_source.h"

namespace ds41rt::engine {

Status fetch_weight(const weight_source &src, const std::string &name, Tensor *out) {
    auto r = src(name);
    if (!r) return r.status();
    *out = std::move(r.value());
    return Status::ok();
}

Status fetch_experts(const weight_source &src, const std::string &prefix, int n, std::vector<Tensor> *w1,
                     std::vector<Tensor> *w2, std::vector<Tensor> *w3) {
    w1->resize(size_t(n));
    w2->resize(size_t(n));
    w3->resize(size_t(n));
    for (int e = 0; e < n; e++) {
        const std::string ep = prefix + std::to_string(e) + ".";
        DS41RT_RETURN_IF_ERROR(fetch_weight(src, ep + "w1.weight", &(*w1)[size_t(e)]));
        DS41RT_RETURN_IF_ERROR(fetch_weight(src, ep + "w2.weight", &(*w2)[size_t(e)]));
        DS41RT_RETURN_IF_ERROR(fetch_weight(src, ep + "w3.weight", &(*w3)[size_t(e)]));
    }
    return Status::ok();
}

}  // namespace ds41rt::engine
