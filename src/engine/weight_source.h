// How the forward passes receive their weights: by checkpoint name, dequantized to fp32.
// engine::open() builds one from model::weights; tests may build one from any map.
#pragma once

#include <functional>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace ds41rt::engine {

using weight_source = std::function<Result<Tensor>(const std::string &name)>;

// Fetches name into *out.
Status fetch_weight(const weight_source &src, const std::string &name, Tensor *out);

}  // namespace ds41rt::engine
