#include "experts/cuda/nccl_remote.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/partial_reduce.cuh"
#include "dist/cuda/nccl_link.h"
#include "dist/hello.h"
#include "dist/nccl_wire.h"

namespace ds41rt::experts {

using namespace dist;

struct nccl_remote::peer {
    std::unique_ptr<channel> ch;
    std::unique_ptr<nccl_link> link;
    bool ever_linked = false;
    void *hdr_d = nullptr;         // [64] the header as sent
    uint8_t *hdr_h = nullptr;      // [64] pinned staging
    int32_t *status_h = nullptr;   // [1] pinned: the status word as received
    float *resp_d = nullptr;       // [rows * dim + 1] the partial and the status word
    size_t resp_bytes = 0;
    ~peer() {
        link.reset();  // abort first: its kernels end, and cudaFree below waits for them
        cudaFree(hdr_d);
        cudaFreeHost(hdr_h);
        cudaFreeHost(status_h);
        cudaFree(resp_d);
    }
    Status buffers(size_t resp) {
        if (!hdr_d) DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&hdr_d, NCCL_HEADER_BYTES));
        if (!hdr_h) DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void **>(&hdr_h), NCCL_HEADER_BYTES));
        if (!status_h) DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void **>(&status_h), sizeof(int32_t)));
        if (resp > resp_bytes) {
            cudaFree(resp_d);
            resp_d = nullptr;
            resp_bytes = 0;
            DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void **>(&resp_d), resp));
            resp_bytes = resp;
        }
        return Status::ok();
    }
};

nccl_remote::nccl_remote(remote_layout layout, int64_t dim, int device)
    : layout_(std::move(layout)), dim_(dim), device_(device) {
    for (size_t i = 0; i < layout_.workers.size(); i++) peers_.push_back(std::make_unique<peer>());
}

nccl_remote::~nccl_remote() {
    peers_.clear();
    if (done_) cudaEventDestroy(done_);
    if (fork_) cudaEventDestroy(fork_);
    if (side_) cudaStreamDestroy(side_);
}

Status nccl_remote::ensure_linked(int w, deadline d) {
    peer &p = *peers_[size_t(w)];
    const std::string &ep = layout_.workers[size_t(w)];
    if (p.link && p.link->alive() && p.ch && p.ch->is_open()) {
        // Nothing arrives on a live link's control channel: readable means the worker hung up.
        if (!p.ch->wait_readable(clock::now())) return Status::ok();
        spdlog::info("experts: NCCL worker {} at {} closed its control channel; re-linking", w, ep);
    }
    p.link.reset();
    if (p.ch) p.ch->close();
    p.ch.reset();
    auto ch = tcp_channel::connect(ep, std::min(d, after_ms(layout_.connect_timeout_ms)));
    if (!ch) return ch.status();
    DS41RT_RETURN_IF_ERROR(hello(**ch, layout_.placement_version, uint32_t(w), d));
    auto id = nccl_new_id();
    if (!id) return id.status();
    nccl_bootstrap b;
    b.placement_version = layout_.placement_version;
    b.executor = uint32_t(w);
    b.id = *id;
    DS41RT_RETURN_IF_ERROR((*ch)->send(encode_nccl_bootstrap(b), d));
    auto reply = (*ch)->recv(d);
    if (!reply) return reply.status();
    auto h = decode_frame(*reply);
    if (!h) return h.status();
    if (h->kind == frame_kind::ERROR) return Status::unavailable("NCCL bootstrap refused: " + decode_error(*reply).message());
    if (h->kind != frame_kind::NCCL_BOOTSTRAP_REPLY)
        return Status::corruption(std::string("NCCL bootstrap answered with ") + frame_kind_name(h->kind));
    if (h->placement_version != layout_.placement_version || h->executor != uint32_t(w))
        return Status::unavailable("NCCL bootstrap answered by worker " + std::to_string(h->executor) +
                                   " with placement version " + std::to_string(h->placement_version));
    auto link = nccl_link::start(b.id, 0, device_, "worker " + std::to_string(w) + " (" + ep + ")");
    if (!link) return link.status();
    channel *c = ch->get();
    // Communicator set-up takes longer than a layer's exchange (topology discovery, first
    // connection): it gets its own allowance, still bounded, still cut short by a hang-up.
    DS41RT_RETURN_IF_ERROR((*link)->settle(std::max(d, after_ms(20000)),
                                           [c] { return c->wait_readable(clock::now()); }, "NCCL communicator init"));
    spdlog::info("experts: {} NCCL worker {} at {} (GPU {} here)", p.ever_linked ? "re-linked" : "linked", w, ep, device_);
    p.ever_linked = true;
    p.ch = std::move(ch.value());
    p.link = std::move(link.value());
    return Status::ok();
}

Status nccl_remote::failed(int i, const Status &st) {
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer_)];
    std::string who;
    if (i >= 0) {
        const int w = ranks[size_t(i)];
        who = "expert worker " + std::to_string(w) + " (" + layout_.workers[size_t(w)] + ", TP rank " +
              std::to_string(i) + " of " + std::to_string(ranks.size()) + ", NCCL)";
    } else {
        who = "expert workers";
        for (int w : ranks) who += " " + std::to_string(w) + " (" + layout_.workers[size_t(w)] + ")";
        who += " (NCCL)";
    }
    std::string m = "layer " + std::to_string(layer_) + ": " + who + ": " + st.message();
    // The layer's links may hold half an exchange: abort them (which also ends the device
    // kernels still waiting on them) and let the next request bootstrap afresh.
    for (int w : ranks) {
        peer &p = *peers_[size_t(w)];
        p.link.reset();
        if (p.ch) p.ch->close();
    }
    // Whatever reached the side stream before the failure must end before the caller reuses its
    // buffers (x, ids, weights, acc): mark it, wait for it (bounded), and order the caller after it.
    if (!recorded_ && side_ && done_ && cudaEventRecord(done_, side_) == cudaSuccess) recorded_ = true;
    if (recorded_) {
        const deadline drain = after_ms(5000);
        cudaError_t e;
        while ((e = cudaEventQuery(done_)) == cudaErrorNotReady && clock::now() < drain)
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (e == cudaErrorNotReady) m += " (the stream did not drain within 5 s of the abort)";
        if (caller_) cudaStreamWaitEvent(caller_, done_, 0);
    }
    recorded_ = false;
    layer_ = -1;
    spdlog::warn("experts: {}", m);
    return Status::unavailable(m);
}

Status nccl_remote::enqueue(int layer, const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids, const float *weights,
                            int64_t rows, int k, float *acc, cudaStream_t caller_stream) {
    if (layer_ >= 0) return Status::internal("experts: NCCL enqueue() with layer " + std::to_string(layer_) + " in flight");
    if (layer < 0 || size_t(layer) >= layout_.layer_ranks.size() || layout_.layer_ranks[size_t(layer)].empty())
        return Status::internal("experts: layer " + std::to_string(layer) + " is not remote");
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer)];
    const int tp = int(ranks.size());
    if (tp > backend::cuda::MAX_REDUCE_RANKS)
        return Status::not_supported("experts: NCCL layers up to TP " + std::to_string(backend::cuda::MAX_REDUCE_RANKS));
    if (!done_) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    if (!fork_) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    if (!side_) DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    // The exchange starts once the caller's stream has produced x, ids and weights.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, caller_stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, fork_, 0));
    cudaStream_t stream = side_;
    caller_ = caller_stream;
    layer_ = layer;
    rows_ = rows;
    recorded_ = false;
    d_ = after_ms(layout_.timeout_ms);
    const uint64_t seq = next_seq_++;
    for (int i = 0; i < tp; i++)
        if (Status st = ensure_linked(ranks[size_t(i)], d_); !st) return failed(i, st);
    const size_t nx = size_t(rows * dim_), nr = size_t(rows) * size_t(k);
    for (int i = 0; i < tp; i++) {
        peer &p = *peers_[size_t(ranks[size_t(i)])];
        if (Status st = p.buffers((nx + 1) * sizeof(float)); !st) return failed(i, st);
        nccl_header h;
        h.flags = uint16_t((nm.official ? FLAG_OFFICIAL : 0) | (nm.weight_after_w2 ? FLAG_WEIGHT_AFTER_W2 : 0));
        h.placement_version = layout_.placement_version;
        h.sequence = seq;
        h.layer = uint32_t(layer);
        h.rows = uint32_t(rows);
        h.k = uint32_t(k);
        h.dim = uint32_t(dim_);
        h.executor = uint32_t(ranks[size_t(i)]);
        h.tp_rank = uint8_t(i);
        h.tp = uint8_t(tp);
        encode_nccl_header(h, p.hdr_h);
        if (cudaError_t e = cudaMemcpyAsync(p.hdr_d, p.hdr_h, NCCL_HEADER_BYTES, cudaMemcpyHostToDevice, stream); e != cudaSuccess)
            return failed(i, backend::cuda::cuda_status(e, "header upload", __FILE__, __LINE__));
    }
    // Three groups, each over every rank's communicator (the ranks' transfers proceed together):
    // the headers, the payloads, the partials. The worker posts the same three (it must read the
    // header before it can size the payload), and NCCL matches a peer's transfers only when both
    // sides group them alike: one group of header + payload against the worker's header-only
    // group failed on the H200 with "Message truncated: received 16384 bytes instead of 8192".
    for (int phase = 0; phase < 3; phase++) {
        ncclResult_t r = ncclGroupStart();
        int bad = -1;
        for (int i = 0; i < tp && (r == ncclSuccess || r == ncclInProgress); i++) {
            peer &p = *peers_[size_t(ranks[size_t(i)])];
            ncclComm_t c = p.link->comm();
            auto fine = [](ncclResult_t v) { return v == ncclSuccess || v == ncclInProgress; };
            if (phase == 0) {
                r = ncclSend(p.hdr_d, NCCL_HEADER_BYTES, ncclUint8, 1, c, stream);
            } else if (phase == 1) {
                r = ncclSend(x, nx, ncclFloat, 1, c, stream);
                if (fine(r)) r = ncclSend(ids, nr, ncclInt32, 1, c, stream);
                if (fine(r)) r = ncclSend(weights, nr, ncclFloat, 1, c, stream);
            } else {
                r = ncclRecv(p.resp_d, nx + 1, ncclFloat, 1, c, stream);
            }
            if (!fine(r)) bad = i;
        }
        const ncclResult_t e = ncclGroupEnd();
        if (bad >= 0) return failed(bad, nccl_status(r, "ncclSend/ncclRecv"));
        if (e != ncclSuccess && e != ncclInProgress) return failed(-1, nccl_status(e, "ncclGroupEnd"));
        for (int i = 0; i < tp; i++) {
            peer &p = *peers_[size_t(ranks[size_t(i)])];
            channel *c = p.ch.get();
            if (Status st = p.link->settle(d_, [c] { return c->wait_readable(clock::now()); }, "NCCL enqueue"); !st)
                return failed(i, st);
        }
    }
    backend::cuda::partial_set set;
    set.tp = tp;
    for (int i = 0; i < tp; i++) set.p[i] = peers_[size_t(ranks[size_t(i)])]->resp_d;
    if (Status st = backend::cuda::reduce_partials(set, int64_t(nx), acc, stream); !st) return failed(-1, st);
    for (int i = 0; i < tp; i++) {
        peer &p = *peers_[size_t(ranks[size_t(i)])];
        if (cudaError_t ce = cudaMemcpyAsync(p.status_h, p.resp_d + nx, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
            ce != cudaSuccess)
            return failed(i, backend::cuda::cuda_status(ce, "status download", __FILE__, __LINE__));
    }
    if (cudaError_t ce = cudaEventRecord(done_, stream); ce != cudaSuccess)
        return failed(-1, backend::cuda::cuda_status(ce, "cudaEventRecord", __FILE__, __LINE__));
    recorded_ = true;
    return Status::ok();
}

Status nccl_remote::wait() {
    if (layer_ < 0 || !recorded_) return Status::internal("experts: NCCL wait() without a layer in flight");
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer_)];
    for (int spin = 0;; spin++) {
        const cudaError_t e = cudaEventQuery(done_);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return failed(-1, backend::cuda::cuda_status(e, "the exchange", __FILE__, __LINE__));
        if ((spin & 31) != 0) continue;
        for (size_t i = 0; i < ranks.size(); i++) {
            peer &p = *peers_[size_t(ranks[i])];
            if (Status st = p.link->check("the exchange"); !st) return failed(int(i), st);
            if (p.ch->wait_readable(clock::now()))
                return failed(int(i), Status::unavailable("the worker closed its control channel (died or restarted)"));
        }
        if (clock::now() >= d_)
            return failed(-1, Status::unavailable("no answer within " + std::to_string(layout_.timeout_ms) + " ms"));
        if (spin > 50000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    for (size_t i = 0; i < ranks.size(); i++) {
        const int32_t s = *peers_[size_t(ranks[i])]->status_h;
        if (s != 0) return failed(int(i), Status::unavailable("refused: " + nccl_reply_reason(s)));
    }
    recorded_ = false;
    layer_ = -1;
    // Join: the caller's later work (the sum's consumer) is ordered after the exchange.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(caller_, done_, 0));
    return Status::ok();
}

}  // namespace ds41rt::experts
