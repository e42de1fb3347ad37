// Prefill GEMM on Hopper's warpgroup MMA (wgmma, sm_90a), in the official numerics of gemm_fp8.cuh:
// y = fake_quant_fp8(x) . dequant(W)^T, fp32, for one weight or a group of them (a prefill's routed
// experts, each over its own rows).
//
// Why BF16 operands and not the FP8 wgmma: the E4M3 wgmma does not sum a 32-k block exactly (the
// products are aligned and truncated to ~13 fraction bits). Measured on the H200 with per-32-k
// scaling around m64n128k32 e4m3: 1e-4 relative error against the exact reference (mma.sync's e4m3
// path: 3e-8), enough to flip bf16 roundings and expert routes and to fail every official fixture's
// prefill-vs-decode self-consistency (1e-5). Every quantized value of this model is exactly a BF16
// value (an E4M3 or E2M1 code times a power of two), so x's fake-quantized values and the weight go
// to the tensor cores as BF16: the products exact and no per-block scaling in the MMA loop. The
// cost: the BF16 rate (measured 744 TFLOP/s on the H200, 58% of FP8's 1,278).
//
// Shape: 384 threads, three warpgroups.
// - x: a pre-pass writes the fake-quantized rows as BF16, tile-major (128-row tiles of 64 k; 256
//   for groups) and already in the 128-byte swizzle wgmma reads (16-byte chunk c of row r at chunk
//   c ^ (r % 8)), so a stage's x is one 16 KB (groups: 32 KB) bulk copy (cp.async.bulk on the
//   stage's mbarrier). With exact_x (the
//   BF16 class: x not quantized) x's three BF16 pieces hi, mid, lo fill three K segments, each
//   against the same weight image (read again, written once): 3x the MMA work, every product
//   exact. Where every mid and lo piece is zero (x already a BF16 value: in official numerics
//   every activation a BF16-class product reads, e.g. wo_a's attention output), the pre-pass says
//   so in a flag word and the kernel sums the hi segment only: the same bits (the skipped
//   segments' partials are zeros; a NaN or infinite weight already makes the hi segment's sum
//   NaN or infinite, as 0 x inf does there too) for a third of the MMA work.
// - the weight, one product (IMAGE): a second pre-pass writes it dequantized (a plain BF16 weight:
//   copied) as the same kind of image (256-row tiles), a 32 KB bulk copy a stage; 4 stages.
//   Measured fastest for the dense products (wq_b 397 TFLOP/s with the pre-passes; decoding in the
//   kernel, below: 221).
// - the weight, a group (a layer's experts have no room for BF16 images): the loading warpgroup
//   reads the checkpoint's bytes (FP8 or MXFP4, 128 rows x 64 k a stage: 8 or 4 KB + scales) with
//   cp.async into a 4-stage raw ring and decodes them to BF16 into the operand stage (E4M3 -> f16 ->
//   f32 by the converts, times the power-of-two scale, -> BF16; E2M1 -> BF16 by byte permutes and a
//   bf16x2 multiply by the scale: exact); 3 stages. What bounds a group is not settled: neither
//   the decode (a rewrite of 2.5x fewer instructions: the same time) nor the ring depth (4 operand
//   stages or 12 raw ones: 11-13% slower), H100 session 24; its time follows the weight tiles, not
//   the rows. Suspect: each stage reads 32 bytes from each of 128 weight rows 2560 bytes apart.
// - two MMA warpgroups of 64 x 256 outputs (groups: 128 x 128): per stage and half of the columns
//   (groups: of the rows), four m64n128k16 wgmmas sum the stage's 64 k from zero, and the partial
//   is added into fp32 accumulators (round to nearest; the tensor cores' own running sum
//   truncates, which over K = 8192 drifted to 1e-5 relative, measured). A warp frees a stage on its empty mbarrier once its wgmmas completed; no
//   block-wide barrier in the loop, so one warpgroup's adds overlap the other's MMAs.
// A block is one job: one product's 128-row x tile against 256 weight rows; for a group a 256-row
// x tile against 128 weight rows (each warpgroup 128 rows in two halves), so that a decoded weight
// stage serves 256 rows: a weight tile's cost (which bounds a group) is shared by twice the rows.
// Short tiles (128 x 128; DS41RT_GEMM_GROUP_ROWS=128 for groups, DS41RT_GEMM_IMAGE_COLS=128 for
// one product, read at every call; built in session 25, not yet measured, so off by default):
// each warpgroup owns 64 rows x 128 columns, and each stage's partial goes into one of two
// register sets while the previous stage's, complete (wgmma wait_group 1), is added: the adds run
// under the next stage's wgmmas, where the tall tiles wait for each half's wgmmas before adding
// (at V4.1's ~128 rows an expert at 8192 tokens the tall group tile also leaves its second
// warpgroup idle). The same partials added in the same order: the same bits as the tall tiles.
// Also for measuring only: DS41RT_GEMM_L2_256=1 (the weight's raw copies ask L2 for 256 bytes),
// DS41RT_GEMM_PROBE=1 / 2 (skip the MMAs / the weight's copies and decode: wrong results).
//
// Roofline at V4.1 prefill, M = 2048: wq_b (N 32768, K 1280) 172 GFLOP, ~231 us at the BF16 rate;
// wo_b (5120 x 8192) the same; an MXFP4 expert w1 (2304 x 5120) 48 GFLOP, 65 us. Bytes from L2 per
// tile and 64 k, for 4.19 MFLOP: IMAGE 16 KB of x and 32 KB of BF16 weight (85 FLOP per byte);
// groups 32 KB of x and 8 KB FP8 / 4 KB MXFP4 + scales (105 to 116). Pre-passes: x M K (4 read +
// 2 written) bytes, the weight image N K (1 or 0.5 read + 2 written): wq_b's 42 MB of E4M3 become
// 84 MB of BF16, ~30 us at the copy rate. A routed expert of tens of rows is bound by the decode of
// its weights instead, once per 256 of its rows (and its tile's padding rows still cost MMAs).
//
// Invariants: every output sums its 64-k partials in increasing k, so row m's bits do not depend on
// M or on the other groups (batch invariance); no split K. Rows past a group's end are zeros in x
// and never stored; weight rows past N and k past K are zeros.
// Test: tests/cuda/gemm_fp8_test.cpp (rel err <= 1e-5 against the CPU reference, NaN poison, batch
// invariance, groups, on both kernels).
#include "backend/cuda/gemm_fp8_sm90.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "backend/cuda/block_quant.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/numerics.cuh"

// The kernel body exists only in an sm_90a compilation; other targets get an empty kernel that
// usable() keeps from ever being launched.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS41RT_WGMMA_BODY 1
#endif

namespace ds41rt::backend::cuda::gemm_fp8_sm90 {

namespace {

constexpr int BK = 64;  // BK BF16 = one 128-byte swizzle row
// A block's tile, TM x rows against TN weight rows: one product (IMAGE) 128 x 256 (or 128 x 128),
// a group 256 x 128 (or 128 x 128); 128 x 128 is gemm_kernel's short tile.
constexpr int BM = 128, BN = 256, GBN = 128;
constexpr int CONSUMERS = 256, LOADERS = 128, THREADS = CONSUMERS + LOADERS;
constexpr int PREP_THREADS = 256;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
// A raw stage (groups): the weight's bytes (item i of 8 k at 8i, FP8; 4i, MXFP4), then two scale
// words a row.
constexpr int ITEMS = GBN * BK / 8, ITEMS_PER_THREAD = ITEMS / LOADERS;
constexpr int RAW_DATA = GBN * BK, RAW_BYTES = RAW_DATA + GBN * 2 * 4;
// Where the weight operand comes from: a BF16 image written by a pre-pass (one weight: the fastest,
// two bulk copies a stage), or the checkpoint's FP8 / MXFP4 bytes decoded by the loading warpgroup
// (groups: the experts of a layer have no room for BF16 images).
enum mode { IMAGE, FP8_BYTES, FP4_BYTES };
// The ring of kernel <MODE, TM, TN>: operand stages (x's tile, then the weight's; ~192 KB of them),
// and for groups the raw ring the loaders decode from.
template <int MODE, int TM, int TN>
struct ring {
    static constexpr int ab = TM * BK * 2, stage_bytes = ab + TN * BK * 2;  // x's bytes a stage, all of them
    static constexpr int stages = MODE == IMAGE ? (TN == 256 ? 4 : 6) : TM == 256 ? 3 : 4, raw = MODE == IMAGE ? 0 : 4;
    static constexpr int smem = stages * stage_bytes + raw * RAW_BYTES + 2 * stages * 8 + 1024;  // + 1024 alignment slack
    static_assert(ab % 1024 == 0 && stage_bytes % 1024 == 0, "swizzle atoms 1024-byte aligned");
};
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int SMEM_BYTES = cmax(cmax(ring<IMAGE, BM, BN>::smem, ring<IMAGE, BM, 128>::smem),
                                cmax(ring<FP8_BYTES, 256, GBN>::smem, ring<FP8_BYTES, 128, GBN>::smem));
static_assert(ITEMS % LOADERS == 0 && GBN * 2 % LOADERS == 0, "loads split evenly");

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct x_tile {  // a tile of x's operand image (tm rows): rows [row0, row0 + rows) of x
    int64_t row0;
    int32_t rows, pad;
};
struct job {  // a block's rows: x tile xt, times weight (w, scale), into y [rows, N]
    const uint8_t *w, *scale;
    float *y;
    int32_t xt, rows;
};
struct params {
    const uint8_t *xi;  // x's operand image: [tiles][Kp / 64][128 x 128 bytes]
    const uint8_t *wi;  // IMAGE: the weight's operand image, [Np / 256][Kp / 64][256 x 128 bytes]
    const job *jobs;    // the jobs' table, or null: one group, P.one over rows [0, implicit_rows)
    job one;
    int64_t implicit_rows = 0;
    int64_t kp;
    int64_t kseg;  // K rounded up to BK: one segment of x's image, and the weight image's K
    // exact_x: the pre-pass's flag word, nonzero when a mid or lo piece of x is not zero; the
    // kernel sums the first K segment only while it is zero. Null: every segment.
    const uint32_t *rest_nonzero = nullptr;
    int N, K;
    int lbo, lbi, scols;  // FP8 scale grid: log2 of its block sizes (powers of two), its columns
    bool round_bf16;
    bool raster_jobs_first = false;  // groups: x-major block order (DS41RT_GEMM_RASTER=jobs), for comparing
    // Groups, for measuring: the weight's raw copies ask L2 for the 256 bytes around them
    // (DS41RT_GEMM_L2_256=1); probe (DS41RT_GEMM_PROBE, wrong results: never outside a benchmark):
    // 1 the MMA warps skip their wgmmas, 2 the loaders skip the weight's copies and decode.
    bool l2_256 = false;
    int probe = 0;
};

// The tiles and jobs of `a`, built the same way for sizing the workspace and for running: each
// group's rows in tm-row tiles, a tile shared by the groups that read the same rows.
struct tables {
    std::vector<x_tile> tiles;
    std::vector<job> jobs;
};
tables tables_of(const gemm_fp8_grouped_args &a, int tm) {
    tables t;
    std::map<std::pair<int64_t, int64_t>, int32_t> seen;
    for (const gemm_fp8_group &g : a.groups)
        for (int64_t r = 0; r < g.rows; r += tm) {
            const int32_t rows = int32_t(std::min<int64_t>(tm, g.rows - r));
            auto [it, fresh] = seen.try_emplace({g.row0 + r, rows}, int32_t(t.tiles.size()));
            if (fresh) t.tiles.push_back({g.row0 + r, rows, 0});
            t.jobs.push_back({g.w, g.scale, g.y + r * a.N, it->second, rows});
        }
    return t;
}

struct layout {
    int64_t kp;
    size_t xi, tiles, jobs, total;
};
layout layout_of(const gemm_fp8_grouped_args &a, const tables &t, int tm) {
    layout l;
    l.kp = round_up(a.K, BK);
    l.xi = 0;
    l.tiles = round_up(int64_t(t.tiles.size()) * tm * l.kp * 2, 256);
    l.jobs = l.tiles + size_t(round_up(int64_t(t.tiles.size() * sizeof(x_tile)), 256));
    l.total = l.jobs + t.jobs.size() * sizeof(job);
    return l;
}

// The piece of v that x_image_kernel's exact mode puts in K segment `piece`: v = hi + mid + lo
// exactly, each a BF16 (8 significant bits each: all of an fp32's 24).
__device__ __forceinline__ uint32_t bf16_piece(float v, int piece) {
    const float hi = dev::round_bf16(v), r = __fsub_rn(v, hi), mid = dev::round_bf16(r);
    return dev::bf16_bits(piece == 0 ? hi : piece == 1 ? mid : __fsub_rn(r, mid));
}

// x -> the operand image (zeros past a tile's rows). Quantized (pieces 1): its fake-quantized
// values (E4M3 code times the block's power-of-two scale, the CPU quantizer's operations) as BF16,
// exact; the act_block / 4 lanes of a block agree on its amax by shuffles. Exact (pieces 3): x as
// it is, in three K segments of kseg (hi, mid, lo; gemm_fp8_args::exact_x), which the weight image
// repeats. One thread per 4 channels. Bytes: rows K 4 read, tiles bm Kp 2 written. No table
// (tiles null): rows [0, rows) in order. bm: the tiles' rows (BM, or a group's tm).
__global__ void x_image_kernel(const float *x, const x_tile *tiles, int64_t rows, int64_t n_tiles, int bm, int K, int64_t kseg,
                               int pieces, int lanes, uint8_t *xi, uint32_t *rest_nonzero) {
    const int64_t kp = kseg * pieces, per_row = kp / 4, total = n_tiles * bm * per_row;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= total) return;  // total is a multiple of 32 (kp % 64 == 0): whole warps leave together
    const int64_t row = t / per_row, tile = row / bm;
    const int r = int(row % bm), kq = int(t % per_row) * 4, piece = int(kq / kseg), k = int(kq % kseg);
    const x_tile T = tiles ? tiles[tile] : x_tile{tile * bm, int32_t(rows - tile * bm < bm ? rows - tile * bm : bm), 0};
    const bool live = r < T.rows && k < K;  // K % act_block == 0: a block is all live or all padding
    const float4 v = live ? *reinterpret_cast<const float4 *>(x + (T.row0 + r) * K + k) : make_float4(0, 0, 0, 0);
    uint2 o = make_uint2(0, 0);
    if (pieces == 1) {  // uniform across the launch: every lane shuffles
        const float amax = dev::block_amax(v, lanes);
        if (live) {
            using dev::qkind;
            const float s = dev::scale_of<qkind::FP8_UE8M0>(amax).s;
            const auto q = [s](float f) {
                return uint32_t(dev::bf16_bits(dev::value_of<qkind::FP8_UE8M0>(dev::code_of<qkind::FP8_UE8M0>(f, s), s)));
            };
            o.x = q(v.x) | q(v.y) << 16, o.y = q(v.z) | q(v.w) << 16;
        }
    } else if (live) {
        o.x = bf16_piece(v.x, piece) | bf16_piece(v.y, piece) << 16, o.y = bf16_piece(v.z, piece) | bf16_piece(v.w, piece) << 16;
        if (piece > 0 && ((o.x | o.y) & 0x7fff7fffu) && rest_nonzero) atomicOr(rest_nonzero, 1u);
    }
    const int kk = kq % BK;
    if (r < ((T.rows + 63) & ~63))  // rows past the tile's last 64-row half are never read (gemm_kernel)
        *reinterpret_cast<uint2 *>(xi + ((tile * (kp / BK) + kq / BK) * bm + r) * 128 + ((((kk >> 3) ^ r) & 7) << 4) +
                                   (kk & 7) * 2) = o;
}

// One weight dequantized to BF16 (exact: a code times a power of two; a BF16 weight as it is) as
// the operand image of 256-row tiles (the layout x_image_kernel writes), zeros in the padding; 8 k
// (one 16-byte chunk) per thread. Bytes: N K (1 FP8, 0.5 MXFP4, 2 BF16) + N K / 32 scales read,
// Np Kp 2 written (Kp: K rounded up to BK; x's pieces all read this one image).
__global__ void w_image_kernel(const uint8_t *w, const uint8_t *scale, bool fp4, bool bf16, int N, int K, int bo, int bi,
                               int64_t np, int64_t kp, uint8_t *wi) {
    const int64_t per_row = kp / 8;
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= np * per_row) return;
    const int64_t n = t / per_row;
    const int k = int(t % per_row) * 8;
    uint32_t o[4] = {0, 0, 0, 0};
    if (bf16 && n < N && k < K) {
        const uint4 p = *reinterpret_cast<const uint4 *>(w + (n * K + k) * 2);
        o[0] = p.x, o[1] = p.y, o[2] = p.z, o[3] = p.w;
    } else if (n < N && k < K) {  // K % 32 == 0: 8 k are all live or all padding
        float v[8];
        if (fp4) {
            const float s = dev::e8m0_value(scale[n * (K / 32) + k / 32]);
            const uint32_t p = *reinterpret_cast<const uint32_t *>(w + n * (K / 2) + k / 2);
            for (int i = 0; i < 8; i++) v[i] = __fmul_rn(dev::e2m1_value(uint8_t((p >> (4 * i)) & 0xfu)), s);
        } else {
            const float s = dev::e8m0_value(scale[(n / bo) * ((K + bi - 1) / bi) + k / bi]);
            const uint2 p = *reinterpret_cast<const uint2 *>(w + n * K + k);
            for (int i = 0; i < 8; i++)
                v[i] = __fmul_rn(dev::e4m3_value(uint8_t(((i < 4 ? p.x : p.y) >> (8 * (i & 3))) & 0xffu)), s);
        }
        for (int i = 0; i < 4; i++) o[i] = uint32_t(dev::bf16_bits(v[2 * i])) | uint32_t(dev::bf16_bits(v[2 * i + 1])) << 16;
    }
    const int64_t tile = n / BN;
    const int r = int(n % BN), kk = k % BK;
    *reinterpret_cast<uint4 *>(wi + ((tile * (kp / BK) + k / BK) * BN + r) * 128 + ((((kk >> 3) ^ r) & 7) << 4)) =
        make_uint4(o[0], o[1], o[2], o[3]);
}

#if DS41RT_WGMMA_BODY

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_u32(b)),
        "r"(parity)
        : "memory");
}
// One contiguous global -> shared copy by the copy engine, counted on `bar` by its bytes.
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::"
        "bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
// cp.async of 4 or 8 bytes; src_bytes 0 fills zeros.
template <int BYTES>
__device__ __forceinline__ void cp_async(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem_u32(dst)), "l"(src), "n"(BYTES), "r"(src_bytes)
                 : "memory");
}
// The same, asking L2 for the 256 bytes around src: a weight row's next stages (32 bytes of MXFP4
// a stage, rows 2560 bytes apart at K 5120) then come from L2, the row read from DRAM in 256-byte
// pieces instead of 32-byte ones.
template <int BYTES>
__device__ __forceinline__ void cp_async_l2_256(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global.L2::256B [%0], [%1], %2, %3;" ::"r"(smem_u32(dst)), "l"(src), "n"(BYTES),
                 "r"(src_bytes)
                 : "memory");
}

// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle: rows of 128 bytes,
// 8-row atoms 1024 bytes apart (stride byte offset); the leading byte offset is unused in this
// mode. Advancing k by 16 BF16 (32 bytes) inside the atom adds 2 to the start address field.
__device__ __forceinline__ uint64_t smem_desc(const void *p) {
    const uint32_t a = smem_u32(p);
    return uint64_t((a & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma.
__device__ __forceinline__ void fence_regs(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d = A (64 x 16, K-major) . B (128 x 16, K-major)^T (+ d with `accumulate`), fp32.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
        "%46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),
          "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

// Two E4M3 codes (low byte first) times the power-of-two s as two BF16: exact (a NaN code stays
// NaN).
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t two, float s) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
    return *reinterpret_cast<const uint32_t *>(&b);
}
// Four E2M1 codes (16 bits, low nibble first) times the power of two whose BF16 is in both halves
// of m2, as four BF16 (two words, k order): the high and low bytes of each magnitude's BF16 (0, .5,
// 1, 1.5, 2, 3, 4, 6) by two byte permutes, the signs into the high bytes, two permutes to pair
// them, and one bf16x2 multiply a pair (exact: two significant bits times a power of two).
__device__ __forceinline__ uint2 e2m1x4_bf16x4(uint32_t c, uint32_t m2) {
    const uint32_t idx = c & 0x7777u;
    uint32_t hi, lo, a, b;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(hi) : "r"(0x3F3F3F00u), "r"(0x40404040u), "r"(idx));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(lo) : "r"(0xC0800000u), "r"(0xC0804000u), "r"(idx));
    hi |= (c & 0x8u) << 4 | (c & 0x80u) << 8 | (c & 0x800u) << 12 | (c & 0x8000u) << 16;
    asm("prmt.b32 %0, %1, %2, 0x5140;" : "=r"(a) : "r"(lo), "r"(hi));
    asm("prmt.b32 %0, %1, %2, 0x7362;" : "=r"(b) : "r"(lo), "r"(hi));
    asm("mul.rn.bf16x2 %0, %0, %1;" : "+r"(a) : "r"(m2));
    asm("mul.rn.bf16x2 %0, %0, %1;" : "+r"(b) : "r"(m2));
    return make_uint2(a, b);
}

// The job of block `b`: from the table, or for a single group (no table) its b-th 128 rows.
__device__ __forceinline__ job job_of(const params &P, int b) {
    if (P.jobs) return P.jobs[b];
    job j = P.one;
    j.y += int64_t(b) * BM * P.N, j.xt = b, j.rows = min(BM, P.one.rows - b * BM);
    return j;
}

// Offset of the scale byte of weight row n, 32-k block starting at k (offsets fit 32 bits: the host
// refuses weights of 2^31 bytes or more).
template <bool FP4>
__device__ __forceinline__ uint32_t scale_offset(const params &P, uint32_t n, uint32_t k) {
    return FP4 ? n * uint32_t(P.K / 32) + k / 32 : (n >> P.lbo) * uint32_t(P.scols) + (k >> P.lbi);
}

// The loaders' share of raw stage kt: items of 8 k (8 bytes FP8, 4 MXFP4) at rows lt / 8 + 16 i,
// chunk lt % 8; the aligned words holding the scale bytes of rows lt / 2 + 64 i, 32-k half lt % 2.
// Weight rows past N and k past K load zeros.
template <bool FP4>
__device__ __forceinline__ void load_raw(const params &P, const job &J, uint8_t *raw, int kt, uint32_t n0, int lt) {
    const uint32_t k = uint32_t(kt * BK + (lt & 7) * 8), live_rows = uint32_t(P.N) - n0;
    const bool k_live = k < uint32_t(P.K);
#pragma unroll 4
    for (int i = 0; i < ITEMS_PER_THREAD; i++) {
        const uint32_t row = uint32_t(lt >> 3) + 16u * uint32_t(i), item = uint32_t(lt) + uint32_t(LOADERS * i);
        const bool live = k_live && row < live_rows;
        const uint8_t *src = J.w + (live ? (n0 + row) * uint32_t(FP4 ? P.K / 2 : P.K) + (FP4 ? k / 2 : k) : 0u);
        uint8_t *dst = raw + item * (FP4 ? 4 : 8);
        if (P.l2_256)
            cp_async_l2_256<FP4 ? 4 : 8>(dst, src, live ? (FP4 ? 4 : 8) : 0);
        else
            cp_async<FP4 ? 4 : 8>(dst, src, live ? (FP4 ? 4 : 8) : 0);
    }
    uint8_t *sw = raw + RAW_DATA;
    const uint32_t ks = uint32_t(kt * BK + (lt & 1) * 32);
#pragma unroll
    for (int i = 0; i < GBN * 2 / LOADERS; i++) {
        const uint32_t row = uint32_t(lt >> 1) + 64u * uint32_t(i);
        const bool live = ks < uint32_t(P.K) && row < live_rows;
        const uintptr_t a =
            reinterpret_cast<uintptr_t>(J.scale + (live ? scale_offset<FP4>(P, n0 + row, ks) : 0u)) & ~uintptr_t(3);
        cp_async<4>(sw + (uint32_t(lt) + uint32_t(LOADERS * i)) * 4, reinterpret_cast<const void *>(a), live ? 4 : 0);
    }
}

// The scale words this loader copied for raw stage kt (its own cp.asyncs landed) -> the scale they
// hold, in place: fp32 for FP8, for MXFP4 its BF16 in both halves (decode_raw's multiplier).
template <bool FP4>
__device__ __forceinline__ void decode_scales(const params &P, const job &J, uint8_t *raw, int kt, uint32_t n0, int lt) {
    uint32_t *sw = reinterpret_cast<uint32_t *>(raw + RAW_DATA);
    const uint32_t ks = uint32_t(kt * BK + (lt & 1) * 32), base = uint32_t(reinterpret_cast<uintptr_t>(J.scale));
#pragma unroll
    for (int i = 0; i < GBN * 2 / LOADERS; i++) {
        const uint32_t row = uint32_t(lt >> 1) + 64u * uint32_t(i), wi = uint32_t(lt) + uint32_t(LOADERS * i);
        const uint32_t shift = ((base + scale_offset<FP4>(P, n0 + row, ks)) & 3u) * 8u;  // a dead row's word is 0
        const uint32_t f = __float_as_uint(dev::e8m0_value((sw[wi] >> shift) & 0xffu));
        sw[wi] = FP4 ? (f >> 16) * 0x10001u : f;  // a power of two's BF16 is its fp32's high half
    }
}

// Raw stage kt -> the B operand of the stage (BF16, swizzled), the same items as load_raw.
template <bool FP4>
__device__ __forceinline__ void decode_raw(const params &P, const job &J, const uint8_t *raw, uint8_t *sb, int kt, uint32_t n0,
                                           int lt) {
    const uint32_t *sw = reinterpret_cast<const uint32_t *>(raw + RAW_DATA);  // decode_scales' output
    const int ch = lt & 7, h = ch >> 2;
#pragma unroll 4
    for (int i = 0; i < ITEMS_PER_THREAD; i++) {
        const uint32_t row = uint32_t(lt >> 3) + 16u * uint32_t(i), item = uint32_t(lt) + uint32_t(LOADERS * i);
        const uint32_t sc = sw[row * 2 + uint32_t(h)];
        uint4 o;
        if constexpr (FP4) {
            const uint32_t c = *reinterpret_cast<const uint32_t *>(raw + item * 4);
            const uint2 a = e2m1x4_bf16x4(c & 0xffffu, sc), b = e2m1x4_bf16x4(c >> 16, sc);
            o = make_uint4(a.x, a.y, b.x, b.y);
        } else {
            const uint2 c = *reinterpret_cast<const uint2 *>(raw + item * 8);
            const float s = __uint_as_float(sc);
            o = make_uint4(e4m3x2_bf16x2(c.x, s), e4m3x2_bf16x2(c.x >> 16, s), e4m3x2_bf16x2(c.y, s),
                           e4m3x2_bf16x2(c.y >> 16, s));
        }
        *reinterpret_cast<uint4 *>(sb + row * 128 + ((uint32_t(ch) ^ (row & 7u)) << 4)) = o;
    }
}

__device__ __forceinline__ void store_pair(const params &P, const job &J, int m, int64_t n, float v0, float v1) {
    if (m >= J.rows || n >= P.N) return;
    if (P.round_bf16) v0 = dev::round_bf16(v0), v1 = dev::round_bf16(v1);
    float *p = J.y + int64_t(m) * P.N + n;
    if (n + 1 < P.N && reinterpret_cast<uintptr_t>(p) % 8 == 0) {
        *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
    } else {
        p[0] = v0;
        if (n + 1 < P.N) p[1] = v1;
    }
}

#endif  // DS41RT_WGMMA_BODY

// The MMA warpgroups' loop of a short tile (128 x 128): warpgroup wg owns rows 64 wg .. 64 wg + 63
// against the tile's 128 weight rows. Each stage's 64 k go into one of two partials (p[kt % 2])
// while the previous stage's partial, complete (wait_group 1), is added into acc: the tensor
// cores get the next stage's wgmmas while the adds run, where a tall tile waits for each half's
// wgmmas before adding them. Same products, same partials, the same order of adds: the same bits.
#if DS41RT_WGMMA_BODY
__device__ __forceinline__ void add_partial(float (&acc)[64], float (&p)[64]) {
    fence_regs(p);
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] += p[i];
}
template <int STAGES, int STAGE, int AB>
__device__ __forceinline__ void mma_stage(const uint8_t *smem, uint64_t *full, uint64_t *empty, int kt, bool live, int wg, int lane,
                                          float (&acc)[64], float (&cur)[64], float (&prev)[64]) {
    const int s = kt % STAGES;
    mbar_wait(&full[s], uint32_t(kt / STAGES) & 1);
    if (live) {
        const uint8_t *st = smem + s * STAGE;
        const uint64_t da = smem_desc(st + wg * 64 * 128), db = smem_desc(st + AB);
        fence_regs(cur);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < BK / 16; k++) wgmma_m64n128k16_bf16(cur, da + 2 * k, db + 2 * k, k);
        wgmma_commit();
    }
    if (kt == 0) return;
    if (live) {
        wgmma_wait<1>();  // stage kt - 1's group is complete
        add_partial(acc, prev);
    }
    if (lane == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);
}
#endif

template <int MODE, int TM, int TN>
__global__ void __launch_bounds__(THREADS, 1) gemm_kernel(const __grid_constant__ params P) {
    constexpr bool FP4 = MODE == FP4_BYTES, SHORT = TM == 128 && TN == 128;
    using R = ring<MODE, TM, TN>;
    constexpr int STAGES = R::stages, RAW = R::raw, STAGE = R::stage_bytes, AB = R::ab, WB = TN * 128;  // WB: weight bytes a stage
#if DS41RT_WGMMA_BODY
    extern __shared__ uint8_t smem_raw[];
    // Aligned by an offset on the shared array (not through an integer), so the compiler keeps
    // every access below in the shared space (LDS / STS, not generic loads).
    uint8_t *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    uint8_t *raw_ring = smem + STAGES * STAGE;
    uint64_t *full = reinterpret_cast<uint64_t *>(raw_ring + RAW * RAW_BYTES), *empty = full + STAGES;
    const int tid = threadIdx.x, lane = tid & 31;
    // Every thread reads the flag (the pre-pass before this launch wrote it), so the loaders and
    // the MMA warps agree on the stage count.
    const int KT = int((P.rest_nonzero && *P.rest_nonzero == 0 ? P.kseg : P.kp) / BK), KW = int(P.kseg / BK);
    // Which job and weight tile: a grouped product's blocks walk one job's weight tiles before the
    // next job's (block b: job b / tiles, tile b % tiles; raster_jobs_first keeps the x-major
    // order, for comparing), so the blocks that read one x tile run at once and share it in L2. It
    // moved little (H100, session 23, 8192 tokens: w2 51.0 -> 47.9 ms, w1 + w3 unchanged; within
    // 3% either way at 1K-4K): x's traffic does not bound the product (see the top). The single
    // product keeps blockIdx (x, y) = (row tile, weight tile): its weight image is the larger
    // operand, shared down a column.
    uint32_t jb = blockIdx.x, nt = blockIdx.y;
    if (MODE != IMAGE && !P.raster_jobs_first) {
        const uint32_t tiles = (uint32_t(P.N) + TN - 1) / TN;
        jb = blockIdx.x / tiles, nt = blockIdx.x % tiles;
    }
    const job J = job_of(P, int(jb));
    const uint32_t n0 = nt * uint32_t(TN);
    // x's live 64-row halves: a tile's rows past them are padding, neither copied nor multiplied
    // (a routed expert of 30 rows in a 256-row group tile costs one half's MMAs, not four).
    const uint32_t x_bytes = uint32_t(min(AB / 128, (J.rows + 63) & ~63)) * 128u;
    if (tid == 0) {
        // full: the x copy's bytes plus an arrival from each loader once its decoded rows are
        // stored; empty: one arrival from each MMA warp once its wgmmas on the stage completed.
        for (int s = 0; s < STAGES; s++)
            mbar_init(&full[s], MODE == IMAGE ? 1 : LOADERS + 1), mbar_init(&empty[s], CONSUMERS / 32);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // The registers go to the MMA warpgroups: 232 each for 128 accumulators, a 64-float partial and
    // the addresses (short tiles: 64 accumulators, two partials), 40 for the loaders (384 threads x
    // 168 as launched; more unrolled loads spill).
    if (tid >= CONSUMERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        const int lt = tid - CONSUMERS;
        const uint8_t *xa = P.xi + int64_t(J.xt) * (P.kp / BK) * AB;  // a tile holds every piece, summed or not
        if constexpr (MODE == IMAGE) {  // one lane streams both operands' tiles
            if (lt == 0) {
                // The image's tiles are 256 rows: a 128-row tile is one half of each stage's.
                const uint8_t *wa = P.wi + int64_t(nt * TN / BN) * KW * B_BYTES + (nt * TN % BN) * 128;
                for (int kt = 0; kt < KT; kt++) {
                    const int s = kt % STAGES;
                    if (kt >= STAGES) mbar_wait(&empty[s], uint32_t(kt / STAGES - 1) & 1);
                    uint8_t *st = smem + s * STAGE;
                    mbar_arrive_expect_tx(&full[s], x_bytes + WB);
                    bulk_copy(st, xa + int64_t(kt) * A_BYTES, x_bytes, &full[s]);
                    bulk_copy(st + A_BYTES, wa + int64_t(kt % KW) * B_BYTES, WB, &full[s]);  // one image for every piece
                }
            }
        } else {  // every loader decodes its share of the weight; one lane also copies x
            const bool decode = P.probe != 2;
#pragma unroll
            for (int p = 0; p < RAW - 1; p++) {
                if (p < KT && decode) load_raw<FP4>(P, J, raw_ring + p * RAW_BYTES, p, n0, lt);
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
            for (int kt = 0; kt < KT; kt++) {
                asm volatile("cp.async.wait_group %0;" ::"n"(RAW - 2) : "memory");
                if (decode) decode_scales<FP4>(P, J, raw_ring + (kt % RAW) * RAW_BYTES, kt, n0, lt);
                // Every loader's share of raw stage kt landed, and every loader is done decoding
                // stage kt - 1, whose raw slot is refilled next.
                asm volatile("bar.sync 1, %0;" ::"n"(LOADERS) : "memory");
                if (kt + RAW - 1 < KT && decode)
                    load_raw<FP4>(P, J, raw_ring + ((kt + RAW - 1) % RAW) * RAW_BYTES, kt + RAW - 1, n0, lt);
                asm volatile("cp.async.commit_group;" ::: "memory");
                const int s = kt % STAGES;
                if (kt >= STAGES) mbar_wait(&empty[s], uint32_t(kt / STAGES - 1) & 1);  // both warpgroups done with it
                uint8_t *st = smem + s * STAGE;
                if (lt == 0) {
                    mbar_arrive_expect_tx(&full[s], x_bytes);
                    bulk_copy(st, xa + int64_t(kt) * AB, x_bytes, &full[s]);
                }
                if (decode) decode_raw<FP4>(P, J, raw_ring + (kt % RAW) * RAW_BYTES, st + AB, kt, n0, lt);
                // The stores were generic-proxy writes; the wgmmas read through the async proxy.
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                mbar_arrive(&full[s]);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int wg = tid >> 7;
    // Accumulator 64h + 4j + e of a thread: row 16 * warp + lane / 4 (+ 8 for e >= 2) of the half's
    // 64 rows, column 8j + 2 (lane % 4) + (e & 1) of the half's 128 columns.
    const int mw = ((tid >> 5) & 3) * 16 + (lane >> 2);
    if constexpr (SHORT) {
        float acc[64], p0[64], p1[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        const bool live = wg * 64 < J.rows && P.probe != 1;  // uniform in the warpgroup
        for (int kt = 0; kt < KT; kt += 2) {
            mma_stage<STAGES, STAGE, AB>(smem, full, empty, kt, live, wg, lane, acc, p0, p1);
            if (kt + 1 < KT) mma_stage<STAGES, STAGE, AB>(smem, full, empty, kt + 1, live, wg, lane, acc, p1, p0);
        }
        if (live) {
            wgmma_wait<0>();
            if ((KT - 1) % 2) add_partial(acc, p1);  // each branch names its array: they stay in registers
            else add_partial(acc, p0);
        }
        const int m = wg * 64 + mw;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int64_t n = n0 + 8 * j + 2 * (lane & 3);
            store_pair(P, J, m, n, acc[4 * j + 0], acc[4 * j + 1]);
            store_pair(P, J, m + 8, n, acc[4 * j + 2], acc[4 * j + 3]);
        }
    } else {
    float acc[128], part[64];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
    for (int kt = 0; kt < KT; kt++) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], uint32_t(kt / STAGES) & 1);
        const uint8_t *st = smem + s * STAGE;
        // Each half of the warpgroup's outputs (IMAGE: 128 of the 256 columns of its 64 rows; groups:
        // 64 of its 128 rows, all 128 columns): the stage's 64 k summed by the tensor cores from
        // zero, then added into acc in fp32.
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r0 = MODE == IMAGE ? wg * 64 : wg * 128 + h * 64;
            if (r0 >= J.rows || P.probe == 1) continue;  // padding rows only (uniform in the warpgroup)
            const uint64_t da = smem_desc(st + r0 * 128);
            const uint64_t db = smem_desc(st + AB + (MODE == IMAGE ? h * 128 * 128 : 0));
            fence_regs(part);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; k++) wgmma_m64n128k16_bf16(part, da + 2 * k, db + 2 * k, k);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(part);
#pragma unroll
            for (int i = 0; i < 64; i++) acc[64 * h + i] += part[i];
        }
        if (lane == 0) mbar_arrive(&empty[s]);  // this warp's wgmmas on the stage are complete
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int m = (MODE == IMAGE ? wg * 64 : wg * 128 + h * 64) + mw;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int64_t n = n0 + (MODE == IMAGE ? 128 * h : 0) + 8 * j + 2 * (lane & 3);
            store_pair(P, J, m, n, acc[64 * h + 4 * j + 0], acc[64 * h + 4 * j + 1]);
            store_pair(P, J, m + 8, n, acc[64 * h + 4 * j + 2], acc[64 * h + 4 * j + 3]);
        }
    }
    }
#endif
}

unsigned blocks_for(int64_t threads) { return unsigned((threads + PREP_THREADS - 1) / PREP_THREADS); }

}  // namespace

bool usable(const device_info &dev, bool by_default) {
#if defined(DS41RT_HAVE_SM90A)
    if (by_default) {
        const char *e = std::getenv("DS41RT_GEMM_WGMMA");
        if (e && std::strcmp(e, "0") == 0) return false;
    }
    return dev.cc_major == 9 && dev.cc_minor == 0 && dev.smem_per_block_optin >= SMEM_BYTES;
#else
    (void)dev, (void)by_default;
    return false;
#endif
}

// One group of rows [0, R) needs no tables (graph-capturable): its tiles and jobs are implicit.
static bool single(const gemm_fp8_grouped_args &a) { return a.groups.size() == 1 && a.groups[0].row0 == 0; }

bool fits(const gemm_fp8_grouped_args &a) {
    const auto pow2 = [](int v) { return v > 0 && (v & (v - 1)) == 0; };
    return (a.fp4 || a.bf16_weight || (pow2(a.block_out) && pow2(a.block_in))) && int64_t(a.N) * a.K < (int64_t(1) << 31) &&
           (!(a.exact_x || a.bf16_weight) || single(a));  // one product (the groups' in-kernel decode reads K once)
}

// The environment's switches, read at every call so a benchmark can compare settings in one
// process: DS41RT_GEMM_GROUP_ROWS=128 gives groups the short tiles (x tiles of 128 rows, not 256:
// a decoded weight stage serves fewer rows, the MMA loop overlaps its adds),
// DS41RT_GEMM_IMAGE_COLS=128 gives one product the short tiles (weight tiles of 128 rows, not 256:
// more x reads, the same MMA loop).
int env_int(const char *name) {
    const char *e = std::getenv(name);
    return e && *e ? std::atoi(e) : 0;
}

size_t workspace_bytes(const gemm_fp8_grouped_args &a) {
    if (single(a))  // x's image (its pieces), the weight's, the flag word
        return size_t((round_up(a.groups[0].rows, BM) * (a.exact_x ? 3 : 1) + round_up(a.N, BN)) * round_up(a.K, BK) * 2 + 256);
    return std::max(layout_of(a, tables_of(a, 256), 256).total, layout_of(a, tables_of(a, 128), 128).total);
}

Status run(const gemm_fp8_grouped_args &a, void *workspace, cudaStream_t stream) {
    uint8_t *ws = static_cast<uint8_t *>(workspace);
    params P;
    const int pieces = a.exact_x ? 3 : 1;
    const int64_t kseg = round_up(a.K, BK);
    P.xi = ws, P.kp = kseg * pieces, P.kseg = kseg;
    uint32_t *rest_nonzero = nullptr;
    P.N = a.N, P.K = a.K, P.lbo = __builtin_ctz(unsigned(a.block_out)), P.lbi = __builtin_ctz(unsigned(a.block_in));
    P.scols = (a.K + a.block_in - 1) / a.block_in;
    P.round_bf16 = a.round_bf16;
    static const bool jobs_first = [] {
        const char *e = std::getenv("DS41RT_GEMM_RASTER");
        return e && std::strcmp(e, "jobs") == 0;
    }();
    P.raster_jobs_first = jobs_first;
    P.l2_256 = env_int("DS41RT_GEMM_L2_256") != 0;
    P.probe = env_int("DS41RT_GEMM_PROBE");
    const int tm = single(a) ? BM : env_int("DS41RT_GEMM_GROUP_ROWS") == 128 ? 128 : 256;
    const int tn = !single(a) ? GBN : env_int("DS41RT_GEMM_IMAGE_COLS") == 128 ? 128 : BN;
    int64_t n_tiles = 0, n_jobs = 0;
    const x_tile *tiles = nullptr;
    if (single(a)) {
        const gemm_fp8_group &g = a.groups[0];
        P.jobs = nullptr, P.one = {g.w, g.scale, g.y, 0, int32_t(g.rows)};
        n_tiles = n_jobs = (g.rows + BM - 1) / BM;
        P.implicit_rows = g.rows;
        uint8_t *wi = ws + n_tiles * BM * P.kp * 2;
        const int64_t np = round_up(a.N, BN);
        w_image_kernel<<<blocks_for(np * kseg / 8), PREP_THREADS, 0, stream>>>(g.w, g.scale, a.fp4, a.bf16_weight, a.N, a.K,
                                                                               a.block_out, a.block_in, np, kseg, wi);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        P.wi = wi;
        if (a.exact_x) {  // after both images: 256-byte aligned (their sizes are multiples of 128 x 128)
            rest_nonzero = reinterpret_cast<uint32_t *>(wi + np * kseg * 2);
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(rest_nonzero, 0, sizeof(uint32_t), stream));
            P.rest_nonzero = rest_nonzero;
        }
    } else {
        const tables t = tables_of(a, tm);
        const layout l = layout_of(a, t, tm);
        n_tiles = int64_t(t.tiles.size()), n_jobs = int64_t(t.jobs.size());
        // Pageable copies: staged before the call returns, so the tables may die with it.
        DS41RT_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(ws + l.tiles, t.tiles.data(), t.tiles.size() * sizeof(x_tile), cudaMemcpyHostToDevice, stream));
        DS41RT_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(ws + l.jobs, t.jobs.data(), t.jobs.size() * sizeof(job), cudaMemcpyHostToDevice, stream));
        tiles = reinterpret_cast<const x_tile *>(ws + l.tiles);
        P.jobs = reinterpret_cast<const job *>(ws + l.jobs);
    }
    if (n_jobs == 0) return Status::ok();
    x_image_kernel<<<blocks_for(n_tiles * tm * P.kp / 4), PREP_THREADS, 0, stream>>>(a.x, tiles, P.implicit_rows, n_tiles, tm,
                                                                                     a.K, kseg, pieces, a.act_block / 4, ws,
                                                                                     rest_nonzero);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const auto pick = [&](auto kernel, int smem) { return std::make_pair(kernel, smem); };
    const auto [kernel, smem] =
        single(a)   ? (tn == 128 ? pick(gemm_kernel<IMAGE, BM, 128>, ring<IMAGE, BM, 128>::smem)
                                 : pick(gemm_kernel<IMAGE, BM, BN>, ring<IMAGE, BM, BN>::smem))
        : tm == 128 ? (a.fp4 ? pick(gemm_kernel<FP4_BYTES, 128, GBN>, ring<FP4_BYTES, 128, GBN>::smem)
                             : pick(gemm_kernel<FP8_BYTES, 128, GBN>, ring<FP8_BYTES, 128, GBN>::smem))
                    : (a.fp4 ? pick(gemm_kernel<FP4_BYTES, 256, GBN>, ring<FP4_BYTES, 256, GBN>::smem)
                             : pick(gemm_kernel<FP8_BYTES, 256, GBN>, ring<FP8_BYTES, 256, GBN>::smem));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const unsigned w_tiles = unsigned(round_up(a.N, tn) / tn);
    if (single(a) || P.raster_jobs_first)
        kernel<<<dim3(unsigned(n_jobs), w_tiles), THREADS, smem, stream>>>(P);
    else
        kernel<<<dim3(unsigned(n_jobs) * w_tiles), THREADS, smem, stream>>>(P);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda::gemm_fp8_sm90
