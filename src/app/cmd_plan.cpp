// ds41rt plan: the placement dry-run. Computes where every layer's routed experts live and what
// every GPU and worker is charged (dist/placement), prints it, and writes plan.json with --out.
// Exit 0 with a plan, 1 when the plan is infeasible (the message says what does not fit and by
// how much), 2 for bad arguments.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "app/commands.h"
#include "app/plan_table.h"
#include "dist/byte_size.h"
#include "dist/placement.h"

namespace ds41rt::app {

namespace {

struct plan_args {
    std::string model_dir;
    std::string model_type = "deepseek_v41";
    std::string format;
    int exl3_bits = 0;
    int gpus = 1;
    bool cpu = false;
    std::string memory_budget;
    int workers = 0;
    std::string worker_budget;
    std::string worker_endpoints;
    std::string worker_devices;
    int tp = 0;
    int64_t context = 131072;
    int concurrency = 16;
    int prefill_batch = 2048;
    int local_layers = -1;
    int kernel_extent = 0;
    bool no_drafter = false;
    bool no_vision = false;
    std::string engram = "host";
    std::string out;
};

std::vector<std::string> split_list(const std::string &s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) v.push_back(item);
    return v;
}

// One size for all, or one per owner.
Result<std::vector<uint64_t>> sizes_for(const std::string &flag, const std::string &text, int count, uint64_t dflt) {
    std::vector<uint64_t> v;
    const auto items = split_list(text);
    if (items.empty()) return std::vector<uint64_t>(size_t(count), dflt);
    for (const auto &i : items) {
        auto b = dist::parse_size(i);
        if (!b) return Status::invalid_argument(flag + ": " + b.status().message());
        v.push_back(*b);
    }
    if (v.size() == 1) return std::vector<uint64_t>(size_t(count), v[0]);
    if (int(v.size()) != count)
        return Status::invalid_argument(flag + ": " + std::to_string(v.size()) + " sizes for " + std::to_string(count) +
                                        " owners (give one, or one each)");
    return v;
}

Result<dist::placement_input> make_input(const plan_args &a) {
    dist::placement_input in;
    Result<dist::model_source> src =
        a.model_dir.empty() ? dist::builtin_model_source(a.model_type) : dist::load_model_source(a.model_dir);
    if (!src) return src.status();
    in.config = src->config;
    in.format = src->format;
    in.exl3_bits = src->exl3_bits;
    if (!a.format.empty()) {
        auto f = dist::parse_expert_format(a.format);
        if (!f) return f.status();
        in.format = *f;
    }
    if (a.exl3_bits > 0) in.exl3_bits = a.exl3_bits;
    in.cpu_coordinator = a.cpu;
    if (a.cpu) {
        if (!a.memory_budget.empty()) {
            auto b = dist::parse_size(a.memory_budget);
            if (!b) return Status::invalid_argument("--memory-budget: " + b.status().message());
            in.gpu_budgets = {*b};
        }
    } else {
        if (a.gpus < 1) return Status::invalid_argument("--gpus: at least 1 (or --cpu)");
        auto b = sizes_for("--memory-budget", a.memory_budget, a.gpus, dist::DEFAULT_GPU_BUDGET);
        if (!b) return b.status();
        in.gpu_budgets = *b;
    }
    auto wb = sizes_for("--worker-budget", a.worker_budget, a.workers, dist::DEFAULT_GPU_BUDGET);
    if (!wb) return wb.status();
    const auto endpoints = split_list(a.worker_endpoints);
    const auto devices = split_list(a.worker_devices);
    if (!endpoints.empty() && int(endpoints.size()) != a.workers)
        return Status::invalid_argument("--worker-endpoints: " + std::to_string(endpoints.size()) + " for " +
                                        std::to_string(a.workers) + " workers");
    if (!devices.empty() && devices.size() != 1 && int(devices.size()) != a.workers)
        return Status::invalid_argument("--worker-devices: " + std::to_string(devices.size()) + " for " +
                                        std::to_string(a.workers) + " workers");
    for (int i = 0; i < a.workers; i++) {
        dist::worker_spec w;
        w.endpoint = endpoints.empty() ? fmt::format("127.0.0.1:{}", 19441 + i) : endpoints[size_t(i)];
        if (!devices.empty()) {
            const std::string &d = devices[devices.size() == 1 ? 0 : size_t(i)];
            try {
                w.device = d == "cpu" ? -1 : std::stoi(d);
            } catch (const std::exception &) {
                return Status::invalid_argument("--worker-devices: '" + d + "' is not a device number or cpu");
            }
        }
        w.budget = (*wb)[size_t(i)];
        in.workers.push_back(w);
    }
    in.tp = a.tp;
    in.load.context = a.context;
    in.load.concurrency = a.concurrency;
    in.load.prefill_batch = a.prefill_batch;
    in.drafter = !a.no_drafter;
    in.vision = !a.no_vision;
    if (a.engram != "host" && a.engram != "device")
        return Status::invalid_argument("--engram: '" + a.engram + "' is not host or device");
    in.engram_on_device = a.engram == "device";
    in.max_local_layers = a.local_layers;
    in.kernel_extent = a.kernel_extent;
    return in;
}

int run_plan(const plan_args &a) {
    auto in = make_input(a);
    if (!in) {
        fmt::print(stderr, "ds41rt plan: {}\n", in.status().message());
        return 2;
    }
    auto p = dist::place(*in);
    if (!p) {
        const bool infeasible = p.status().message().rfind("infeasible:", 0) == 0;
        fmt::print(stderr, "ds41rt plan: {}\n", p.status().message());
        return infeasible ? 1 : 2;
    }
    fmt::print("{}", plan_table(*in, *p));
    if (!a.out.empty()) {
        std::ofstream f(a.out, std::ios::binary);
        f << dist::to_json(p->plan);
        if (!f) {
            fmt::print(stderr, "ds41rt plan: cannot write {}\n", a.out);
            return 2;
        }
        fmt::print("\nwrote {}\n", a.out);
    }
    return 0;
}

}  // namespace

void register_plan(CLI::App &app, command_list &cmds) {
    auto a = std::make_shared<plan_args>();
    auto *sub = app.add_subcommand("plan", "placement dry-run: where routed experts live and what every device is charged");
    auto *model = sub->add_option("--model", a->model_dir, "checkpoint directory (reads its config.json)");
    sub->add_option("--model-type", a->model_type,
                    "full-size built-in shapes when no --model: deepseek_v41 or deepseek_v4")
        ->capture_default_str()
        ->excludes(model);
    sub->add_option("--format", a->format, "routed-expert format: official, nvfp4 or exl3 (default: from the config)");
    sub->add_option("--exl3-bits", a->exl3_bits, "EXL3 bits per weight K (default: the config's bits, else 2)")
        ->check(CLI::Range(1, 8));
    sub->add_option("--gpus", a->gpus, "coordinator GPUs")->capture_default_str()->check(CLI::Range(1, 16));
    sub->add_flag("--cpu", a->cpu, "coordinator on the CPU backend (budget unchecked unless --memory-budget)");
    sub->add_option("--memory-budget", a->memory_budget,
                    "per coordinator GPU, one or a comma list (32GiB, 141GB); default: an H200 less 1 GiB (" +
                        dist::format_size(dist::DEFAULT_GPU_BUDGET) + ")");
    sub->add_option("--workers", a->workers, "expert workers")->capture_default_str()->check(CLI::Range(0, 64));
    sub->add_option("--worker-budget", a->worker_budget, "per worker, one or a comma list (default as the GPUs)");
    sub->add_option("--worker-endpoints", a->worker_endpoints, "host:port per worker (default 127.0.0.1:19441...)");
    sub->add_option("--worker-devices", a->worker_devices, "CUDA device per worker, or cpu (one or a comma list; default 0)");
    sub->add_option("--tp", a->tp, "TP width of the remote layers (default: all workers); workers form groups of --tp")
        ->check(CLI::Range(0, 64));
    sub->add_option("--context", a->context, "tokens per sequence the KV pool holds")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
    sub->add_option("--concurrency", a->concurrency, "sequences at once")->capture_default_str()->check(CLI::Range(1, 4096));
    sub->add_option("--prefill-batch", a->prefill_batch, "most prompt tokens of one step")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    sub->add_option("--local-layers", a->local_layers, "at most this many expert layers on the coordinator (default: all that fit)")
        ->check(CLI::Range(0, 1024));
    sub->add_option("--kernel-extent", a->kernel_extent,
                    "pad every rank's slice to a multiple of this many channels (the reference's kernels: 128)")
        ->check(CLI::Range(0, 4096));
    sub->add_flag("--no-drafter", a->no_drafter, "leave the MTP / DSpark drafter out");
    sub->add_flag("--no-vision", a->no_vision, "leave the vision tower out");
    sub->add_option("--engram", a->engram, "Engram tables: host (memory-mapped) or device")->capture_default_str();
    sub->add_option("--out", a->out, "write plan.json here");
    cmds.push_back({sub, [a] { return run_plan(*a); }});
}

}  // namespace ds41rt::app
