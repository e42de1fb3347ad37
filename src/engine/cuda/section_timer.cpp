#include "engine/cuda/section_timer.h"

namespace ds41rt::engine::gpu {

section_timer::~section_timer() {
    for (auto &o : stack_) free_.push_back(o.start), free_.push_back(o.stop);
    for (auto &o : closed_) free_.push_back(o.start), free_.push_back(o.stop);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t section_timer::event() {
    if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) (void)cudaGetLastError();
    return e;
}

void section_timer::begin(std::string name, cudaStream_t s, double bytes, double flops) {
    if (!on_) return;
    open_section o{std::move(name), event(), event(), bytes, flops};
    cudaEventRecord(o.start, s);
    stack_.push_back(o);
}

void section_timer::end(cudaStream_t s) {
    if (!on_ || stack_.empty()) return;
    open_section o = std::move(stack_.back());
    stack_.pop_back();
    cudaEventRecord(o.stop, s);
    closed_.push_back(std::move(o));
}

void section_timer::collect() {
    if (!on_) return;
    for (auto &o : stack_) free_.push_back(o.start), free_.push_back(o.stop);  // left open by an error
    stack_.clear();
    for (auto &o : closed_) {
        float ms = 0;
        if (cudaEventSynchronize(o.stop) == cudaSuccess && cudaEventElapsedTime(&ms, o.start, o.stop) == cudaSuccess) {
            op_time &t = totals_[o.name];
            t.name = o.name;
            t.ms += ms;
            t.calls++;
            t.bytes += o.bytes;
            t.flops += o.flops;
        } else {
            (void)cudaGetLastError();
        }
        free_.push_back(o.start);
        free_.push_back(o.stop);
    }
    closed_.clear();
}

void section_timer::add_host(const char *name, double ms) {
    op_time &t = totals_[name];
    t.name = name;
    t.ms += ms;
    t.calls++;
}

std::vector<op_time> section_timer::times() const {
    std::vector<op_time> v;
    for (auto &[n, t] : totals_) v.push_back(t);
    return v;
}

}  // namespace ds41rt::engine::gpu
