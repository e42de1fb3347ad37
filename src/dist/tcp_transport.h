// Framed channels over TCP (POSIX sockets): the transport that always works (CPU workers, tests,
// and the control channel other transports bootstrap over).
//
// Every blocking call takes a deadline and returns UNAVAILABLE naming the peer when it passes,
// so a peer that stops answering costs at most the deadline, never a hang. A channel whose
// stream may be out of step (timeout mid-frame, a header that does not decode) must be closed
// by its owner; reconnecting is the owner's choice (experts/remote reconnects on the next
// request). recv() decodes the header before reading the payload, so an oversize or foreign
// frame is refused without allocating for it; the payload checksum is checked by the caller
// (wire.h decode_*).
//
// Thread safety: a channel is used by one thread at a time; listeners likewise.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "dist/wire.h"

namespace ds41rt::dist {

using clock = std::chrono::steady_clock;
using deadline = clock::time_point;

inline deadline after_ms(int ms) { return clock::now() + std::chrono::milliseconds(ms); }

// "host:port" -> (host, port); INVALID_ARGUMENT naming the endpoint when malformed.
Status split_endpoint(const std::string &endpoint, std::string *host, int *port);

// One framed, bidirectional connection. The interface other transports implement as well.
class channel {
public:
    virtual ~channel() = default;
    virtual Status send(const frame_bytes &f, deadline d) = 0;
    virtual Result<frame_bytes> recv(deadline d) = 0;
    // True when a frame has started to arrive (or the peer hung up) before d.
    virtual bool wait_readable(deadline d) = 0;
    virtual void close() = 0;
    virtual bool is_open() const = 0;
    virtual const std::string &peer() const = 0;
};

class tcp_channel final : public channel {
public:
    // Connects (TCP_NODELAY) before d; UNAVAILABLE when refused or when d passes.
    static Result<std::unique_ptr<tcp_channel>> connect(const std::string &endpoint, deadline d);
    tcp_channel(int fd, std::string peer);  // takes ownership of a connected socket
    ~tcp_channel() override;

    Status send(const frame_bytes &f, deadline d) override;
    Result<frame_bytes> recv(deadline d) override;
    bool wait_readable(deadline d) override;
    void close() override;
    bool is_open() const override { return fd_ >= 0; }
    const std::string &peer() const override { return peer_; }

private:
    Status write_all(const uint8_t *p, size_t n, deadline d);
    Status read_all(uint8_t *p, size_t n, deadline d, const char *what);

    int fd_ = -1;
    std::string peer_;
};

class tcp_listener {
public:
    // Binds and listens on "host:port" (port 0: any free port, see port()).
    static Result<std::unique_ptr<tcp_listener>> listen(const std::string &endpoint);
    ~tcp_listener();
    int port() const { return port_; }
    // The next connection, or UNAVAILABLE when d passes first (callers loop to poll a stop flag).
    Result<std::unique_ptr<tcp_channel>> accept(deadline d);

private:
    tcp_listener(int fd, int port) : fd_(fd), port_(port) {}
    int fd_ = -1;
    int port_ = 0;
};

}  // namespace ds41rt::dist
