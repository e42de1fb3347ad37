// The device's measured peaks, taken in the same run as the numbers they judge (docs/perf
// method): copy bandwidth (device-to-device, read + write counted) and the driver version.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// GB/s of cudaMemcpyAsync device-to-device over `bytes` (best of `iters`, after one warm-up),
// counting the bytes read and the bytes written. Allocates 2 x bytes for the duration.
Result<double> measure_copy_gbps(size_t bytes = size_t(2) << 30, int iters = 10);

// "major.minor" of the installed driver's CUDA version (cudaDriverGetVersion).
std::string driver_cuda_version();

}  // namespace ds41rt::backend::cuda
