// Programmatic dependent launch (sm_90+). A kernel launched with programmatic stream
// serialization (launch_pdl) may become resident while the kernel before it in the stream still
// runs, once that kernel's blocks have all called pdl_trigger (or exited); it must call pdl_wait
// before touching anything an earlier kernel writes. What it may do before: work on bytes no
// kernel writes, e.g. the decode GEMV's first weight stages (tools/device/pdl_overlap.cu, H200: a
// wq_b-sized weight stream after a 5 us one-block kernel, 16.9 -> 14.8 us a pair).
// pdl_wait in a kernel launched without the attribute returns at once; pdl_trigger without a
// programmatic dependent does nothing. Both compile to nothing below sm_90.
// Internal to backend/cuda: include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace ds41rt::backend::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The first statement of a kernel that launch_pdl launches and that reads what came before it
// from the start: let the next kernel's blocks become resident, then wait for the kernel before,
// so each launch's setup overlaps the kernel before it (tools/device/launch_gap.cu, H200: 0.74 ->
// 0.47 us a dependent launch of one block, 1.00 -> 0.75 us of 132). Releasing before waiting
// lets the kernel two launches on become resident while this one waits, so a decode GEMV after a
// small kernel issues its first weight stages during the tail of the GEMV before that (the GEMVs
// release at their start too), where it waited for the small kernel to begin. Still in stream
// order: a kernel's wait returns once the kernel before it has completed, which that kernel does
// only after its own wait returned.
__device__ __forceinline__ void pdl_enter() {
    pdl_trigger();
    pdl_wait();
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization. The
// legacy default stream (null) gets a plain launch.
template <class... P, class... A>
cudaError_t launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c{};
    c.gridDim = grid, c.blockDim = block, c.dynamicSmemBytes = smem, c.stream = stream;
    c.attrs = at, c.numAttrs = stream ? 1 : 0;
    return cudaLaunchKernelEx(&c, kernel, std::forward<A>(args)...);
}

}  // namespace ds41rt::backend::cuda
