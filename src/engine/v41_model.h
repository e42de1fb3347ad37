// DeepSeek V4.1 Flash forward pass (spec: shared/specs/deepseek-v41-flash.md, section 4).
//
// Internal to the engine room: engine::open() builds one of these for model_type deepseek_v41.
#pragma once

#include <memory>

#include "engine/engine.h"
#include "engine/weight_source.h"

namespace ds41rt::engine {

// Extra tables the Engram hash needs beyond the checkpoint: the compressed token map [vocab]
// and, for configs other than the released one, the hash multipliers [layers * max_ngram].
struct engram_tables {
    std::vector<int64_t> token_map;
    std::vector<int64_t> multipliers;
};

Result<std::unique_ptr<engine>> make_v41_engine(const model::model_config &c, const weight_source &w,
                                                const engram_tables &tables, const engine_options &opt);

}  // namespace ds41rt::engine
