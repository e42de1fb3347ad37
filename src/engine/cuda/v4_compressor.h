// V4's compressor windows (spec 3.5; engine/v4_steps compress_pool) on the device: each
// sequence's projected rows wait in device buffers until a window of `ratio` of them closes;
// then the closing windows of every sequence of a step pool together in one launch
// (backend/cuda compress_pool_slots), so a step's compressors never bring rows to the host.
//
// The host keeps only counts (rows buffered, whether a previous window exists), from which it
// knows which windows close and which rows each one reads, and hands the kernel lists of row
// pointers in the host code's slot order. The arithmetic is the host's, step for step (pooling
// in fp32 in slot order, the ape bias added once to the rows of windows about to close); exp is
// fp64-rounded where the host calls expf (backend/cuda/compressor.cu), so a latent may differ by
// an ulp or two of its terms.
//
// Thread safety: none; the engine's thread drives it on the model's stream.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cuda/device_model.h"

namespace ds41rt::engine::gpu {

// One compressor's open windows in one sequence.
struct v4_open_windows {
    dev_rows kv, gate;         // [rows buffered, c * d] (c = 2 with overlap), gate not yet biased
    dtemp prev_kv, prev_gate;  // overlap: [ratio, d], the Ca half of the last closed window (biased)
    bool has_prev = false;
};

// The shape of one compressor.
struct v4_compressor_shape {
    int64_t d = 0;         // head dim of its entries
    int ratio = 0;         // window length m
    bool overlap = false;  // CSA's overlapping windows (c = 2)
    const float *ape = nullptr;  // device [ratio, c * d]
};

// Appends sequence i's rows (kv, gate: device [S, c * d]; sequence i's are rows [off[i], off[i] +
// n[i])) to st[i] and pools every window that closes, as v4::compress_pool. latent: [G, d] for the
// G closing windows, sequence by sequence, window order within each (unset when G = 0); groups[i]:
// sequence i's count. Stream-ordered, no synchronisation.
Status v4_compress_pool(const device_model &m, const v4_compressor_shape &c, const std::vector<v4_open_windows *> &st,
                        const float *kv, const float *gate, const std::vector<int64_t> &off,
                        const std::vector<int64_t> &n, dtemp *latent, std::vector<int64_t> *groups);

}  // namespace ds41rt::engine::gpu
