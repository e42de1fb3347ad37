// cp.async (sm_80+): global -> shared copies that skip registers, in commit groups a thread
// waits for by count. Shared by the kernels that stage tiles through rings (GEMV, FP8 GEMM,
// attention). Internal to backend/cuda: include only from .cu files.
#pragma once

namespace ds41rt::backend::cuda {

// 16 bytes; src_bytes = 0 writes zeros (rows or columns past the edge). .cg bypasses L1: the
// data is read once. L2HINT: .L2::256B lets L2 fetch the whole 256-byte block around each
// request, so a row's next piece is on its way from HBM before its own copy is issued.
template <bool L2HINT = false>
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    const unsigned d = unsigned(__cvta_generic_to_shared(dst));
    if constexpr (L2HINT)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
}
// 16 bytes through L1 (.ca): data many warps of an SM read, such as a GEMV's x.
__device__ __forceinline__ void cp_async16_ca(void *dst, const void *src, int src_bytes) {
    const unsigned d = unsigned(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
}
// 4 bytes (.ca: only .ca takes sizes below 16).
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes) {
    const unsigned d = unsigned(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Until at most N of this thread's groups are still in flight. The thread's own copies only:
// other threads' need a barrier after it.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

}  // namespace ds41rt::backend::cuda
