// The device's measured peaks, taken in the same run as the numbers they judge (docs/perf
// method): copy bandwidth (device-to-device, read + write counted), the dense matrix rates
// (cuBLASLt's FP8 and BF16 products) and the driver version.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace ds41rt::backend::cuda {

// GB/s of cudaMemcpyAsync device-to-device over `bytes` (best of `iters`, after one warm-up),
// counting the bytes read and the bytes written. Allocates 2 x bytes for the duration.
Result<double> measure_copy_gbps(size_t bytes = size_t(2) << 30, int iters = 10);

// TFLOP/s of a dense n x n x n product through cuBLASLt (the library's best kernel for the
// shape: what "the device's matrix rate" means in the reports), on random finite operands: FP8
// E4M3 x E4M3 with fp32 accumulation and a BF16 output (no fast accumulation: the precise mode),
// or BF16 x BF16 with fp32 accumulation. Median of `iters` products after two warm-ups. Two
// output elements are checked against a host dot product, so a mis-set layout cannot pass as a
// fast one. cuBLASLt is loaded at run time (libcublasLt.so.13 on the loader's path, or under
// $CUDA_HOME / /usr/local/cuda): a build needs its header only, and a machine without the
// library gets NOT_FOUND, not a binary that fails to start.
enum class matmul_kind { FP8_E4M3, BF16 };
Result<double> measure_matmul_tflops(matmul_kind kind, int n = 8192, int iters = 10);

// "major.minor" of the installed driver's CUDA version (cudaDriverGetVersion).
std::string driver_cuda_version();

}  // namespace ds41rt::backend::cuda
