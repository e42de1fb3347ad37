// What one TP rank's slice of a layer's routed experts costs, for the planner.
//
// The storage of every routed-expert format (official MXFP4, NVFP4, EXL3) is known in one place,
// model/catalog (expert_layer_bytes, expert_tp_align, pinned to the specs' figures by its tests).
// What stays here is the planner's own concern: naming the publication it plans for, and cutting a
// layer to the width one rank stores, which may be a padded kernel extent rather than its share of
// the intermediate dimension (--kernel-extent 128: the reference's TP4 slices of 640).
//
// Slicing follows the TP rule of the workers: w1 and w3 ([inter, dim]) are cut along their
// output rows, w2 ([dim, inter]) along its input columns, so a rank's slice of width w stores
// the experts of a layer whose intermediate dimension is w (plus what the format replicates per
// tensor: NVFP4's two FP32 scalars, EXL3's codebook tag).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "model/catalog.h"
#include "model/config.h"

namespace ds41rt::dist {

// The routed-expert publication a plan is for: the model room's enum ("official" | "nvfp4" | "exl3",
// model::expert_quant_name).
using expert_format = model::expert_quant;

// "official" (or "mxfp4"), "nvfp4", "exl3": the names `ds41rt plan --format` and deployment files take.
Result<expert_format> parse_expert_format(std::string_view name);

// How the target layers' routed experts of a publication are stored.
model::storage_format expert_storage(expert_format f);

// The channel unit a TP cut of the intermediate dimension must respect (model::expert_tp_align).
int expert_slice_align(const model::model_config &c, expert_format f);

// Bytes of the routed experts of one layer held by a rank whose slice of the intermediate
// dimension is `width` channels (width = moe_inter_dim: the whole layer). exl3_bits is K (1..8),
// ignored by the other formats. INVALID_ARGUMENT when the width breaks the format's blocks.
Result<uint64_t> layer_slice_bytes(expert_format f, const model::model_config &c, int64_t width, int exl3_bits);

}  // namespace ds41rt::dist
