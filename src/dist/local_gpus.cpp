#include "dist/local_gpus.h"

#include <spdlog/spdlog.h>

#include <map>

#include "dist/byte_size.h"

namespace ds41rt::dist {

Result<std::unique_ptr<local_gpu_workers>> local_gpu_workers::start(const std::string &model_dir, const Plan &plan,
                                                                      bool nccl, Plan *rewritten) {
    return start(plan, nccl, [&](const Plan &p, int rank, int device) { return expert_worker::load(model_dir, p, rank, device); },
                 rewritten);
}

Result<std::unique_ptr<local_gpu_workers>> local_gpu_workers::start(const Plan &plan, bool nccl, const loader &load,
                                                                      Plan *rewritten) {
    *rewritten = plan;
    std::unique_ptr<local_gpu_workers> out(new local_gpu_workers());
    std::map<int, int> worker_of;  // coordinator GPU -> its worker's index in the rewritten plan
    std::vector<int> gpus;         // in the order of listeners_ (and of workers_ below)
    for (const LayerPlacement &l : plan.layers)
        if (!l.remote && l.local_device > 0 && !worker_of.count(l.local_device)) {
            auto lst = tcp_listener::listen("127.0.0.1:0");
            if (!lst) return Status(lst.status().code(), "local GPU workers: " + lst.status().message());
            worker_of[l.local_device] = int(rewritten->workers.size());
            gpus.push_back(l.local_device);
            WorkerSlot w;
            w.endpoint = "127.0.0.1:" + std::to_string((*lst)->port());
            w.device = l.local_device;
            w.budget = plan.coordinator[size_t(l.local_device)];
            w.transport = nccl ? "nccl" : "tcp";
            rewritten->workers.push_back(w);
            out->listeners_.push_back(std::move(lst.value()));
        }
    if (worker_of.empty()) return out;
    // The planner charges a GPU the dense weights, KV and head of the layers whose experts it
    // holds (a layer split); this engine keeps every layer's dense part on GPU 0 and moves only
    // the experts. GPU 0 must have room for what it takes over.
    DeviceBudget gpu0 = plan.coordinator[0];
    for (const auto &[gpu, index] : worker_of)
        for (const auto &[k, v] : plan.coordinator[size_t(gpu)].charges)
            if ((k.rfind("weights.", 0) == 0 && k != "weights.experts") || k.rfind("kv.", 0) == 0 || k == "logits" ||
                k == "request")
                gpu0.charges[k] += v;
    if (gpu0.budget_bytes != 0 && gpu0.charged() > gpu0.budget_bytes)
        return Status::invalid_argument(
            "the plan charges the dense weights and KV of its GPU >= 1 layers to those GPUs, but the engine keeps them on "
            "GPU 0 (only the experts move): " + gpu0.name + " would hold " + format_gib(gpu0.charged()) + " of its " +
            format_gib(gpu0.budget_bytes) + "; plan with --gpus 1 and a worker on the other GPU");
    for (LayerPlacement &l : rewritten->layers)
        if (!l.remote && l.local_device > 0) {
            l.ranks = {worker_of.at(l.local_device)};
            l.remote = true;
            l.local_device = 0;
        }
    // Workers are loaded before any starts serving, so a load error leaves nothing running.
    for (int gpu : gpus) {
        const int index = worker_of.at(gpu);
        // On a thread of its own: a GPU loader makes its device current, and the caller's thread
        // must keep its own (bench-remote's first eager calls ran on GPU 1 otherwise).
        Result<std::unique_ptr<expert_worker>> w = Status::internal("not loaded");
        std::thread([&] { w = load(*rewritten, index, gpu); }).join();
        if (!w) return Status(w.status().code(), "coordinator GPU " + std::to_string(gpu) + ": " + w.status().message());
        spdlog::info("local GPU {}: {} expert layers, served in-process at {} ({})", gpu, (*w)->layers().size(),
                     rewritten->workers[size_t(index)].endpoint, rewritten->workers[size_t(index)].transport);
        out->workers_.push_back(std::move(w.value()));
    }
    for (size_t i = 0; i < out->workers_.size(); i++)
        out->threads_.emplace_back([w = out->workers_[i].get(), l = out->listeners_[i].get(), stop = &out->stop_] {
            if (Status st = w->serve(*l, *stop); !st) spdlog::error("local GPU worker {}: {}", w->rank(), st.message());
        });
    return out;
}

local_gpu_workers::~local_gpu_workers() {
    stop_ = true;
    for (std::thread &t : threads_) t.join();
}

}  // namespace ds41rt::dist
