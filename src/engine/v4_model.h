// DeepSeek V4 Flash forward pass (spec: shared/specs/deepseek-v4-flash.md, sections 2-4).
//
// Internal to the engine room: engine::open() builds one of these for model_type deepseek_v4.
// The TRANSFORMERS numerics follow HF transformers' deepseek_v4 model (fp32, no QAT simulation,
// no indexer Hadamard); the OFFICIAL numerics follow DeepSeek's reference (bf16 rounding points,
// FP8 activation quantization, the QAT simulations, the sparse-attention kernel's arithmetic).
// Each place where the two differ is commented in v4_model.cpp.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "engine/weight_source.h"

namespace ds41rt::engine {

// w: the integer table ffn.gate.tid2eid arrives converted to fp32 and is converted back at load.
Result<std::unique_ptr<engine>> make_v4_engine(const model::model_config &c, const weight_source &w,
                                               const engine_options &opt);

}  // namespace ds41rt::engine
