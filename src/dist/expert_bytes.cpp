// A rank's routed-expert bytes, priced by the model room's catalog (expert_bytes.h).
#include "dist/expert_bytes.h"

#include <string>

namespace ds41rt::dist {

Result<expert_format> parse_expert_format(std::string_view name) {
    if (name == "official" || name == "mxfp4") return expert_format::OFFICIAL;
    if (name == "nvfp4") return expert_format::NVFP4;
    if (name == "exl3") return expert_format::EXL3;
    return Status::invalid_argument("format: '" + std::string(name) + "' is not official, nvfp4 or exl3");
}

model::storage_format expert_storage(expert_format f) {
    switch (f) {
    case expert_format::OFFICIAL: return model::storage_format::MXFP4;
    case expert_format::NVFP4:    return model::storage_format::NVFP4;
    case expert_format::EXL3:     return model::storage_format::EXL3;
    }
    return model::storage_format::MXFP4;
}

int expert_slice_align(const model::model_config &c, expert_format f) {
    return model::expert_tp_align(c, expert_storage(f));
}

Result<uint64_t> layer_slice_bytes(expert_format f, const model::model_config &c, int64_t width, int exl3_bits) {
    if (width <= 0 || width > c.moe_inter_dim)
        return Status::invalid_argument("expert slice width " + std::to_string(width) + " outside 1.." +
                                        std::to_string(c.moe_inter_dim));
    if (f == expert_format::EXL3 && (exl3_bits < 1 || exl3_bits > 8))
        return Status::invalid_argument("EXL3 bits per weight " + std::to_string(exl3_bits) + ": expected 1..8");
    // The catalog's shapes assume whole blocks: the FP4 formats block the input of every
    // projection (dim for w1 / w3, the slice for w2), EXL3 tiles both axes.
    const int align = expert_slice_align(c, f);
    if (width % align != 0 || c.dim % align != 0)
        return Status::invalid_argument(std::string(model::expert_quant_name(f)) + " expert slice of " +
                                        std::to_string(width) + " channels (dim " + std::to_string(c.dim) +
                                        "): not whole blocks of " + std::to_string(align));
    model::model_config s = c;
    s.moe_inter_dim = int(width);
    s.exl3_bits = exl3_bits;
    return model::expert_layer_bytes(s, expert_storage(f));
}

}  // namespace ds41rt::dist
