// Dummy weights on the GPU (`--load-format dummy`): one tensor's stored bytes in a checkpoint
// storage format, filled from (seed, tensor id, position) so full-size models of the real shapes
// and formats appear in seconds without a checkpoint. The descriptor, the encoding choice and the
// value arithmetic are backend/cpu/dummy_values.h (read it for the formats and rules); this fill
// writes exactly the bytes of its CPU reference fill_dummy_host.
//
// What crosses this boundary: a plain descriptor and raw device (or host-mapped) pointers; nothing
// about the model. A call is graph-capturable: no device state, the code tables travel in the
// kernel parameters. Any block-aligned window (a TP slice, a chunk of an Engram table filled here
// and copied to host memory) holds exactly that range of a whole-tensor fill.
//
// Thread safety: free functions; the fill is ordered on `stream` like any kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cpu/dummy_values.h"
#include "core/status.h"

namespace ds41rt::backend::cuda {

using cpu::dummy_bytes;
using cpu::dummy_dist;
using cpu::dummy_encoding;
using cpu::dummy_encoding_for;
using cpu::dummy_format;
using cpu::dummy_tensor_desc;
using cpu::dummy_window_bytes;

// Fills the window of d: weight (dummy_bytes().weight bytes; 16-byte alignment makes the stores
// vector-wide) and, for quantized formats, scale (dummy_bytes().scale bytes; null otherwise).
//
// Cost: writes exactly dummy_bytes() and reads nothing; ALU-bound (a hash per 8 codes and a
// table lookup per code) at an estimated 1.5-3 TB/s for the quantized formats, below the ~4.8 TB/s
// write roof (dummy_fill.cu has the count); the test prints the measured GB/s.
Status fill_dummy(const dummy_tensor_desc &d, void *weight, void *scale, uint64_t seed, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
