#include "experts/remote.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "dist/hello.h"

namespace ds41rt::experts {

using namespace dist;

Status remote_experts::ensure_connected(int w, deadline d) {
    peer &p = peers_[size_t(w)];
    const std::string &ep = layout_.workers[size_t(w)];
    if (p.ch && p.ch->is_open()) {
        // Between exchanges nothing may arrive; something readable is the worker's hang-up (it
        // restarted, or gave up on us) or junk: either way the stream is done.
        if (!p.ch->wait_readable(clock::now())) return Status::ok();
        spdlog::info("experts: worker {} at {} closed its connection; reconnecting", w, ep);
        p.ch->close();
    }
    const deadline cd = std::min(d, after_ms(layout_.connect_timeout_ms));
    auto ch = tcp_channel::connect(ep, cd);
    if (!ch) return ch.status();
    DS41RT_RETURN_IF_ERROR(hello(**ch, layout_.placement_version, uint32_t(w), d));
    spdlog::info("experts: {} worker {} at {}", p.ever_connected ? "reconnected to" : "connected to", w, ep);
    p.ever_connected = true;
    p.ch = std::move(ch.value());
    return Status::ok();
}

Status remote_experts::failed(int i, const Status &st) {
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(cur_.layer)];
    const int w = ranks[size_t(i)];
    Status out = Status::unavailable("layer " + std::to_string(cur_.layer) + ": expert worker " + std::to_string(w) +
                                     " (" + layout_.workers[size_t(w)] + ", TP rank " + std::to_string(i) + " of " +
                                     std::to_string(ranks.size()) + "): " + st.message());
    // The layer's streams may hold half a frame or a late answer: start them afresh.
    for (int r : ranks)
        if (peers_[size_t(r)].ch) peers_[size_t(r)].ch->close();
    cur_ = {};
    spdlog::warn("experts: {}", out.message());
    return out;
}

Status remote_experts::send_all(const frame_bytes &req) {
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(cur_.layer)];
    for (size_t i = 0; i < ranks.size(); i++) {
        const int w = ranks[i];
        if (Status st = ensure_connected(w, cur_.d); !st) return failed(int(i), st);
        if (Status st = peers_[size_t(w)].ch->send(req, cur_.d); !st) return failed(int(i), st);
    }
    return Status::ok();
}

Status remote_experts::collect(std::vector<std::vector<float>> *partials) {
    const std::vector<int> &ranks = layout_.layer_ranks[size_t(cur_.layer)];
    const int tp = int(ranks.size());
    // Rank order here is only the order of reading: every rank's answer waits in its own socket
    // until read, so which one arrives first changes nothing.
    for (int i = 0; i < tp; i++) {
        channel &ch = *peers_[size_t(ranks[size_t(i)])].ch;
        response_expectation e;
        e.placement_version = layout_.placement_version;
        e.request_id = cur_.id;
        e.layer = uint32_t(cur_.layer);
        e.rows = cur_.rows;
        e.dim = uint32_t(dim_);
        e.executor = uint32_t(ranks[size_t(i)]);
        e.tp_rank = uint8_t(i);
        e.tp = uint8_t(tp);
        auto f = ch.recv(cur_.d);
        if (!f) return failed(i, f.status());
        auto h = decode_frame(*f);
        if (!h) return failed(i, h.status());
        if (h->kind == frame_kind::ERROR) return failed(i, Status::unavailable("refused: " + decode_error(*f).message()));
        auto r = decode_response(*f);
        if (!r) return failed(i, r.status());
        if (Status st = check_response(r->h, e); !st) return failed(i, st);
        (*partials)[size_t(i)] = std::move(r->partial);
    }
    return Status::ok();
}

Status remote_experts::start(int layer, const backend::cpu::expert_numerics &nm, const float *x,
                             const backend::cpu::route_table &rt) {
    cur_ = {layer, next_request_++, uint32_t(rt.rows()), after_ms(layout_.timeout_ms)};
    frame_header h;
    h.placement_version = layout_.placement_version;
    h.request_id = cur_.id;
    h.layer = uint32_t(layer);
    h.flags = uint16_t((nm.official ? FLAG_OFFICIAL : 0) | (nm.weight_after_w2 ? FLAG_WEIGHT_AFTER_W2 : 0));
    return send_all(encode_request(h, rt, x, uint32_t(dim_)));
}

Status remote_experts::finish(float *acc) {
    if (cur_.layer < 0) return Status::internal("experts: finish() without a request in flight");
    std::vector<std::vector<float>> partials(layout_.layer_ranks[size_t(cur_.layer)].size());
    DS41RT_RETURN_IF_ERROR(collect(&partials));
    const size_t n = size_t(cur_.rows) * size_t(dim_);
    cur_ = {};
    // FP32, in rank order; one partial is returned as is.
    std::copy(partials[0].begin(), partials[0].begin() + long(n), acc);
    for (size_t i = 1; i < partials.size(); i++)
        for (size_t j = 0; j < n; j++) acc[j] += partials[i][j];
    return Status::ok();
}

}  // namespace ds41rt::experts
