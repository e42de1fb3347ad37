// Decode GEMV over EXL3 trellis weights (spec quant-formats 2.3-2.5, 2.8), decoded in the kernel.
// Reference: backend/cpu exl3_linear on model::exl3_decode's What.
//
// Three steps, as exllamav3 factors the layer:
//  1. rotate_x_kernel: xr = (x . suh) H / sqrt(128) per 128-block of each row (fp32 butterflies:
//     2 in-thread stages, 5 warp-shuffle stages), split into fp16 hi + lo (22 significant bits)
//     and stored in the B-fragment order of mma.m16n8k16 (one 16-byte load per thread and tile).
//     Matrices with the same x and suh (none in V4.1: w1 and w3 have their own suh) share it.
//  2. exl3_gemv_kernel: one CTA per (matrix, 128-output block, K slice); warp w owns the 16-column
//     tile 8 nb + w and walks the slice's 16-row tiles. Each lane decodes its 8 weights of a tile
//     from the trellis words it loads itself: the tile's element order is already the A fragment of
//     What^T (swap-AB: output features are the MMA's rows, tokens its columns; spec 2.8), so the 8
//     decoded fp16 values are 4 A registers with no shuffle. Two mma.m16n8k16 per 8 tokens (x hi,
//     x lo), fp32 accumulation.
//  3. Epilogue in the same CTA: the 16 x 128 fp32 block goes through shared memory; with split K
//     each slice writes its partial to the workspace and the last to arrive (atomic counter per
//     block) sums them in slice order (deterministic) and resets the counter. Then the output
//     Hadamard per token row (the same butterfly) times svh / sqrt(128), stored as fp32.
//
// Roofline (H200, V4.1 expert w1: in 5120, out 2304, K = 2, M = 1): 2.95 MB of trellis + 15 KB of
// suh/svh, 23.6 MFLOP of MMA (2 x 2 per weight per 8-token tile; the tensor cores are far from
// binding). The decode is integer work and binds. Counted in the SASS (cuobjdump -sass, sm_90a,
// nvcc 13.0; the main loop of exl3_gemv_kernel<1> built for K = 2 MCG alone, 4 tiles a trip), per
// warp and 16x16 tile (256 weights, 64 bytes at K = 2):
//   before: 110.5 instructions (NT = 2: 134.8): 27.5 LOP3 (mask and xor as two immediates, so two
//           LOP3 per state), 21 IMAD, 14 SHF, 8 PRMT, 4 HADD2, 2 HMMA, and ~34 of per-tile address
//           arithmetic, predicated x loads with their branches (BSSY / BSYNC) and re-read thread ids;
//   after:  52.5 (NT = 2: 57.0; K = 2 3INST 52.5, MUL1 52.3): per lane 12 ops for its 8 states
//           (decode8's K = 2 path: four funnel shifts, each window pair cut by one shift and one
//           PRMT, no masks), per weight 1 IMAD and 1 LOP3 ((x & mask) ^ xr with xr a register),
//           per pair 2 PRMT + 1 HADD2 (= 40 a tile), 2 HMMA, and ~10 of loads: one pointer per
//           trellis word advanced by the tile-row stride, x fragments at immediate offsets, whole
//           groups of U tiles (no tail predicates). Other K keep the generic cut (shift + mask a
//           state): K = 3 59.5, K = 4 57.8.
// At one warp instruction per scheduler per clock (132 SMs x 4 x ~1.8 GHz = 0.95e12/s): before
// ~0.55 TB/s of K = 2 trellis (measured on the H200: ~7% of copy, ~0.3 TB/s), after ~1.16 TB/s,
// so an expected ~0.6-0.65 TB/s (~15% of copy) at the same issue efficiency. The floor of this
// decode is ~5 thread instructions per weight (~40 a tile): K = 2 stays ALU-bound below ~1.5 TB/s,
// far from the HBM's ~4.3 TB/s; the bytes per weight grow with K and the count barely does, so
// K >= 6 approaches balance. M does not change the decode: M = 1 and M = 16 cost about the same.
//
// Invariants: in, out % 128 == 0; K 1..8; M <= 16; |(x . suh) H| / sqrt(128) < 65504 (fp16 hi);
// y does not alias x. Graph-replayable: yes (counters return to zero).
// Test: tests/cuda/exl3_gemv_test.cpp: decoded tiles bit-exact vs model::exl3_decode; layer output
// within 1e-4 relative (Frobenius) and 1e-3 of max|ref| per element vs backend/cpu exl3_linear;
// NaN-poisoned y; two runs per plan.
#include "backend/cuda/exl3_gemv.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/exl3_gemv_kernel.cuh"
#include "backend/cuda/splitk_plan.cuh"

namespace ds41rt::backend::cuda {

namespace {

using namespace exl3_detail;

constexpr int MAX_JOBS = 24;    // matrices per launch (kernel parameter space)
constexpr int MIN_KT = 8;       // thinnest K slice, in 16-row tiles
constexpr int MAX_KSPLIT = 24;  // bounds the partial sum of the last CTA ...
constexpr int MAX_SLICE_ROWS = 128;  // ... as does slices x tokens (64 KB of partials per block)

struct batch {
    job jobs[MAX_JOBS];
    int njobs, items;
    uint32_t cb_xor;  // 0x3B603B60 (cb_pair: a register operand, not a literal)
};

struct rot_job {
    const float *x;
    const uint16_t *suh;
    uint32_t *xs;
    int M, in;
};

struct rot_batch {
    rot_job jobs[MAX_JOBS];
    int njobs;
};

__global__ void rotate_x_kernel(const __grid_constant__ rot_batch b) {
    const rot_job &J = b.jobs[blockIdx.y];
    const int lane = threadIdx.x & 31, nblk = J.in / 128, total = J.M * nblk;
    for (int i = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < total; i += (gridDim.x * blockDim.x) >> 5) {
        const int m = i / nblk;
        rotate_block(J.x, J.suh, J.xs, J.in, m, i - m * nblk, lane);
    }
}

template <int NT>  // token tiles of 8 (M <= 8 NT)
__global__ void __launch_bounds__(THREADS) exl3_gemv_kernel(const __grid_constant__ batch b) {
    const int item = blockIdx.x;
    int j = 0;
    while (j + 1 < b.njobs && item >= b.jobs[j + 1].item_begin) ++j;
    exl3_item<NT>(b.jobs[j], item - b.jobs[j].item_begin, b.cb_xor);
}

// One warp per tile: the lane's 8 decoded values to their (row, column) of What (spec 2.3's map).
__global__ void decode_what_kernel(const uint32_t *trellis, int in, int out, int k, int cb, uint16_t *what) {
    const int lane = threadIdx.x & 31, tb = out / 16, tiles = (in / 16) * tb;
    for (int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < tiles; t += (gridDim.x * blockDim.x) >> 5) {
        const int a = t / tb, bcol = t - a * tb;
        uint32_t af[4] = {};
        switch (k * 3 + cb) {
#define DS41RT_EXL3_CASE(K, CB)                                                   \
    case K * 3 + CB: {                                                            \
        uint32_t w[geom<K>::NW];                                                  \
        const int start = span_start<K>(lane);                                    \
        load_words<K>(trellis + size_t(t) * geom<K>::WORDS, start, w);            \
        decode8<K, CB>(w, start & 31, 0x3B603B60u, af);                           \
        break;                                                                    \
    }
            DS41RT_EXL3_CASES(DS41RT_EXL3_CASE)
#undef DS41RT_EXL3_CASE
        default: break;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int jp = j >> 1, reg = ((jp & 1) << 1) | (jp >> 1);
            const uint16_t v = uint16_t(af[reg] >> (16 * (j & 1)));
            const int r = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1), c = lane / 4 + 8 * (j >> 2);
            what[size_t(16 * a + r) * out + 16 * bcol + c] = v;
        }
    }
}

using splitk::align256;
using splitk::token_tiles;

// Tiles per K slice: whole pipeline groups of U (in % 128 == 0 makes every tile count a multiple
// of 8, so every slice, the last included, is whole groups and the main loop needs no tail).
int slice_tiles(int kt, int ks) { return splitk::slice_len(kt, ks, U); }

template <int NT>
int blocks_per_sm() {
    static const int blocks = splitk::resident_blocks(exl3_gemv_kernel<NT>, THREADS);
    return blocks;
}

size_t xs_bytes(const exl3_matrix &m) { return align256(size_t(m.in) * 64); }  // in / 16 tiles x 16 tokens x 64 B

bool same_x(const exl3_matrix &a, const exl3_matrix &b) {
    return a.x == b.x && a.suh == b.suh && a.M == b.M && a.in == b.in;
}

}  // namespace

// Workspace layout: [block counters][split-K partials][rotated x, one per distinct (x, suh)].
Result<exl3_plan> plan_exl3_gemv(const device_info &dev, const std::vector<exl3_matrix> &mats) {
    exl3_plan plan;
    long total_blocks = 0;
    for (size_t i = 0; i < mats.size(); i++) {
        const exl3_matrix &m = mats[i];
        const std::string what = "exl3 matrix " + std::to_string(i) + " (in " + std::to_string(m.in) + ", out " +
                                 std::to_string(m.out) + ", K " + std::to_string(m.k) + ", M " + std::to_string(m.M) + ")";
        if (m.M < 1 || m.in < 1 || m.out < 1) return Status::invalid_argument(what + ": empty shape");
        if (m.M > 16) return Status::not_supported(what + ": at most 16 activation rows per launch");
        if (m.in % 128 != 0 || m.out % 128 != 0)
            return Status::invalid_argument(what + ": in and out must be multiples of the 128 Hadamard block");
        if (m.k < 1 || m.k > 8) return Status::invalid_argument(what + ": trellis bits per weight outside 1..8");
        if (int(m.cb) < 0 || int(m.cb) > 2) return Status::invalid_argument(what + ": unknown codebook");
        if (!m.trellis || !m.suh || !m.svh || !m.x || !m.y) return Status::invalid_argument(what + ": null pointer");
        if (reinterpret_cast<uintptr_t>(m.trellis) % 4 != 0)
            return Status::invalid_argument(what + ": trellis must be 4-byte aligned (read as uint32 words)");
        if (static_cast<const void *>(m.y) == static_cast<const void *>(m.x))
            return Status::invalid_argument(what + ": y aliases x");
        total_blocks += m.out / 128;
    }
    plan.mats = mats;
    // One wave of CTAs when K slicing can provide it; the decode is ALU-bound, so every SM must
    // have work. Slices no thinner than MIN_KT tiles.
    const int nt = token_tiles(mats);
    const int want = splitk::slices_wanted(
        long(dev.sm_count) * (nt == 1 ? blocks_per_sm<1>() : blocks_per_sm<2>()), total_blocks);
    splitk::workspace_layout ws;
    for (const exl3_matrix &m : plan.mats) {
        const int ks = splitk::slice_count(m.in / 16, want, MIN_KT, U, std::min(MAX_KSPLIT, MAX_SLICE_ROWS / m.M));
        plan.ksplit.push_back(ks);
        ws.add(size_t(m.out / 128), ks, size_t(m.M) * 128);
    }
    plan.workspace_bytes = splitk::place_x(plan.mats, ws.x_begin(), same_x, xs_bytes, &plan.x_offset);
    return plan;
}

Status run_exl3_gemv(const exl3_plan &plan, void *workspace, cudaStream_t stream) {
    char *ws = static_cast<char *>(workspace);
    const int nt = token_tiles(plan.mats);
    splitk::workspace_layout layout;
    for (size_t i = 0; i < plan.mats.size(); i++) layout.add(size_t(plan.mats[i].out / 128), plan.ksplit[i], 0);
    unsigned *counters = reinterpret_cast<unsigned *>(ws);
    float *partials = reinterpret_cast<float *>(ws + layout.counters_bytes());

    rot_batch rb{};
    int max_warps = 0;
    auto flush_rot = [&]() -> Status {
        if (rb.njobs == 0) return Status::ok();
        const dim3 grid(unsigned(std::min(1024, (max_warps * 32 + THREADS - 1) / THREADS)), unsigned(rb.njobs));
        rotate_x_kernel<<<grid, THREADS, 0, stream>>>(rb);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        rb.njobs = 0, max_warps = 0;
        return Status::ok();
    };
    for (size_t i = 0; i < plan.mats.size(); i++) {
        if (!splitk::first_use(plan.x_offset, i)) continue;
        const exl3_matrix &m = plan.mats[i];
        rot_job &R = rb.jobs[rb.njobs++];
        R.x = m.x, R.suh = m.suh, R.xs = reinterpret_cast<uint32_t *>(ws + plan.x_offset[i]), R.M = m.M, R.in = m.in;
        max_warps = std::max(max_warps, m.M * (m.in / 128));
        if (rb.njobs == MAX_JOBS) DS41RT_RETURN_IF_ERROR(flush_rot());
    }
    DS41RT_RETURN_IF_ERROR(flush_rot());

    size_t first = 0;
    while (first < plan.mats.size()) {
        batch b{};
        int items = 0;
        size_t i = first;
        for (; i < plan.mats.size() && b.njobs < MAX_JOBS; i++) {
            const exl3_matrix &m = plan.mats[i];
            const int ks = plan.ksplit[i];
            job &J = b.jobs[b.njobs++];
            J.trellis = reinterpret_cast<const uint32_t *>(m.trellis);
            J.svh = m.svh;
            J.xs = reinterpret_cast<const uint4 *>(ws + plan.x_offset[i]);
            J.y = m.y;
            J.in = m.in, J.out = m.out, J.k = m.k, J.cb = int(m.cb), J.M = m.M;
            J.ksplit = ks;
            J.kt_per_split = slice_tiles(m.in / 16, ks);
            J.item_begin = items;
            J.partials = partials, J.counters = counters;
            if (ks > 1) {
                counters += m.out / 128;
                partials += size_t(m.out / 128) * ks * m.M * 128;
            }
            items += (m.out / 128) * ks;
        }
        b.items = items;
        b.cb_xor = 0x3B603B60u;
        if (nt == 1) exl3_gemv_kernel<1><<<items, THREADS, 0, stream>>>(b);
        else exl3_gemv_kernel<2><<<items, THREADS, 0, stream>>>(b);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        first = i;
    }
    return Status::ok();
}

Status exl3_decode_what(const uint16_t *trellis, int in, int out, int k, exl3_cb cb, uint16_t *what,
                        cudaStream_t stream) {
    if (in < 128 || out < 128 || in % 128 != 0 || out % 128 != 0 || k < 1 || k > 8 || int(cb) < 0 || int(cb) > 2)
        return Status::invalid_argument("exl3_decode_what: in " + std::to_string(in) + ", out " + std::to_string(out) +
                                        ", K " + std::to_string(k) + ": need multiples of 128 and K in 1..8");
    const long tiles = long(in / 16) * (out / 16);
    const int grid = int(std::min<long>(4096, (tiles * 32 + THREADS - 1) / THREADS));
    decode_what_kernel<<<grid, THREADS, 0, stream>>>(reinterpret_cast<const uint32_t *>(trellis), in, out, k, int(cb), what);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
