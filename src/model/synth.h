// Synthetic checkpoints: a tiny V4.1-architecture model with deterministic random weights.
//
// What crosses this boundary: options in (seed, vocabulary size, width, the Engram token map),
// a checkpoint directory out, in exactly the layout and storage formats of the official release
// (spec V4.1 sections 1 and 8.2): config.json with model_type deepseek_v41, nested text_config
// and root quantization_config (32x32 FP8 blocks, fp4 experts); model.safetensors with FP8 E4M3
// linears + E8M0 .scale per 32x32 block, MXFP4 routed experts, F8_E4M3 Engram rows + E8M0 per
// 32 channels, BF16 / F32 where the release keeps them; engram_token_map.safetensors beside it.
// The schedule is the tiny one of the test fixtures (12 layers: window-only, ratio-2 sources
// with Reuse readers, a ratio-1 candidate source with Reindex layers, Engram on layers 1 and 4,
// 3 DSpark stages); no vision tensors. This is the default model scripts/run.sh serves: the real
// DeepSeek vocabulary (129,280 ids) on random weights.
//
// Determinism: every tensor draws from its own stream, seeded by (seed, tensor name), so the
// files are byte-identical for one seed on one platform, whatever order tensors are made in.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds41rt::model {

// The Engram layers and n-gram size of the synthesized config (the token map file's multipliers
// must be for these).
inline const std::vector<int> SYNTH_ENGRAM_LAYERS = {1, 4};
constexpr int SYNTH_ENGRAM_MAX_NGRAM = 4;

struct synth_options {
    uint64_t seed = 0;
    int64_t vocab_size = 129280;         // the DeepSeek V4 / V4.1 vocabulary
    int64_t dim = 64;                    // hidden_size, a multiple of 32
    int64_t moe_intermediate = 32;       // moe_intermediate_size, a multiple of 32 (wider for TP tests)
    int64_t engram_vocab_size = 5000;    // prime search start: ~6x this rows per Engram table
    bool mtp = true;                     // also write the DSpark stages (mtp.0..2)
    // Engram hashing: the compressed token map [vocab_size] and the multipliers
    // [SYNTH_ENGRAM_LAYERS.size() * SYNTH_ENGRAM_MAX_NGRAM]. Empty: the identity map (every id
    // its own class) and odd multipliers drawn from the seed.
    std::vector<int64_t> token_map;
    std::vector<int64_t> multipliers;
};

// The config.json text of the synthesized model (parses and validates as a V4.1 config).
Result<std::string> synth_config_json(const synth_options &o);

// Reads a token map file as tools/synth/engram_token_map.py writes it (engram.token_map I64
// [vocab], engram.multipliers I64 [engram layers, max_ngram]) into o->token_map /
// o->multipliers and sets o->vocab_size to the map's length. INVALID_ARGUMENT when its
// multipliers are for other Engram layers than the synth config's.
Status load_synth_token_map(const std::string &path, synth_options *o);

// Writes dir/model.safetensors, dir/engram_token_map.safetensors and, last, dir/config.json
// (so a present config.json means a complete model). Creates dir if needed.
Status synthesize(const std::string &dir, const synth_options &o);

}  // namespace ds41rt::model
