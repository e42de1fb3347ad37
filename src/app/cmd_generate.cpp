// ds41rt generate: greedy continuation of a prompt given as token ids, with timing. A debugging
// and benchmarking tool for the engine; the server has its own sampling path.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <sstream>

#include "app/commands.h"
#include "engine/engine.h"

namespace ds41rt::app {

namespace {

struct generate_args {
    std::string model;
    std::string prompt_ids;
    int max_tokens = 16;
    std::string numerics = "transformers";
    std::string backend = "cpu";
};

int run_generate(const generate_args &a) {
    std::vector<int32_t> prompt;
    std::stringstream ss(a.prompt_ids);
    for (std::string item; std::getline(ss, item, ',');) {
        try {
            prompt.push_back(int32_t(std::stol(item)));
        } catch (...) {
            fmt::print(stderr, "generate: --prompt-ids: '{}' is not a token id\n", item);
            return 2;
        }
    }
    if (prompt.empty()) {
        fmt::print(stderr, "generate: --prompt-ids is empty\n");
        return 2;
    }
    engine::engine_options opt;
    opt.mode = a.numerics == "official" ? engine::numerics::OFFICIAL : engine::numerics::TRANSFORMERS;
    opt.backend = a.backend == "cuda" ? engine::backend_kind::CUDA : engine::backend_kind::CPU;
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    auto opened = engine::engine::open(a.model, opt);
    if (!opened) {
        fmt::print(stderr, "generate: {}\n", opened.status().to_string());
        return 1;
    }
    auto &eng = *opened.value();
    auto t1 = clock::now();
    engine::seq_id seq = eng.create_sequence();
    // Greedy picks by the engine (on the device for the GPU engines: no logits row comes back).
    std::vector<Tensor> logits;
    std::vector<engine::sample_result> picks;
    std::vector<int32_t> out;
    Status st = eng.step_sampled({{seq, prompt, engine::logit_rows::SAMPLE}}, &logits, &picks);
    auto t2 = clock::now();
    for (int i = 0; st.is_ok() && i < a.max_tokens; i++) {
        out.push_back(picks[0].token);
        if (i + 1 < a.max_tokens) st = eng.step_sampled({{seq, {out.back()}, engine::logit_rows::SAMPLE}}, &logits, &picks);
    }
    auto t3 = clock::now();
    if (!st.is_ok()) {
        fmt::print(stderr, "generate: {}\n", st.to_string());
        return 1;
    }
    std::string ids;
    for (size_t i = 0; i < out.size(); i++) ids += (i ? "," : "") + std::to_string(out[i]);
    fmt::print("{}\n", ids);
    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    const double decode_ms = ms(t3 - t2);
    fmt::print(stderr, "load {:.1f} ms, prefill {} tokens {:.1f} ms, decode {} tokens {:.1f} ms ({:.2f} tok/s)\n",
               ms(t1 - t0), prompt.size(), ms(t2 - t1), out.size() > 0 ? out.size() - 1 : 0, decode_ms,
               out.size() > 1 ? double(out.size() - 1) / (decode_ms / 1000.0) : 0.0);
    return 0;
}

}  // namespace

void register_generate(CLI::App &app, command_list &cmds) {
    auto args = std::make_shared<generate_args>();
    auto *sub = app.add_subcommand("generate", "greedy continuation of a prompt given as token ids");
    sub->add_option("--model", args->model, "checkpoint directory (config.json + safetensors)")->required();
    sub->add_option("--prompt-ids", args->prompt_ids, "comma-separated prompt token ids")->required();
    sub->add_option("--max-tokens", args->max_tokens, "tokens to generate")->check(CLI::Range(1, 1 << 20));
    sub->add_option("--numerics", args->numerics, "transformers (default) or official")
        ->check(CLI::IsMember({"transformers", "official"}));
    sub->add_option("--backend", args->backend, "cpu (the reference, default) or cuda (V4.1, GPU 0)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmds.push_back({sub, [args] { return run_generate(*args); }});
}

}  // namespace ds41rt::app
