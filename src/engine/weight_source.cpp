#include "engine/weight_source.h"

namespace ds41rt::engine {

Status fetch_weight(const weight_source &src, const std::string &name, Tensor *out) {
    auto r = src(name);
    if (!r) return r.status();
    *out = std::move(r.value());
    return Status::ok();
}

}  // namespace ds41rt::engine
