// Stored bytes of routed-expert weights per checkpoint format, whole or as one TP rank's slice.
//
// This is the one place that knows what a routed-expert projection costs in each format the
// planner supports; dist/placement asks it and nothing else. The official release is also
// described tensor by tensor by model/catalog (tests check the two agree byte for byte); the
// NVFP4 and EXL3 releases are not in the catalog yet, so their bytes come from the storage
// layouts in shared/specs/quant-formats.md (formulas in expert_bytes.cpp). When the catalog
// learns those formats, projection_bytes() is the function to switch over.
//
// Slicing follows the TP rule of the workers: w1 and w3 ([inter, dim]) are cut along their
// output rows, w2 ([dim, inter]) along its input columns, so a rank's slice of width w stores
// two [w, dim] projections and one [dim, w] projection per expert, plus whatever the format
// replicates per tensor.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "model/config.h"

namespace ds41rt::dist {

enum class expert_format {
    OFFICIAL,  // MXFP4: packed E2M1 + UE8M0 per 32 along K (the release; also the drafter's experts)
    NVFP4,     // ModelOpt NVFP4: packed E2M1 + E4M3 per 16 along K + two FP32 scalars per tensor
    EXL3,      // exllamav3 trellis, K bits per weight over 16x16 tiles + FP16 suh/svh + codebook tag
};
const char *expert_format_name(expert_format f);  // "official" | "nvfp4" | "exl3"
Result<expert_format> parse_expert_format(std::string_view name);

// The smallest unit a TP cut may take from the expert intermediate dimension: the format's
// scale block along K (32 MXFP4, 16 NVFP4) or EXL3's 128-channel Hadamard block.
int expert_slice_align(expert_format f);

// Bytes one linear of logical shape [out, in] ("y = W x") occupies in format f. exl3_bits is K
// (1..8), ignored by the other formats. INVALID_ARGUMENT when the shape breaks the format's
// blocking (in % 32 for MXFP4, in % 16 for NVFP4, both % 128 for EXL3).
Result<uint64_t> projection_bytes(expert_format f, int64_t out, int64_t in, int exl3_bits);

// Bytes of the routed experts of one layer held by a rank whose slice of the intermediate
// dimension is `width` channels wide (width = moe_inter_dim: the whole layer).
Result<uint64_t> layer_slice_bytes(expert_format f, const model::model_config &c, int64_t width, int exl3_bits);

// What a config.json says about its routed experts: NVFP4 when quantization_config has
// moe_quant_algo "NVFP4", EXL3 when quant_method is "exl3" (bits -> *exl3_bits when integral),
// OFFICIAL otherwise.
Result<expert_format> detect_expert_format(std::string_view config_json, int *exl3_bits);

}  // namespace ds41rt::dist
