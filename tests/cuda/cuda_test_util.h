// Helpers shared by the GPU tests and the GPU benchmark: random quantized weights in the
// checkpoint formats and their CPU dequantization (from core/dtype, independent of the kernels),
// and the decode GEMVs' bandwidth harness (copy rate, graph-replay timing, zeroed workspaces).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"

// The benchmarks' checks (ds41rt_cuda_bench has no test framework): a failed CUDA call, or a
// Status that is not ok, ends the process with its message.
#define CHECK_CUDA(call)                                                                 \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));             \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)
#define CHECK_OK(expr)                                                                   \
    do {                                                                                 \
        const ::ds41rt::Status s_ = (expr);                                              \
        if (!s_.is_ok()) {                                                               \
            std::fprintf(stderr, "%s: %s\n", #expr, s_.to_string().c_str());             \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

namespace ds41rt::testing_util {

struct quant_weight {
    std::vector<uint8_t> w, scale;
    std::vector<float> dequant;  // [N, K]
};

// FP8 E4M3 with E8M0 scales on a [block_out, block_in] grid; NaN codes avoided.
inline quant_weight random_fp8_block(int N, int K, int bo, int bi, uint32_t seed) {
    std::mt19937 rng(seed);
    quant_weight q;
    q.w.resize(size_t(N) * K);
    for (auto &b : q.w) {
        do b = uint8_t(rng());
        while ((b & 0x7f) == 0x7f);
    }
    const int sr = (N + bo - 1) / bo, sc = (K + bi - 1) / bi;
    q.scale.resize(size_t(sr) * sc);
    for (auto &s : q.scale) s = uint8_t(118 + rng() % 12);  // 2^-9 .. 2^2
    q.dequant.resize(size_t(N) * K);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            q.dequant[size_t(n) * K + k] = e4m3_to_f32(q.w[size_t(n) * K + k]) * e8m0_to_f32(q.scale[size_t(n / bo) * sc + k / bi]);
    return q;
}

// MXFP4: packed E2M1 (low nibble = even k) with one E8M0 scale per (row, 32 k).
inline quant_weight random_mxfp4(int N, int K, uint32_t seed) {
    std::mt19937 rng(seed);
    quant_weight q;
    q.w.resize(size_t(N) * K / 2);
    for (auto &b : q.w) b = uint8_t(rng());
    q.scale.resize(size_t(N) * K / 32);
    for (auto &s : q.scale) s = uint8_t(118 + rng() % 12);
    q.dequant.resize(size_t(N) * K);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            q.dequant[size_t(n) * K + k] = e2m1_to_f32(e2m1_unpack(q.w.data() + size_t(n) * K / 2, size_t(k))) *
                                           e8m0_to_f32(q.scale[size_t(n) * (K / 32) + k / 32]);
    return q;
}

// NVFP4 as ModelOpt writes it: packed E2M1 (low nibble = even k), one E4M3 scale per (row, 16
// k), two fp32 scalars; dequantized as model::nvfp4_dequantize defines it (e2m1 * fp32(e4m3 *
// ws2), in that order; model/nvfp4.cpp itself needs libfmt, which the static GPU binaries do not
// link).
struct nvfp4_weight {
    int N = 0, K = 0;
    std::vector<uint8_t> codes, scales;
    float ws2 = 0, input_scale = 0;
    std::vector<float> dequant;  // [N, K]
};

// A realistic E4M3 block scale byte: 90% in [2, 448] (codes 0x40 .. 0x7e), the rest anywhere
// below 2 including subnormals and zero; never 0x7f (NaN).
inline uint8_t random_scale(std::mt19937 &rng) {
    if (rng() % 10 != 0) return uint8_t(0x40 + rng() % (0x7e - 0x40 + 1));
    return uint8_t(rng() % 0x40);
}

inline nvfp4_weight random_nvfp4(int N, int K, float ws2, float input_scale, uint32_t seed) {
    std::mt19937 rng(seed);
    nvfp4_weight q;
    q.N = N, q.K = K, q.ws2 = ws2, q.input_scale = input_scale;
    q.codes.resize(size_t(N) * K / 2);
    for (auto &b : q.codes) b = uint8_t(rng());
    q.scales.resize(size_t(N) * K / 16);
    for (auto &s : q.scales) s = random_scale(rng);
    q.dequant.resize(size_t(N) * K);
    ds41rt::parallel_for(N, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; n++)
            for (int b = 0; b < K / 16; b++) {
                const float s = e4m3_to_f32(q.scales[size_t(n) * (K / 16) + b]) * ws2;
                for (int k = b * 16; k < b * 16 + 16; k++)
                    q.dequant[size_t(n) * K + k] = e2m1_to_f32(e2m1_unpack(q.codes.data() + size_t(n) * K / 2, size_t(k))) * s;
            }
    });
    return q;
}

inline std::vector<float> random_normal(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = d(rng);
    return v;
}

// ---- decode-GEMV bandwidth harness -----------------------------------------------------------

// Device memory freed on scope exit (a failed cudaMalloc leaves p null; the test's next CUDA call
// reports it).
struct device_buffer {
    void *p = nullptr;
    explicit device_buffer(size_t n) {
        if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
    }
    ~device_buffer() { cudaFree(p); }
    device_buffer(const device_buffer &) = delete;
    device_buffer &operator=(const device_buffer &) = delete;
    template <typename T> T *as() const { return static_cast<T *>(p); }
};

// The median of `runs` event-timed calls of run() (launches on the legacy stream) after `warmups`
// untimed ones, in milliseconds; negative if a call's completion reported an error.
template <class Run>
double event_median_ms(int warmups, int runs, Run run) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<float> ms;
    bool ok = true;
    for (int i = 0; ok && i < warmups + runs; i++) {
        cudaEventRecord(e0);
        run();
        cudaEventRecord(e1);
        ok = cudaEventSynchronize(e1) == cudaSuccess;
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= warmups) ms.push_back(t);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (!ok) return -1;
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// Device-to-device copy rate in bytes per second, counting bytes read plus bytes written: the
// median of 10 copies of `bytes` (1 GiB) after 2 warm-ups. What the GEMVs' bandwidth is judged
// against.
inline double copy_bandwidth(size_t bytes = size_t(1) << 30) {
    device_buffer a(bytes), b(bytes);
    cudaMemset(a.p, 1, bytes);
    const double ms = event_median_ms(2, 10, [&] { cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice); });
    return 2.0 * double(bytes) / (ms * 1e-3);
}

// `copies` zeroed workspaces of `bytes` (at least 1): one per weight copy of a bandwidth run, so
// the split-K counters of the launches never meet.
inline std::vector<std::unique_ptr<device_buffer>> zeroed_workspaces(int copies, size_t bytes) {
    std::vector<std::unique_ptr<device_buffer>> ws;
    bytes = std::max<size_t>(bytes, 1);
    for (int c = 0; c < copies; c++) {
        ws.push_back(std::make_unique<device_buffer>(bytes));
        cudaMemset(ws.back()->p, 0, bytes);
    }
    return ws;
}

// Milliseconds per launch: `launches` launches, enqueue(stream, c) for c = 0..launches-1 (each on
// its own weight copy, so none finds its weights in L2: decode streams every weight once per
// token), captured in one CUDA graph and replayed `replays` times after 3 warm-ups; the median
// replay over `launches`. Negative if capture, instantiation or a replay failed, or enqueue
// returned false.
template <class Enqueue>
double graph_median_ms(int launches, int replays, Enqueue enqueue) {
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return -1;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (int c = 0; ok && c < launches; c++) ok = enqueue(s, c);
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && ok;
    ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    std::vector<float> ms;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int r = 0; ok && r < replays + 3; r++) {
        cudaEventRecord(e0, s);
        cudaGraphLaunch(exec, s);
        cudaEventRecord(e1, s);
        ok = cudaEventSynchronize(e1) == cudaSuccess;
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (r >= 3) ms.push_back(t / float(launches));
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    if (!ok || ms.empty()) return -1;
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
}

}  // namespace ds41rt::testing_util
