// The remote half of the experts room: one connection per worker, one exchange per remote
// layer (routed_experts.h says what it guarantees). Internal to the room.
#pragma once

#include <memory>
#include <vector>

#include "dist/tcp_transport.h"
#include "experts/routed_experts.h"

namespace ds41rt::experts {

class remote_experts {
public:
    remote_experts(remote_layout layout, int64_t dim) : layout_(std::move(layout)), dim_(dim) {
        peers_.resize(layout_.workers.size());
    }
    // Sends the layer's request to every rank; finish() collects and reduces the partials.
    Status start(int layer, const backend::cpu::expert_numerics &nm, const float *x,
                 const backend::cpu::route_table &rt);
    Status finish(float *acc);

private:
    struct peer {
        std::unique_ptr<dist::channel> ch;
        bool ever_connected = false;
    };
    struct in_flight {
        int layer = -1;
        uint64_t id = 0;
        uint32_t rows = 0;
        dist::deadline d;
    };
    Status ensure_connected(int w, dist::deadline d);
    Status send_all(const dist::frame_bytes &req);
    Status collect(std::vector<std::vector<float>> *partials);
    Status failed(int rank_index, const Status &st);  // closes the layer's connections, names the worker

    remote_layout layout_;
    int64_t dim_;
    std::vector<peer> peers_;
    uint64_t next_request_ = 1;
    in_flight cur_;
};

}  // namespace ds41rt::experts
