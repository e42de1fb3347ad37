// Facts about a CUDA device, read once at start (STYLE convention 9): nothing about a particular
// card is baked into a kernel. Tile and grid heuristics take a device_info as input.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace ds41rt::backend::cuda {

struct device_info {
    int device = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    int sm_count = 0;
    int64_t l2_bytes = 0;
    int64_t smem_per_block_optin = 0;  // dynamic shared memory a block may opt into
    int64_t global_mem_bytes = 0;
};

// Reads the facts of `device`; UNAVAILABLE when there is no usable CUDA device.
Result<device_info> query_device(int device = 0);

}  // namespace ds41rt::backend::cuda
