#include "engine/cuda/device_model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "backend/cuda/bf16_gemv.cuh"
#include "backend/cuda/collapse_norm.cuh"
#include "backend/cuda/cuda_status.h"
#include "backend/cuda/dense.cuh"
#include "backend/cuda/dummy_fill.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/fake_quant.cuh"
#include "backend/cuda/gemm_fp8.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/mhc.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/stream_drain.h"
#include "backend/cuda/swiglu.cuh"
#include "engine/cuda/temp_arena.h"

namespace ds41rt::engine::gpu {

namespace cuda = backend::cuda;

namespace {

constexpr int64_t GEMV_MAX_ROWS = 16;  // the decode GEMV's rows per launch
// Tile counters kept zero at the start of the GEMV workspace: 16384 16-row tiles (a launch of
// 24 V4.1 expert matrices has 3456, wq_b 2048).
constexpr size_t GEMV_COUNTERS_RESERVE = 64 * 1024;

// Prefill products on the tensor cores (run_linears) unless DS41RT_PREFILL_GEMM=0, which keeps
// the 16-row GEMV pieces (for comparing the two).
bool prefill_gemm_default() {
    const char *e = std::getenv("DS41RT_PREFILL_GEMM");
    return !(e && std::string(e) == "0");
}

// Prefill chunks of at most this many rows take the 16-row GEMV pieces instead of the GEMM for FP8
// weights whose GEMM would fill under half the SMs (takes_gemm); DS41RT_PREFILL_GEMV_MAX_M=16 keeps
// the GEMM for every product, for comparing.
int64_t prefill_gemv_max_m() {
    const char *e = std::getenv("DS41RT_PREFILL_GEMV_MAX_M");
    return e && *e ? std::atoll(e) : 128;
}

// Wide plain-BF16 products at decode sizes (the head; N >= BF16_GEMV_MIN_N) run on the tensor
// cores (backend/cuda bf16_gemv) from DS41RT_BF16_GEMV_MIN_M rows on (default 4; 17 keeps
// dense_linear, for comparing). Below 4 rows dense_linear streams the head faster (H200, V4.1's
// head: 324 against 420 us at M 1, 419 against 422 at M 4, 1692 against 542 at M 16;
// docs/perf/2026-12-02-s16-run45-bf16-head.log), so a row's logits differ in their last bits between a
// step of fewer than 4 rows and one of more. Narrow products (router, compressor and indexer
// projections) stay on dense_linear's narrow kernel.
constexpr int64_t BF16_GEMV_MIN_N = 4096;
int64_t bf16_gemv_min_m() {
    const char *e = std::getenv("DS41RT_BF16_GEMV_MIN_M");
    return e && *e ? std::atoll(e) : 4;
}

// Freed memory the device's default pool keeps across synchronisations, for the stream-ordered
// temporaries (dtemp). The pool's default, 0, hands all of it back at every synchronisation; a
// prefill layer synchronises once (its routes come to the host), so each layer's temporaries (GBs
// at 8192 tokens) were mapped afresh. DS41RT_POOL_KEEP_MB overrides the 8 GiB kept.
uint64_t pool_keep_bytes() {
    const char *e = std::getenv("DS41RT_POOL_KEEP_MB");
    return (e && *e ? uint64_t(std::strtoull(e, nullptr, 10)) : uint64_t(8192)) << 20;
}

// The device current and the model's stream on it, its pool told what to keep.
Status start_device(int device, cudaStream_t *stream) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaMemPool_t pool = nullptr;
    DS41RT_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = pool_keep_bytes();
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
    return Status::ok();
}

// A catalog name's role in its layer: "layers.3.attn.wq_a.weight" -> "attn.wq_a". Numbered
// parts go ("ffn.experts.7.w1" -> "ffn.experts.w1"), and with them the word a layer's or a
// drafter stage's number follows ("layers.3.", "mtp.0."), so the layers' products add up under
// one label.
std::string role_of(const std::string &name) {
    std::vector<std::string> parts;
    size_t a = 0;
    for (size_t b; (b = name.find('.', a)) != std::string::npos; a = b + 1) parts.push_back(name.substr(a, b - a));
    parts.push_back(name.substr(a));
    if (parts.size() > 1 && parts.back() == "weight") parts.pop_back();
    const auto numeric = [](const std::string &p) {
        return !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    std::string r;
    for (size_t i = 0; i < parts.size(); i++) {
        if (numeric(parts[i]) || (i == 0 && parts.size() > 1 && numeric(parts[1]))) continue;
        r += (r.empty() ? "" : ".") + parts[i];
    }
    return r;
}

}  // namespace

using backend::cpu::lin;

product_cost cost_of(const dlinear &L, int64_t M) {
    const double nk = double(L.N) * double(L.K);
    double w = nk * (L.wd_bf16 ? 2 : 4);
    if (L.k == dlinear::kind::FP8) w = nk + double((L.N + L.bo - 1) / L.bo) * double((L.K + L.bi - 1) / L.bi);
    if (L.k == dlinear::kind::MXFP4) w = nk / 2 + nk / 32;
    return {w + double(M) * (L.K + L.N) * sizeof(float), 2.0 * double(M) * nk};
}

dtemp::dtemp(size_t bytes, cudaStream_t s) : bytes_(bytes), s_(s) {
    if ((p_ = arena_alloc(bytes))) return;
    // A failed allocation leaves p_ null; the kernel launches that use it then fail loudly.
    if (cudaMallocAsync(&p_, std::max<size_t>(bytes, 16), s) == cudaSuccess) pooled_ = true;
    else p_ = nullptr;
}

dtemp::~dtemp() {
    // A destructor cannot report; clear the error so the next launch check does not inherit it.
    if (p_ && pooled_ && cudaFreeAsync(p_, s_) != cudaSuccess) (void)cudaGetLastError();
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
    m->cfg_ = w->config();
    m->w_ = std::move(w);
    m->dev_ = dev.value();
    m->official_ = official;
    m->prefill_gemm_ = prefill_gemm_default();
    m->prefill_gemv_max_m_ = prefill_gemv_max_m();
    DS41RT_RETURN_IF_ERROR(start_device(m->dev_.device, &m->stream_));
    return m;
}

Result<std::unique_ptr<device_model>> device_model::make_dummy(model::model_config c, model::dummy_plan plan,
                                                               uint64_t seed, bool official) {
    auto dev = cuda::query_device(0);
    if (!dev) return dev.status();
    std::unique_ptr<device_model> m(new device_model());
    m->cfg_ = std::move(c);
    for (size_t i = 0; i < plan.tensors.size(); i++) m->by_name_[plan.tensors[i].entry.name] = i;
    m->plan_ = std::make_shared<const model::dummy_plan>(std::move(plan));
    m->seed_ = seed;
    m->dev_ = dev.value();
    m->official_ = official;
    m->prefill_gemm_ = prefill_gemm_default();
    m->prefill_gemv_max_m_ = prefill_gemv_max_m();
    DS41RT_RETURN_IF_ERROR(start_device(m->dev_.device, &m->stream_));
    return m;
}

device_model::~device_model() {
    if (stream_) cudaStreamSynchronize(stream_);
    if (sync_ev_) cudaEventDestroy(sync_ev_);
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


namespace {

// The plan's entry as the filler's descriptor (model/dummy_weights.h spells out the mapping).
backend::cpu::dummy_tensor_desc desc_of(const model::dummy_tensor &t) {
    using backend::cpu::dummy_dist;
    using backend::cpu::dummy_format;
    backend::cpu::dummy_tensor_desc d;
    d.name = t.entry.name.c_str();
    switch (t.entry.format) {
    case model::storage_format::FP8_BLOCK:
    case model::storage_format::ENGRAM_TABLE: d.format = dummy_format::FP8_BLOCK; break;
    case model::storage_format::MXFP4: d.format = dummy_format::MXFP4; break;
    case model::storage_format::NVFP4: d.format = dummy_format::NVFP4; break;
    case model::storage_format::EXL3: d.format = dummy_format::EXL3; break;
    case model::storage_format::F32: d.format = dummy_format::F32; break;
    case model::storage_format::I64: d.format = dummy_format::I64; break;
    default: d.format = dummy_format::BF16; break;
    }
    const shape_t &sh = t.entry.shape;
    d.rows = sh.size() >= 2 ? sh[0] : 1;
    d.cols = sh.empty() ? 1 : sh.back();
    d.block_out = t.block_out;
    d.block_in = t.block_in;
    switch (t.rule.init) {
    case model::dummy_init::NORMAL: d.dist = dummy_dist::NORMAL; d.std = t.rule.std; break;
    case model::dummy_init::CONSTANT: d.dist = dummy_dist::CONSTANT; d.mean = t.rule.value; break;
    case model::dummy_init::EXPERT_IDS: d.dist = dummy_dist::INDEX; d.index_range = t.rule.id_range; break;
    }
    d.id = t.id;
    if (t.input_amax > 0) d.input_amax = t.input_amax;
    if (t.exl3_bits > 0) d.exl3_bits = t.exl3_bits;
    d.exl3_code_rms = t.exl3_code_rms;
    return d;
}

}  // namespace

Result<const model::dummy_tensor *> device_model::dummy(const std::string &name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return Status::not_found(name + ": not in the dummy-weight plan");
    return &plan_->tensors[it->second];
}

Status device_model::fill(const model::dummy_tensor &t, int64_t rows, void **w, void **scale, int as_format) {
    backend::cpu::dummy_tensor_desc d = desc_of(t);
    if (as_format >= 0) d.format = backend::cpu::dummy_format(as_format);
    if (rows >= 0 && rows < d.rows) d.nrows = rows;
    auto b = backend::cpu::dummy_bytes(d);
    if (!b) return b.status();
    auto pw = alloc(b->weight);
    if (!pw) return pw.status();
    *w = pw.value();
    void *ps = nullptr;
    if (b->scale > 0) {
        auto r = alloc(b->scale);
        if (!r) return r.status();
        ps = r.value();
    }
    if (scale) *scale = ps;
    DS41RT_RETURN_IF_ERROR(cuda::fill_dummy(d, *w, ps, seed_, stream_));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::ok();
}

Result<device_model::nvfp4_dev> device_model::nvfp4(const std::string &name) {
    nvfp4_dev d;
    if (!w_) {  // dummy weights: codes and E4M3 scales filled as published, the scalars from the encoding
        auto t = dummy(name);
        if (!t) return t.status();
        if (t.value()->entry.format != model::storage_format::NVFP4)
            return Status::invalid_argument(name + ": stored as " + model::storage_format_name(t.value()->entry.format) +
                                            ", not NVFP4");
        auto enc = backend::cpu::dummy_encoding_for(desc_of(*t.value()));
        if (!enc) return enc.status();
        void *w = nullptr, *scale = nullptr;
        DS41RT_RETURN_IF_ERROR(fill(*t.value(), -1, &w, &scale));
        d.codes = static_cast<const uint8_t *>(w);
        d.scales = static_cast<const uint8_t *>(scale);
        d.weight_scale_2 = enc->weight_scale_2;
        d.input_scale = enc->input_scale;
        return d;
    }
    auto l = w_->nvfp4(name);
    if (!l) return l.status();
    auto c = upload(l->codes, size_t(l->out * l->in / 2));
    if (!c) return c.status();
    auto sc = upload(l->scales, size_t(l->out * l->in / 16));
    if (!sc) return sc.status();
    d.codes = static_cast<const uint8_t *>(c.value());
    d.scales = static_cast<const uint8_t *>(sc.value());
    d.weight_scale_2 = l->weight_scale_2;
    d.input_scale = l->input_scale;
    return d;
}

Result<device_model::exl3_dev> device_model::exl3(const std::string &name) {
    exl3_dev d;
    if (!w_) {  // dummy weights: trellis, then suh and svh in one scale buffer (backend/cpu/dummy_values.h)
        auto t = dummy(name);
        if (!t) return t.status();
        const model::dummy_tensor &x = *t.value();
        if (x.entry.format != model::storage_format::EXL3)
            return Status::invalid_argument(name + ": stored as " + model::storage_format_name(x.entry.format) +
                                            ", not EXL3");
        void *w = nullptr, *sv = nullptr;
        DS41RT_RETURN_IF_ERROR(fill(x, -1, &w, &sv));
        d.out = x.entry.shape[0];
        d.in = x.entry.shape[1];
        d.k = x.exl3_bits;
        d.cb = cfg_.exl3_cb;
        d.trellis = static_cast<const uint16_t *>(w);
        d.suh = static_cast<const uint16_t *>(sv);
        d.svh = d.suh + d.in;
        return d;
    }
    auto l = w_->exl3(name);
    if (!l) return l.status();
    auto tr = upload(l->trellis, size_t(l->in * l->out / 8 * l->k));
    if (!tr) return tr.status();
    auto su = upload(l->suh, size_t(l->in) * 2);
    if (!su) return su.status();
    auto sv = upload(l->svh, size_t(l->out) * 2);
    if (!sv) return sv.status();
    d.in = l->in;
    d.out = l->out;
    d.k = l->k;
    d.cb = l->cb;
    d.trellis = static_cast<const uint16_t *>(tr.value());
    d.suh = static_cast<const uint16_t *>(su.value());
    d.svh = static_cast<const uint16_t *>(sv.value());
    return d;
}

Result<model::storage_format> device_model::format(const std::string &name) const {
    if (w_) return w_->format(name);
    auto t = dummy(name);
    if (!t) return t.status();
    return t.value()->entry.format;
}

Result<shape_t> device_model::shape(const std::string &name) const {
    if (w_) {
        const model::catalog_entry *e = w_->entry(name);
        if (!e) return Status::not_found(name + ": not in the catalog");
        return e->shape;
    }
    auto t = dummy(name);
    if (!t) return t.status();
    return t.value()->entry.shape;
}

Result<Tensor> device_model::host_f32(const std::string &name) const {
    if (w_) return w_->f32(name);
    auto t = dummy(name);
    if (!t) return t.status();
    backend::cpu::dummy_tensor_desc d = desc_of(*t.value());
    Tensor out = Tensor::f32(t.value()->entry.shape);
    if (d.format == backend::cpu::dummy_format::I64) {  // V4's tid2eid: ids as fp32, as model::weights::f32 gives
        std::vector<int64_t> ids(static_cast<size_t>(out.numel()));
        DS41RT_RETURN_IF_ERROR(backend::cpu::fill_dummy_host(d, ids.data(), nullptr, seed_));
        for (size_t i = 0; i < ids.size(); i++) out.f()[i] = float(ids[i]);
        return out;
    }
    d.format = backend::cpu::dummy_format::F32;
    DS41RT_RETURN_IF_ERROR(backend::cpu::fill_dummy_host(d, out.raw_mut(), nullptr, seed_));
    return out;
}

Status device_model::engram_table(const std::string &name, int64_t max_rows, const uint8_t **w, const uint8_t **scale,
                                  int64_t *rows) {
    auto fmt = format(name);
    if (!fmt) return fmt.status();
    if (fmt.value() != model::storage_format::ENGRAM_TABLE)
        return Status::not_supported(name + ": the GPU gathers Engram rows from FP8 tables");
    auto sh = shape(name);
    if (!sh) return sh.status();
    if (w_) {
        auto tw = bytes(name);
        if (!tw) return tw.status();
        auto ts = bytes(name.substr(0, name.size() - std::string("weight").size()) + "scale");
        if (!ts) return ts.status();
        *w = tw.value();
        *scale = ts.value();
        *rows = sh.value()[0];
        return Status::ok();
    }
    auto t = dummy(name);
    if (!t) return t.status();
    *rows = std::min<int64_t>(sh.value()[0], max_rows);
    void *pw = nullptr, *ps = nullptr;
    DS41RT_RETURN_IF_ERROR(fill(*t.value(), *rows, &pw, &ps));
    *w = static_cast<const uint8_t *>(pw);
    *scale = static_cast<const uint8_t *>(ps);
    return Status::ok();
}

Result<const uint8_t *> device_model::bytes(const std::string &name) {
    auto t = w_->raw(name);
    if (!t) return t.status();
    auto p = upload(t->raw(), t->nbytes());
    if (!p) return p.status();
    return static_cast<const uint8_t *>(p.value());
}

Result<dlinear> device_model::linear(const std::string &name) {
    auto fmt = format(name);
    if (!fmt) return fmt.status();
    auto sh = shape(name);
    if (!sh) return sh.status();
    if (sh->size() != 2) return Status::invalid_argument(name + ": not a matrix in the catalog");
    dlinear L;
    L.N = int(sh.value()[0]);
    L.K = int(sh.value()[1]);
    L.role = roles_.insert(role_of(name)).first->c_str();
    if (!w_) {  // dummy weights: filled in the stored format
        auto t = dummy(name);
        if (!t) return t.status();
        switch (fmt.value()) {  // before filling: a refused format allocates nothing
        case model::storage_format::FP8_BLOCK: L.k = dlinear::kind::FP8; break;
        case model::storage_format::MXFP4: L.k = dlinear::kind::MXFP4; break;
        case model::storage_format::BF16: L.k = dlinear::kind::DENSE; L.wd_bf16 = true; break;
        case model::storage_format::F32: L.k = dlinear::kind::DENSE; break;
        default:
            return Status::not_supported(name + ": stored as " + model::storage_format_name(fmt.value()) +
                                         ", which has no GPU linear (NVFP4 / EXL3 experts: device_model::nvfp4 / exl3)");
        }
        void *w = nullptr, *scale = nullptr;
        DS41RT_RETURN_IF_ERROR(fill(*t.value(), -1, &w, &scale));
        L.bo = cfg_.fp8_block_out;
        L.bi = cfg_.fp8_block_in;
        if (L.k == dlinear::kind::DENSE) L.wd = w;
        else {
            L.w = static_cast<const uint8_t *>(w);
            L.scale = static_cast<const uint8_t *>(scale);
        }
        if (L.k != dlinear::kind::DENSE && L.K % 32 != 0)
            return Status::not_supported(name + ": the GPU GEMV needs K a multiple of 32");
        return L;
    }
    const std::string scale = name.substr(0, name.size() - std::string("weight").size()) + "scale";
    switch (fmt.value()) {
    case model::storage_format::FP8_BLOCK:
    case model::storage_format::MXFP4: {
        L.k = fmt.value() == model::storage_format::FP8_BLOCK ? dlinear::kind::FP8 : dlinear::kind::MXFP4;
        L.bo = cfg_.fp8_block_out;
        L.bi = cfg_.fp8_block_in;
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
    if (!w_) {
        auto t = dummy(name);
        if (!t) return t.status();
        void *w = nullptr;
        DS41RT_RETURN_IF_ERROR(fill(*t.value(), -1, &w, nullptr, int(backend::cpu::dummy_format::F32)));
        return static_cast<const float *>(w);
    }
    auto t = w_->f32(name);
    if (!t) return t.status();
    auto p = upload(t->raw(), t->nbytes());
    if (!p) return p.status();
    return static_cast<const float *>(p.value());
}

Result<const uint16_t *> device_model::bf16_table(const std::string &name) {
    if (!w_) {
        auto t = dummy(name);
        if (!t) return t.status();
        void *w = nullptr;
        DS41RT_RETURN_IF_ERROR(fill(*t.value(), -1, &w, nullptr, int(backend::cpu::dummy_format::BF16)));
        return static_cast<const uint16_t *>(w);
    }
    auto t = w_->raw(name);
    if (!t) return t.status();
    if (t->type() != dtype::BF16) return Status::not_supported(name + ": the GPU embedding gather reads BF16 tables");
    auto p = upload(t->raw(), t->nbytes());
    if (!p) return p.status();
    return static_cast<const uint16_t *>(p.value());
}

Status device_model::sync() const {
    if (!watch_.waiting) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        return Status::ok();
    }
    if (!sync_ev_) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&sync_ev_, cudaEventDisableTiming));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(sync_ev_, stream_));
    for (uint64_t spin = 0;; spin++) {
        const cudaError_t e = cudaEventQuery(sync_ev_);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return backend::cuda::cuda_status(e, "stream sync", __FILE__, __LINE__);
        // The watch aborted what the stream waited on: its kernels end.
        if (Status st = watch_.waiting(); !st) return drain_after(st);
        if (spin > 20000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return watch_.drained ? watch_.drained() : Status::ok();
}

Status device_model::drain_after(const Status &st) const {
    if (!sync_ev_ && cudaEventCreateWithFlags(&sync_ev_, cudaEventDisableTiming) != cudaSuccess) return st;
    if (!cuda::drain_stream(stream_, sync_ev_, 5000))
        return Status(st.code(), st.message() + " (the stream did not drain within 5 s)");
    return st;
}

Status device_model::to_host(void *host, const void *dev, size_t bytes) const {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    return sync();
}

Status device_model::to_device(void *dev, const void *host, size_t bytes) const {
    // From pageable memory the runtime stages the bytes before returning (CUDA API sync
    // behaviour), so the host buffer may die right after, and the stream is not drained.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    return Status::ok();
}

Result<dtemp> device_model::upload_temp(const void *host, size_t bytes) const {
    dtemp t = temp(bytes);
    DS41RT_RETURN_IF_ERROR(to_device(t.as<void>(), host, bytes));
    return t;
}

std::vector<float> device_model::download_f32(const float *dev, int64_t n, Status *s) const {
    std::vector<float> h(static_cast<size_t>(n));
    if (n > 0) *s = to_host(h.data(), dev, size_t(n) * sizeof(float));
    return h;
}

// A growing row buffer's next capacity for `need` rows: doubling, at least 16.
static int64_t grown_cap(int64_t cap, int64_t need) { return std::max({cap * 2, need, int64_t(16)}); }

// Room for n more rows of r (capacity doubles; the old rows are copied on the stream).
Status device_model::reserve(dev_rows &r, int64_t n) const {
    if (r.rows + n > r.cap) {
        const int64_t cap = grown_cap(r.cap, r.rows + n);
        dtemp nb = temp_f32(cap * r.width);
        if (r.rows > 0)
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(nb.f(), r.buf.f(), size_t(r.rows * r.width) * sizeof(float),
                                                        cudaMemcpyDeviceToDevice, stream_));
        r.buf = std::move(nb);
        r.cap = cap;
    }
    return Status::ok();
}

Status device_model::append(dev_rows &r, const float *src, int64_t n) const {
    if (n <= 0) return Status::ok();
    DS41RT_RETURN_IF_ERROR(reserve(r, n));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.buf.f() + r.rows * r.width, src, size_t(n * r.width) * sizeof(float),
                                                cudaMemcpyDeviceToDevice, stream_));
    r.rows += n;
    return Status::ok();
}

Status device_model::append_rows(const std::vector<row_append> &jobs) const {
    std::vector<cuda::float_copy> copies;
    copies.reserve(jobs.size());
    for (const row_append &j : jobs) {
        if (j.n <= 0) continue;
        for (const cuda::float_copy &c : copies)
            if (c.dst >= j.r->buf.f() && c.dst < j.r->buf.f() + j.r->cap * j.r->width)
                return Status::internal("append_rows: two appends to one buffer");
        DS41RT_RETURN_IF_ERROR(reserve(*j.r, j.n));
        copies.push_back({j.src, j.r->buf.f() + j.r->rows * j.r->width, j.n * j.r->width});
        j.r->rows += j.n;
    }
    return cuda::copy_floats(copies.data(), int(copies.size()), stream_);
}

hc_mix_dev device_model::hc_mix_buffers(int64_t S) const {
    const int64_t hc = cfg_.hc_mult;
    return {temp_f32(S * hc), temp_f32(S * hc), temp_f32(S * hc * hc), temp_f32(S * (2 + hc) * hc)};
}

Status device_model::hc_mixes(const float *X, int64_t S, const float *fn, const float *scale, const float *base,
                              const hc_mix_dev &out) const {
    const int hc = cfg_.hc_mult;
    const int64_t n_mix = int64_t(2 + hc) * hc;
    DS41RT_RETURN_IF_ERROR(
        cuda::hc_project(X, S, int64_t(hc) * cfg_.dim, fn, n_mix, cfg_.norm_eps, official_, out.mm.f(), stream_));
    return cuda::hc_split_sinkhorn(out.mm.f(), S, hc, scale, base, cfg_.hc_eps, cfg_.hc_sinkhorn_iters, out.pre.f(),
                                   out.post.f(), out.comb.f(), stream_);
}

cuda::gemv_split device_model::split_into(uint8_t *xs, float *sx, int64_t S, int64_t width) const {
    const int ab = cfg_.fp8_block_in;
    if (xs && sx && official_ && S <= GEMV_MAX_ROWS && (ab == 32 || ab == 128) && width % ab == 0) return {xs, sx};
    return {};
}

Result<cuda::gemv_split> device_model::hc_collapse_norm(const float *X, const float *pre, int64_t S, const float *w,
                                                       float *x, uint8_t *xs, float *sx) const {
    const int64_t D = cfg_.dim;
    const int hc = cfg_.hc_mult, ab = cfg_.fp8_block_in;
    if (!cuda::collapse_norm_fits(hc, D)) {
        DS41RT_RETURN_IF_ERROR(cuda::hc_collapse(X, pre, S, hc, D, official_, x, stream_));
        DS41RT_RETURN_IF_ERROR(cuda::rms_norm_rows(x, w, x, S, D, cfg_.norm_eps, official_, stream_));
        return cuda::gemv_split{};
    }
    const cuda::gemv_split sp = split_into(xs, sx, S, D);
    DS41RT_RETURN_IF_ERROR(
        cuda::hc_collapse_norm(X, pre, S, hc, D, official_, w, cfg_.norm_eps, x, sp.xs ? &sp : nullptr, ab, stream_));
    return sp;
}

cuda::gemv_split device_model::norm_split_of(uint8_t *xs, float *sx, int64_t S, int64_t dim) const {
    return cuda::collapse_norm_fits(1, dim) ? split_into(xs, sx, S, dim) : cuda::gemv_split{};
}

Result<cuda::gemv_split> device_model::rms_norm_split(float *x, const float *w, int64_t S, int64_t dim, uint8_t *xs,
                                                     float *sx) const {
    const int ab = cfg_.fp8_block_in;
    if (!cuda::collapse_norm_fits(1, dim)) {
        DS41RT_RETURN_IF_ERROR(cuda::rms_norm_rows(x, w, x, S, dim, cfg_.norm_eps, official_, stream_));
        return cuda::gemv_split{};
    }
    const cuda::gemv_split sp = norm_split_of(xs, sx, S, dim);
    DS41RT_RETURN_IF_ERROR(
        cuda::rms_norm_split(x, w, x, S, dim, official_, cfg_.norm_eps, sp.xs ? &sp : nullptr, ab, stream_));
    return sp;
}

Status device_model::swiglu_w2(const dlinear &w2, float *g, const float *u, int64_t S, int64_t I, float limit,
                               float *y) const {
    dtemp xs, sx;  // stream-ordered: freed after the GEMV queued below
    if (S <= GEMV_MAX_ROWS) xs = temp(size_t(S * I)), sx = temp_f32((I / 32) * 16);
    const cuda::gemv_split sp = split_into(xs.as<uint8_t>(), sx.f(), S, I);
    DS41RT_RETURN_IF_ERROR(
        cuda::swiglu_rows(g, u, nullptr, g, S, I, limit, official_, stream_, sp.xs ? &sp : nullptr, cfg_.fp8_block_in));
    return run_linears({{&w2, g, y, sp}}, S, backend::cpu::lin::FP8);
}

Status device_model::grouped_output(const dlinear &wo_a, const dlinear &wo_b, const float *o, int64_t S,
                                    int64_t heads_width, int64_t G, int64_t R, float *out) const {
    const int64_t gin = heads_width / G;
    dtemp z = temp_f32(S * G * R);
    std::vector<dlinear> wa(static_cast<size_t>(G));
    std::vector<linear_job> jobs;
    for (int64_t g = 0; g < G; g++) wa[size_t(g)] = wo_a.rows(int(g * R), int(R));
    // A single row's groups are contiguous slices of o and z; the GEMV (FP8 / MXFP4 wo_a at decode
    // sizes) reads more rows' group columns and writes them in place (its row strides); otherwise
    // the rows are gathered into per-group blocks first and scattered back after.
    const bool strided = wo_a.k != dlinear::kind::DENSE && S <= GEMV_MAX_ROWS;
    if (S == 1 || strided) {
        for (int64_t g = 0; g < G; g++)
            jobs.push_back({&wa[size_t(g)], o + g * gin, z.f() + g * R, {}, S > 1 ? heads_width : 0, S > 1 ? G * R : 0});
        DS41RT_RETURN_IF_ERROR(run_linears(jobs, S, lin::BF16));
    } else {
        dtemp og = temp_f32(G * S * gin), zg = temp_f32(G * S * R);
        for (int64_t g = 0; g < G; g++) {
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(og.f() + g * S * gin, size_t(gin) * 4, o + g * gin,
                                                          size_t(heads_width) * 4, size_t(gin) * 4, size_t(S),
                                                          cudaMemcpyDeviceToDevice, stream_));
            jobs.push_back({&wa[size_t(g)], og.f() + g * S * gin, zg.f() + g * S * R});
        }
        DS41RT_RETURN_IF_ERROR(run_linears(jobs, S, lin::BF16));
        for (int64_t g = 0; g < G; g++)
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(z.f() + g * R, size_t(G * R) * 4, zg.f() + g * S * R,
                                                          size_t(R) * 4, size_t(R) * 4, size_t(S),
                                                          cudaMemcpyDeviceToDevice, stream_));
    }
    return run_linear(wo_b, z.f(), out, S, lin::FP8);
}

Status device_model::to_host_pair(void *h1, const void *d1, size_t b1, void *h2, const void *d2, size_t b2) const {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h1, d1, b1, cudaMemcpyDeviceToHost, stream_));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h2, d2, b2, cudaMemcpyDeviceToHost, stream_));
    return sync();
}

Result<dtemp> device_model::head_rows(const dlinear &head, const float *x, int64_t S, const std::vector<int32_t> *rows) const {
    const int64_t R = rows ? int64_t(rows->size()) : S, D = head.K;
    const float *xh = x;
    dtemp xr;
    if (rows && R > 0) {
        auto idx = upload_temp(rows->data(), rows->size() * sizeof(int32_t));
        if (!idx) return idx.status();
        xr = temp_f32(R * D);
        DS41RT_RETURN_IF_ERROR(cuda::gather_rows(x, idx->as<int32_t>(), R, D, xr.f(), stream_));
        xh = xr.f();
    }
    dtemp lg = temp_f32(R * head.N);
    if (R > 0) DS41RT_RETURN_IF_ERROR(run_linear(head, xh, lg.f(), R, lin::F32));
    return lg;
}

Status device_model::run_linear(const dlinear &L, const float *x, float *y, int64_t M, lin cls) const {
    return run_linears({{&L, x, y}}, M, cls);
}

cuda::gemv_matrix device_model::gemv_piece(const linear_job &j, int64_t m0, int64_t M, bool quant_x, lin cls) const {
    const dlinear &L = *j.L;
    const float *x = j.x;
    float *y = j.y;
    cuda::gemv_matrix g;
    g.w = L.w;
    g.scale = L.scale;
    g.fp4 = L.k == dlinear::kind::MXFP4;
    g.block_out = L.bo;
    g.block_in = L.bi;
    g.N = L.N;
    g.K = L.K;
    g.x = x + m0 * (j.ldx ? j.ldx : L.K);
    g.act_block = quant_x ? cfg_.fp8_block_in : 0;
    g.y = y + m0 * (j.ldy ? j.ldy : L.N);
    g.ldx = int(j.ldx), g.ldy = int(j.ldy);
    g.M = int(std::min<int64_t>(GEMV_MAX_ROWS, M - m0));
    g.round_bf16_out = official_ && cls != lin::F32;  // fused: no separate round launch
    if (quant_x && j.split.xs && m0 == 0 && M <= GEMV_MAX_ROWS) g.split = j.split;
    return g;
}

Status device_model::run_gemv_pieces(const std::vector<cuda::gemv_matrix> &pieces) const {
    // 24 matrices a launch (the kernel's parameter space).
    constexpr size_t MATS = 24;
    for (size_t j0 = 0; j0 < pieces.size(); j0 += MATS) {
        const std::vector<cuda::gemv_matrix> mats(pieces.begin() + j0, pieces.begin() + std::min(pieces.size(), j0 + MATS));
        cuda::gemv_tuning tuning = cuda::gemv_default_tuning();
        tuning.counters_reserve = GEMV_COUNTERS_RESERVE;
        auto plan = cuda::plan_gemv(dev_, mats, tuning);
        if (!plan) return plan.status();
        if (gemv_ws_.bytes() < plan->workspace_bytes) {
            // Graphs captured earlier hold the old workspace: growing it while capturing would
            // hand a graph-owned block to later eager steps, so a capture refuses instead
            // (the caller runs a step eagerly first, which sizes it).
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_, &cs));
            if (cs != cudaStreamCaptureStatusNone)
                return Status::internal("GEMV workspace must grow while a graph is being captured");
            gemv_ws_ = temp(plan->workspace_bytes * 2);
            ws_gen_++;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(gemv_ws_.as<void>(), 0, GEMV_COUNTERS_RESERVE, stream_));
        }
        // The counters' region stays zero between plans (gemv_tuning::counters_reserve); only a
        // plan with more counters than it holds is zeroed first (a memset node fewer per GEMV).
        if (plan->counters_bytes > GEMV_COUNTERS_RESERVE)
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(gemv_ws_.as<void>(), 0, plan->counters_bytes, stream_));
        DS41RT_RETURN_IF_ERROR(cuda::run_gemv(plan.value(), gemv_ws_.as<void>(), stream_));
    }
    return Status::ok();
}

Status device_model::run_grouped(const std::vector<grouped_job> &jobs, lin cls) const {
    const bool quant_x = official_ && (cls == lin::FP8 || cls == lin::FP4);
    std::vector<cuda::gemv_matrix> pieces;
    for (const grouped_job &j : jobs) {
        if (j.L->k == dlinear::kind::DENSE) return Status::internal("run_grouped: a dense weight (GEMV classes only)");
        for (int64_t m0 = 0; m0 < j.M; m0 += GEMV_MAX_ROWS) pieces.push_back(gemv_piece({j.L, j.x, j.y}, m0, j.M, quant_x, cls));
    }
    return run_gemv_pieces(pieces);
}

// A GEMM of few tiles (gemm_fp8_sm90's 128 x 256: a short prompt chunk through a narrow FP8 weight,
// as `serve --prefill-chunk 128`) leaves most SMs idle after writing the weight's whole BF16 image,
// where the GEMV pieces read the weight once per 16 rows at decode speed: H100, session 22, at
// M 128 wo_a's eight 4-tile GEMMs took 600 us a layer, its GEMV at M 1 24 us for all eight; the
// shared w1 + w3, wq_a + wkv and wo_b GEMMs (2-16 tiles) likewise lost to 8 GEMV pieces or tied.
bool device_model::takes_gemm(const dlinear &L, int64_t M) const {
    if (M <= GEMV_MAX_ROWS || !official_ || !prefill_gemm_) return false;
    if (L.k == dlinear::kind::DENSE) return L.wd_bf16;
    if (L.k != dlinear::kind::FP8) return false;
    const int64_t tiles = (M + 127) / 128 * ((L.N + 255) / 256);
    return M > prefill_gemv_max_m_ || 2 * tiles >= dev_.sm_count;
}

// The product timer's label of a run_linears call: its weights' roles, their storage and the
// kernel family the call's first weight takes, the rows.
std::string device_model::product_label(const std::vector<linear_job> &jobs, int64_t M) const {
    std::vector<std::string> seen;  // a grouped projection's groups share one role
    std::string roles;
    for (const linear_job &j : jobs)
        if (std::find(seen.begin(), seen.end(), j.L->role) == seen.end()) {
            seen.push_back(j.L->role);
            roles += (roles.empty() ? "" : " + ") + std::string(*j.L->role ? j.L->role : "?");
        }
    const dlinear &L = *jobs.front().L;
    const bool gemm = takes_gemm(L, M);
    const char *store = L.k == dlinear::kind::FP8 ? "fp8" : L.k == dlinear::kind::MXFP4 ? "mxfp4" : L.wd_bf16 ? "bf16" : "f32";
    const char *family = gemm ? "gemm" : L.k == dlinear::kind::DENSE ? "dense" : "gemv";
    return roles + " [" + store + " " + family + ", M " + std::to_string(M) + "]";
}

Status device_model::run_linears(const std::vector<linear_job> &jobs, int64_t M, lin cls) const {
    std::optional<section_scope> timed;
    if (section_timer *t = product_timer(); t && !jobs.empty()) {
        product_cost c;
        for (const linear_job &j : jobs) c += cost_of(*j.L, M);
        timed.emplace(*t, product_label(jobs, M), stream_, c.bytes, c.flops);
    }
    const bool quant_x = official_ && (cls == lin::FP8 || cls == lin::FP4);
    const int act_block = cfg_.fp8_block_in;
    std::vector<const linear_job *> gemv_jobs, dense_jobs;
    // A dense job's product on the BF16 tensor cores (wide plain-BF16 weights at decode sizes).
    static const int64_t bf16_min_m = bf16_gemv_min_m();
    auto to_bf16_gemv = [&](const linear_job &jj) {
        const dlinear &D = *jj.L;
        const bool a16 = ((reinterpret_cast<uintptr_t>(jj.x) | reinterpret_cast<uintptr_t>(D.wd)) & 15u) == 0;
        return !quant_x && D.wd_bf16 && M >= bf16_min_m && M <= cuda::BF16_GEMV_MAX_M && D.N >= BF16_GEMV_MIN_N &&
               D.K % 32 == 0 && a16;
    };
    for (size_t ji = 0; ji < jobs.size(); ji++) {
        const linear_job &j = jobs[ji];
        const dlinear &L = *j.L;
        if ((j.ldx || j.ldy) && (M > GEMV_MAX_ROWS || L.k == dlinear::kind::DENSE))
            return Status::internal("run_linears: row strides are for GEMV-sized FP8 / MXFP4 products only");
        const bool exact_x = official_ && cls == lin::BF16;  // x unquantized: on sm_90a only
        // Plain BF16 weights of the BF16 and F32 classes (x unquantized either way; F32 keeps fp32 outputs).
        const bool bf16_dense = L.k == dlinear::kind::DENSE && L.wd_bf16 && official_ && (cls == lin::BF16 || cls == lin::F32);
        if ((bf16_dense || (L.k == dlinear::kind::FP8 && (quant_x || exact_x))) && takes_gemm(L, M)) {
            // Prefill-shaped official products on the tensor cores: the weight read once for all
            // rows, not once per 16-row GEMV piece. Another summation order than the GEMV's or
            // dense_linear's (rows of a prefill and of a decode step may differ in the last fp32
            // bit before the bf16 rounding), the same numerics class; the BF16 class (wo_a) and
            // the plain BF16 weights (compressors, indexer projections, the router) take x
            // exactly, as three BF16 pieces. Not MXFP4 here (routed_prefill groups the experts).
            cuda::gemm_fp8_args a;
            a.x = j.x, a.M = int(M), a.K = L.K, a.act_block = act_block;
            a.exact_x = exact_x || bf16_dense, a.round_bf16 = cls != lin::F32;
            a.N = L.N, a.y = j.y;
            if (bf16_dense) {
                a.w = static_cast<const uint8_t *>(L.wd), a.bf16_weight = true;
            } else {
                a.w = L.w, a.scale = L.scale, a.block_out = L.bo, a.block_in = L.bi;
            }
            dtemp ws = temp(cuda::gemm_fp8_workspace_bytes(a));
            const Status st = cuda::run_gemm_fp8(dev_, a, ws.as<void>(), stream_);
            if (st.is_ok()) continue;
            // A shape or alignment outside the GEMM's contract (refused before any launch): the
            // GEMV pieces or dense_linear below serve it.
            if (st.code() != status_code::NOT_SUPPORTED && st.code() != status_code::INVALID_ARGUMENT) return st;
        }
        if (L.k != dlinear::kind::DENSE) {
            gemv_jobs.push_back(&j);
            continue;
        }
        if (to_bf16_gemv(j)) {
            dtemp ws = temp(cuda::bf16_gemv_workspace_bytes(int(M), L.K));
            DS41RT_RETURN_IF_ERROR(
                cuda::bf16_gemv(j.x, static_cast<const uint16_t *>(L.wd), j.y, int(M), L.N, L.K, ws.as<void>(), stream_));
            dense_jobs.push_back(&j);  // OFFICIAL's BF16 rounding below, as dense_linear's outputs
            continue;
        }
        const float *xin = j.x;
        dtemp xq;
        if (quant_x) {  // weights stored plain, numerics of a quantized class: fake-quantize x
            xq = temp_f32(M * L.K);
            DS41RT_CUDA_RETURN_IF_ERROR(
                cudaMemcpyAsync(xq.f(), j.x, size_t(M) * L.K * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
            DS41RT_RETURN_IF_ERROR(cuda::fake_quant_fp8_ue8m0(xq.f(), M, L.K, act_block, stream_));
            xin = xq.f();
        }
        // The next job a second product of the same x and weight type that would come here too
        // (the compressor's kv and gate): one launch for both (dense_linear_pair, the same bits).
        if (ji + 1 < jobs.size() && !quant_x && M <= GEMV_MAX_ROWS) {
            const linear_job &k = jobs[ji + 1];
            const dlinear &L2 = *k.L;
            if (L2.k == dlinear::kind::DENSE && k.x == j.x && !k.ldx && !k.ldy && L2.K == L.K && L2.wd_bf16 == L.wd_bf16 &&
                !to_bf16_gemv(k)) {
                DS41RT_RETURN_IF_ERROR(
                    cuda::dense_linear_pair(j.x, L.wd, j.y, L.N, L2.wd, k.y, L2.N, L.wd_bf16, M, L.K, stream_));
                dense_jobs.push_back(&j);
                dense_jobs.push_back(&k);
                ji++;
                continue;
            }
        }
        DS41RT_RETURN_IF_ERROR(cuda::dense_linear(xin, L.wd, L.wd_bf16, j.y, M, L.N, L.K, stream_));
        dense_jobs.push_back(&j);
    }
    // The GEMV takes 16 rows a matrix; longer inputs (prefill chunks) go in pieces.
    std::vector<cuda::gemv_matrix> pieces;
    for (int64_t m0 = 0; m0 < M; m0 += GEMV_MAX_ROWS)
        for (const linear_job *j : gemv_jobs) pieces.push_back(gemv_piece(*j, m0, M, quant_x, cls));
    DS41RT_RETURN_IF_ERROR(run_gemv_pieces(pieces));
    // The GEMV and the GEMM rounded their outputs themselves; only dense_linear's need the pass.
    if (official_ && cls != lin::F32)
        for (const linear_job *j : dense_jobs) DS41RT_RETURN_IF_ERROR(cuda::round_bf16_inplace(j->y, M * j->L->N, stream_));
    return Status::ok();
}

}  // namespace ds41rt::engine::gpu
