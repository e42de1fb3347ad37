// The routed experts' grouped MXFP4 product of a V4.1 prefill on its own (backend/cuda gemm_fp8's
// grouped path), at the real shapes: 384 experts of w1 and w3 (2304 x 5120) and w2 (5120 x 2304),
// each token's 6 experts drawn uniformly, rows sorted by expert as routed_prefill sorts them.
// Dummy weights (fill_dummy), random x; the results are not checked here (tests/cuda
// gemm_fp8_test.cpp does that on the same kernel).
//
// Usage: ds41rt_cuda_bench OUT_DIR grouped   (writes OUT_DIR/grouped.md; then the dense products
// of the same prefill, one weight each, in both tile widths)
// Each line is one kernel setting (the environment switches gemm_fp8_sm90 reads at every call):
// the tile height (256 or 128 rows of x), the L2 256-byte fetch of the weight's raw copies, and
// the probes that skip the MMAs or the weight's copies and decode (wrong results: what the other
// side alone costs). Time: CUDA events around the whole call (tables, x's pre-pass, the kernel),
// median of 5 after a warm-up. Useful TFLOP/s counts 2 R N K per product, tile TFLOP/s the MMAs
// the kernel issues (live 64-row halves of each tile).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/dummy_fill.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/peaks.cuh"
#include "cuda_test_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;

namespace {

constexpr int E = 384, TOPK = 6, D = 5120, I = 2304;

struct mxfp4 {
    uint8_t *w = nullptr, *scale = nullptr;
};
mxfp4 dummy_mxfp4(int N, int K, uint64_t id) {
    cuda::dummy_tensor_desc d;
    d.format = cuda::dummy_format::MXFP4, d.rows = N, d.cols = K, d.std = 1 / std::sqrt(double(K)), d.id = id;
    auto b = cuda::dummy_bytes(d);
    CHECK_OK(b.status());
    mxfp4 m;
    CHECK_CUDA(cudaMalloc(&m.w, b.value().weight));
    CHECK_CUDA(cudaMalloc(&m.scale, b.value().scale));
    CHECK_OK(cuda::fill_dummy(d, m.w, m.scale, 7, nullptr));
    return m;
}
float *dummy_f32(int64_t n, uint64_t id) {
    cuda::dummy_tensor_desc d;
    d.format = cuda::dummy_format::F32, d.rows = 1, d.cols = n, d.std = 1, d.id = id;
    float *p;
    CHECK_CUDA(cudaMalloc(&p, size_t(n) * 4));
    CHECK_OK(cuda::fill_dummy(d, p, nullptr, 7, nullptr));
    return p;
}

// Rows per expert of T tokens, each routed to TOPK distinct experts drawn uniformly.
std::vector<int64_t> expert_rows(int T, uint64_t seed) {
    std::vector<int64_t> rows(E, 0);
    uint64_t s = seed;
    const auto next = [&s] {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return s;
    };
    for (int t = 0; t < T; t++) {
        int picked[TOPK], n = 0;
        while (n < TOPK) {
            const int e = int(next() % E);
            if (std::find(picked, picked + n, e) == picked + n) picked[n++] = e;
        }
        for (int e : picked) rows[size_t(e)]++;
    }
    return rows;
}

struct setting {
    const char *name, *tile_rows, *l2, *probe;
};

double time_ms(const cuda::device_info &dev, const cuda::gemm_fp8_grouped_args &a, void *ws) {
    const double ms = testing_util::event_median_ms(1, 5, [&] { CHECK_OK(cuda::run_gemm_fp8_grouped(dev, a, ws, nullptr)); });
    if (ms < 0) std::fprintf(stderr, "grouped gemm: a timed run failed\n"), std::exit(1);
    return ms;
}

// MMA rows the kernel multiplies for a group of `rows` in tiles of tm: each tile's live 64-row halves.
int64_t tile_rows(int64_t rows, int tm) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r += tm) n += (std::min<int64_t>(tm, rows - r) + 63) / 64 * 64;
    return n;
}

}  // namespace

int grouped_bench(const cuda::device_info &dev, const std::string &out) {
    auto bf16 = cuda::measure_matmul_tflops(cuda::matmul_kind::BF16);
    auto fp8 = cuda::measure_matmul_tflops(cuda::matmul_kind::FP8_E4M3);
    const double bf16_rate = bf16 ? bf16.value() : 0, fp8_rate = fp8 ? fp8.value() : 0;
    std::vector<mxfp4> w1, w3, w2;
    for (int e = 0; e < E; e++) {
        w1.push_back(dummy_mxfp4(I, D, 3 * uint64_t(e)));
        w3.push_back(dummy_mxfp4(I, D, 3 * uint64_t(e) + 1));
        w2.push_back(dummy_mxfp4(D, I, 3 * uint64_t(e) + 2));
    }
    const std::vector<int> tokens = {1024, 4096, 8192, 16384};
    const int64_t max_rows = int64_t(tokens.back()) * TOPK;
    float *x = dummy_f32(max_rows * D, 1000), *h = dummy_f32(max_rows * I, 1001);
    float *y13, *y2;
    CHECK_CUDA(cudaMalloc(&y13, size_t(max_rows) * I * 2 * 4));
    CHECK_CUDA(cudaMalloc(&y2, size_t(max_rows) * D * 4));
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<setting> settings = {
        {"tiles 256", "256", "0", "0"},           {"tiles 128", "128", "0", "0"},
        {"tiles 256, L2 256B", "256", "1", "0"},  {"tiles 128, L2 256B", "128", "1", "0"},
        {"tiles 256, no MMA", "256", "0", "1"},   {"tiles 256, no decode", "256", "0", "2"},
        {"tiles 128, no MMA", "128", "0", "1"},   {"tiles 128, no decode", "128", "0", "2"},
    };
    FILE *md = std::fopen((out + "/grouped.md").c_str(), "w");
    if (!md) {
        std::fprintf(stderr, "cannot write %s/grouped.md\n", out.c_str());
        return 1;
    }
    std::fprintf(md,
                 "device %s (%d SMs); cuBLASLt 8192^3 BF16 %.0f TFLOP/s, FP8 %.0f TFLOP/s (same run)\n\n"
                 "| tokens | product | setting | ms | useful TFLOP/s | %% of BF16 | %% of FP8 | tile TFLOP/s |\n"
                 "|---|---|---|---|---|---|---|---|\n",
                 dev.name.c_str(), dev.sm_count, bf16_rate, fp8_rate);
    std::printf("BF16 %.0f TFLOP/s, FP8 %.0f TFLOP/s\n", bf16_rate, fp8_rate);
    for (int T : tokens) {
        const std::vector<int64_t> rows = expert_rows(T, 0x9e3779b97f4a7c15ull + uint64_t(T));
        const int64_t R = int64_t(T) * TOPK;
        for (int product = 0; product < 2; product++) {  // w1 + w3, then w2
            cuda::gemm_fp8_grouped_args a;
            a.x = product ? h : x, a.R = R, a.K = product ? I : D, a.N = product ? D : I, a.fp4 = true, a.act_block = 32,
            a.round_bf16 = true;
            int64_t row0 = 0;
            for (int e = 0; e < E; e++) {
                const int64_t n = rows[size_t(e)];
                if (n == 0) continue;
                if (product) {
                    a.groups.push_back({row0, n, w2[size_t(e)].w, w2[size_t(e)].scale, y2 + row0 * D});
                } else {
                    a.groups.push_back({row0, n, w1[size_t(e)].w, w1[size_t(e)].scale, y13 + row0 * I});
                    a.groups.push_back({row0, n, w3[size_t(e)].w, w3[size_t(e)].scale, y13 + (R + row0) * I});
                }
                row0 += n;
            }
            const double flops = 2.0 * double(R) * a.N * a.K * (product ? 1 : 2);
            void *ws;
            CHECK_CUDA(cudaMalloc(&ws, cuda::gemm_fp8_grouped_workspace_bytes(a)));
            for (const setting &s : settings) {
                setenv("DS41RT_GEMM_GROUP_ROWS", s.tile_rows, 1);
                setenv("DS41RT_GEMM_L2_256", s.l2, 1);
                setenv("DS41RT_GEMM_PROBE", s.probe, 1);
                int64_t mma_rows = 0;
                for (const auto &g : a.groups) mma_rows += tile_rows(g.rows, std::atoi(s.tile_rows));
                const double ms = time_ms(dev, a, ws);
                const double tile_flops = 2.0 * double(mma_rows) * a.N * a.K;
                const double useful = flops / (ms * 1e-3) / 1e12;
                std::fprintf(md, "| %d | %s | %s | %.3f | %.1f | %.1f%% | %.1f%% | %.1f |\n", T, product ? "w2" : "w1 + w3", s.name, ms,
                             useful, bf16_rate > 0 ? 100 * useful / bf16_rate : 0.0, fp8_rate > 0 ? 100 * useful / fp8_rate : 0.0,
                             tile_flops / (ms * 1e-3) / 1e12);
                std::printf("%6d %-8s %-22s %8.3f ms %6.1f TFLOP/s useful, %6.1f tile\n", T, product ? "w2" : "w1+w3", s.name, ms,
                            useful, tile_flops / (ms * 1e-3) / 1e12);
                std::fflush(stdout);
            }
            CHECK_CUDA(cudaFree(ws));
        }
    }
    unsetenv("DS41RT_GEMM_GROUP_ROWS"), unsetenv("DS41RT_GEMM_L2_256"), unsetenv("DS41RT_GEMM_PROBE");
    // The dense products of the same prefill (one FP8 weight each, 32 x 32 blocks), in both tile
    // widths (DS41RT_GEMM_IMAGE_COLS).
    struct dense {
        const char *name;
        int N, K;
    };
    for (const dense &p : {dense{"attn.wq_b", 32768, 1280}, dense{"attn.wo_b", 5120, 8192}, dense{"shared w1 + w3", 4608, 5120},
                           dense{"shared w2", 5120, 2304}})
        for (int T : {2048, 8192}) {
            cuda::dummy_tensor_desc d;
            d.format = cuda::dummy_format::FP8_BLOCK, d.rows = p.N, d.cols = p.K, d.block_out = 32, d.block_in = 32;
            d.std = 1 / std::sqrt(double(p.K)), d.id = 2000;
            auto b = cuda::dummy_bytes(d);
            CHECK_OK(b.status());
            uint8_t *w, *sc;
            CHECK_CUDA(cudaMalloc(&w, b.value().weight));
            CHECK_CUDA(cudaMalloc(&sc, b.value().scale));
            CHECK_OK(cuda::fill_dummy(d, w, sc, 7, nullptr));
            cuda::gemm_fp8_grouped_args a;
            a.x = x, a.R = T, a.K = p.K, a.N = p.N, a.act_block = 32, a.round_bf16 = true;
            a.groups.push_back({0, T, w, sc, y2});
            void *ws;
            CHECK_CUDA(cudaMalloc(&ws, cuda::gemm_fp8_grouped_workspace_bytes(a)));
            for (const char *cols : {"256", "128"}) {
                setenv("DS41RT_GEMM_IMAGE_COLS", cols, 1);
                const double ms = time_ms(dev, a, ws), tflops = 2.0 * T * p.N * p.K / (ms * 1e-3) / 1e12;
                std::fprintf(md, "| %d | %s | tiles 128 x %s | %.3f | %.1f | %.1f%% | %.1f%% | %.1f |\n", T, p.name, cols, ms, tflops,
                             bf16_rate > 0 ? 100 * tflops / bf16_rate : 0.0, fp8_rate > 0 ? 100 * tflops / fp8_rate : 0.0, tflops);
                std::printf("%6d %-14s tiles 128 x %-4s %8.3f ms %6.1f TFLOP/s\n", T, p.name, cols, ms, tflops);
                std::fflush(stdout);
            }
            unsetenv("DS41RT_GEMM_IMAGE_COLS");
            CHECK_CUDA(cudaFree(ws));
            CHECK_CUDA(cudaFree(w));
            CHECK_CUDA(cudaFree(sc));
        }
    std::fclose(md);
    return 0;
}
