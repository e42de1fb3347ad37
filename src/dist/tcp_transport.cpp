#include "dist/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ds41rt::dist {

namespace {

int remaining_ms(deadline d) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - clock::now()).count();
    return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

// Waits for events on fd until d; false when d passed first. EINTR restarts with the time left.
bool wait_fd(int fd, short events, deadline d, short *revents) {
    for (;;) {
        pollfd p{fd, events, 0};
        int r = ::poll(&p, 1, remaining_ms(d));
        if (r > 0) {
            *revents = p.revents;
            return true;
        }
        if (r == 0) return false;
        if (errno != EINTR) {
            *revents = POLLERR;
            return true;
        }
    }
}

std::string err_text() { return std::strerror(errno); }

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

void set_nodelay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

Status split_endpoint(const std::string &endpoint, std::string *host, int *port) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size())
        return Status::invalid_argument("endpoint '" + endpoint + "' is not host:port");
    *host = endpoint.substr(0, colon);
    if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
    char *end = nullptr;
    long p = std::strtol(endpoint.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || p < 0 || p > 65535)
        return Status::invalid_argument("endpoint '" + endpoint + "': bad port");
    *port = int(p);
    return Status::ok();
}

// ---- tcp_channel --------------------------------------------------------------------------------

Result<std::unique_ptr<tcp_channel>> tcp_channel::connect(const std::string &endpoint, deadline d) {
    std::string host;
    int port = 0;
    DS41RT_RETURN_IF_ERROR(split_endpoint(endpoint, &host, &port));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo *res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
        return Status::unavailable("connect " + endpoint + ": " + gai_strerror(rc));
    Status last = Status::unavailable("connect " + endpoint + ": no address");
    for (addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = Status::unavailable("connect " + endpoint + ": socket: " + err_text());
            continue;
        }
        set_nonblocking(fd);
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno != EINPROGRESS) {
            last = Status::unavailable("connect " + endpoint + ": " + err_text());
            ::close(fd);
            continue;
        }
        if (rc != 0) {
            short ev = 0;
            if (!wait_fd(fd, POLLOUT, d, &ev)) {
                ::close(fd);
                ::freeaddrinfo(res);
                return Status::unavailable("connect " + endpoint + ": timed out");
            }
            int so = 0;
            socklen_t len = sizeof so;
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
            if (so != 0) {
                last = Status::unavailable("connect " + endpoint + ": " + std::strerror(so));
                ::close(fd);
                continue;
            }
        }
        set_nodelay(fd);
        ::freeaddrinfo(res);
        return std::make_unique<tcp_channel>(fd, endpoint);
    }
    ::freeaddrinfo(res);
    return last;
}

tcp_channel::tcp_channel(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) { set_nonblocking(fd_); }

tcp_channel::~tcp_channel() { close(); }

void tcp_channel::close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

Status tcp_channel::write_all(const uint8_t *p, size_t n, deadline d) {
    while (n > 0) {
        ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= size_t(w);
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            short ev = 0;
            if (!wait_fd(fd_, POLLOUT, d, &ev)) return Status::unavailable(peer_ + ": timed out sending");
            continue;
        }
        return Status::unavailable(peer_ + ": send: " + err_text());
    }
    return Status::ok();
}

Status tcp_channel::read_all(uint8_t *p, size_t n, deadline d, const char *what) {
    while (n > 0) {
        ssize_t r = ::recv(fd_, p, n, 0);
        if (r > 0) {
            p += r;
            n -= size_t(r);
            continue;
        }
        if (r == 0) return Status::unavailable(peer_ + ": connection closed (reading the " + std::string(what) + ")");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            short ev = 0;
            if (!wait_fd(fd_, POLLIN, d, &ev))
                return Status::unavailable(peer_ + ": timed out waiting for the " + std::string(what));
            continue;
        }
        return Status::unavailable(peer_ + ": recv: " + err_text());
    }
    return Status::ok();
}

Status tcp_channel::send(const frame_bytes &f, deadline d) {
    if (fd_ < 0) return Status::unavailable(peer_ + ": not connected");
    return write_all(f.data(), f.size(), d);
}

Result<frame_bytes> tcp_channel::recv(deadline d) {
    if (fd_ < 0) return Status::unavailable(peer_ + ": not connected");
    frame_bytes f(HEADER_BYTES);
    DS41RT_RETURN_IF_ERROR(read_all(f.data(), HEADER_BYTES, d, "frame header"));
    auto h = decode_header(f.data(), f.size());
    if (!h) return Status(h.status().code(), peer_ + ": " + h.status().message());
    f.resize(HEADER_BYTES + h->payload_bytes);
    DS41RT_RETURN_IF_ERROR(read_all(f.data() + HEADER_BYTES, h->payload_bytes, d, "frame payload"));
    return f;
}

bool tcp_channel::wait_readable(deadline d) {
    if (fd_ < 0) return true;
    short ev = 0;
    return wait_fd(fd_, POLLIN, d, &ev);
}

// ---- tcp_listener -------------------------------------------------------------------------------

Result<std::unique_ptr<tcp_listener>> tcp_listener::listen(const std::string &endpoint) {
    std::string host;
    int port = 0;
    DS41RT_RETURN_IF_ERROR(split_endpoint(endpoint, &host, &port));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo *res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
        return Status::invalid_argument("listen " + endpoint + ": " + gai_strerror(rc));
    int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0) {
        ::freeaddrinfo(res);
        return Status::io_error("listen " + endpoint + ": socket: " + err_text());
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
        Status st = Status::unavailable("listen " + endpoint + ": " + err_text());
        ::freeaddrinfo(res);
        ::close(fd);
        return st;
    }
    ::freeaddrinfo(res);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len);
    const int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
    set_nonblocking(fd);
    return std::unique_ptr<tcp_listener>(new tcp_listener(fd, bound));
}

tcp_listener::~tcp_listener() {
    if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<tcp_channel>> tcp_listener::accept(deadline d) {
    for (;;) {
        int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
            set_nodelay(fd);
            sockaddr_storage ss{};
            socklen_t len = sizeof ss;
            char buf[INET6_ADDRSTRLEN] = "?";
            int port = 0;
            if (::getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0) {
                if (ss.ss_family == AF_INET) {
                    auto *a = reinterpret_cast<sockaddr_in *>(&ss);
                    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
                    port = ntohs(a->sin_port);
                } else if (ss.ss_family == AF_INET6) {
                    auto *a = reinterpret_cast<sockaddr_in6 *>(&ss);
                    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
                    port = ntohs(a->sin6_port);
                }
            }
            return std::make_unique<tcp_channel>(fd, std::string(buf) + ":" + std::to_string(port));
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::io_error("accept: " + err_text());
        short ev = 0;
        if (!wait_fd(fd_, POLLIN, d, &ev)) return Status::unavailable("accept: timed out");
    }
}

}  // namespace ds41rt::dist
