// How the forward passes receive their weights: by checkpoint name, dequantized to fp32.
// engine::open() builds one from model::weights; tests may build one from any map.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace ds41rt::engine {

using weight_source = std::function<Result<Tensor>(const std::string &name)>;

// Fetches name into *out.
Status fetch_weight(const weight_source &src, const std::string &name, Tensor *out);

// The n routed experts under prefix ("layers.L.ffn.experts." or "mtp.S.ffn.experts."):
// E.w1.weight, E.w2.weight, E.w3.weight for E = 0..n-1.
Status fetch_experts(const weight_source &src, const std::string &prefix, int n, std::vector<Tensor> *w1,
                     std::vector<Tensor> *w2, std::vector<Tensor> *w3);

}  // namespace ds41rt::engine
