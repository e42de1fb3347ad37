// The worker handshake (hello.h).
#include "dist/hello.h"

#include <string>

namespace ds41rt::dist {

Status hello(channel &ch, uint64_t placement_version, uint32_t executor, deadline d) {
    DS41RT_RETURN_IF_ERROR(ch.send(encode_hello(frame_kind::HELLO, placement_version, 0), d));
    auto reply = ch.recv(d);
    if (!reply) return reply.status();
    auto h = decode_frame(*reply);
    if (!h) return h.status();
    if (h->kind == frame_kind::ERROR) return decode_error(*reply);
    if (h->kind != frame_kind::HELLO_REPLY)
        return Status::corruption(std::string("handshake answered with ") + frame_kind_name(h->kind));
    if (h->placement_version != placement_version)
        return Status::unavailable("the worker runs placement version " + std::to_string(h->placement_version) +
                                   ", we run " + std::to_string(placement_version) + " (started from another plan.json?)");
    if (h->executor != executor)
        return Status::unavailable("the worker at " + ch.peer() + " says it is worker " + std::to_string(h->executor) +
                                   ", expected worker " + std::to_string(executor));
    return Status::ok();
}

}  // namespace ds41rt::dist
