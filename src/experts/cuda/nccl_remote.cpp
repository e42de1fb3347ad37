#include "experts/cuda/nccl_remote.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <thread>

#include "backend/cuda/cuda_status.h"
#include "backend/cuda/partial_reduce.cuh"
#include "backend/cuda/stream_drain.h"
#include "dist/cuda/nccl_link.h"
#include "dist/hello.h"
#include "dist/nccl_wire.h"

namespace ds41rt::experts {

using namespace dist;

namespace {

// A status word not yet come down from the worker (the protocol's words are small and >= 0).
constexpr int32_t NOT_YET = INT32_MIN;

}  // namespace

struct nccl_remote::peer {
    std::unique_ptr<channel> ch;
    std::unique_ptr<nccl_link> link;
    bool ever_linked = false;
    float *resp_d = nullptr;  // [capacity rows * dim + 1] the partial and the status word
    std::shared_ptr<void> resp;  // owns resp_d; a link's abort holds it too (freed after the reclaim)
    Status alloc_resp(size_t bytes) {
        resp.reset();
        resp_d = nullptr;
        void *q = nullptr;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&q, bytes));
        resp = std::shared_ptr<void>(q, [](void *v) { cudaFree(v); });
        resp_d = static_cast<float *>(q);
        if (link) link->hold_until_aborted(resp);
        return Status::ok();
    }
};

// One remote layer's fixed host and device slots: graphs hold their addresses.
struct nccl_remote::slot {
    int tp = 0;
    uint8_t *hdr_h = nullptr;        // [tp][64] pinned: the headers staged for the next exchange
    void *hdr_d = nullptr;           // [tp][64] where they are sent from
    int32_t *status_h = nullptr;     // [tp] pinned: the status words as received (NOT_YET before)
    ~slot() {
        cudaFreeHost(hdr_h);
        cudaFree(hdr_d);
        cudaFreeHost(status_h);
    }
};

nccl_remote::nccl_remote(remote_layout layout, int64_t dim, int device)
    : layout_(std::move(layout)), dim_(dim), device_(device) {
    for (size_t i = 0; i < layout_.workers.size(); i++) peers_.push_back(std::make_unique<peer>());
    slots_.resize(layout_.layer_ranks.size());
}

nccl_remote::~nccl_remote() {
    peers_.clear();
    slots_.clear();
    if (join_) cudaEventDestroy(join_);
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
    generation_++;  // graphs holding the old communicator are dead from here on
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
    if (p.resp) p.link->hold_until_aborted(p.resp);
    return Status::ok();
}

Status nccl_remote::failed(int layer, int i, const Status &st) {
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer)];
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
    const std::string m = "layer " + std::to_string(layer) + ": " + who + ": " + st.message();
    // Any layer in flight may hold half an exchange: abort all their links (which also ends the
    // device kernels still waiting on them, so the stream drains) and let the next prepare()
    // bootstrap afresh.
    std::vector<int> layers = in_flight_;
    if (std::find(layers.begin(), layers.end(), layer) == layers.end()) layers.push_back(layer);
    for (int l : layers)
        for (int w : layout_.layer_ranks[size_t(l)]) {
            peer &p = *peers_[size_t(w)];
            p.link.reset();
            if (p.ch) p.ch->close();
        }
    in_flight_.clear();
    answered_ = 0;
    spdlog::warn("experts: {}", m);
    return Status::unavailable(m);
}

Status nccl_remote::prepare(int64_t rows) {
    // A step that failed before its synchronisation left its layers staged: they are not waited
    // for (whatever ran of them ran before this step's exchanges, in stream order).
    in_flight_.clear();
    answered_ = 0;
    const deadline d = after_ms(layout_.timeout_ms);
    std::vector<bool> seen(peers_.size(), false);
    for (size_t l = 0; l < layout_.layer_ranks.size(); l++) {
        if (!layout_.layer_nccl(int(l))) continue;
        const std::vector<int> &ranks = layout_.layer_ranks[l];
        for (size_t i = 0; i < ranks.size(); i++) {
            if (seen[size_t(ranks[i])]) continue;
            seen[size_t(ranks[i])] = true;
            if (Status st = ensure_linked(ranks[i], d); !st) return failed(int(l), int(i), st);
        }
    }
    // Answer buffers for at least a decode step's rows, grown (and the graphs dropped) only for a
    // longer step.
    if (rows > capacity_rows_) {
        const int64_t cap = std::max<int64_t>(rows, 16);
        for (auto &p : peers_) DS41RT_RETURN_IF_ERROR(p->alloc_resp(size_t(cap * dim_ + 1) * sizeof(float)));
        capacity_rows_ = cap;
        generation_++;
    }
    if (!fork_) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    if (!join_) DS41RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    if (!side_) DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    return Status::ok();
}

Status nccl_remote::stage(int layer, const backend::cpu::expert_numerics &nm, int64_t rows, int k) {
    if (!layout_.layer_nccl(layer)) return Status::internal("experts: layer " + std::to_string(layer) + " is not an NCCL layer");
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer)];
    const int tp = int(ranks.size());
    if (tp > backend::cuda::MAX_REDUCE_RANKS)
        return Status::not_supported("experts: NCCL layers up to TP " + std::to_string(backend::cuda::MAX_REDUCE_RANKS));
    if (rows > capacity_rows_ || !side_)
        return Status::internal("experts: NCCL stage() of " + std::to_string(rows) + " rows after prepare() of " +
                                std::to_string(capacity_rows_));
    if (std::find(in_flight_.begin(), in_flight_.end(), layer) != in_flight_.end())
        return Status::internal("experts: NCCL layer " + std::to_string(layer) + " staged twice in one step");
    auto &sp = slots_[size_t(layer)];
    if (!sp) {
        auto s = std::make_unique<slot>();
        s->tp = tp;
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void **>(&s->hdr_h), size_t(tp) * NCCL_HEADER_BYTES));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMalloc(&s->hdr_d, size_t(tp) * NCCL_HEADER_BYTES));
        DS41RT_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void **>(&s->status_h), size_t(tp) * sizeof(int32_t)));
        sp = std::move(s);
    }
    slot &s = *sp;
    const uint64_t seq = next_seq_++;
    for (int i = 0; i < tp; i++) {
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
        encode_nccl_header(h, s.hdr_h + size_t(i) * NCCL_HEADER_BYTES);
        s.status_h[i] = NOT_YET;
    }
    if (in_flight_.empty()) progress_ = clock::now(), answered_ = 0;
    in_flight_.push_back(layer);
    return Status::ok();
}

Status nccl_remote::enqueue(int layer, const float *x, const int32_t *ids, const float *weights, int64_t rows, int k,
                            float *acc, cudaStream_t caller_stream) {
    if (std::find(in_flight_.begin(), in_flight_.end(), layer) == in_flight_.end())
        return Status::internal("experts: NCCL enqueue() of layer " + std::to_string(layer) + ", which is not staged");
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer)];
    const int tp = int(ranks.size());
    slot &s = *slots_[size_t(layer)];
    // The exchange starts once the caller's stream has produced x, ids and weights.
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, caller_stream));
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, fork_, 0));
    cudaStream_t stream = side_;
    caller_ = caller_stream;
    const deadline d = after_ms(layout_.timeout_ms);
    const size_t nx = size_t(rows * dim_), nr = size_t(rows) * size_t(k);
    // Copied when it runs: a replayed graph sends what stage() wrote for its step.
    if (cudaError_t e = cudaMemcpyAsync(s.hdr_d, s.hdr_h, size_t(tp) * NCCL_HEADER_BYTES, cudaMemcpyHostToDevice, stream);
        e != cudaSuccess)
        return failed(layer, -1, backend::cuda::cuda_status(e, "header upload", __FILE__, __LINE__));
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
            if (!p.link || !p.link->alive()) {
                bad = i;
                break;
            }
            ncclComm_t c = p.link->comm();
            auto fine = [](ncclResult_t v) { return v == ncclSuccess || v == ncclInProgress; };
            if (phase == 0) {
                r = ncclSend(static_cast<uint8_t *>(s.hdr_d) + size_t(i) * NCCL_HEADER_BYTES, NCCL_HEADER_BYTES, ncclUint8, 1, c,
                             stream);
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
        if (bad >= 0) return failed(layer, bad, r == ncclSuccess ? Status::unavailable("the link is closed") : nccl_status(r, "ncclSend/ncclRecv"));
        if (e != ncclSuccess && e != ncclInProgress) return failed(layer, -1, nccl_status(e, "ncclGroupEnd"));
        for (int i = 0; i < tp; i++) {
            peer &p = *peers_[size_t(ranks[size_t(i)])];
            channel *c = p.ch.get();
            if (Status st = p.link->settle(d, [c] { return c->wait_readable(clock::now()); }, "NCCL enqueue"); !st)
                return failed(layer, i, st);
        }
    }
    backend::cuda::partial_set set;
    set.tp = tp;
    for (int i = 0; i < tp; i++) set.p[i] = peers_[size_t(ranks[size_t(i)])]->resp_d;
    if (Status st = backend::cuda::reduce_partials(set, int64_t(nx), acc, stream); !st) return failed(layer, -1, st);
    // The status words last: once they are down, the layer's partials are in acc.
    for (int i = 0; i < tp; i++) {
        peer &p = *peers_[size_t(ranks[size_t(i)])];
        if (cudaError_t ce = cudaMemcpyAsync(s.status_h + i, p.resp_d + nx, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
            ce != cudaSuccess)
            return failed(layer, i, backend::cuda::cuda_status(ce, "status download", __FILE__, __LINE__));
    }
    DS41RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_, stream));
    return Status::ok();
}

Status nccl_remote::join(cudaStream_t stream) {
    DS41RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, join_, 0));
    return Status::ok();
}

bool nccl_remote::answered(const slot &s) const {
    for (int i = 0; i < s.tp; i++)
        if (reinterpret_cast<const volatile int32_t *>(s.status_h)[i] == NOT_YET) return false;
    return true;
}

Status nccl_remote::waiting() {
    while (answered_ < in_flight_.size() && answered(*slots_[size_t(in_flight_[answered_])])) {
        answered_++;
        progress_ = clock::now();
    }
    if (answered_ == in_flight_.size()) return Status::ok();
    // The health checks are syscalls: every 32nd call (the callers spin).
    if ((spins_++ & 31) != 0) return Status::ok();
    for (size_t j = answered_; j < in_flight_.size(); j++) {
        const int layer = in_flight_[j];
        const std::vector<int> &ranks = layout_.layer_ranks[size_t(layer)];
        for (size_t i = 0; i < ranks.size(); i++) {
            peer &p = *peers_[size_t(ranks[i])];
            if (!p.link || !p.ch) return failed(layer, int(i), Status::unavailable("the link is closed"));
            if (Status st = p.link->check("the exchange"); !st) return failed(layer, int(i), st);
            if (p.ch->wait_readable(clock::now()))
                return failed(layer, int(i), Status::unavailable("the worker closed its control channel (died or restarted)"));
        }
    }
    if (clock::now() - progress_ >= std::chrono::milliseconds(layout_.timeout_ms))
        return failed(in_flight_[answered_], -1,
                      Status::unavailable("no answer within " + std::to_string(layout_.timeout_ms) + " ms"));
    return Status::ok();
}

Status nccl_remote::keep_up(size_t behind) {
    for (uint64_t spin = 0;; spin++) {
        DS41RT_RETURN_IF_ERROR(waiting());
        if (in_flight_.size() - answered_ <= behind) return Status::ok();
        if (spin > 50000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

Status nccl_remote::drained() {
    for (int layer : in_flight_) {
        const slot &s = *slots_[size_t(layer)];
        for (int i = 0; i < s.tp; i++) {
            const int32_t w = reinterpret_cast<const volatile int32_t *>(s.status_h)[i];
            if (w == NOT_YET) return failed(layer, i, Status::internal("the exchange was staged but never ran"));
            if (w != 0) return failed(layer, i, Status::unavailable("refused: " + nccl_reply_reason(w)));
        }
    }
    in_flight_.clear();
    answered_ = 0;
    return Status::ok();
}

Status nccl_remote::wait() {
    if (in_flight_.empty()) return Status::internal("experts: NCCL wait() without a layer in flight");
    if (Status st = keep_up(0); !st) {
        // The aborts end the side stream's NCCL kernels: let it drain (bounded) before the caller
        // reuses its buffers, and order the caller after it.
        const bool ok = backend::cuda::drain_stream(side_, join_, 5000);
        if (caller_) cudaStreamWaitEvent(caller_, join_, 0);
        return ok ? st : Status::unavailable(st.message() + " (the stream did not drain within 5 s of the abort)");
    }
    DS41RT_RETURN_IF_ERROR(drained());
    if (caller_) DS41RT_RETURN_IF_ERROR(join(caller_));
    return Status::ok();
}

Status nccl_remote::run(int layer, const backend::cpu::expert_numerics &nm, const float *x, const int32_t *ids,
                        const float *weights, int64_t rows, int k, float *acc, cudaStream_t stream) {
    DS41RT_RETURN_IF_ERROR(prepare(rows));
    DS41RT_RETURN_IF_ERROR(stage(layer, nm, rows, k));
    DS41RT_RETURN_IF_ERROR(enqueue(layer, x, ids, weights, rows, k, acc, stream));
    return wait();
}

}  // namespace ds41rt::experts
