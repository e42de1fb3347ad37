#include "backend/cuda/peaks.cuh"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

Result<double> measure_copy_gbps(size_t bytes, int iters) {
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    auto cleanup = [&] {
        cudaFree(a);
        cudaFree(b);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
    };
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cleanup();
        (void)cudaGetLastError();
        return Status::resource_exhausted("measure_copy_gbps: no room for 2 x " + std::to_string(bytes) + " bytes");
    }
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemset(a, 1, bytes);
    float best = 1e30f;
    for (int i = 0; i <= iters; i++) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0) best = std::min(best, ms);
    }
    const cudaError_t err = cudaGetLastError();
    cleanup();
    DS41RT_CUDA_RETURN_IF_ERROR(err);
    return 2.0 * double(bytes) / (double(best) * 1e-3) / 1e9;
}

namespace {

// The cuBLASLt entry points the measurement uses, from a dlopen()ed library.
struct cublaslt_api {
    void *lib = nullptr;
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
};

Result<cublaslt_api> load_cublaslt() {
    std::vector<std::string> names = {"libcublasLt.so.13", "libcublasLt.so"};
    if (const char *h = std::getenv("CUDA_HOME"); h && *h) names.push_back(std::string(h) + "/lib64/libcublasLt.so.13");
    names.push_back("/usr/local/cuda/lib64/libcublasLt.so.13");
    cublaslt_api a;
    for (const std::string &n : names)
        if ((a.lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    if (!a.lib) return Status::not_found("measure_matmul_tflops: libcublasLt.so.13 not found (LD_LIBRARY_PATH, CUDA_HOME)");
    bool ok = true;
    auto sym = [&](auto &f, const char *name) {
        f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(a.lib, name));
        ok = ok && f;
    };
    sym(a.create, "cublasLtCreate");
    sym(a.destroy, "cublasLtDestroy");
    sym(a.desc_create, "cublasLtMatmulDescCreate");
    sym(a.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(a.desc_set, "cublasLtMatmulDescSetAttribute");
    sym(a.layout_create, "cublasLtMatrixLayoutCreate");
    sym(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(a.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(a.matmul, "cublasLtMatmul");
    if (!ok) return Status::not_found("measure_matmul_tflops: libcublasLt lacks a symbol it needs");
    return a;
}

// Random finite operands from a hash of the index: E4M3 codes (NaN codes moved to their
// neighbours) or BF16 values in (-1, 1).
__global__ void random_operand_kernel(uint8_t *p, int64_t n, bool fp8, uint32_t seed) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    if (fp8) {
        uint8_t c = uint8_t(h);
        if ((c & 0x7f) == 0x7f) c ^= 1;
        p[i] = c;
    } else {
        const float v = float(int32_t(h >> 8) - (1 << 23)) / float(1 << 23);
        reinterpret_cast<uint16_t *>(p)[i] = uint16_t(__float_as_uint(v) >> 16);
    }
}

double value_of(const uint8_t *p, int64_t i, bool fp8) {
    if (!fp8) {
        const uint32_t b = uint32_t(reinterpret_cast<const uint16_t *>(p)[i]) << 16;
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
    const uint8_t c = p[i];
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e ? std::ldexp(1.0 + m / 8.0, e - 7) : std::ldexp(m / 8.0, -6);
    return c & 0x80 ? -v : v;
}

}  // namespace

Result<double> measure_matmul_tflops(matmul_kind kind, int n, int iters) {
    auto api = load_cublaslt();
    if (!api) return api.status();
    const cublaslt_api &L = api.value();
    const bool fp8 = kind == matmul_kind::FP8_E4M3;
    const size_t el = fp8 ? 1 : 2, nn = size_t(n) * size_t(n), ws_bytes = size_t(64) << 20;
    uint8_t *a = nullptr, *b = nullptr, *d = nullptr, *ws = nullptr;
    cublasLtHandle_t h = nullptr;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    auto cleanup = [&] {
        if (pref) L.pref_destroy(pref);
        if (la) L.layout_destroy(la);
        if (lb) L.layout_destroy(lb);
        if (ld) L.layout_destroy(ld);
        if (desc) L.desc_destroy(desc);
        if (h) L.destroy(h);
        cudaFree(a), cudaFree(b), cudaFree(d), cudaFree(ws);
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        (void)cudaGetLastError();
    };
    auto fail = [&](const std::string &what) {
        cleanup();
        return Status::internal("measure_matmul_tflops: " + what);
    };
    if (cudaMalloc(&a, nn * el) != cudaSuccess || cudaMalloc(&b, nn * el) != cudaSuccess ||
        cudaMalloc(&d, nn * 2) != cudaSuccess || cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
        cleanup();
        return Status::resource_exhausted("measure_matmul_tflops: no room for the operands");
    }
    const unsigned blocks = unsigned((nn + 255) / 256);
    random_operand_kernel<<<blocks, 256>>>(a, int64_t(nn), fp8, 1u);
    random_operand_kernel<<<blocks, 256>>>(b, int64_t(nn), fp8, 2u);
    if (cudaGetLastError() != cudaSuccess) return fail("operand fill");
    // Column-major as cuBLASLt counts: D [n x n] = op(A) B with A stored [k x m] and transposed
    // (row i of the product's left operand is A's i-th run of k values), B [k x n]: the "TN" form
    // the FP8 kernels require. D(i, j) = sum_k A[i k + t] B[j k + t].
    const cudaDataType_t t_in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    if (L.create(&h) != CUBLAS_STATUS_SUCCESS || L.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        L.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)) != CUBLAS_STATUS_SUCCESS ||
        L.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)) != CUBLAS_STATUS_SUCCESS ||
        L.layout_create(&la, t_in, uint64_t(n), uint64_t(n), int64_t(n)) != CUBLAS_STATUS_SUCCESS ||
        L.layout_create(&lb, t_in, uint64_t(n), uint64_t(n), int64_t(n)) != CUBLAS_STATUS_SUCCESS ||
        L.layout_create(&ld, CUDA_R_16BF, uint64_t(n), uint64_t(n), int64_t(n)) != CUBLAS_STATUS_SUCCESS ||
        L.pref_create(&pref) != CUBLAS_STATUS_SUCCESS ||
        L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)) != CUBLAS_STATUS_SUCCESS)
        return fail("descriptor setup");
    cublasLtMatmulHeuristicResult_t algo{};
    int found = 0;
    if (L.heuristic(h, desc, la, lb, ld, ld, pref, 1, &algo, &found) != CUBLAS_STATUS_SUCCESS || found == 0)
        return fail(std::string("no cuBLASLt kernel for the ") + (fp8 ? "FP8" : "BF16") + " product");
    const float alpha = 1, beta = 0;
    auto product = [&] {
        return L.matmul(h, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo.algo, ws, ws_bytes, nullptr);
    };
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    for (int i = 0; i < iters + 2; i++) {
        cudaEventRecord(e0);
        if (product() != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmul");
        cudaEventRecord(e1);
        if (cudaEventSynchronize(e1) != cudaSuccess) return fail("cublasLtMatmul's run");
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 2) ms.push_back(t);
    }
    // Two outputs, (0, 0) and (n - 1, n - 1), against the host's dot product of their operands.
    std::vector<uint8_t> ha(size_t(n) * el), hb(size_t(n) * el);
    for (int64_t i : {int64_t(0), int64_t(n) - 1}) {
        uint16_t out = 0;
        if (cudaMemcpy(ha.data(), a + size_t(i) * n * el, ha.size(), cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(hb.data(), b + size_t(i) * n * el, hb.size(), cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(&out, d + (size_t(i) * n + size_t(i)) * 2, 2, cudaMemcpyDeviceToHost) != cudaSuccess)
            return fail("reading the check's operands");
        double ref = 0, mag = 0;
        for (int t = 0; t < n; t++) {
            const double p = value_of(ha.data(), t, fp8) * value_of(hb.data(), t, fp8);
            ref += p, mag += std::fabs(p);
        }
        const double got = value_of(reinterpret_cast<const uint8_t *>(&out), 0, false);
        if (!(std::fabs(got - ref) <= 1e-2 * std::fabs(ref) + 1e-3 * mag))
            return fail("the product's output (" + std::to_string(i) + ", " + std::to_string(i) + ") is " +
                        std::to_string(got) + ", the host's dot product " + std::to_string(ref));
    }
    cleanup();
    std::sort(ms.begin(), ms.end());
    return 2.0 * double(n) * double(n) * double(n) / (double(ms[ms.size() / 2]) * 1e-3) / 1e12;
}

std::string driver_cuda_version() {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) return "unknown";
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace ds41rt::backend::cuda
