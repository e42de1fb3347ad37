// Block-wide top-k selection by radix select, shared by topk.cu (index lists) and
// candidate_mask.cu (a per-position mask): the k largest of n values under the order of
// engine::top_indices_ordered, "greater value first, equal values by lower index".
//
// Method: values map to 32-bit keys whose unsigned order is the float order (-0 and +0 share
// one key, as the host comparator finds them equal). Four passes of a 256-bin histogram over
// the key bytes, high to low, find the key of the k-th largest value and how many of the
// values equal to it are still needed; one last pass in index order takes every value above it
// and the first `need` equal ones (a block-wide running count of equal values keeps index
// order). Five reads of the row, no sort, no workspace; the callers sort the k picks if the
// order matters. Values must not be NaN (the host comparator does not order NaN either).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41rt::backend::cuda::dev {

// Unsigned key in the order of the float value, zeros of both signs equal.
__device__ __forceinline__ uint32_t order_key(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) == 0) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The key of -inf: picks with it are dropped as top_indices_ordered drops them.
constexpr uint32_t NEG_INF_KEY = ~0xff800000u;

struct select_threshold {
    uint32_t key;   // every value with a larger key is selected
    uint32_t need;  // and the first `need` (lowest index) values with exactly this key
};

// Shared memory a block_select call needs.
struct select_smem {
    uint32_t hist[256];
    uint32_t warp_count[32];
    uint32_t pick[2];
};

// The threshold of the k largest of load(0 .. n-1); 1 <= k <= n, blockDim.x a multiple of 32.
// Every thread of the block calls it and gets the same answer.
template <class Load>
__device__ select_threshold block_select(const Load &load, int64_t n, uint32_t k, select_smem &sm) {
    uint32_t prefix = 0, mask = 0, remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[i] = 0;
        __syncthreads();
        for (int64_t i0 = 0; i0 < n; i0 += blockDim.x) {  // the same trip count in every lane
            const int64_t i = i0 + threadIdx.x;
            const uint32_t key = i < n ? order_key(load(i)) : 0u;
            // Lanes with the same bin add once (the top byte, sign and exponent, takes only a
            // few values in a real row, so plain atomics would serialize on them); 256 marks
            // lanes past n or outside the prefix.
            const uint32_t bin = i < n && (key & mask) == prefix ? (key >> shift) & 0xffu : 256u;
            const uint32_t peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256u && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sm.hist[bin], uint32_t(__popc(peers)));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l holds bins 255 - 8l down to 248 - 8l; a scan over lanes counts the values
            // in higher bins, and the lane whose range reaches `remaining` names the bin.
            const int lane = threadIdx.x;
            uint32_t c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) sum += (c[j] = sm.hist[255 - 8 * lane - j]);
            uint32_t incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            uint32_t acc = incl - sum;
            if (acc < remaining && remaining <= incl) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (acc + c[j] >= remaining) {
                        sm.pick[0] = uint32_t(255 - 8 * lane - j);
                        sm.pick[1] = remaining - acc;
                        break;
                    }
                    acc += c[j];
                }
            }
        }
        __syncthreads();
        prefix |= sm.pick[0] << shift;
        mask |= 0xffu << shift;
        remaining = sm.pick[1];
    }
    __syncthreads();  // pick is read by every thread before a later call rewrites it
    return {prefix, remaining};
}

// Visits 0 .. n-1 in chunks of blockDim.x, calling emit(i, key, selected) once per index with
// the selection of `th` (above the key, or equal and among the first th.need equal ones).
// Every thread of the block calls it.
template <class Load, class Emit>
__device__ void block_emit(const Load &load, int64_t n, select_threshold th, select_smem &sm, const Emit &emit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    uint32_t seen = 0;  // equal values in earlier chunks
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
        const int64_t i = c0 + threadIdx.x;
        const bool valid = i < n;
        const uint32_t key = valid ? order_key(load(i)) : 0u;
        const bool eq = valid && key == th.key;
        const uint32_t bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) sm.warp_count[warp] = __popc(bal);
        __syncthreads();
        uint32_t before = seen, total = 0;
        for (int w = 0; w < n_warps; w++) {
            if (w < warp) before += sm.warp_count[w];
            total += sm.warp_count[w];
        }
        before += __popc(bal & ((1u << lane) - 1u));
        if (valid) emit(i, key, key > th.key || (eq && before < th.need));
        seen += total;
        __syncthreads();
    }
}

}  // namespace ds41rt::backend::cuda::dev
