// What every GPU forward pass stands on: device memory (owned blocks and stream-ordered
// temporaries), the checkpoint's tensors uploaded in their stored formats, and one linear that
// picks the kernel family from the weight's format and applies the numerics of its class.
//
// Tensors come from a checkpoint (model::weights) or, for `--load-format dummy`, from the
// dummy plan (model/dummy_weights): the same stored formats and shapes, filled on the device
// (backend/cuda/dummy_fill) from (seed, tensor id).
//
// Weights stay as the checkpoint stores them: FP8 blocks and MXFP4 go to the GEMV as bytes with
// their E8M0 scales; BF16 and F32 tensors go to dense_linear as stored; vectors (norms, biases,
// sinks, mHC parameters) are converted to fp32 once, since kernels read them as fp32.
//
// Threads: one host thread drives a device_model and its stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/numerics.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/gemv.cuh"
#include "core/status.h"
#include "engine/cuda/section_timer.h"
#include "model/dummy_weights.h"
#include "model/weights.h"

namespace ds41rt::engine::gpu {

// A stream-ordered device temporary (cudaMallocAsync / cudaFreeAsync on the model's stream): the
// pool recycles the memory, so a forward pass allocates its activations freely.
class dtemp {
public:
    dtemp() = default;
    dtemp(size_t bytes, cudaStream_t s);
    ~dtemp();
    dtemp(dtemp &&o) noexcept { swap(o); }
    dtemp &operator=(dtemp &&o) noexcept {
        swap(o);
        return *this;
    }
    dtemp(const dtemp &) = delete;
    dtemp &operator=(const dtemp &) = delete;
    float *f() const { return static_cast<float *>(p_); }
    template <typename T> T *as() const { return static_cast<T *>(p_); }
    size_t bytes() const { return bytes_; }

private:
    void swap(dtemp &o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        std::swap(s_, o.s_);
        std::swap(pooled_, o.pooled_);
    }
    void *p_ = nullptr;
    size_t bytes_ = 0;
    cudaStream_t s_ = nullptr;
    bool pooled_ = false;  // from the pool (freed here), not from a temp_arena (temp_arena.h)
};

// Rows of a fixed width on the device that grow at the end (compressed entries, index keys, open
// compression groups): capacity doubles, old rows are copied on the stream.
struct dev_rows {
    dtemp buf;
    int64_t rows = 0, cap = 0, width = 0;
    const float *at(int64_t r) const { return buf.f() + r * width; }
};

// The mHC mixes of one site for S tokens: pre, post [S, hc], comb [S, hc, hc], and the
// projection they come from, mm [S, (2 + hc) hc]. mm is a step buffer rather than a temporary
// so that a captured step's side branch (hc_mixes off the main stream) holds no graph memory
// nodes.
struct hc_mix_dev {
    dtemp pre, post, comb, mm;
};

// A linear's weight on the device, in its stored format.
struct dlinear {
    enum class kind { FP8, MXFP4, DENSE } k = kind::DENSE;
    const uint8_t *w = nullptr, *scale = nullptr;  // FP8 / MXFP4 (gemv_matrix layout)
    const void *wd = nullptr;                      // DENSE: bf16 bits or fp32
    bool wd_bf16 = false;
    int N = 0, K = 0, bo = 32, bi = 32;  // FP8 scale grid
    // The weight's role in its layer ("attn.wq_a": the catalog name without its layer prefix and
    // ".weight"), the product timer's label; owned by the device_model that loaded it.
    const char *role = "";

    // Rows [r0, r0 + n) of the output dimension (grouped projections). FP8 needs r0 % bo == 0.
    dlinear rows(int r0, int n) const;
};

// What a product of M rows through L must move and compute at least (the product timer's
// figures): L's stored weight once (codes and scales) plus M fp32 rows in and out; 2 M N K FLOPs.
struct product_cost {
    double bytes = 0, flops = 0;
    product_cost &operator+=(const product_cost &o) {
        bytes += o.bytes, flops += o.flops;
        return *this;
    }
};
product_cost cost_of(const dlinear &L, int64_t M);

class device_model {
public:
    // Uploads nothing yet; tensors come in through the loaders below.
    static Result<std::unique_ptr<device_model>> make(std::shared_ptr<const model::weights> w, bool official);
    // Dummy weights: every loader fills the plan's tensor on the device instead of uploading it.
    static Result<std::unique_ptr<device_model>> make_dummy(model::model_config c, model::dummy_plan plan,
                                                            uint64_t seed, bool official);
    ~device_model();

    const model::model_config &config() const { return cfg_; }
    const backend::cuda::device_info &device() const { return dev_; }
    cudaStream_t stream() const { return stream_; }
    // Sends the launches made through this model to s until set back (engine/cuda side_branch);
    // returns the stream it replaces.
    cudaStream_t set_stream(cudaStream_t s) const {
        const cudaStream_t old = stream_;
        stream_ = s;
        return old;
    }
    bool official() const { return official_; }
    // Times every weight product launched through this model (run_linears and what builds on
    // it) on t while t is on, labelled by role, kernel family and rows (null: none). The routed
    // experts (engine/cuda routed_decode, routed_prefill) time theirs on product_timer() too.
    void set_product_timer(section_timer *t) { products_ = t; }
    section_timer *product_timer() const { return products_ && products_->on() ? products_ : nullptr; }
    // OFFICIAL products of more than 16 rows on backend/cuda gemm_fp8 (DS41RT_PREFILL_GEMM=0: off).
    bool prefill_gemm() const { return prefill_gemm_; }
    // Whether run_linears takes the tensor-core GEMM for M rows through L (official numerics,
    // more than 16 rows, FP8 or plain BF16 weights; not a GEMM of a few tiles over a short chunk).
    bool takes_gemm(const dlinear &L, int64_t M) const;
    bool is_dummy() const { return w_ == nullptr; }

    // ---- loading: the stored tensor of a catalog name on the device ----
    Result<dlinear> linear(const std::string &name);
    Result<const float *> vec(const std::string &name);           // any float dtype -> fp32
    Result<const uint16_t *> bf16_table(const std::string &name);  // BF16 as stored (embedding)
    // An NVFP4 routed-expert linear: codes and E4M3 scales as published (uploaded, or filled for
    // dummy weights), the two per-tensor scalars.
    struct nvfp4_dev {
        const uint8_t *codes = nullptr, *scales = nullptr;
        float weight_scale_2 = 0, input_scale = 0;
    };
    Result<nvfp4_dev> nvfp4(const std::string &name);
    // An EXL3 routed-expert linear (name: the catalog's "....w1.weight"): the trellis tiles
    // [in/16, out/16, 16 K] int16, suh [in] and svh [out] fp16, as stored (uploaded, or filled for
    // dummy weights); the codebook from the config. What backend/cuda/exl3_gemv takes.
    struct exl3_dev {
        int64_t in = 0, out = 0;
        int k = 0;
        model::exl3_codebook cb = model::exl3_codebook::MCG;
        const uint16_t *trellis = nullptr, *suh = nullptr, *svh = nullptr;
    };
    Result<exl3_dev> exl3(const std::string &name);
    Result<model::storage_format> format(const std::string &name) const;
    Result<shape_t> shape(const std::string &name) const;
    Result<Tensor> host_f32(const std::string &name) const;        // small tensors the host reads
    // An Engram table (FP8 rows + E8M0 scales). Dummy weights keep at most max_rows rows (the
    // full tables are ~190 GB for V4.1, beyond any GPU): the caller reduces ids modulo *rows.
    Status engram_table(const std::string &name, int64_t max_rows, const uint8_t **w, const uint8_t **scale,
                        int64_t *rows);
    // Uploads host data into memory the model owns.
    Result<void *> upload(const void *host, size_t bytes);
    size_t resident_bytes() const { return resident_; }

    // ---- running ----
    dtemp temp(size_t bytes) const { return dtemp(bytes, stream_); }
    dtemp temp_f32(int64_t n) const { return dtemp(size_t(n) * sizeof(float), stream_); }
    // y[M, N] = x[M, K] . W^T with the numerics of the weight's class (backend/cpu linear_numerics):
    // OFFICIAL quantizes x to FP8 per fp8_block_in before FP8 / FP4 classes and rounds the output
    // to bf16 for every class but F32. x and y are device arrays.
    Status run_linear(const dlinear &L, const float *x, float *y, int64_t M, backend::cpu::lin cls) const;
    // Several linears of one class over M rows each, their FP8 / MXFP4 products in one GEMV
    // launch per 16 rows (projections that share an input, the groups of a grouped projection);
    // in OFFICIAL numerics, FP8 weights over more than 16 rows (prefill) go to the tensor-core
    // GEMM (backend/cuda gemm_fp8) instead, one launch per weight (DS41RT_PREFILL_GEMM=0: GEMV
    // pieces).
    struct linear_job {
        const dlinear *L;
        const float *x;
        float *y;
        // x already split for an official FP8 / MXFP4 GEMV (hc_collapse_norm): used by decode
        // sizes (M <= 16), which then need no split launch; otherwise ignored.
        backend::cuda::gemv_split split = {};
        // Row strides of x and y in floats (0: K and N), for decode sizes (M <= 16, the GEMV)
        // only: a grouped projection's groups read and write their columns in place.
        int64_t ldx = 0, ldy = 0;
    };
    Status run_linears(const std::vector<linear_job> &jobs, int64_t M, backend::cpu::lin cls) const;
    // FP8 / MXFP4 linears of one class, each over its own M rows (the routed experts of a
    // prefill, each with its rows): the GEMV in 16-row pieces, up to 24 pieces of any of them a
    // launch, so a layer's experts take a few launches, not a few per expert.
    struct grouped_job {
        const dlinear *L;
        const float *x;
        float *y;
        int64_t M;
    };
    Status run_grouped(const std::vector<grouped_job> &jobs, backend::cpu::lin cls) const;
    // What a synchronisation watches besides the stream: work on it that waits on others (a
    // remote layer's NCCL exchange, experts/cuda/nccl_remote). waiting() is polled while the
    // stream is busy, drained() called once it is idle; an error from either ends the
    // synchronisation with that error, after a bounded wait for the stream to drain (the
    // watch's failure path aborts what the stream waits on). Without a watch: a plain sync.
    struct sync_watch {
        std::function<Status()> waiting, drained;
    };
    void set_sync_watch(sync_watch w) { watch_ = std::move(w); }
    Status sync() const;
    // After a failure whose aborts end the stream's waiting kernels: waits up to 5 s for the
    // stream to drain, so the step's buffers are free to reuse; the error st, noted if it did not.
    Status drain_after(const Status &st) const;
    Status to_host(void *host, const void *dev, size_t bytes) const;  // synchronises the stream
    Status to_host_pair(void *h1, const void *d1, size_t b1, void *h2, const void *d2, size_t b2) const;  // one sync
    Status to_device(void *dev, const void *host, size_t bytes) const;  // stream-ordered, no sync
    Result<dtemp> upload_temp(const void *host, size_t bytes) const;    // a temporary holding host's bytes
    std::vector<float> download_f32(const float *dev, int64_t n, Status *s) const;  // synchronises
    // Appends n rows of src (device) to r.
    Status append(dev_rows &r, const float *src, int64_t n) const;
    // Many appends (to distinct dev_rows) in one launch (backend/cuda copy_floats), where one
    // append each costs a copy call: a decode step's row joining every sequence's buffers.
    struct row_append {
        dev_rows *r = nullptr;
        const float *src = nullptr;
        int64_t n = 0;
    };
    Status append_rows(const std::vector<row_append> &jobs) const;
    // One mHC site's mixes from the streams X [S, hc, dim] (engine/mhc.h; OFFICIAL folds the RMS in
    // after the projection, as the reference does), into buffers of hc_mix_buffers(S).
    Status hc_mixes(const float *X, int64_t S, const float *fn, const float *scale, const float *base,
                    const hc_mix_dev &out) const;
    hc_mix_dev hc_mix_buffers(int64_t S) const;
    // A sublayer's input: x [S, dim] = rms_norm(collapse of the streams X by pre) with weights w
    // (OFFICIAL's bf16 points), in one launch where the width allows (backend/cuda
    // hc_collapse_norm); given xs / sx (S <= 16), for OFFICIAL with activation blocks of 32 or
    // 128 also x's GEMV split there. Returns the split made, or none (GEMVs on x then split it).
    Result<backend::cuda::gemv_split> hc_collapse_norm(const float *X, const float *pre, int64_t S, const float *w,
                                                       float *x, uint8_t *xs, float *sx) const;
    // The same for a plain RMSNorm of x [S, dim] in place (the q rows before wq_b).
    Result<backend::cuda::gemv_split> rms_norm_split(float *x, const float *w, int64_t S, int64_t dim, uint8_t *xs,
                                                     float *sx) const;
    // The split rms_norm_split(.., S, dim, xs, sx) makes (none where it makes none), without
    // running it: for a later reader of the same rows while xs / sx still hold it.
    backend::cuda::gemv_split norm_split_of(uint8_t *xs, float *sx, int64_t S, int64_t dim) const;
    // A shared expert's second half: h = swiglu(g, u) in g (S rows, I wide), then y = w2 h. Where
    // OFFICIAL's GEMV takes a split (split_into), the SwiGLU launch leaves it, and w2 needs no
    // split launch of its own.
    Status swiglu_w2(const dlinear &w2, float *g, const float *u, int64_t S, int64_t I, float limit, float *y) const;
    // Bumped whenever the GEMV workspace is reallocated: graphs captured before hold the old one.
    uint64_t workspace_generation() const { return ws_gen_; }
    // The head over the rows whose logits a step returns (rows: their indices in x [S, K]; null:
    // all S): logits [rows, N] on the device. A prompt chunk needs its last row at most, and the
    // head over every prompt row was the largest product of a long prefill.
    Result<dtemp> head_rows(const dlinear &head, const float *x, int64_t S, const std::vector<int32_t> *rows) const;
    // The grouped output projection (engine/output_projection on the device): o [S, heads_width]
    // in G groups, each through its R rows of wo_a (BF16 class), then wo_b (FP8 class) into out
    // [S, dim]. The G group products go in one GEMV launch.
    Status grouped_output(const dlinear &wo_a, const dlinear &wo_b, const float *o, int64_t S, int64_t heads_width,
                          int64_t G, int64_t R, float *out) const;

private:
    Status reserve(dev_rows &r, int64_t n) const;
    device_model() = default;
    Result<void *> alloc(size_t bytes);
    Result<const uint8_t *> bytes(const std::string &name);  // a checkpoint tensor's stored bytes
    Result<const model::dummy_tensor *> dummy(const std::string &name) const;
    // Rows [m0, m0 + 16) of x [M, K] through L as one GEMV matrix, and launches of such pieces.
    backend::cuda::gemv_matrix gemv_piece(const linear_job &j, int64_t m0, int64_t M, bool quant_x,
                                          backend::cpu::lin cls) const;
    Status run_gemv_pieces(const std::vector<backend::cuda::gemv_matrix> &pieces) const;
    std::string product_label(const std::vector<linear_job> &jobs, int64_t M) const;
    // xs / sx as the GEMV split of S rows `width` wide, when OFFICIAL's GEMV can take one there
    // (S <= 16, activation blocks of 32 or 128 dividing the width); otherwise none.
    backend::cuda::gemv_split split_into(uint8_t *xs, float *sx, int64_t S, int64_t width) const;
    // Fills a dummy tensor (or its first `rows` rows) on the device, as `as` when given.
    Status fill(const model::dummy_tensor &t, int64_t rows, void **w, void **scale, int as_format = -1);

    model::model_config cfg_;
    std::shared_ptr<const model::weights> w_;  // null with dummy weights
    std::shared_ptr<const model::dummy_plan> plan_;
    std::unordered_map<std::string, size_t> by_name_;  // plan index by name
    uint64_t seed_ = 0;
    backend::cuda::device_info dev_;
    mutable cudaStream_t stream_ = nullptr;
    bool official_ = false;
    std::vector<void *> blocks_;
    size_t resident_ = 0;
    mutable dtemp gemv_ws_;  // GEMV split-K workspace, grown on demand, zeroed before each plan
    mutable uint64_t ws_gen_ = 0;
    bool prefill_gemm_ = true;  // official FP8 products of more than 16 rows on backend/cuda gemm_fp8
    int64_t prefill_gemv_max_m_ = 128;  // takes_gemm: chunks this short may keep the GEMV pieces
    sync_watch watch_;
    mutable cudaEvent_t sync_ev_ = nullptr;
    section_timer *products_ = nullptr;
    std::set<std::string> roles_;  // dlinear::role's strings (a set's nodes never move)
};

}  // namespace ds41rt::engine::gpu
