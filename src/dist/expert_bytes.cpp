// Routed-expert storage per format. Each formula is the tensor list of the format's release, byte
// for byte, and cites where that list is written down.
#include "dist/expert_bytes.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace ds41rt::dist {

const char *expert_format_name(expert_format f) {
    switch (f) {
    case expert_format::OFFICIAL: return "official";
    case expert_format::NVFP4:    return "nvfp4";
    case expert_format::EXL3:     return "exl3";
    }
    return "?";
}

Result<expert_format> parse_expert_format(std::string_view name) {
    if (name == "official" || name == "mxfp4") return expert_format::OFFICIAL;
    if (name == "nvfp4") return expert_format::NVFP4;
    if (name == "exl3") return expert_format::EXL3;
    return Status::invalid_argument("format: '" + std::string(name) + "' is not official, nvfp4 or exl3");
}

int expert_slice_align(expert_format f) {
    switch (f) {
    case expert_format::OFFICIAL: return 32;
    case expert_format::NVFP4:    return 16;
    case expert_format::EXL3:     return 128;
    }
    return 1;
}

Result<uint64_t> projection_bytes(expert_format f, int64_t out, int64_t in, int exl3_bits) {
    const std::string shape = "[" + std::to_string(out) + ", " + std::to_string(in) + "]";
    if (out <= 0 || in <= 0) return Status::invalid_argument("expert projection " + shape + ": empty");
    const uint64_t o = uint64_t(out), i = uint64_t(in);
    switch (f) {
    case expert_format::OFFICIAL:
        // V4.1 spec 8.3: I8 [out, in/2] (two E2M1 codes a byte) + F8_E8M0 [out, in/32]; the same
        // rule model/catalog applies (0.53125 B per parameter).
        if (in % 32 != 0) return Status::invalid_argument("MXFP4 projection " + shape + ": in is not a multiple of 32");
        return o * i / 2 + o * i / 32;
    case expert_format::NVFP4:
        // quant-formats.md 1.3: weight U8 [out, in/2], weight_scale F8_E4M3 [out, in/16],
        // weight_scale_2 and input_scale F32 [] (replicated on every rank). Full V4.1 w1:
        // 5,898,240 + 737,280 + 8 = 6,635,528 B (1.14).
        if (in % 16 != 0) return Status::invalid_argument("NVFP4 projection " + shape + ": in is not a multiple of 16");
        return o * i / 2 + o * i / 16 + 8;
    case expert_format::EXL3:
        // quant-formats.md 2.1 / 2.6: trellis I16 [in/16, out/16, 16*K] = in*out*K/8 bytes,
        // suh F16 [in], svh F16 [out], one I32 [] codebook tag (mcg / mul1; none for 3INST is
        // 4 bytes less, ignored). A TP slice keeps whole 128-blocks, so its suh/svh are cut
        // with it (2.5). Full V4.1 projection at K=2: 2,949,120 + 14,848 + 4 B.
        if (exl3_bits < 1 || exl3_bits > 8)
            return Status::invalid_argument("EXL3 bits per weight " + std::to_string(exl3_bits) + ": expected 1..8");
        if (in % 128 != 0 || out % 128 != 0)
            return Status::invalid_argument("EXL3 projection " + shape + ": both dims must be multiples of 128");
        return i * o * uint64_t(exl3_bits) / 8 + 2 * i + 2 * o + 4;
    }
    return Status::internal("projection_bytes: unknown format");
}

Result<uint64_t> layer_slice_bytes(expert_format f, const model::model_config &c, int64_t width, int exl3_bits) {
    if (width <= 0 || width > c.moe_inter_dim)
        return Status::invalid_argument("expert slice width " + std::to_string(width) + " outside 1.." +
                                        std::to_string(c.moe_inter_dim));
    Result<uint64_t> up = projection_bytes(f, width, c.dim, exl3_bits);  // w1 and w3: rows of the slice
    if (!up) return up;
    Result<uint64_t> down = projection_bytes(f, c.dim, width, exl3_bits);  // w2: columns of the slice
    if (!down) return down;
    return uint64_t(c.n_routed_experts) * (2 * *up + *down);
}

Result<expert_format> detect_expert_format(std::string_view config_json, int *exl3_bits) {
    nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Status::invalid_argument("config.json: not a JSON object");
    auto q = j.find("quantization_config");
    if (q == j.end() || !q->is_object()) return expert_format::OFFICIAL;
    auto str = [&](const char *key) -> std::string {
        auto it = q->find(key);
        return it != q->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (str("moe_quant_algo") == "NVFP4") return expert_format::NVFP4;
    if (str("quant_method") == "exl3") {
        auto b = q->find("bits");
        if (b != q->end() && b->is_number()) {
            const double bits = b->get<double>();
            if (bits == std::floor(bits) && exl3_bits) *exl3_bits = int(bits);
        }
        return expert_format::EXL3;
    }
    return expert_format::OFFICIAL;
}

}  // namespace ds41rt::dist
