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
    Status run(int layer, const backend::cpu::expert_numerics &nm, const float *x, const backend::cpu::route_table &rt,
               float *acc);

private:
    struct peer {
        std::unique_ptr<dist::channel> ch;
        bool ever_connected = false;
    };
    Status ensure_connected(int w, dist::deadline d);
    Status exchange(int layer, const std::vector<int> &ranks, const dist::frame_bytes &req, uint64_t id,
                    uint32_t rows, dist::deadline d, std::vector<std::vector<float>> *partials);

    remote_layout layout_;
    int64_t dim_;
    std::vector<peer> peers_;
    uint64_t next_request_ = 1;
};

}  // namespace ds41rt::experts
