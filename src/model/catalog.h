// The tensor catalog: every tensor a V4 / V4.1 checkpoint holds, by canonical name (STYLE 15).
//
// One entry per logical weight, named as the official checkpoint stores it (no "model." prefix:
// "layers.3.attn.wq_a.weight"), with its role, its storage format in the official release and
// its logical shape ([out, in] for linears, [n] for vectors). A quantized entry implies a second
// stored tensor, the ".scale" companion; stored_tensors() expands an entry into exactly what the
// safetensors files hold, so the totals of the release (spec V4.1 section 8.1, V4 section 5) can
// be reproduced byte for byte. Conditional tensors (KV / index sources, hash layers, Engram
// layers, MTP / DSpark stages, the vision tower) appear only where the config says they exist.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/config.h"

namespace ds41rt::model {

enum class tensor_role {
    EMBED,
    HEAD,
    NORM,           // block and final RMSNorm weights (module-internal norms belong to the module)
    ATTN,
    COMPRESSOR,
    INDEXER,
    MHC,
    ROUTER,
    SHARED_EXPERT,
    ROUTED_EXPERT,
    ENGRAM,
    MTP,            // MTP / DSpark-only tensors (main_proj, e_proj, Markov and confidence heads)
    VISION,         // ViT, aligner and the image_* marker vectors
};
const char *tensor_role_name(tensor_role r);

enum class storage_format {
    BF16,
    F32,
    FP8_BLOCK,      // F8_E4M3 [out, in] + .scale F8_E8M0 [ceil(out/bo), ceil(in/bi)]
    MXFP4,          // I8 [out, in/2] (two e2m1, low nibble even) + .scale F8_E8M0 [out, ceil(in/32)]
    ENGRAM_TABLE,   // F8_E4M3 [rows, d] + .scale F8_E8M0 [rows, ceil(d/32)]
    I64,            // tid2eid
    // Routed experts of the quantized publications (spec quant-formats 1.3, 2.1). The catalog name
    // stays "<p>.weight"; the stored tensors are named from the prefix <p>.
    NVFP4,          // <p>.weight U8 [out, in/2], .weight_scale F8_E4M3 [out, in/16], .weight_scale_2 F32 [],
                    // .input_scale F32 []
    EXL3,           // <p>.trellis I16 [in/16, out/16, 16K], .suh F16 [in], .svh F16 [out], and .mcg or
                    // .mul1 I32 [] by codebook (neither: 3INST)
};
const char *storage_format_name(storage_format f);

enum class model_part { TEXT, MTP, VISION };
const char *model_part_name(model_part p);

// Which parts build_catalog returns. TEXT is what the target forward pass needs.
enum class catalog_scope { TEXT, MTP, VISION, ALL };

struct catalog_entry {
    std::string name;       // stored name of the primary tensor
    tensor_role role;
    storage_format format;  // as in the official release
    shape_t shape;          // logical shape
    int layer;              // block index, n_layers + s for MTP / DSpark stage s, -1 for globals
    model_part part;
};

// One tensor as a safetensors file stores it.
struct stored_tensor {
    std::string name;
    dtype type;
    shape_t shape;
};

std::vector<catalog_entry> build_catalog(const model_config &c, catalog_scope scope);

// "x.weight" -> "x.scale" (the companion of a quantized weight).
std::string scale_name(const std::string &weight_name);
// "x.weight" -> "x.<suffix>" (NVFP4 / EXL3 companions: "weight_scale", "trellis", "suh", ...).
std::string companion_name(const std::string &weight_name, const char *suffix);
// The stored tensors of an entry in its catalog format: the weight, then the .scale if any.
std::vector<stored_tensor> stored_tensors(const catalog_entry &e, const model_config &c);
// The stored shape of the primary tensor / of the scale for a format.
shape_t stored_weight_shape(storage_format f, const shape_t &logical);
shape_t stored_scale_shape(storage_format f, const shape_t &logical, const model_config &c);

struct catalog_totals {
    uint64_t tensors = 0;  // stored tensors: weights and .scale companions counted separately
    uint64_t bytes = 0;
};
catalog_totals totals(const std::vector<catalog_entry> &entries, const model_config &c);

// Bytes of one target layer's routed experts (all n_routed_experts, w1 + w3 + w2 with every
// companion tensor) if stored in format f: MXFP4, NVFP4, EXL3 (K = c.exl3_bits, 2 if unset),
// FP8_BLOCK or BF16. The placement planner's per-layer cost of each publication.
uint64_t expert_layer_bytes(const model_config &c, storage_format f);
// The channel unit a tensor-parallel cut of the expert intermediate dimension must respect in
// format f: 32 (MXFP4 scale blocks), 16 (NVFP4 scale blocks), 128 (EXL3 Hadamard blocks), the FP8
// block grid, 1 otherwise. What dist::tp_slice takes as `align`.
int expert_tp_align(const model_config &c, storage_format f);
// The storage format of the target layers' routed experts under c.
storage_format routed_expert_format(const model_config &c);

}  // namespace ds41rt::model
