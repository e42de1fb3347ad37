// The tiny synthesized V4.1 model the worker, quantized-model and GPU-engine tests share: seed 3,
// a 512-token vocabulary, Engram tables from 50 rows, no DSpark stages, routed experts 96 wide
// (whole TP2 and TP3 slices). A test changes what it needs (dim, moe_intermediate) after.
#pragma once

#include "model/synth.h"

namespace ds41rt {

inline model::synth_options tiny_synth() {
    model::synth_options o;
    o.seed = 3;
    o.vocab_size = 512;
    o.engram_vocab_size = 50;
    o.moe_intermediate = 96;
    o.mtp = false;
    return o;
}

}  // namespace ds41rt
