// The full-size configs of the released models, built in: `ds41rt plan --model-type` plans
// against the real shapes (a "dummy inventory" of the release) without the checkpoint at hand.
//
// The texts are tests/fixtures/configs/*.json, written from the team specs (V4.1 spec 1.1, V4
// spec 1.1 and 1.3; see that folder's README). tests/unit/flash_configs_test.cpp checks that the
// catalogs built from them reproduce the released tensor counts and byte totals.
#pragma once

#include "core/status.h"
#include "model/config.h"

namespace ds41rt::model {

// config.json text of DeepSeek V4.1 Flash (arch::V41) or V4 Flash (arch::V4).
const char *flash_config_json(arch a);
// The same, parsed and validated.
Result<model_config> flash_config(arch a);
// The same with the routed experts of one of the quantized publications (`ds41rt bench --quant`,
// dummy weights of their real shapes): the config text with quantization_config replaced by the
// block the publication ships (nvidia/DeepSeek-V4.1-Flash-NVFP4 for NVFP4; diffbot's
// DeepSeek-V4.1-Flash-EXL3-2.0bpw for EXL3, K = 2, MCG; spec quant-formats 1.2 and 2.2), then read by
// the same parser as a checkpoint's, so the format is detected as it would be at open.
// OFFICIAL gives flash_config(a).
Result<model_config> flash_config(arch a, expert_quant q);

}  // namespace ds41rt::model
