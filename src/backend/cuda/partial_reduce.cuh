// The reduction of a remote expert layer's TP partials (experts/cuda/nccl_remote): out[i] =
// ((p[0][i] + p[1][i]) + p[2][i]) + ... in FP32, rank order fixed whatever order the partials
// arrived in, exactly as experts/remote.cpp adds the TCP partials on the host (the CPU reference:
// the same left-to-right fp32 sum, rounded to nearest at every add).
//
// Shapes: each p[r] is [n] fp32 (a worker's partial rows, [rows, dim] flattened), out [n] fp32;
// out may alias none of the partials. At most MAX_REDUCE_RANKS ranks (the plan's TP widths go to
// 6).
//
// Cost: reads 4 * tp * n bytes, writes 4 * n, (tp - 1) * n adds: at decode (rows 1, dim 4096,
// TP 2) 48 KB, about 10 ns of H200 bandwidth and far below a launch (~3 us); C16 0.8 MB. Launch
// bound at every decode shape; nothing to tune.
// Graph-replayable: yes (pointers and n are kernel parameters; no host reads).
// Test: tests/cuda/partial_reduce_test.cpp, bit-exact against the host sum.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace ds41rt::backend::cuda {

constexpr int MAX_REDUCE_RANKS = 8;

struct partial_set {
    const float *p[MAX_REDUCE_RANKS] = {};
    int tp = 0;
};

Status reduce_partials(const partial_set &parts, int64_t n, float *out, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
