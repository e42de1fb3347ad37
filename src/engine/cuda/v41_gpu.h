// DeepSeek V4.1 Flash on the CUDA backend (engine::open with engine_options::backend CUDA).
// Internal to the engine room.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "engine/v41_model.h"
#include "model/weights.h"

namespace ds41rt::engine::gpu {

// Uploads the checkpoint's text weights in their stored formats to device 0. NOT_SUPPORTED for
// what has no GPU path yet (routed experts stored other than MXFP4, remote expert layers),
// UNAVAILABLE without a usable GPU.
Result<std::unique_ptr<engine>> make_v41_gpu_engine(std::shared_ptr<const model::weights> w,
                                                    const engram_tables &tables, const engine_options &opt);

}  // namespace ds41rt::engine::gpu
