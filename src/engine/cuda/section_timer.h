// Device time of named sections of a forward pass (engine_options::profile): a pair of CUDA
// events around each section, read back once the step has synchronised. Sections may repeat
// (per layer); their times add up under one name, and so do the bytes and FLOPs a section is
// given (the weight products' timer, device_model::set_product_timer). Off, it costs nothing
// (host times, one clock read per step, are kept either way).
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace ds41rt::engine::gpu {

class section_timer {
public:
    explicit section_timer(bool on) : on_(on) {}
    ~section_timer();
    section_timer(const section_timer &) = delete;
    section_timer &operator=(const section_timer &) = delete;

    // Marks the start of `name` on stream s; end() closes the innermost open section. bytes and
    // flops are added to the name's totals once the section is collected.
    void begin(std::string name, cudaStream_t s, double bytes = 0, double flops = 0);
    // The engines' sections: no string is made while the timer is off (every step calls this).
    void begin(const char *name, cudaStream_t s) {
        if (on_) begin(std::string(name), s);
    }
    void end(cudaStream_t s);
    // Adds the closed sections' times (after the stream has synchronised) and recycles events.
    void collect();
    std::vector<op_time> times() const;
    void reset() { totals_.clear(); }
    void set_on(bool on) { on_ = on; }
    bool on() const { return on_; }
    // A host wall time, added whether or not the device sections are on.
    void add_host(const char *name, double ms);

private:
    struct open_section {
        std::string name;
        cudaEvent_t start, stop;
        double bytes, flops;
    };
    cudaEvent_t event();
    bool on_;
    std::vector<open_section> stack_, closed_;
    std::vector<cudaEvent_t> free_;
    std::map<std::string, op_time> totals_;
};

// begin() on construction, end() on scope exit.
class section_scope {
public:
    section_scope(section_timer &t, std::string name, cudaStream_t s, double bytes = 0, double flops = 0)
        : t_(t), s_(s) {
        t_.begin(std::move(name), s, bytes, flops);
    }
    section_scope(const section_scope &) = delete;
    section_scope &operator=(const section_scope &) = delete;
    ~section_scope() { t_.end(s_); }

private:
    section_timer &t_;
    cudaStream_t s_;
};

}  // namespace ds41rt::engine::gpu
