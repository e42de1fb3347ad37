// One tensor-parallel rank's share of a routed-expert projection, cut where the format stores it.
//
// What crosses this boundary: a catalog name, the axis of the logical [out, in] that the TP rule
// cuts (w1 / w3: OUT, their rows; w2: IN, its columns) and a channel range come in; the fp32
// logical slice [end - begin, in] or [out, end - begin] comes out, equal bit for bit to the same
// rows / columns of weights::f32(name). NVFP4 and EXL3 are sliced in their stored form and only
// the slice is decoded (a worker never holds a whole dequantized expert); other formats are
// dequantized whole and cut.
//
// A cut must be whole blocks of the format (model::expert_tp_align: 32 MXFP4, 16 NVFP4, 128
// EXL3) on the cut axis; otherwise INVALID_ARGUMENT naming the tensor, the range and the block.
// Thread-safe as weights' const methods are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/weights.h"

namespace ds41rt::model {

enum class slice_axis { OUT, IN };

Result<Tensor> expert_slice_f32(const weights &w, const std::string &name, slice_axis axis, int64_t begin, int64_t end);

// The same cut of an MXFP4 expert in its stored form, for kernels that read MXFP4 (a GPU
// worker): codes [out, in / 2] (low nibble = even input) and E8M0 scales [out, in / 32] of the
// slice, contiguous. NOT_SUPPORTED for a tensor stored otherwise.
struct mxfp4_slice {
    std::vector<uint8_t> codes, scales;
    int64_t out = 0, in = 0;
};
Result<mxfp4_slice> expert_slice_mxfp4(const weights &w, const std::string &name, slice_axis axis, int64_t begin,
                                       int64_t end);

// The same for an NVFP4 expert (a GPU worker's W4A4 kernels read it as published): codes
// [out, in / 2], E4M3 scales [out, in / 16] (plain row-major) of the slice, contiguous, and the
// tensor's two scalars. NOT_SUPPORTED for a tensor stored otherwise.
struct nvfp4_slice {
    std::vector<uint8_t> codes, scales;
    int64_t out = 0, in = 0;
    float weight_scale_2 = 0, input_scale = 0;
};
Result<nvfp4_slice> expert_slice_nvfp4(const weights &w, const std::string &name, slice_axis axis, int64_t begin,
                                       int64_t end);

// The same for an EXL3 expert (a GPU worker's trellis GEMV decodes it in the kernel): the
// slice's trellis tiles [in / 16, out / 16, 16 k] and its suh [in] / svh [out] (the cut one of
// the two sliced, the other whole), in exllamav3's [in, out] orientation: w1 / w3 (OUT) keep
// every input row and a column range of tiles, w2 (IN) a row range. NOT_SUPPORTED for a tensor
// stored otherwise.
struct exl3_slice {
    std::vector<uint16_t> trellis, suh, svh;
    int64_t in = 0, out = 0;
    int k = 0;
    exl3_codebook cb = exl3_codebook::MCG;
};
Result<exl3_slice> expert_slice_exl3(const weights &w, const std::string &name, slice_axis axis, int64_t begin,
                                     int64_t end);

}  // namespace ds41rt::model
