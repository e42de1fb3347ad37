// Which storage the checkpoint's quantization_config describes (official FP8 + MXFP4, ModelOpt
// NVFP4 routed experts, exllamav3 EXL3 routed experts), read by config.cpp. Every refusal names
// the field as a JSON path, so an unsupported publication fails at open with a reason.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "model/config.h"

namespace ds41rt::model {

// q: the quantization_config object; prefix: its JSON path with a trailing '.'. Fills quant_method,
// expert_dtype, the FP8 block grid, routed_quant and the EXL3 fields of c.
Status parse_quantization_config(const nlohmann::json &q, const std::string &prefix, model_config &c);

}  // namespace ds41rt::model
