// Weights: a checkpoint directory seen through the tensor catalog.
//
// What crosses this boundary: catalog names in, stored bytes (raw) or fp32 values (f32) out, plus
// the verdict of check(). Storage details (FP8 32x32 or 128x128 blocks, MXFP4 nibbles, Engram row
// scales, or a plain BF16/F32 variant of the same names without .scale companions) stay inside:
// callers ask format() when a kernel family depends on it.
//
// Parts: the text part (what the target forward pass needs) must be complete; the MTP / DSpark and
// vision parts are optional, checked only where the checkpoint holds any of their tensors, and
// reported by has_part() / parts_present(), never silently ignored.
//
// Ownership and threads: weights owns the mapped checkpoint; tensors returned by raw() keep their
// file mapped, tensors returned by f32() are shared with the cache. check() is setup: call it once,
// before the object is shared. After that every const method, f32() and engram_row() included, may
// be called from any thread; f32() dequantizes each tensor exactly once (concurrent callers of the
// same name wait for the first).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/catalog.h"
#include "model/config.h"
#include "model/exl3.h"
#include "model/nvfp4.h"

namespace ds41rt::model {

struct check_report {
    std::vector<std::string> problems;    // one line per missing or mismatched tensor, catalog order
    std::vector<std::string> missing;     // names of absent tensors (weights or .scale companions)
    std::vector<std::string> unexpected;  // stored tensors no catalog entry explains (not an error)
    uint64_t checked = 0;                 // catalog entries verified
};

class weights {
public:
    // Reads dir/config.json, validates it, opens the checkpoint and builds the catalog.
    static Result<std::unique_ptr<weights>> open(const std::string &dir);
    // Same with a config already in hand (synthetic and test checkpoints).
    static Result<std::unique_ptr<weights>> open(const std::string &dir, model_config cfg);

    const model_config &config() const { return cfg_; }
    const io::checkpoint &files() const { return ckpt_; }
    // Every catalog entry of every part (ALL scope), whether stored or not.
    const std::vector<catalog_entry> &catalog() const { return catalog_; }
    const catalog_entry *entry(const std::string &name) const;

    // ---- setup: not thread-safe ----
    // Verifies every text entry (and every entry of the optional parts present): presence, dtype
    // and shape of the weight and its .scale (NVFP4 / EXL3: every companion). NVFP4: also that
    // gate (w1) and up (w3) of each expert share weight_scale_2 and input_scale. Returns the first problem with the count of the
    // rest; report() has all of them and the unexpected tensors.
    Status check();
    const check_report &report() const { return report_; }

    // ---- thread-safe ----
    bool has_part(model_part p) const;
    std::vector<model_part> parts_present() const;
    // How the named catalog entry is actually stored: its release format, or BF16 / F32 for the
    // plain variant (a quantized weight stored as its logical tensor without .scale). Entries the
    // release keeps in BF16 or F32 accept either, since fp32 fixtures store norms in F32.
    // NOT_FOUND for a name outside the catalog; the check() error if the tensor is bad.
    Result<storage_format> format(const std::string &name) const;
    // The stored bytes of any stored tensor (weights, .scale companions, unexpected extras).
    Result<Tensor> raw(const std::string &name) const;
    // The logical tensor in fp32: FP8 blocks, MXFP4 and Engram tables dequantized, BF16 / F32
    // converted. Stored tensors outside the catalog convert if their dtype is a float type.
    Result<Tensor> f32(const std::string &name) const;
    // Row `row` of layer `layer`'s Engram table, dequantized into out[engram_head_dim].
    Status engram_row(int layer, int64_t row, float *out) const;
    // The stored views of an NVFP4 / EXL3 routed-expert linear (catalog name "<p>.weight"),
    // verified (dtypes, shapes, NaN scales, finite rotations); they point into the mapping this
    // object owns. f32() of the same name gives the dequantized logical [out, in].
    Result<nvfp4_linear> nvfp4(const std::string &name) const;
    Result<exl3_linear> exl3(const std::string &name) const;

private:
    weights() = default;
    Result<Tensor> dequantize(const std::string &name) const;
    Status check_nvfp4_gate_up() const;

    model_config cfg_;
    io::checkpoint ckpt_;
    std::vector<catalog_entry> catalog_;
    std::unordered_map<std::string, size_t> by_name_;  // catalog name -> index in catalog_
    bool present_[3] = {false, false, false};          // by model_part
    check_report report_;

    struct cache_slot;
    mutable std::mutex mu_;
    mutable std::map<std::string, std::shared_ptr<cache_slot>> cache_;  // GUARDED_BY(mu_)
};

}  // namespace ds41rt::model
