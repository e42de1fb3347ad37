// Status and Result: how errors travel between rooms (STYLE convention 11).
//
// Three tiers, never mixed:
//  - a broken programmer invariant is DS41RT_ASSERT (aborts with file:line and the condition);
//  - an I/O, CUDA or transport failure, or bad user or checkpoint input, is a Status value with a
//    code and a message naming what failed (file, tensor, byte offset, field);
//  - nothing throws across a room boundary: functions that can fail return Status or Result<T>.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace ds41rt {

enum class status_code {
    OK = 0,
    INVALID_ARGUMENT,   // bad user input (HTTP 400)
    NOT_FOUND,          // a named file, tensor or key is missing
    CORRUPTION,         // a checkpoint or frame is malformed (names tensor and byte offset)
    NOT_SUPPORTED,      // valid but not implemented (HTTP 501)
    IO_ERROR,           // the OS said no
    UNAVAILABLE,        // a peer or resource is gone for now (HTTP 503)
    RESOURCE_EXHAUSTED, // a bounded queue is full: retry later (HTTP 429)
    EXCEEDS_CONTEXT,    // request longer than the context (HTTP 400)
    INTERNAL,
};

const char *status_code_name(status_code c);

class Status {
public:
    Status() = default;
    Status(status_code code, std::string msg) : code_(code), msg_(std::move(msg)) {}

    static Status ok() { return {}; }
    static Status invalid_argument(std::string m) { return {status_code::INVALID_ARGUMENT, std::move(m)}; }
    static Status not_found(std::string m) { return {status_code::NOT_FOUND, std::move(m)}; }
    static Status corruption(std::string m) { return {status_code::CORRUPTION, std::move(m)}; }
    static Status not_supported(std::string m) { return {status_code::NOT_SUPPORTED, std::move(m)}; }
    static Status io_error(std::string m) { return {status_code::IO_ERROR, std::move(m)}; }
    static Status unavailable(std::string m) { return {status_code::UNAVAILABLE, std::move(m)}; }
    static Status resource_exhausted(std::string m) { return {status_code::RESOURCE_EXHAUSTED, std::move(m)}; }
    static Status internal(std::string m) { return {status_code::INTERNAL, std::move(m)}; }

    bool is_ok() const { return code_ == status_code::OK; }
    explicit operator bool() const { return is_ok(); }
    status_code code() const { return code_; }
    const std::string &message() const { return msg_; }
    std::string to_string() const;

private:
    status_code code_ = status_code::OK;
    std::string msg_;
};

// A value or the Status that explains why there is none.
template <typename T>
class Result {
public:
    Result(T v) : v_(std::move(v)) {}
    Result(Status s) : v_(std::move(s)) {}

    bool is_ok() const { return v_.index() == 0; }
    explicit operator bool() const { return is_ok(); }
    T &value() & { return std::get<0>(v_); }
    T &&value() && { return std::get<0>(std::move(v_)); }
    const T &value() const & { return std::get<0>(v_); }
    T *operator->() { return &value(); }
    const T *operator->() const { return &value(); }
    T &operator*() { return value(); }
    const T &operator*() const { return value(); }
    Status status() const { return is_ok() ? Status::ok() : std::get<1>(v_); }
    // The value moved into *out, or the error (out untouched): a loader's one-line assignment.
    Status move_to(T *out) && {
        if (!is_ok()) return std::get<1>(v_);
        *out = std::get<0>(std::move(v_));
        return Status::ok();
    }

private:
    std::variant<T, Status> v_;
};

[[noreturn]] void assert_fail(const char *cond, const char *file, int line, const char *msg);

}  // namespace ds41rt

#define DS41RT_ASSERT(cond)                                                                    \
    do {                                                                                       \
        if (!(cond)) ::ds41rt::assert_fail(#cond, __FILE__, __LINE__, nullptr);                \
    } while (0)
#define DS41RT_ASSERT_MSG(cond, msg)                                                           \
    do {                                                                                       \
        if (!(cond)) ::ds41rt::assert_fail(#cond, __FILE__, __LINE__, (msg));                  \
    } while (0)

// Propagate a failed Status (or Result) to the caller.
#define DS41RT_RETURN_IF_ERROR(expr)                                                           \
    do {                                                                                       \
        ::ds41rt::Status ds41rt_st_ = (expr);                                                  \
        if (!ds41rt_st_.is_ok()) return ds41rt_st_;                                            \
    } while (0)
