// Which pipe limits the MXFP4 decode GEMV's weight decode? Per-SM throughput, in warp instructions
// a clock, of the instructions its inner loop is made of (gemv_kernel.cuh kblock_x8, MXFP4):
//  - cvt e4m3x2 -> f16x2 (SASS F2FP.F16.E4M3.UNPACK_B: 12 of ~80 warp instructions a 32-k block);
//  - the integer steps of e2m1x8_to_e4m3 (SHF / LOP3 / PRMT);
//  - both mixed in the GEMV's proportion (9 integer ops to 4 cvt);
//  - mma.sync m16n8k16 f16 (HMMA), for scale.
// Each thread runs 8 independent chains (enough to cover latency at full occupancy); every
// result feeds an XOR that is stored, so nothing is dead code. If cvt runs at a quarter of the
// integer rate, decoding E2M1 straight to fp16 bits with integer ops alone (~15 ops per 8 codes
// against 9 + 4 cvt) is the next step for the routed experts (docs/perf/2026-12-02-session16.md).
// Build and run on the device machine:
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/convert_rate tools/device/convert_rate.cu && /tmp/convert_rate
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

constexpr int THREADS = 256, ITERS = 4096, CHAINS = 8;

__device__ __forceinline__ uint32_t cvt2(uint32_t v) {
    uint32_t r;
    asm volatile("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\t}" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ uint32_t int_step(uint32_t w) {  // e2m1x8_to_e4m3's even half: shifts, masks, a permute
    const uint32_t even = ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);
    return __byte_perm(even, w, 0x5140);
}

// MODE 0: cvt only; 1: integer only; 2: integer and cvt about as the GEMV mixes them; 3: HMMA only.
template <int MODE>
__global__ void __launch_bounds__(THREADS) rate_kernel(uint32_t seed, uint32_t *out) {
    uint32_t v[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; c++) v[c] = seed * (threadIdx.x + 1) + c * 0x9e3779b9u;
    float d[4] = {0, 0, 0, 0};
    for (int i = 0; i < ITERS; i++) {
#pragma unroll
        for (int c = 0; c < CHAINS; c++) {
            if constexpr (MODE == 0) v[c] = cvt2(v[c]);
            if constexpr (MODE == 1) v[c] = int_step(v[c]);
            if constexpr (MODE == 2) v[c] = (c & 1) ? cvt2(cvt2(v[c])) : int_step(v[c]);  // ~5 : 2, the GEMV's 9 : 4
            if constexpr (MODE == 3) {
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(v[c]), "r"(v[c]), "r"(v[c]), "r"(v[c]), "r"(v[c]), "r"(v[c]));
            }
        }
    }
    uint32_t x = __float_as_uint(d[0] + d[1] + d[2] + d[3]);
#pragma unroll
    for (int c = 0; c < CHAINS; c++) x ^= v[c];
    out[blockIdx.x * THREADS + threadIdx.x] = x;
}

// The printed rate counts chain steps: a cvt step is one instruction, an integer step ~5 (SHF /
// IMAD.SHL, LOP3, PRMT: read the SASS), a mixed pair of steps ~5 integer + 2 cvt.
template <int MODE>
double rate(int sms, uint32_t *out, const char *what) {
    const int blocks = sms * (2048 / THREADS);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    rate_kernel<MODE><<<blocks, THREADS>>>(1, out);
    cudaEventRecord(a);
    rate_kernel<MODE><<<blocks, THREADS>>>(2, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    const double steps = double(blocks) * THREADS / 32 * ITERS * CHAINS;  // warp-level chain steps
    const double per_sm_clk = steps / (ms * 1e-3 * khz * 1e3) / sms;
    std::printf("%-34s %8.3f ms  %6.2f warp steps per SM per clock (at the %d MHz boost clock)\n", what, ms, per_sm_clk, khz / 1000);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return per_sm_clk;
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    uint32_t *out = nullptr;
    cudaMalloc(&out, size_t(sms) * 2048 * sizeof(uint32_t));
    rate<0>(sms, out, "cvt.rn.f16x2.e4m3x2");
    rate<1>(sms, out, "e2m1 -> e4m3 integer step");
    rate<2>(sms, out, "mixed (GEMV proportion)");
    rate<3>(sms, out, "mma.sync m16n8k16 f16");
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("%s\n", e == cudaSuccess ? "ok" : cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
