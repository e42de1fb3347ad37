#include "dist/cuda/nccl_worker.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

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
    ~worker_loop() {
        link_.reset();  // abort first: its kernels end, and the buffers' cudaFree waits for them
        if (done_) cudaEventDestroy(done_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    Status run(const nccl_bootstrap &b) {
        DS41RT_CUDA_RETURN_IF_ERROR(cudaSetDevice(g_.device()));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
        auto l = nccl_link::start(b.id, 1, g_.device(), "coordinator at " + ctl_.peer());
        if (!l) return l.status();
        link_ = std::move(l.value());
        DS41RT_RETURN_IF_ERROR(link_->settle(after_ms(60000), cancel(), "NCCL communicator init"));
        spdlog::info("worker {}: NCCL link to {} up on GPU {}", info_.executor, ctl_.peer(), g_.device());
        DS41RT_RETURN_IF_ERROR(hdr_.need(NCCL_HEADER_BYTES));
        for (;;) {
            // The idle wait: no deadline, only the coordinator's hang-up or stop ends it.
            DS41RT_RETURN_IF_ERROR(group([&] {
                return ncclRecv(hdr_.p, NCCL_HEADER_BYTES, ncclUint8, 0, link_->comm(), stream_);
            }, "receive header"));
            if (Status st = wait(deadline::max(), "header"); !st) {
                // Idle: the coordinator went away (or stop); nothing was in flight.
                spdlog::info("worker {}: NCCL link idle end: {}", info_.executor, st.message());
                return Status::ok();
            }
            uint8_t raw[NCCL_HEADER_BYTES];
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(raw, hdr_.p, NCCL_HEADER_BYTES, cudaMemcpyDeviceToHost));
            auto h = decode_nccl_header(raw, NCCL_HEADER_BYTES);
            if (!h) return Status(h.status().code(), "request refused, ending the NCCL link: " + h.status().message());
            DS41RT_RETURN_IF_ERROR(serve_one(*h));
        }
    }

private:
    std::function<bool()> cancel() {
        return [this] { return stop_.load() || ctl_.wait_readable(clock::now()); };
    }
    template <typename F> Status group(F &&ops, const char *what) {
        DS41RT_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), what));
        const ncclResult_t r = ops();
        const ncclResult_t e = ncclGroupEnd();
        DS41RT_RETURN_IF_ERROR(nccl_status(r, what, link_->comm()));
        DS41RT_RETURN_IF_ERROR(nccl_status(e, what, link_->comm()));
        DS41RT_RETURN_IF_ERROR(link_->settle(after_ms(30000), cancel(), what));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
        return Status::ok();
    }

    // Waits for the stream's last group; polls the link and the control channel meanwhile.
    Status wait(deadline d, const char *what) {
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
                if (clock::now() >= d) {
                    link_->abort();
                    return Status::unavailable(std::string("waiting for the ") + what + ": timed out");
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
        // The coordinator posted the payload right after the header, in a group of its own as here.
        DS41RT_RETURN_IF_ERROR(wait(after_ms(30000), "payload"));
        nccl_reply status = check(h);
        if (status != nccl_reply::OK)
            spdlog::warn("worker {}: NCCL request {} (layer {}) refused: {}", info_.executor, h.sequence, h.layer,
                         nccl_reply_reason(int32_t(status)));
        if (status == nccl_reply::OK) {
            std::vector<int32_t> ids(nr);
            std::vector<float> wts(nr);
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(ids.data(), ids_.p, nr * 4, cudaMemcpyDeviceToHost));
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMemcpy(wts.data(), w_.p, nr * 4, cudaMemcpyDeviceToHost));
            backend::cpu::route_table rt;
            rt.offsets.reserve(h.rows + 1);
            rt.offsets.push_back(0);
            for (uint32_t r = 0; r < h.rows; r++) {
                for (uint32_t k = 0; k < h.k; k++) {
                    const size_t i = size_t(r) * h.k + k;
                    rt.routes.push_back({uint32_t(ids[i]), wts[i]});
                }
                rt.offsets.push_back(uint32_t(rt.routes.size()));
            }
            backend::cpu::expert_numerics nm = info_.numerics;
            nm.official = h.flags & FLAG_OFFICIAL;
            nm.weight_after_w2 = h.flags & FLAG_WEIGHT_AFTER_W2;
            Status st;
            {
                std::lock_guard<std::mutex> lk(compute_);
                st = g_.run_device(int(h.layer), nm, x_.as<float>(), int64_t(h.rows), rt, y_.as<float>());
            }
            if (!st) {
                spdlog::warn("worker {}: NCCL request {} (layer {}): {}", info_.executor, h.sequence, h.layer,
                             st.message());
                status = nccl_reply::EXPERTS_FAILED;
            }
        }
        if (status != nccl_reply::OK) DS41RT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(y_.p, 0, (ny - 1) * 4, stream_));
        status_word_ = int32_t(status);
        DS41RT_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(y_.as<float>() + (ny - 1), &status_word_, 4, cudaMemcpyHostToDevice, stream_));
        DS41RT_RETURN_IF_ERROR(group([&] {
            return ncclSend(y_.p, ny, ncclFloat, 0, link_->comm(), stream_);
        }, "send partial"));
        return wait(after_ms(30000), "partial's delivery");
    }

    channel &ctl_;
    gpu_experts &g_;
    const nccl_worker_info &info_;
    std::mutex &compute_;
    const std::atomic<bool> &stop_;
    std::unique_ptr<nccl_link> link_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t done_ = nullptr;
    dev_buf hdr_, x_, ids_, w_, y_;
    int32_t status_word_ = 0;
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
