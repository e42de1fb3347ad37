// The device probes' kernel launch: cudaLaunchKernelEx with or without programmatic stream
// serialization (the engine's backend/cuda/pdl.cuh launch_pdl always sets it; the probes time
// both). Included by launch_gap.cu, pdl_overlap.cu and graph_fork.cu.
#pragma once

#include <cuda_runtime.h>

template <class... P, class... A>
cudaError_t launch_ex(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      A... args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cfg.attrs = at, cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}
