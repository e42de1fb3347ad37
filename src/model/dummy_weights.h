// The dummy-weight plan (`--load-format dummy`): which tensors a full-size model of a config
// stores in the official formats, and how each is filled so activations stay O(1).
//
// What crosses this boundary: a model_config (and `--layers N`) in; out, the text part's catalog
// entries (the first N target layers plus embed, head, final norm and, for V4, hc_head), each with
// its stored tensors and bytes, the scale grid of its format, a fill rule chosen from its role,
// and a 64-bit id (FNV-1a of the name) that seeds its values. No values are made here: the engine
// hands each entry to the GPU filler (backend/cuda/dummy_fill), whose descriptor takes exactly
// these fields, so the model room needs no CUDA and the backend no model headers.
//
// The rules, and why they keep the forward pass finite and O(1) (activations of unit RMS enter
// every linear because an RMSNorm or the mHC's own normalization precedes it):
//   - linears (attention, compressor, indexer, router gate, shared and routed experts, Engram
//     projection, MTP projections): N(0, 1/fan_in), so a unit-RMS input gives unit-RMS outputs;
//   - head: N(0, 1/dim): logits of unit scale after the final norm (softmax neither flat nor one-hot);
//   - embed and Engram table rows: N(0, 1): unit-RMS residual streams and looked-up rows;
//   - RMSNorm gains (and the Engram gate's q / k gains): 1, the identity gain;
//   - additive terms (router biases, attention sinks, compressor position biases, mHC bases): 0,
//     the neutral point (balanced routing, a sink logit of 0, pooling by content only);
//   - mHC: hc_*_fn N(0, 1/fan_in) on the normalized streams gives unit-scale mix logits, and
//     hc_*_scale 0.5 shrinks them, so pre / post / comb stay near 1/2, 1 and a uniform
//     doubly-stochastic mix (Sinkhorn well conditioned, no stream amplified) while still
//     depending on the token;
//   - V4's tid2eid: expert ids of the row's token, distinct, in [0, n_routed_experts).
// With doubly-stochastic combination the residual streams grow only as sqrt(layers) (each
// sublayer adds an O(1) vector in a random direction), far inside BF16 / FP32 range.
//
// The quantized publications' routed experts get the official experts' N(0, 1/fan_in) in their
// own stored form: NVFP4 (ModelOpt: E2M1 codes, E4M3 per-16 scales, weight_scale_2, and an
// input_scale standing for an activation amax of DUMMY_NVFP4_INPUT_AMAX, the same for w1 and w3
// as the loader demands) and EXL3 (random trellis bits of the config's K, suh / svh signs and
// magnitudes, the config's codebook flag).
//
// To the filler's descriptor (backend/cpu/dummy_values.h), field for field: format FP8_BLOCK and
// ENGRAM_TABLE -> FP8_BLOCK, MXFP4 / NVFP4 / EXL3 the same, BF16 / F32 / I64 the same; rows x cols = the logical
// shape ([n] is 1 x n); block_out / block_in; NORMAL -> NORMAL with std, CONSTANT -> CONSTANT with
// mean = value, EXPERT_IDS -> INDEX with index_range = id_range; id; name = entry.name; NVFP4's
// input_amax, EXL3's exl3_bits and exl3_code_rms.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/catalog.h"
#include "model/config.h"

namespace ds41rt::model {

enum class dummy_init : uint8_t {
    NORMAL = 0,  // zero-mean bell of the given std (quantized formats: of the dequantized values)
    CONSTANT,    // every value `value`
    EXPERT_IDS,  // I64 ids in [0, id_range), distinct within a row
};
const char *dummy_init_name(dummy_init i);  // "normal" / "constant" / "expert_ids"

struct dummy_rule {
    dummy_init init = dummy_init::NORMAL;
    double std = 0;        // NORMAL
    double value = 0;      // CONSTANT
    int64_t id_range = 0;  // EXPERT_IDS
    const char *why = "";  // the rule's reason, one phrase (for printing)
};

struct dummy_tensor {
    catalog_entry entry;               // name, role, storage format, logical shape, layer, part
    std::vector<stored_tensor> stored; // what a checkpoint file would hold: weight, then .scale
    uint64_t bytes = 0;                // of all stored tensors
    int block_out = 1, block_in = 1;   // scale grid: FP8 blocks from the config, MXFP4 and Engram rows 1 x 32,
                                       // NVFP4 1 x 16, EXL3 128 x 128 (Hadamard blocks)
    double input_amax = 0;             // NVFP4: the activation amax input_scale stands for
    int exl3_bits = 0;                 // EXL3: trellis K
    double exl3_code_rms = 0;          // EXL3: RMS of the config's codebook over all 2^16 states
    dummy_rule rule;
    uint64_t id = 0;                   // dummy_tensor_id(entry.name)
};

struct dummy_plan {
    std::vector<dummy_tensor> tensors; // catalog order
    int layers = 0;                    // target layers kept
    uint64_t bytes = 0;                // sum of tensors[].bytes
    uint64_t stored_tensors = 0;       // sum of tensors[].stored.size()
};

// The text part's tensors of c for the first `layers` target layers (-1: all; 0 keeps only
// embed, head, final norm and hc_head). INVALID_ARGUMENT for layers outside -1..n_layers. The
// routed experts take the config's storage: official MXFP4, NVFP4 or EXL3.
Result<dummy_plan> plan_dummy_weights(const model_config &c, int layers = -1);

// The fill rule of one catalog entry (any part: text, MTP, vision); NOT_SUPPORTED naming the
// tensor when no rule covers it, so a new catalog row cannot slip through without one.
Result<dummy_rule> dummy_rule_for(const catalog_entry &e, const model_config &c);

// NVFP4 dummy experts' activation amax: unit-RMS expert inputs (and SwiGLU outputs of O(1)) stay
// below it, so the per-16 activation scales do not saturate.
constexpr double DUMMY_NVFP4_INPUT_AMAX = 16.0;

// The RMS of an EXL3 codebook's value over all 2^16 states (what random trellis bits decode to).
double exl3_codebook_rms(exl3_codebook cb);

// The fill's tensor id: FNV-1a (64-bit) of the stored name, independent of order and --layers.
uint64_t dummy_tensor_id(const std::string &name);

}  // namespace ds41rt::model
