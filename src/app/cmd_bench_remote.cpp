// ds41rt bench-remote: what a remote expert layer costs, over TCP and over NCCL, against expert
// workers already running the plan (`ds41rt worker --load-format dummy --device N` with the same
// plan and --seed: full-size V4.1 slices in seconds). Writes bench_remote.json and
// bench_remote.md into --out (docs/perf reports are made from them).
//
// Per transport: (1) the round trip of one remote layer, timed from the coordinator's side over
// --iters exchanges at each of --rows (C1, C16): TCP sends host rows and routes and adds the
// partials on the host (experts/remote); NCCL sends device rows and routes and adds the partials
// on the device (experts/cuda/nccl_remote), each exchange synchronised on the host. (2) decode
// with the GPU engine on dummy weights (the plan's first num_layers layers) and those remote
// layers: ms per step and tok/s at each concurrency of --rows. A GPU worker serves both
// transports, so the two runs meet the same workers.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "app/commands.h"
#include "dist/local_gpus.h"
#include "dist/plan.h"
#include "engine/engine.h"
#include "experts/from_plan.h"
#include "experts/remote.h"
#include "model/config.h"
#include "model/flash_configs.h"
#ifdef DS41RT_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/device_info.h"
#include "backend/cuda/peaks.cuh"
#endif
#ifdef DS41RT_HAVE_NCCL
#include "experts/cuda/nccl_remote.h"
#endif

namespace ds41rt::app {

namespace {

struct bench_remote_args {
    std::string plan, model_type = "v41", model, numerics = "official", out = ".", commit = "unknown";
    std::string rows = "1,16", transports = "tcp,nccl";
    int iters = 200, decode_steps = 16, context = 32, timeout_ms = 10000;
    uint64_t seed = 1;
};

std::vector<int> ints(const std::string &s) {
    std::vector<int> v;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) v.push_back(std::stoi(item));
    return v;
}
std::vector<std::string> words(const std::string &s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) v.push_back(item);
    return v;
}

struct stats {
    double mean_us = 0, p50_us = 0, p90_us = 0, min_us = 0;
};
stats summarize(std::vector<double> us) {
    stats s;
    if (us.empty()) return s;
    std::sort(us.begin(), us.end());
    s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / double(us.size());
    s.p50_us = us[us.size() / 2];
    s.p90_us = us[std::min(us.size() - 1, us.size() * 9 / 10)];
    s.min_us = us.front();
    return s;
}

// Rows of random hidden states and K distinct routes each (what a router gives one layer).
struct layer_input {
    std::vector<float> x;
    std::vector<int32_t> ids;
    std::vector<float> w;
    backend::cpu::route_table rt;
};
layer_input random_input(const model::model_config &c, int rows, std::mt19937 &rng) {
    layer_input in;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    in.x.resize(size_t(rows) * size_t(c.dim));
    for (float &v : in.x) v = nd(rng);
    in.rt.offsets.push_back(0);
    const int K = int(c.n_activated_experts), E = int(c.n_routed_experts);
    for (int r = 0; r < rows; r++) {
        std::vector<int32_t> pick(static_cast<size_t>(E));
        std::iota(pick.begin(), pick.end(), 0);
        std::shuffle(pick.begin(), pick.end(), rng);
        std::sort(pick.begin(), pick.begin() + K);
        for (int k = 0; k < K; k++) {
            const float wt = 1.0f / float(K);
            in.ids.push_back(pick[size_t(k)]);
            in.w.push_back(wt);
            in.rt.routes.push_back({uint32_t(pick[size_t(k)]), wt});
        }
        in.rt.offsets.push_back(uint32_t(in.rt.routes.size()));
    }
    return in;
}

int run_bench_remote(const bench_remote_args &a, const std::string &command_line) {
#ifndef DS41RT_HAVE_CUDA
    (void)a;
    (void)command_line;
    fmt::print(stderr, "bench-remote: this build has no CUDA backend\n");
    return 1;
#else
    using clock = std::chrono::steady_clock;
    auto us_since = [](clock::time_point t0) { return std::chrono::duration<double, std::micro>(clock::now() - t0).count(); };
    std::ifstream pf(a.plan);
    if (!pf) return fmt::print(stderr, "bench-remote: cannot read {}\n", a.plan), 1;
    std::stringstream text;
    text << pf.rdbuf();
    auto plan = dist::parse_plan(text.str());
    if (!plan) return fmt::print(stderr, "bench-remote: {}: {}\n", a.plan, plan.status().to_string()), 1;
    Status vst = dist::validate(*plan);
    if (!vst) return fmt::print(stderr, "bench-remote: {}: {}\n", a.plan, vst.to_string()), 1;
    const model::expert_quant quant = plan->format == "exl3"    ? model::expert_quant::EXL3
                                      : plan->format == "nvfp4" ? model::expert_quant::NVFP4
                                                                : model::expert_quant::OFFICIAL;
    auto cfg = a.model.empty() ? model::flash_config(a.model_type == "v4" ? model::arch::V4 : model::arch::V41, quant)
                               : model::load_config(a.model);
    if (!cfg) return fmt::print(stderr, "bench-remote: {}\n", cfg.status().to_string()), 1;
    model::model_config c = cfg.value();
    // Layers the plan holds on coordinator GPUs >= 1 (`ds41rt plan --gpus 2`): in-process dummy
    // workers there (dist/local_gpus); from here on the plan is the rewritten one.
    dist::Plan run_plan;
    auto local = dist::local_gpu_workers::start(
        *plan, true, [&](const dist::Plan &p, int rank, int device) { return dist::expert_worker::load_dummy(c, p, rank, device, a.seed); },
        &run_plan);
    if (!local) return fmt::print(stderr, "bench-remote: {}: {}\n", a.plan, local.status().to_string()), 1;
    if ((*local)->count() > 0)
        fmt::print(stderr, "bench-remote: {} coordinator GPU(s) beyond GPU 0 served in-process\n", (*local)->count());
    *plan = run_plan;
    int first_remote = -1, n_remote = 0;
    for (const auto &lp : plan->layers)
        if (lp.remote) n_remote++, first_remote = first_remote < 0 ? lp.layer : first_remote;
    if (first_remote < 0) return fmt::print(stderr, "bench-remote: the plan places no layer on workers\n"), 1;
    auto dev = backend::cuda::query_device(0);
    if (!dev) return fmt::print(stderr, "bench-remote: {}\n", dev.status().to_string()), 1;
    const bool official = a.numerics == "official";

    nlohmann::json j;
    j["device"] = dev->name;
    j["driver_cuda"] = backend::cuda::driver_cuda_version();
    j["commit"] = a.commit;
    j["command"] = command_line;
    j["plan"] = a.plan;
    j["placement_version"] = plan->version();
    j["layers"] = plan->num_layers;
    j["local_gpu_workers"] = (*local)->count();
    j["remote_layers"] = n_remote;
    j["tp"] = plan->layers[size_t(first_remote)].tp();
    j["numerics"] = a.numerics;
    std::mt19937 rng(uint32_t(a.seed));
    backend::cpu::expert_numerics nm;
    nm.official = official;
    nm.act_block = c.fp8_block_in;
    nm.kind = backend::cpu::lin::FP4;
    nm.swiglu_limit = c.swiglu_limit;

    for (const std::string &t : words(a.transports)) {
        if (t != "tcp" && t != "nccl") return fmt::print(stderr, "bench-remote: transport '{}' (tcp or nccl)\n", t), 2;
        experts::remote_layout layout = experts::layout_from_plan(*plan, a.timeout_ms, 2000);
        layout.transports.assign(layout.workers.size(),
                                 t == "nccl" ? experts::transport_kind::NCCL : experts::transport_kind::TCP);
        // ---- the round trip of one remote layer ----
        for (int rows : ints(a.rows)) {
            layer_input in = random_input(c, rows, rng);
            std::vector<double> us;
            if (t == "tcp") {
                experts::remote_experts r(layout, c.dim);
                std::vector<float> acc(in.x.size());
                for (int i = 0; i < a.iters + 5; i++) {
                    const auto t0 = clock::now();
                    Status st = r.start(first_remote, nm, in.x.data(), in.rt);
                    if (st) st = r.finish(acc.data());
                    if (!st) return fmt::print(stderr, "bench-remote: tcp: {}\n", st.to_string()), 1;
                    if (i >= 5) us.push_back(us_since(t0));
                }
            } else {
#ifdef DS41RT_HAVE_NCCL
                experts::nccl_remote r(layout, c.dim, 0);
                float *x = nullptr, *w = nullptr, *acc = nullptr;
                int32_t *ids = nullptr;
                cudaMalloc(&x, in.x.size() * 4);
                cudaMalloc(&w, in.w.size() * 4);
                cudaMalloc(&ids, in.ids.size() * 4);
                cudaMalloc(&acc, in.x.size() * 4);
                cudaMemcpy(x, in.x.data(), in.x.size() * 4, cudaMemcpyHostToDevice);
                cudaMemcpy(w, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice);
                cudaMemcpy(ids, in.ids.data(), in.ids.size() * 4, cudaMemcpyHostToDevice);
                cudaStream_t s = nullptr;
                cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
                Status st;
                for (int i = 0; i < a.iters + 5 && st; i++) {
                    const auto t0 = clock::now();
                    st = r.run(first_remote, nm, x, ids, w, rows, int(c.n_activated_experts), acc, s);
                    if (i >= 5) us.push_back(us_since(t0));
                }
                cudaStreamDestroy(s);
                for (void *p : {static_cast<void *>(x), static_cast<void *>(w), static_cast<void *>(ids), static_cast<void *>(acc)})
                    cudaFree(p);
                if (!st) return fmt::print(stderr, "bench-remote: nccl: {}\n", st.to_string()), 1;
#else
                return fmt::print(stderr, "bench-remote: this build has no NCCL\n"), 1;
#endif
            }
            const stats s = summarize(us);
            j["round_trip"].push_back({{"transport", t}, {"rows", rows}, {"layer", first_remote}, {"iters", a.iters},
                                       {"mean_us", s.mean_us}, {"p50_us", s.p50_us}, {"p90_us", s.p90_us},
                                       {"min_us", s.min_us}});
            fmt::print(stderr, "bench-remote: {} round trip, layer {}, rows {}: p50 {:.1f} us, mean {:.1f} us, p90 {:.1f} us\n",
                       t, first_remote, rows, s.p50_us, s.mean_us, s.p90_us);
        }
        // ---- decode with the remote layers ----
        engine::engine_options opt;
        opt.mode = official ? engine::numerics::OFFICIAL : engine::numerics::TRANSFORMERS;
        opt.backend = engine::backend_kind::CUDA;
        opt.remote = layout;
        auto t0 = clock::now();
        auto opened = engine::engine::open_dummy(c, plan->num_layers, a.seed, opt);
        if (!opened) return fmt::print(stderr, "bench-remote: {}\n", opened.status().to_string()), 1;
        engine::engine &eng = *opened.value();
        const double load_s = us_since(t0) / 1e6;
        auto tokens = [&](int n) {
            std::vector<int32_t> v(static_cast<size_t>(n));
            for (auto &tk : v) tk = int32_t(rng() % uint32_t(c.vocab_size));
            return v;
        };
        std::vector<Tensor> out;
        // NCCL layers are part of the captured step; the same run with graphs off shows what
        // that is worth (TCP layers always run eagerly).
        for (const bool graphs : t == "nccl" ? std::vector<bool>{true, false} : std::vector<bool>{true})
        for (int C : ints(a.rows)) {
            eng.set_cuda_graphs(graphs);
            const std::string label = t == "nccl" ? (graphs ? "nccl, in the graphs" : "nccl, graphs off") : t;
            std::vector<engine::step_input> in;
            for (int i = 0; i < C; i++) {
                in.push_back({eng.create_sequence(), tokens(a.context)});
                Status st = eng.step({in.back()}, &out);
                if (!st) return fmt::print(stderr, "bench-remote: {} prefill: {}\n", t, st.to_string()), 1;
            }
            Status st;
            for (int w = 0; w < 2 && st; w++) {  // warm-up: the first step sizes the workspaces, the second captures
                for (auto &s : in) s.tokens = tokens(1);
                st = eng.step(in, &out);
            }
            if (!st) return fmt::print(stderr, "bench-remote: {} decode: {}\n", label, st.to_string()), 1;
            const auto d0 = clock::now();
            for (int k = 0; k < a.decode_steps; k++) {
                for (auto &s : in) s.tokens = tokens(1);
                st = eng.step(in, &out);
                if (!st) return fmt::print(stderr, "bench-remote: {} decode: {}\n", label, st.to_string()), 1;
            }
            const double ms = us_since(d0) / 1e3 / a.decode_steps;
            j["decode"].push_back({{"transport", label}, {"cuda_graphs", graphs}, {"concurrency", C}, {"ms_per_step", ms},
                                   {"tok_s", C * 1e3 / ms}, {"load_s", load_s}});
            fmt::print(stderr, "bench-remote: {} decode C{}: {:.2f} ms per step, {:.1f} tok/s ({} of {} layers remote)\n",
                       label, C, ms, C * 1e3 / ms, n_remote, plan->num_layers);
            for (auto &s : in) eng.free_sequence(s.seq);
        }
    }

    std::filesystem::create_directories(a.out);
    std::ofstream(a.out + "/bench_remote.json") << j.dump(2) << "\n";
    std::ofstream md(a.out + "/bench_remote.md");
    md << fmt::format("# ds41rt bench-remote\n\nDevice {}, driver CUDA {}, commit {}, {} numerics; {} layers, {} "
                      "remote at TP{} (plan {}, version {}).\nCommand: `{}`\n\n",
                      dev->name, backend::cuda::driver_cuda_version(), a.commit, a.numerics, plan->num_layers,
                      n_remote, int(j["tp"]), a.plan, plan->version(), command_line);
    md << "| transport | rows | p50 us | mean us | p90 us | min us |\n|---|---|---|---|---|---|\n";
    for (auto &r : j["round_trip"])
        md << fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", std::string(r["transport"]), int(r["rows"]),
                          double(r["p50_us"]), double(r["mean_us"]), double(r["p90_us"]), double(r["min_us"]));
    md << "\n| transport | concurrency | ms / step | tok/s |\n|---|---|---|---|\n";
    for (auto &d : j["decode"])
        md << fmt::format("| {} | {} | {:.2f} | {:.1f} |\n", std::string(d["transport"]), int(d["concurrency"]),
                          double(d["ms_per_step"]), double(d["tok_s"]));
    fmt::print(stderr, "bench-remote: wrote {}/bench_remote.json and bench_remote.md\n", a.out);
    return 0;
#endif
}

}  // namespace

void register_bench_remote(CLI::App &app, command_list &cmds) {
    auto args = std::make_shared<bench_remote_args>();
    auto *sub = app.add_subcommand(
        "bench-remote", "remote expert layers over TCP and NCCL: per-layer round trip and decode tok/s (workers running)");
    sub->add_option("--plan", args->plan, "plan.json the workers run (GPU workers, --load-format dummy)")->required();
    auto *mt = sub->add_option("--model-type", args->model_type, "built-in full-size config: v41 (default) or v4")
                   ->check(CLI::IsMember({"v41", "v4"}));
    sub->add_option("--model", args->model, "a directory with a config.json instead")->excludes(mt);
    sub->add_option("--seed", args->seed, "dummy weights (the workers' --seed) and inputs");
    sub->add_option("--numerics", args->numerics, "official (default) or transformers")
        ->check(CLI::IsMember({"transformers", "official"}));
    sub->add_option("--rows", args->rows, "comma-separated rows per exchange = decode concurrencies (default 1,16)");
    sub->add_option("--transports", args->transports, "comma-separated: tcp,nccl (default both)");
    sub->add_option("--iters", args->iters, "timed exchanges per row count")->check(CLI::Range(1, 1000000));
    sub->add_option("--decode-steps", args->decode_steps, "timed decode steps")->check(CLI::Range(1, 100000));
    sub->add_option("--context", args->context, "tokens prefilled per sequence")->check(CLI::Range(1, 1 << 20));
    sub->add_option("--timeout-ms", args->timeout_ms, "one layer's exchange deadline")->check(CLI::Range(100, 600000));
    sub->add_option("--commit", args->commit, "commit label recorded in the report");
    sub->add_option("--out", args->out, "directory for bench_remote.json and bench_remote.md");
    cmds.push_back({sub, [args, sub] {
                        std::string cl = "ds41rt bench-remote";
                        for (const auto &o : sub->get_options())
                            if (o->count() > 0 && !o->get_lnames().empty())
                                cl += " --" + o->get_lnames()[0] + " " + o->as<std::string>();
                        return run_bench_remote(*args, cl);
                    }});
}

}  // namespace ds41rt::app
