#include "dist/cuda/gpu_experts.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <tuple>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/dummy_fill.cuh"
#include "backend/cuda/exl3_moe.cuh"
#include "backend/cuda/exl3_routed.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_routed.cuh"

namespace ds41rt::dist {

namespace cuda = backend::cuda;

struct gpu_experts::impl {
    cuda::device_info dev;
    cudaStream_t stream = nullptr;
    std::vector<void *> blocks;
    std::map<int, cuda::moe_layer> layers;
    // EXL3 layers run backend/cuda exl3_moe from host routes (no moe_layer form).
    struct exl3_layer {
        int64_t D = 0;
        float swiglu_limit = 0;
        std::vector<cuda::exl3_expert_dev> experts;
    };
    std::map<int, exl3_layer> exl3_layers;
    // Per-request device buffers, grown on demand.
    void *x = nullptr, *out = nullptr, *buf = nullptr, *ws = nullptr;
    size_t x_bytes = 0, out_bytes = 0, buf_bytes = 0, ws_bytes = 0;
    // run_routed: plans by (layer, rows, K, act_block, weight_after_w2), each uploading the
    // layer's expert table once; workspaces by the rest (the layers' slices share shapes, so
    // their plans share a layout), zeroed once when made.
    struct routed_ws {
        void *mem = nullptr;
        const cuda::moe_routed_plan *plan = nullptr;
    };
    std::map<std::tuple<int, int, int, int, bool>, cuda::moe_routed_plan> rplans;
    std::map<std::tuple<int, int, int, bool>, routed_ws> rws;
    // The same for EXL3 layers (backend/cuda exl3_routed): a runner (plans and their workspace)
    // per (K, act_block, weight_after_w2).
    std::map<std::tuple<int, int, bool>, cuda::exl3_routed_runner> xrun;
    cudaEvent_t in_ev = nullptr, out_ev = nullptr;

    Status grow(void **p, size_t *have, size_t need) {
        if (need <= *have) return Status::ok();
        cudaFree(*p);
        *p = nullptr;
        *have = 0;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(p, need));
        *have = need;
        return Status::ok();
    }
};

Result<std::unique_ptr<gpu_experts>> gpu_experts::make(int device) {
    auto dev = cuda::query_device(device);
    if (!dev) return dev.status();
    std::unique_ptr<gpu_experts> g(new gpu_experts());
    g->p_ = std::make_unique<impl>();
    g->p_->dev = dev.value();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&g->p_->stream, cudaStreamNonBlocking));
    return g;
}

gpu_experts::~gpu_experts() {
    if (!p_) return;
    if (p_->stream) cudaStreamSynchronize(p_->stream);
    for (void *b : p_->blocks) cudaFree(b);
    for (void *b : {p_->x, p_->out, p_->buf, p_->ws}) cudaFree(b);
    for (auto &[k, w] : p_->rws) cudaFree(w.mem);
    if (p_->in_ev) cudaEventDestroy(p_->in_ev);
    if (p_->out_ev) cudaEventDestroy(p_->out_ev);
    if (p_->stream) cudaStreamDestroy(p_->stream);
}

Result<const uint8_t *> gpu_experts::upload(const void *host, size_t bytes) {
    void *p = nullptr;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    p_->blocks.push_back(p);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    bytes_ += bytes;
    return static_cast<const uint8_t *>(p);
}

template <class Slice>
Status gpu_experts::upload_slices(const std::array<Slice, 3> &e, const uint8_t *(&dev)[6]) {
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            const std::vector<uint8_t> &h = j == 0 ? e[size_t(i)].codes : e[size_t(i)].scales;
            auto d = upload(h.data(), h.size());
            if (!d) return d.status();
            dev[i * 2 + j] = d.value();
        }
    return Status::ok();
}

Status gpu_experts::add_layer(int layer, int64_t D, float swiglu_limit,
                              std::vector<std::array<model::mxfp4_slice, 3>> experts) {
    cuda::moe_layer L;
    L.D = int(D);
    L.swiglu_limit = swiglu_limit;
    for (auto &e : experts) {
        const uint8_t *dev[6];
        DS41RT_RETURN_IF_ERROR(upload_slices(e, dev));
        L.I = int(e[0].out);
        // moe_expert holds w1, w3, w2 in that order.
        L.experts.push_back({dev[0], dev[1], dev[4], dev[5], dev[2], dev[3]});
    }
    p_->layers[layer] = std::move(L);
    return Status::ok();
}

namespace {

// An NVFP4 expert's three slices ({w1, w2, w3}: their input widths and their two scalars) as the
// GPU's W4A4 decode can take them: w1 and w3 sharing their scalars (the checkpoint's check), every
// input whole 32 channels (the W4A4 GEMV's K).
Status check_nvfp4(const std::string &what, const std::array<int64_t, 3> &in, const std::array<float, 3> &weight_scale_2,
                   const std::array<float, 3> &input_scale) {
    if (weight_scale_2[0] != weight_scale_2[2] || input_scale[0] != input_scale[2])
        return Status::invalid_argument(what + ": NVFP4 w1 and w3 have different weight_scale_2 / input_scale");
    for (int64_t w : in)
        if (w % 32 != 0)
            return Status::invalid_argument(what + ": an NVFP4 slice " + std::to_string(w) +
                                            " channels wide: the GPU's W4A4 GEMV takes whole 32-channel inputs "
                                            "(choose a TP width whose slices are, or a CPU worker)");
    return Status::ok();
}

// dev = {w1 codes, w1 scales, w2 codes, w2 scales, w3 codes, w3 scales} on this GPU.
cuda::moe_nvfp4_expert nvfp4_expert(const uint8_t *const (&dev)[6], const std::array<float, 3> &weight_scale_2,
                                    const std::array<float, 3> &input_scale) {
    cuda::moe_nvfp4_expert x;
    x.w1 = dev[0], x.w1_scale = dev[1], x.w2 = dev[2], x.w2_scale = dev[3], x.w3 = dev[4], x.w3_scale = dev[5];
    x.w13_weight_scale_2 = weight_scale_2[0], x.w13_input_scale = input_scale[0];
    x.w2_weight_scale_2 = weight_scale_2[1], x.w2_input_scale = input_scale[1];
    return x;
}

}  // namespace

Status gpu_experts::add_nvfp4_layer(int layer, int64_t D, float swiglu_limit,
                                    std::vector<std::array<model::nvfp4_slice, 3>> experts) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p_->dev.device));
    cuda::moe_layer L;
    L.D = int(D);
    L.swiglu_limit = swiglu_limit;
    for (size_t id = 0; id < experts.size(); id++) {
        const auto &e = experts[id];
        const std::array<float, 3> ws2 = {e[0].weight_scale_2, e[1].weight_scale_2, e[2].weight_scale_2};
        const std::array<float, 3> is = {e[0].input_scale, e[1].input_scale, e[2].input_scale};
        DS41RT_RETURN_IF_ERROR(
            check_nvfp4("layer " + std::to_string(layer) + " expert " + std::to_string(id), {e[0].in, e[1].in, e[2].in}, ws2, is));
        const uint8_t *dev[6];
        DS41RT_RETURN_IF_ERROR(upload_slices(e, dev));
        L.I = int(e[0].out);
        L.nvfp4_experts.push_back(nvfp4_expert(dev, ws2, is));
    }
    p_->layers[layer] = std::move(L);
    return Status::ok();
}

Status gpu_experts::add_dummy_nvfp4_layer(int layer, int64_t D, float swiglu_limit,
                                          const std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> &windows,
                                          uint64_t seed) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p_->dev.device));
    cuda::moe_layer L;
    L.D = int(D);
    L.swiglu_limit = swiglu_limit;
    for (size_t id = 0; id < windows.size(); id++) {
        const auto &e = windows[id];
        std::array<int64_t, 3> in{};
        std::array<float, 3> ws2{}, is{};
        for (int i = 0; i < 3; i++) {
            const backend::cpu::dummy_tensor_desc &d = e[size_t(i)];
            if (d.format != backend::cpu::dummy_format::NVFP4)
                return Status::invalid_argument(std::string(d.name ? d.name : "a dummy expert") + ": not NVFP4");
            auto enc = backend::cpu::dummy_encoding_for(d);
            if (!enc) return enc.status();
            ws2[size_t(i)] = enc->weight_scale_2, is[size_t(i)] = enc->input_scale;
            in[size_t(i)] = d.ncols < 0 ? d.cols - d.col0 : d.ncols;
        }
        DS41RT_RETURN_IF_ERROR(check_nvfp4("layer " + std::to_string(layer) + " expert " + std::to_string(id), in, ws2, is));
        const uint8_t *dev[6];
        for (int i = 0; i < 3; i++) DS41RT_RETURN_IF_ERROR(fill_window(e[size_t(i)], seed, &dev[i * 2], &dev[i * 2 + 1]));
        L.I = int(e[0].nrows < 0 ? e[0].rows - e[0].row0 : e[0].nrows);
        L.nvfp4_experts.push_back(nvfp4_expert(dev, ws2, is));
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(p_->stream));
    p_->layers[layer] = std::move(L);
    return Status::ok();
}

Status gpu_experts::add_exl3_layer(int layer, int64_t D, float swiglu_limit,
                                   std::vector<std::array<model::exl3_slice, 3>> experts) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p_->dev.device));
    impl::exl3_layer L;
    L.D = D;
    L.swiglu_limit = swiglu_limit;
    for (const auto &e : experts) {
        cuda::exl3_expert_dev x;
        cuda::exl3_linear_dev *dst[] = {&x.w1, &x.w2, &x.w3};
        for (int i = 0; i < 3; i++) {
            const model::exl3_slice &s = e[size_t(i)];
            cuda::exl3_linear_dev &d = *dst[i];
            d.in = s.in, d.out = s.out, d.k = s.k;
            d.cb = cuda::exl3_cb(int(s.cb));  // the same numbering (exllamav3's)
            for (auto [h, out] : {std::pair{&s.trellis, &d.trellis}, std::pair{&s.suh, &d.suh}, std::pair{&s.svh, &d.svh}}) {
                auto p = upload(h->data(), h->size() * sizeof(uint16_t));
                if (!p) return p.status();
                *out = reinterpret_cast<const uint16_t *>(p.value());
            }
        }
        L.experts.push_back(x);
    }
    p_->exl3_layers[layer] = std::move(L);
    return Status::ok();
}

Status gpu_experts::fill_window(const backend::cpu::dummy_tensor_desc &d, uint64_t seed, const uint8_t **w,
                                const uint8_t **scale) {
    auto b = backend::cpu::dummy_bytes(d);
    if (!b) return b.status();
    void *pw = nullptr, *ps = nullptr;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&pw, std::max<uint64_t>(b->weight, 16)));
    p_->blocks.push_back(pw);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&ps, std::max<uint64_t>(b->scale, 16)));
    p_->blocks.push_back(ps);
    DS41RT_RETURN_IF_ERROR(cuda::fill_dummy(d, pw, ps, seed, p_->stream));
    bytes_ += b->weight + b->scale;
    *w = static_cast<const uint8_t *>(pw);
    *scale = static_cast<const uint8_t *>(ps);
    return Status::ok();
}

Status gpu_experts::add_dummy_layer(int layer, int64_t D, int64_t I, float swiglu_limit,
                                    const std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> &windows,
                                    uint64_t seed) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p_->dev.device));
    cuda::moe_layer L;
    L.D = int(D);
    L.I = int(I);
    L.swiglu_limit = swiglu_limit;
    for (const auto &e : windows) {
        const uint8_t *dev[6];
        for (int i = 0; i < 3; i++) DS41RT_RETURN_IF_ERROR(fill_window(e[size_t(i)], seed, &dev[i * 2], &dev[i * 2 + 1]));
        L.experts.push_back({dev[0], dev[1], dev[4], dev[5], dev[2], dev[3]});  // w1, w3, w2
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(p_->stream));
    p_->layers[layer] = std::move(L);
    return Status::ok();
}

Status gpu_experts::add_dummy_exl3_layer(int layer, int64_t D, float swiglu_limit,
                                         const std::vector<std::array<backend::cpu::dummy_tensor_desc, 3>> &windows,
                                         uint64_t seed, model::exl3_codebook cb) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p_->dev.device));
    impl::exl3_layer L;
    L.D = D;
    L.swiglu_limit = swiglu_limit;
    for (const auto &e : windows) {
        cuda::exl3_expert_dev x;
        cuda::exl3_linear_dev *dst[] = {&x.w1, &x.w2, &x.w3};
        for (int i = 0; i < 3; i++) {
            const backend::cpu::dummy_tensor_desc &d = e[size_t(i)];
            if (d.format != backend::cpu::dummy_format::EXL3)
                return Status::invalid_argument(std::string(d.name ? d.name : "a dummy expert") + ": not EXL3");
            const uint8_t *w = nullptr, *sc = nullptr;
            DS41RT_RETURN_IF_ERROR(fill_window(d, seed, &w, &sc));
            // The window's logical [out, in] (rows x cols of the descriptor).
            cuda::exl3_linear_dev &l = *dst[i];
            l.out = d.nrows >= 0 ? d.nrows : d.rows - d.row0;
            l.in = d.ncols >= 0 ? d.ncols : d.cols - d.col0;
            l.k = d.exl3_bits;
            l.cb = cuda::exl3_cb(int(cb));  // the same numbering (exllamav3's)
            l.trellis = reinterpret_cast<const uint16_t *>(w);
            l.suh = reinterpret_cast<const uint16_t *>(sc);
            l.svh = l.suh + l.in;
        }
        L.experts.push_back(x);
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(p_->stream));
    p_->exl3_layers[layer] = std::move(L);
    return Status::ok();
}

bool gpu_experts::has_layer(int layer) const { return p_->layers.count(layer) != 0 || p_->exl3_layers.count(layer) != 0; }

int gpu_experts::device() const { return p_->dev.device; }

Status gpu_experts::run(int layer, const backend::cpu::expert_numerics &nm, const float *hidden, int64_t rows,
                        const backend::cpu::route_table &rt, float *partial) {
    auto it = p_->layers.find(layer);
    auto x3 = p_->exl3_layers.find(layer);
    if (it == p_->layers.end() && x3 == p_->exl3_layers.end())
        return Status::not_found("layer " + std::to_string(layer) + " is not on this GPU");
    const int64_t D = it != p_->layers.end() ? int64_t(it->second.D) : x3->second.D;
    impl &p = *p_;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p.dev.device));
    DS41RT_RETURN_IF_ERROR(p.grow(&p.x, &p.x_bytes, size_t(rows * D) * sizeof(float)));
    DS41RT_RETURN_IF_ERROR(p.grow(&p.out, &p.out_bytes, size_t(rows * D) * sizeof(float)));
    DS41RT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(p.x, hidden, size_t(rows * D) * sizeof(float), cudaMemcpyHostToDevice, p.stream));
    DS41RT_RETURN_IF_ERROR(run_device(layer, nm, static_cast<float *>(p.x), rows, rt, static_cast<float *>(p.out)));
    DS41RT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(partial, p.out, size_t(rows * D) * sizeof(float), cudaMemcpyDeviceToHost, p.stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(p.stream));
    return Status::ok();
}

Status gpu_experts::run_device(int layer, const backend::cpu::expert_numerics &nm, const float *x, int64_t rows,
                               const backend::cpu::route_table &rt, float *out) {
    if (auto x3 = p_->exl3_layers.find(layer); x3 != p_->exl3_layers.end()) {
        impl &p = *p_;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p.dev.device));
        backend::cpu::expert_numerics n = nm;
        n.swiglu_limit = x3->second.swiglu_limit;
        // Stream-ordered scratch, freed once the request's work has run (the call synchronises).
        std::vector<void *> held;
        auto scratch = [&](size_t bytes) -> Result<void *> {
            void *q = nullptr;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&q, std::max<size_t>(bytes, 16), p.stream));
            held.push_back(q);
            return q;
        };
        Status st = cuda::exl3_routed_sum(p.dev, x3->second.experts, n, x, x3->second.D, rt, out, scratch, p.stream);
        for (void *q : held) cudaFreeAsync(q, p.stream);
        DS41RT_RETURN_IF_ERROR(st);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(p.stream));
        return Status::ok();
    }
    auto it = p_->layers.find(layer);
    if (it == p_->layers.end()) return Status::not_found("layer " + std::to_string(layer) + " is not on this GPU");
    cuda::moe_layer L = it->second;
    L.act_block = nm.official ? int(nm.act_block) : 0;
    L.weight_after_w2 = nm.weight_after_w2;
    const int64_t D = L.D;
    impl &p = *p_;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p.dev.device));
    // 16 rows a launch (the decode kernels' limit); a row's routes as the table gives them (the
    // kernels combine them in increasing expert id, as routed_expert_sum does).
    for (int64_t r0 = 0; r0 < rows; r0 += cuda::MOE_MAX_ROWS) {
        const int B = int(std::min<int64_t>(cuda::MOE_MAX_ROWS, rows - r0));
        std::vector<cuda::moe_route> routes;
        int K = -1;
        for (int64_t r = r0; r < r0 + B; r++) {
            const int k = int(rt.offsets[size_t(r) + 1] - rt.offsets[size_t(r)]);
            if (K >= 0 && k != K) return Status::not_supported("rows with different route counts in one request");
            K = k;
            for (uint32_t i = rt.offsets[size_t(r)]; i < rt.offsets[size_t(r) + 1]; i++)
                routes.push_back({rt.routes[i].expert, rt.routes[i].weight});
        }
        const int R = int(routes.size());
        DS41RT_RETURN_IF_ERROR(p.grow(&p.buf, &p.buf_bytes, cuda::moe_buffer_bytes(int(D), L.I, R)));
        const cuda::moe_buffers buf = cuda::moe_buffers_at(p.buf, int(D), L.I, R);
        auto plan = cuda::plan_moe_decode(p.dev, L, buf, x + r0 * D, out + r0 * D, routes, B, K);
        if (!plan) return plan.status();
        DS41RT_RETURN_IF_ERROR(p.grow(&p.ws, &p.ws_bytes, plan->workspace_bytes));
        DS41RT_RETURN_IF_ERROR(cuda::reset_moe_workspace(plan.value(), p.ws, p.stream));
        DS41RT_RETURN_IF_ERROR(cuda::run_moe_decode(plan.value(), p.ws, p.stream));
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(p.stream));
    return Status::ok();
}

Status gpu_experts::run_routed(int layer, const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids,
                               const float *weights, int64_t rows, int k, float *out, int32_t *status_word,
                               int32_t fail_value, cudaStream_t stream) {
    auto it = p_->layers.find(layer);
    auto x3 = p_->exl3_layers.find(layer);
    if (it == p_->layers.end() && x3 == p_->exl3_layers.end())
        return Status::not_found("layer " + std::to_string(layer) + " is not on this GPU");
    impl &p = *p_;
    const int act_block = nm.official ? int(nm.act_block) : 0;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(p.dev.device));
    if (!p.in_ev) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&p.in_ev, cudaEventDisableTiming));
    if (!p.out_ev) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&p.out_ev, cudaEventDisableTiming));
    // The arithmetic runs on this object's stream, so the workspaces are used in one order
    // whatever link asks; the caller's stream waits for it.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(p.in_ev, stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(p.stream, p.in_ev, 0));
    if (x3 != p_->exl3_layers.end()) {  // EXL3: backend/cuda exl3_routed, a runner per numerics
        const impl::exl3_layer &L = x3->second;
        backend::cpu::expert_numerics n = nm;
        n.swiglu_limit = L.swiglu_limit;
        cuda::exl3_routed_runner &run = p.xrun[std::make_tuple(k, act_block, nm.weight_after_w2)];
        for (int64_t r0 = 0; r0 < rows; r0 += cuda::MOE_MAX_ROWS) {
            const int B = int(std::min<int64_t>(cuda::MOE_MAX_ROWS, rows - r0));
            DS41RT_RETURN_IF_ERROR(run.run(p.dev, layer, L.experts, n, L.D, B, k, x + r0 * L.D, ids + r0 * k,
                                           weights + r0 * k, out + r0 * L.D, p.stream));
            DS41RT_RETURN_IF_ERROR(run.flag_error(status_word, fail_value, p.stream));
        }
    } else {
        cuda::moe_layer L = it->second;
        L.act_block = act_block;
        L.weight_after_w2 = nm.weight_after_w2;
        const int64_t D = L.D;
        for (int64_t r0 = 0; r0 < rows; r0 += cuda::MOE_MAX_ROWS) {
            const int B = int(std::min<int64_t>(cuda::MOE_MAX_ROWS, rows - r0));
            auto key = std::make_tuple(layer, B, k, L.act_block, L.weight_after_w2);
            auto pi = p.rplans.find(key);
            if (pi == p.rplans.end()) {
                auto plan = cuda::plan_moe_routed(p.dev, L, B, k);
                if (!plan) return plan.status();
                pi = p.rplans.emplace(key, std::move(plan.value())).first;
            }
            const cuda::moe_routed_plan &plan = pi->second;
            impl::routed_ws &w = p.rws[std::make_tuple(B, k, L.act_block, L.weight_after_w2)];
            if (!w.mem) {
                DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&w.mem, plan.workspace_bytes));
                DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.mem, 0, plan.workspace_bytes, p.stream));
                w.plan = &plan;
            } else if (w.plan->workspace_bytes != plan.workspace_bytes) {
                return Status::internal("layer " + std::to_string(layer) + ": routed-expert workspace layout differs from "
                                        "another layer's at " + std::to_string(B) + " rows");
            }
            DS41RT_RETURN_IF_ERROR(
                cuda::run_moe_routed(plan, x + r0 * D, ids + r0 * k, weights + r0 * k, out + r0 * D, w.mem, p.stream));
            DS41RT_RETURN_IF_ERROR(cuda::moe_routed_flag_error(plan, w.mem, status_word, fail_value, p.stream));
        }
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(p.out_ev, p.stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, p.out_ev, 0));
    return Status::ok();
}

Status gpu_experts::routed_errors() {
    Status first;
    for (auto &[key, run] : p_->xrun) {
        Status st = run.error(p_->stream);
        if (!st && first) first = st;
    }
    for (auto &[key, w] : p_->rws) {
        if (!w.plan) continue;
        Status st = cuda::moe_routed_error(*w.plan, w.mem, p_->stream);
        if (!st && first) first = st;
    }
    return first;
}

}  // namespace ds41rt::dist
