// Sparse attention rows on the GPU: the twin of engine/attention_row's attend_row (V4 and V4.1),
// many query rows at once. K = V (one shared latent head), a per-head sink that joins only the
// softmax denominator, a key list per query row whose nullptr entries are skipped (index -1).
//
// Numerics (see attention.cu for the order of every sum):
//  - Scores: fp64 dot products (on the fp64 tensor cores) rounded once: the host's bits wherever
//    the products' partial sums are exact in fp64 (quantized keys), an fp64 rounding away
//    elsewhere.
//  - Softmax denominators: fp32 sums in the host's sequential list order.
//  - P.V: fp64, as the host sums it (w * k is exact in fp64), per 64-entry block on the tensor
//    cores, the blocks folded in order; it differs from the host's single chain only in fp64
//    roundings.
//  - TRANSFORMERS (official = false): one softmax over all scores and the sink; weights p = e / den
//    as the host forms them; out = float(acc). OFFICIAL: the reference kernel's blocks of 64 list
//    entries, running max over real scores, bf16(exp(score - max)) weights for P.V, the sink's
//    exp joining the denominator last, out = bf16(float(acc) / den). Both are the host's bits
//    except where exp (fp64 here, glibc expf there) or an fp64 rounding of the block fold lands
//    on the other side of a rounding boundary (rare; tests/cuda/attention_test.cpp bounds it).
//  - Every sum runs in an order fixed by (L, hd) alone, so a row's output bits do not depend on R
//    or on the other rows of the batch (decode and prefill agree exactly).
//  - No key at all (L = 0 or every entry nullptr): out = 0, as the host gives.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/cache_pack.cuh"
#include "core/status.h"

namespace ds41rt::backend::cuda {

// R query rows x H heads; each query row r has its own key list of L entries (same list for all
// H heads of that row): keys[r * L + i] is a device pointer to a key row of hd fp32 values, or a
// packed cache record tagged with its format (cache_pack.cuh key_record: FP8 + E8M0 per 32, FP4 +
// E4M3 per 16; hd a multiple of the block), or nullptr (skipped; the OFFICIAL list pads with it). A
// packed key gives the bits its unpacked fp32 row gives. K = V.
struct attention_batch {
    const float *q = nullptr;            // [R, H, hd] device, 16-byte aligned
    const float *const *keys = nullptr;  // [R, L] device array of device pointers (key rows / records 16-byte aligned)
    const float *sink = nullptr;         // [H] device
    float scale = 0;                     // 1/sqrt(hd)
    int R = 0, H = 0, L = 0, hd = 0;     // hd <= 512, multiple of 4 (V4.1/V4: 512; fixtures 40/64)
    bool official = false;
    float *out = nullptr;                // [R, H, hd] device, must not alias q or the keys
    // Added to the interface first agreed: attention_workspace_bytes(*this) bytes of device memory
    // (16-byte aligned), or nullptr: then a buffer kept per (device, stream) is grown when a larger
    // shape comes (a cudaMalloc, refused while the stream is being captured: run one call at the
    // largest shape before capturing, or pass a workspace). Used by one call at a time.
    void *workspace = nullptr;
};

// Scratch for the scores (R x H x ceil(L / 64) * 64 floats) and, when R is small, the per-block
// P.V partials (R x ceil(L / 64) x H x hd doubles): 11 MB at R = 4, H = 64, L = 640, hd = 512.
// Reads the current device's SM count (the launch shape depends on it, the results do not).
size_t attention_workspace_bytes(const attention_batch &b);

Status run_attention(const attention_batch &b, cudaStream_t stream);

}  // namespace ds41rt::backend::cuda
