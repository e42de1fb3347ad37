#include "engine/cuda/device_model.h"

#include <algorithm>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/dense.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/gemv.cuh"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;
using backend::cpu::lin;

dtemp::dtemp(size_t bytes, cudaStream_t s) : bytes_(bytes), s_(s) {
    // A failed allocation leaves p_ null; the kernel launches that use it then fail loudly.
    if (cudaMallocAsync(&p_, std::max<size_t>(bytes, 16), s) != cudaSuccess) p_ = nullptr;
}

dtemp::~dtemp() {
    // A destructor cannot report; clear the error so the next launch check does not inherit it.
    if (p_ && cudaFreeAsync(p_, s_) != cudaSuccess) (void)cudaGetLastError();
}

dlinear dlinear::rows(int r0, int n) const {
    dlinear r = *this;
    r.N = n;
    switch (k) {
    case kind::FP8:
        r.w = w + size_t(r0) * size_t(K);
        r.scale = scale + size_t(r0 / bo) * size_t((K + bi - 1) / bi);
        break;
    case kind::MXFP4:
        r.w = w + size_t(r0) * size_t(K / 2);
        r.scale = scale + size_t(r0) * size_t(K / 32);
        break;
    case kind::DENSE:
        r.wd = static_cast<const uint8_t *>(wd) + size_t(r0) * size_t(K) * (wd_bf16 ? 2 : 4);
        break;
    }
    return r;
}

Result<std::unique_ptr<device_model>> device_model::make(std::shared_ptr<const model::weights> w, bool official) {
    auto dev = cuda::query_device(0);
    if (!dev) return dev.status();
    std::unique_ptr<device_model> m(new device_model());
    m->w_ = std::move(w);
    m->dev_ = dev.value();
    m->official_ = official;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(m->dev_.device));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking));
    return m;
}

device_model::~device_model() {
    if (stream_) cudaStreamSynchronize(stream_);
    gemv_ws_ = dtemp();
    for (void *p : blocks_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
}

Result<void *> device_model::alloc(size_t bytes) {
    void *p = nullptr;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    blocks_.push_back(p);
    resident_ += bytes;
    return p;
}

Result<void *> device_model::upload(const void *host, size_t bytes) {
    auto p = alloc(bytes);
    if (!p) return p.status();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(p.value(), host, bytes, cudaMemcpyHostToDevice));
    return p;
}

Result<const uint8_t *> device_model::bytes(const std::string &name) {
    auto t = w_->raw(name);
    if (!t) return t.status();
    auto p = upload(t->raw(), t->nbytes());
    if (!p) return p.status();
    return static_cast<const uint8_t *>(p.value());
}

Result<dlinear> device_model::linear(const std::string &name) {
    auto fmt = w_->format(name);
    if (!fmt) return fmt.status();
    const model::catalog_entry *e = w_->entry(name);
    if (!e || e->shape.size() != 2) return Status::invalid_argument(name + ": not a matrix in the catalog");
    dlinear L;
    L.N = int(e->shape[0]);
    L.K = int(e->shape[1]);
    const std::string scale = name.substr(0, name.size() - std::string("weight").size()) + "scale";
    switch (fmt.value()) {
    case model::storage_format::FP8_BLOCK:
    case model::storage_format::MXFP4: {
        L.k = fmt.value() == model::storage_format::FP8_BLOCK ? dlinear::kind::FP8 : dlinear::kind::MXFP4;
        L.bo = config().fp8_block_out;
        L.bi = config().fp8_block_in;
        if (L.K % 32 != 0) {
            // The GEMV reads whole 32-wide k blocks; a matrix that has none (tiny test models only,
            // e.g. a grouped wo_a over 40-wide heads) goes to dense_linear dequantized instead.
            auto t = w_->f32(name);
            if (!t) return t.status();
            auto p = upload(t->raw(), t->nbytes());
            if (!p) return p.status();
            L.k = dlinear::kind::DENSE;
            L.wd = p.value();
            return L;
        }
        auto w = bytes(name);
        if (!w) return w.status();
        auto s = bytes(scale);
        if (!s) return s.status();
        L.w = w.value();
        L.scale = s.value();
        return L;
    }
    case model::storage_format::BF16:
    case model::storage_format::F32: {
        auto t = w_->raw(name);
        if (!t) return t.status();
        L.k = dlinear::kind::DENSE;
        L.wd_bf16 = t->type() == dtype::BF16;
        if (!L.wd_bf16 && t->type() != dtype::F32)
            return Status::not_supported(name + ": dense weights must be BF16 or F32 for the GPU");
        auto p = upload(t->raw(), t->nbytes());
        if (!p) return p.status();
        L.wd = p.value();
        return L;
    }
    default:
        return Status::not_supported(name + ": this storage format has no GPU kernel yet");
    }
}

Result<const float *> device_model::vec(const std::string &name) {
    auto t = w_->f32(name);
    if (!t) return t.status();
    auto p = upload(t->raw(), t->nbytes());
    if (!p) return p.status();
    return static_cast<const float *>(p.value());
}

Result<const uint16_t *> device_model::bf16_table(const std::string &name) {
    auto t = w_->raw(name);
    if (!t) return t.status();
    if (t->type() != dtype::BF16) return Status::not_supported(name + ": the GPU embedding gather reads BF16 tables");
    auto p = upload(t->raw(), t->nbytes());
    if (!p) return p.status();
    return static_cast<const uint16_t *>(p.value());
}

Status device_model::to_host(void *host, const void *dev, size_t bytes) const {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::ok();
}

Status device_model::to_device(void *dev, const void *host, size_t bytes) const {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    // The host buffer may die right after: wait for the copy (pageable memory is staged anyway).
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::ok();
}

Status device_model::run_linear(const dlinear &L, const float *x, float *y, int64_t M, lin cls) const {
    const bool quant_x = official_ && (cls == lin::FP8 || cls == lin::FP4);
    const int act_block = config().fp8_block_in;
    if (L.k == dlinear::kind::DENSE) {
        const float *xin = x;
        dtemp xq;
        if (quant_x) {  // weights stored plain, numerics of a quantized class: fake-quantize x
            xq = temp_f32(M * L.K);
            DS41RT_CUDA_RETURN_IF_ERROR(
                cudaMemcpyAsync(xq.f(), x, size_t(M) * L.K * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
            DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp8_ue8m0(xq.f(), M, L.K, act_block, stream_));
            xin = xq.f();
        }
        DS41RT_RETURN_IF_ERROR(cuda::dense_linear(xin, L.wd, L.wd_bf16, y, M, L.N, L.K, stream_));
    } else {
        // The GEMV takes 16 rows a launch; longer inputs (prefill chunks) go through in pieces.
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
            cuda::gemv_matrix g;
            g.w = L.w;
            g.scale = L.scale;
            g.fp4 = L.k == dlinear::kind::MXFP4;
            g.block_out = L.bo;
            g.block_in = L.bi;
            g.N = L.N;
            g.K = L.K;
            g.x = x + m0 * L.K;
            g.act_block = quant_x ? act_block : 0;
            g.y = y + m0 * L.N;
            g.M = int(std::min<int64_t>(16, M - m0));
            auto plan = cuda::plan_gemv(dev_, {g});
            if (!plan) return plan.status();
            if (gemv_ws_.bytes() < plan->workspace_bytes) gemv_ws_ = temp(plan->workspace_bytes * 2);
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(gemv_ws_.as<void>(), 0, plan->workspace_bytes, stream_));
            DS41RT_RETURN_IF_ERROR(cuda::run_gemv(plan.value(), gemv_ws_.as<void>(), stream_));
        }
    }
    if (official_ && cls != lin::F32) DS41RT_RETURN_IF_ERROR(cuda::round_bf16_inplace(y, M * L.N, stream_));
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
