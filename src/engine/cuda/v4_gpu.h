// DeepSeek V4 Flash on the CUDA backend (engine::open / open_dummy with engine_options::backend
// CUDA). Internal to the engine room.
#pragma once

#include <memory>

#include "engine/cuda/device_model.h"
#include "engine/engine.h"

namespace ds41rt::engine::gpu {

// Loads the text weights of m's source (a checkpoint, or dummy weights) onto its device.
// NOT_SUPPORTED for what has no GPU path yet (routed experts stored other than MXFP4, remote
// expert layers).
Result<std::unique_ptr<engine>> make_v4_gpu_engine(std::unique_ptr<device_model> m, const engine_options &opt);

}  // namespace ds41rt::engine::gpu
