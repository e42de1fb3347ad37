#include "dist/cuda/nccl_worker.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_status.h"
#include "dist/cuda/gpu_experts.h"
#include "dist/cuda/nccl_link.h"

namespace ds41rt::dist {

namespace {

// Device buffers of one request, grown on demand and kept.
struct dev_buf {
    void *p = nullptr;
    size_t bytes = 0;
    ~dev_buf() { cudaFree(p); }
    Status need(size_t n) {
        if (n <= bytes) return Status::ok();
        cudaFree(p);
        p = nullptr;
        bytes = 0;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, n));
        bytes = n;
        return Status::ok();
    }
    template <typename T> T *as() const { return static_cast<T *>(p); }
};

class worker_loop {
public:
    worker_loop(channel &ctl, gpu_experts &g, const nccl_worker_info &info, std::mutex &compute,
                const std::atomic<bool> &stop)
        : ctl_(ctl), g_(g), info_(info), compute_(compute), stop_(stop) {}
    // The link's abort holds the stream, event, pinned and device buffers (res_) until NCCL's
    // reclaim has returned; they are freed after that, once the stream has drained.
    ~worker_loop() { link_.reset(); }

    Status run(const nccl_bootstrap &b) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(g_.device()));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&res_->stream, cudaStreamNonBlocking));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&res_->done, cudaEventDisableTiming));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&res_->pinned, PINNED_BYTES));
        std::memset(res_->pinned, 0, PINNED_BYTES);
        auto l = nccl_link::start(b.id, 1, g_.device(), "coordinator at " + ctl_.peer());
        if (!l) return l.status();
        link_ = std::move(l.value());
        link_->hold_until_aborted(res_);
        DS41RT_RETURN_IF_ERROR(link_->settle(after_ms(60000), cancel(), "NCCL communicator init"));
        spdlog::info("worker {}: NCCL link to {} up on GPU {}", info_.executor, ctl_.peer(), g_.device());
        DS41RT_RETURN_IF_ERROR(hdr_.need(NCCL_HEADER_BYTES));
        DS41RT_RETURN_IF_ERROR(post_header());
        for (;;) {
            // The idle wait: no deadline, only the coordinator's hang-up or stop ends it. The
            // stream has run everything queued before the header: the last request's answer
            // has left.
            if (Status st = wait("header"); !st) {
                spdlog::info("worker {}: NCCL link idle end: {}", info_.executor, st.message());
                return Status::ok();
            }
            if (*last_status() == int32_t(nccl_reply::EXPERTS_FAILED) && last_ran_) {
                std::lock_guard<std::mutex> lk(compute_);
                spdlog::warn("worker {}: NCCL request {} (layer {}): {}", info_.executor, last_.sequence, last_.layer,
                             g_.routed_errors().message());
            }
            auto h = decode_nccl_header(header(), NCCL_HEADER_BYTES);
            if (!h) return Status(h.status().code(), "request refused, ending the NCCL link: " + h.status().message());
            DS41RT_RETURN_IF_ERROR(serve_one(*h));
            DS41RT_RETURN_IF_ERROR(post_header());
        }
    }

private:
    // Pinned host bytes: [0, 64) the header as received, [64, 68) the last answer's status word
    // as sent, [68, 72) a refusal's status word to send.
    static constexpr size_t PINNED_BYTES = NCCL_HEADER_BYTES + 8;
    uint8_t *header() const { return static_cast<uint8_t *>(res_->pinned); }
    int32_t *last_status() const { return reinterpret_cast<int32_t *>(header() + NCCL_HEADER_BYTES); }
    int32_t *refusal() const { return last_status() + 1; }

    std::function<bool()> cancel() {
        return [this] { return stop_.load() || ctl_.wait_readable(clock::now()); };
    }
    template <typename F> Status group(F &&ops, const char *what) {
        DS41RT_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), what));
        const ncclResult_t r = ops();
        const ncclResult_t e = ncclGroupEnd();
        DS41RT_RETURN_IF_ERROR(nccl_status(r, what, link_->comm()));
        DS41RT_RETURN_IF_ERROR(nccl_status(e, what, link_->comm()));
        return link_->settle(after_ms(30000), cancel(), what);
    }

    // The next header's receive, and its copy to the host, marked by done_.
    Status post_header() {
        DS41RT_RETURN_IF_ERROR(group([&] {
            return ncclRecv(hdr_.p, NCCL_HEADER_BYTES, ncclUint8, 0, link_->comm(), stream_);
        }, "receive header"));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(header(), hdr_.p, NCCL_HEADER_BYTES, cudaMemcpyDeviceToHost, stream_));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
        return Status::ok();
    }

    // Waits for done_; polls the link and the control channel meanwhile.
    Status wait(const char *what) {
        // Spin first (a decode step's next layer comes within microseconds), then poll gently.
        for (uint64_t spin = 0;; spin++) {
            const cudaError_t e = cudaEventQuery(done_);
            if (e == cudaSuccess) return Status::ok();
            if (e != cudaErrorNotReady) return backend::cuda::cuda_status(e, what, __FILE__, __LINE__);
            if ((spin & 63) == 0) {
                DS41RT_RETURN_IF_ERROR(link_->check(what));
                if (cancel()()) {
                    link_->abort();
                    return Status::unavailable(std::string("waiting for the ") + what + ": the coordinator hung up");
                }
            }
            if (spin > 20000) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    nccl_reply check(const nccl_header &h) const {
        if (h.placement_version != info_.placement_version) return nccl_reply::STALE_PLACEMENT;
        auto it = info_.layers.find(int(h.layer));
        if (it == info_.layers.end() || !g_.has_layer(int(h.layer))) return nccl_reply::LAYER_NOT_HELD;
        if (int64_t(h.dim) != info_.dim || h.executor != info_.executor || h.tp_rank != it->second.first ||
            h.tp != it->second.second)
            return nccl_reply::BAD_HEADER;
        return nccl_reply::OK;
    }

    Status serve_one(const nccl_header &h) {
        const uint64_t nx = nccl_x_elems(h), nr = nccl_route_elems(h), ny = nccl_reply_elems(h);
        DS41RT_RETURN_IF_ERROR(x_.need(nx * 4));
        DS41RT_RETURN_IF_ERROR(ids_.need(nr * 4));
        DS41RT_RETURN_IF_ERROR(w_.need(nr * 4));
        DS41RT_RETURN_IF_ERROR(y_.need(ny * 4));
        DS41RT_RETURN_IF_ERROR(group([&] {
            // Non-blocking communicators may answer ncclInProgress for a queued op: that is success.
            auto fine = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
            ncclResult_t r = ncclRecv(x_.p, nx, ncclFloat, 0, link_->comm(), stream_);
            if (fine(r)) r = ncclRecv(ids_.p, nr, ncclInt32, 0, link_->comm(), stream_);
            if (fine(r)) r = ncclRecv(w_.p, nr, ncclFloat, 0, link_->comm(), stream_);
            return r;
        }, "receive payload"));
        int32_t *word = y_.as<int32_t>() + (ny - 1);
        nccl_reply status = check(h);
        last_ = h;
        last_ran_ = false;
        if (status == nccl_reply::OK) {
            backend::cpu::expert_numerics nm = info_.numerics;
            nm.official = h.flags & FLAG_OFFICIAL;
            nm.weight_after_w2 = h.flags & FLAG_WEIGHT_AFTER_W2;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(word, 0, sizeof(int32_t), stream_));
            Status st;
            {
                std::lock_guard<std::mutex> lk(compute_);
                st = g_.run_routed(int(h.layer), nm, x_.as<float>(), ids_.as<int32_t>(), w_.as<float>(), int64_t(h.rows),
                                   int(h.k), y_.as<float>(), word, int32_t(nccl_reply::EXPERTS_FAILED), stream_);
            }
            if (!st) {
                spdlog::warn("worker {}: NCCL request {} (layer {}): {}", info_.executor, h.sequence, h.layer,
                             st.message());
                status = nccl_reply::EXPERTS_FAILED;
            }
            last_ran_ = st.is_ok();
        } else {
            spdlog::warn("worker {}: NCCL request {} (layer {}) refused: {}", info_.executor, h.sequence, h.layer,
                         nccl_reply_reason(int32_t(status)));
        }
        if (status != nccl_reply::OK) {
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(y_.p, 0, (ny - 1) * 4, stream_));
            // The stream has passed the last use of this pinned word (the header wait above).
            *refusal() = int32_t(status);
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(word, refusal(), 4, cudaMemcpyHostToDevice, stream_));
        }
        DS41RT_RETURN_IF_ERROR(group([&] {
            return ncclSend(y_.p, ny, ncclFloat, 0, link_->comm(), stream_);
        }, "send partial"));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(last_status(), word, 4, cudaMemcpyDeviceToHost, stream_));
        return Status::ok();
    }

    channel &ctl_;
    gpu_experts &g_;
    const nccl_worker_info &info_;
    std::mutex &compute_;
    const std::atomic<bool> &stop_;
    // What the link's queued work touches; shared with its abort (nccl_link::hold_until_aborted:
    // a worker resumed after its coordinator aborted died of SIGSEGV when these were freed under
    // the reclaim, and of a copy into a freed pinned header before that).
    struct resources {
        cudaStream_t stream = nullptr;
        cudaEvent_t done = nullptr;
        void *pinned = nullptr;
        dev_buf hdr, x, ids, w, y;
        ~resources() {
            if (stream) cudaStreamSynchronize(stream);  // the aborted kernels have ended; the header copy may follow
            if (done) cudaEventDestroy(done);
            if (stream) cudaStreamDestroy(stream);
            cudaFreeHost(pinned);
        }
    };
    std::shared_ptr<resources> res_ = std::make_shared<resources>();
    std::unique_ptr<nccl_link> link_;  // declared after res_, so destroyed (aborted) before it
    cudaStream_t &stream_ = res_->stream;
    cudaEvent_t &done_ = res_->done;
    dev_buf &hdr_ = res_->hdr, &x_ = res_->x, &ids_ = res_->ids, &w_ = res_->w, &y_ = res_->y;
    nccl_header last_;       // the last request served
    bool last_ran_ = false;  // its experts ran (so a failed status word came from their routes)
};

}  // namespace

Status serve_nccl(channel &ctl, const nccl_bootstrap &b, gpu_experts &g, const nccl_worker_info &info,
                  std::mutex &compute, const std::atomic<bool> &stop) {
    worker_loop loop(ctl, g, info, compute, stop);
    Status st = loop.run(b);
    if (st) spdlog::info("worker {}: NCCL link to {} ended", info.executor, ctl.peer());
    return st;
}

}  // namespace ds41rt::dist
