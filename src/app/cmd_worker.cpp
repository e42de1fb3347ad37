// ds41rt worker: an expert worker. Loads, from its own copy of the checkpoint, its TP slice of
// the routed experts of the layers the plan places on it (--rank is its index in the plan's
// workers), then answers expert requests over TCP until SIGINT or SIGTERM (dist/worker.h).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/commands.h"
#include "dist/plan.h"
#include "dist/tcp_transport.h"
#include "dist/worker.h"
#include "model/config.h"
#include "model/flash_configs.h"

namespace ds41rt::app {

namespace {

struct worker_args {
    std::string model;
    std::string plan;
    int rank = 0;
    std::string listen;
    int device = -1;
    std::string load_format = "checkpoint", model_type;
    uint64_t seed = 1;
};

std::atomic<bool> g_stop{false};

int run_worker(const worker_args &a) {
    std::signal(SIGPIPE, SIG_IGN);
    std::ifstream in(a.plan);
    if (!in) {
        spdlog::error("worker: cannot read the plan {}", a.plan);
        return 1;
    }
    std::stringstream text;
    text << in.rdbuf();
    auto plan = dist::parse_plan(text.str());
    if (!plan) {
        spdlog::error("worker: {}: {}", a.plan, plan.status().to_string());
        return 1;
    }
    if (a.rank < 0 || a.rank >= int(plan->workers.size())) {
        spdlog::error("worker: --rank {} is not a worker of {} ({} workers)", a.rank, a.plan, plan->workers.size());
        return 1;
    }
    const std::string listen = a.listen.empty() ? plan->workers[size_t(a.rank)].endpoint : a.listen;
    Result<std::unique_ptr<dist::expert_worker>> w = Status::internal("unset");
    if (a.load_format == "dummy") {
        Result<model::model_config> cfg = a.model_type.empty()
                                              ? model::load_config(a.model)
                                              : model::flash_config(a.model_type == "v4" ? model::arch::V4 : model::arch::V41);
        if (!cfg) {
            spdlog::error("worker: {}", cfg.status().to_string());
            return 1;
        }
        w = dist::expert_worker::load_dummy(*cfg, *plan, a.rank, a.device, a.seed);
    } else {
        w = dist::expert_worker::load(a.model, *plan, a.rank, a.device);
    }
    if (!w) {
        spdlog::error("worker: {}", w.status().to_string());
        return 1;
    }
    auto l = dist::tcp_listener::listen(listen);
    if (!l) {
        spdlog::error("worker: {}", l.status().to_string());
        return 1;
    }
    std::string layers;
    for (int x : (*w)->layers()) layers += (layers.empty() ? "" : ",") + std::to_string(x);
    spdlog::info("worker {}: layers [{}] of {}, placement version {}, listening on {} (port {})", a.rank, layers,
                 a.load_format == "dummy" ? "dummy weights" : a.model, plan->version(), listen, (*l)->port());
    std::signal(SIGINT, [](int) { g_stop = true; });
    std::signal(SIGTERM, [](int) { g_stop = true; });
    Status st = (*w)->serve(**l, g_stop);
    if (!st) {
        spdlog::error("worker: {}", st.to_string());
        return 1;
    }
    spdlog::info("worker {}: stopped", a.rank);
    return 0;
}

}  // namespace

void register_worker(CLI::App &app, command_list &cmds) {
    auto args = std::make_shared<worker_args>();
    auto *sub = app.add_subcommand("worker", "expert worker: serves its TP slice of the plan's remote layers over TCP (NCCL data path for GPU workers)");
    sub->add_option("--model", args->model, "checkpoint directory (this worker's own copy; dummy: its config.json)");
    sub->add_option("--model-type", args->model_type, "dummy weights: the built-in full-size config, v41 (or v4)")
        ->check(CLI::IsMember({"v41", "v4"}));
    sub->add_option("--load-format", args->load_format,
                    "checkpoint (default) or dummy (slices filled on the GPU from --seed, as the coordinator's "
                    "`--load-format dummy` fills the whole tensors; needs --device)")
        ->check(CLI::IsMember({"checkpoint", "dummy"}));
    sub->add_option("--seed", args->seed, "dummy weights: the coordinator's seed");
    sub->add_option("--plan", args->plan, "plan.json (the coordinator's; versions are compared)")->required();
    sub->add_option("--rank", args->rank, "this worker's index in the plan's workers")->required();
    sub->add_option("--listen", args->listen, "host:port to listen on (default: the plan's endpoint for --rank)");
    sub->add_option("--device", args->device, "GPU to hold the slices on (-1: the CPU backend)")
        ->check(CLI::Range(-1, 1023));
    cmds.push_back({sub, [args] {
                        if (args->model.empty() && (args->load_format != "dummy" || args->model_type.empty())) {
                            spdlog::error("worker: give --model (or --load-format dummy --model-type v41)");
                            return 2;
                        }
                        return run_worker(*args);
                    }});
}

}  // namespace ds41rt::app
