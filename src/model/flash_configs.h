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

}  // namespace ds41rt::model
