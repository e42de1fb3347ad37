// ds41rt bench: decode and prefill speed of the engine on the GPU, judged against the device's
// measured copy bandwidth (the decode roofline: weight bytes read per step). Writes bench.json and
// bench.md into --out (docs/perf reports are made from them).
//
// Decode at concurrency C: C sequences, each prefilled with --context tokens, then --decode-steps
// steps of one token per sequence. The C1 step's bytes are counted from the dummy-weight plan of
// the same config (every non-expert tensor of a layer once, plus the routed experts a token
// selects: n_activated_experts of them), so the fraction says how close a step is to reading its
// weights once at copy speed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

#include "app/commands.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/dummy_weights.h"
#include "model/flash_configs.h"
#ifdef DS41RT_HAVE_CUDA
#include "backend/cuda/device_info.h"
#include "backend/cuda/peaks.cuh"
#endif

namespace ds41rt::app {

namespace {

struct bench_args {
    std::string model, model_type, load_format = "dummy", numerics = "official", out = ".", commit = "unknown";
    std::string quant = "official";  // with --model-type: the routed experts' publication
    int layers = -1, context = 128, decode_steps = 16, warmup_steps = 8, prefill_chunk = 8192;
    uint64_t seed = 1;
    std::string concurrency = "1,4,16", prefill = "1024,2048,4096,8192,16384,32768";
};

std::vector<int> parse_list(const std::string &s) {
    std::vector<int> v;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) v.push_back(std::stoi(item));
    return v;
}

// Bytes one C1 decode step reads: per layer every tensor but the routed experts, plus the K
// experts one token selects; the head, final norm and hc_head; one embedding row.
struct step_bytes {
    uint64_t per_layer_sum = 0, head = 0;
    std::vector<uint64_t> layer;
};

step_bytes c1_bytes(const model::model_config &c, const model::dummy_plan &plan) {
    step_bytes b;
    b.layer.assign(size_t(plan.layers), 0);
    std::vector<uint64_t> expert_sum(size_t(plan.layers), 0);
    for (const auto &t : plan.tensors) {
        const int l = t.entry.layer;
        if (l < 0 || l >= plan.layers) {
            if (t.entry.name.rfind("embed.", 0) != 0) b.head += t.bytes;
            else b.head += t.bytes / uint64_t(std::max<int64_t>(1, c.vocab_size));
            continue;
        }
        if (t.entry.name.find(".ffn.experts.") != std::string::npos) expert_sum[size_t(l)] += t.bytes;
        else if (t.entry.name.find(".engram.embed.") != std::string::npos)
            continue;  // a token gathers a few rows: negligible
        else b.layer[size_t(l)] += t.bytes;
    }
    for (int l = 0; l < plan.layers; l++) {
        b.layer[size_t(l)] += expert_sum[size_t(l)] * uint64_t(c.n_activated_experts) / uint64_t(c.n_routed_experts);
        b.per_layer_sum += b.layer[size_t(l)];
    }
    return b;
}

// The weight products of profiled steps (engine::product_times), largest time first, per step
// (`steps` of them): time, the bytes they must move and their FLOPs, the rates these make, and
// those rates as fractions of the copy bandwidth and of the dense FP8 matrix rate measured in the
// same run.
nlohmann::json products_json(std::vector<engine::op_time> times, int steps, double copy_gbps, std::optional<double> fp8_tflops) {
    std::sort(times.begin(), times.end(), [](const engine::op_time &x, const engine::op_time &y) { return x.ms > y.ms; });
    nlohmann::json v = nlohmann::json::array();
    for (const engine::op_time &t : times) {
        const double s = t.ms * 1e-3, gbps = s > 0 ? t.bytes / s / 1e9 : 0, tflops = s > 0 ? t.flops / s / 1e12 : 0;
        nlohmann::json p = {{"name", t.name},
                            {"calls_per_step", double(t.calls) / steps},
                            {"ms_per_step", t.ms / steps},
                            {"bytes_per_step", t.bytes / steps},
                            {"flops_per_step", t.flops / steps},
                            {"gbps", gbps},
                            {"copy_fraction", gbps / copy_gbps},
                            {"tflops", tflops}};
        if (fp8_tflops) p["fp8_fraction"] = tflops / *fp8_tflops;
        v.push_back(p);
    }
    return v;
}

// products_json's rows as a Markdown table, the first `max_rows` of them (a time column in us
// for decode steps, ms for prefills).
std::string products_md(const nlohmann::json &products, size_t max_rows, bool us) {
    std::string md = fmt::format("| product | calls | {} | bytes | GB/s | % of copy | GFLOP | TFLOP/s | % of FP8 rate |\n"
                                 "|---|---|---|---|---|---|---|---|---|\n",
                                 us ? "us / step" : "ms");
    for (size_t i = 0; i < std::min(max_rows, products.size()); i++) {
        const nlohmann::json &p = products[i];
        const double b = double(p["bytes_per_step"]);
        md += fmt::format("| {} | {:g} | {:.1f} | {} | {:.0f} | {:.1f}% | {:.2f} | {:.1f} | {} |\n", std::string(p["name"]),
                          double(p["calls_per_step"]), double(p["ms_per_step"]) * (us ? 1e3 : 1),
                          b >= 1e9 ? fmt::format("{:.2f} GB", b / 1e9) : fmt::format("{:.1f} MB", b / 1e6), double(p["gbps"]),
                          100 * double(p["copy_fraction"]), double(p["flops_per_step"]) / 1e9, double(p["tflops"]),
                          p.contains("fp8_fraction") ? fmt::format("{:.1f}%", 100 * double(p["fp8_fraction"])) : "-");
    }
    if (products.size() > max_rows) md += fmt::format("| ({} more in bench.json) | | | | | | | | |\n", products.size() - max_rows);
    return md;
}

int run_bench(const bench_args &a, const std::string &command_line) {
#ifndef DS41RT_HAVE_CUDA
    (void)a;
    (void)command_line;
    fmt::print(stderr, "bench: this build has no CUDA backend\n");
    return 1;
#else
    using clock = std::chrono::steady_clock;
    auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
    model::model_config cfg;
    if (!a.model_type.empty()) {
        const model::expert_quant q = a.quant == "nvfp4" ? model::expert_quant::NVFP4
                                      : a.quant == "exl3"  ? model::expert_quant::EXL3
                                                           : model::expert_quant::OFFICIAL;
        auto c = model::flash_config(a.model_type == "v4" ? model::arch::V4 : model::arch::V41, q);
        if (!c) return fmt::print(stderr, "bench: {}\n", c.status().to_string()), 1;
        cfg = c.value();
    } else {
        auto c = model::load_config(a.model);
        if (!c) return fmt::print(stderr, "bench: {}\n", c.status().to_string()), 1;
        cfg = c.value();
    }
    auto dev = backend::cuda::query_device(0);
    if (!dev) return fmt::print(stderr, "bench: {}\n", dev.status().to_string()), 1;
    auto copy = backend::cuda::measure_copy_gbps();
    if (!copy) return fmt::print(stderr, "bench: {}\n", copy.status().to_string()), 1;
    fmt::print(stderr, "bench: {} ({} SMs), driver CUDA {}, copy {:.0f} GB/s\n", dev->name, dev->sm_count,
               backend::cuda::driver_cuda_version(), copy.value());
    // The dense matrix rates the products are judged against, measured here as the copy rate is
    // (a machine without cuBLASLt gets the table without them, and says why).
    std::optional<double> fp8_tflops, bf16_tflops;
    for (auto [kind, out, what] : {std::tuple{backend::cuda::matmul_kind::FP8_E4M3, &fp8_tflops, "FP8"},
                                   std::tuple{backend::cuda::matmul_kind::BF16, &bf16_tflops, "BF16"}}) {
        auto r = backend::cuda::measure_matmul_tflops(kind);
        if (r) *out = r.value();
        fmt::print(stderr, "bench: dense {} matrix rate {}\n", what,
                   r ? fmt::format("{:.0f} TFLOP/s (cuBLASLt, 8192^3)", r.value()) : "not measured: " + r.status().to_string());
    }

    engine::engine_options opt;
    opt.mode = a.numerics == "official" ? engine::numerics::OFFICIAL : engine::numerics::TRANSFORMERS;
    opt.backend = engine::backend_kind::CUDA;
    opt.profile = true;
    auto t0 = clock::now();
    auto opened = a.load_format == "dummy" ? engine::engine::open_dummy(cfg, a.layers, a.seed, opt)
                                           : engine::engine::open(a.model, opt);
    if (!opened) return fmt::print(stderr, "bench: {}\n", opened.status().to_string()), 1;
    engine::engine &eng = *opened.value();
    const double load_s = secs(clock::now() - t0);
    const model::model_config &c = eng.config();
    fmt::print(stderr, "bench: loaded {} layers in {:.1f} s\n", c.n_layers, load_s);

    std::mt19937 rng(uint32_t(a.seed));
    auto tokens = [&](int n) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (auto &t : v) t = int32_t(rng() % uint32_t(c.vocab_size));
        return v;
    };
    nlohmann::json j;
    j["device"] = dev->name;
    j["sm_count"] = dev->sm_count;
    j["driver_cuda"] = backend::cuda::driver_cuda_version();
    j["commit"] = a.commit;
    j["command"] = command_line;
    j["model"] = a.model_type.empty() ? a.model : "built-in " + a.model_type + " Flash config";
    j["routed_experts"] = model::expert_quant_name(c.routed_quant);
    j["load_format"] = a.load_format;
    j["numerics"] = a.numerics;
    j["layers"] = c.n_layers;
    j["copy_gbps"] = copy.value();
    if (fp8_tflops) j["fp8_tflops"] = *fp8_tflops;
    if (bf16_tflops) j["bf16_tflops"] = *bf16_tflops;
    j["load_s"] = load_s;
    j["decode_sampling"] = "greedy, picked by the engine (step_sampled: on the device)";

    std::vector<Tensor> out;
    double c1_step_ms = 0;
    for (int C : parse_list(a.concurrency)) {
        std::vector<engine::step_input> in;
        for (int i = 0; i < C; i++) {
            in.push_back({eng.create_sequence(), tokens(a.context)});
            Status st = eng.step({in.back()}, &out);
            if (!st.is_ok()) return fmt::print(stderr, "bench: prefill: {}\n", st.to_string()), 1;
        }
        // Decode rows are sampled (greedy) by the engine, as serve's scheduler asks: on the device,
        // so a step returns its picks and no logits rows.
        std::vector<engine::sample_result> picks;
        for (auto &s : in) {
            s.tokens = tokens(1);
            s.logits = engine::logit_rows::SAMPLE;
        }
        // Untimed steps first: a row count's step graphs are captured on its second step, and one
        // capture inside the timed steps moved a 32-step C1 mean by up to 0.2 ms between runs.
        // Unprofiled, as the timed steps: a profiled step runs eagerly, so warm-up steps left
        // profiled (the engine starts so, and the previous concurrency ends so) captured nothing,
        // and every concurrency's second timed step was the capture (6.7-11.5 ms against a C1
        // median of 4.8, H200 2026-12-02). Eight of them: two ratio-4 compression cycles, so every
        // kind of step has run before the timing starts.
        eng.set_profile(false);
        Status st;
        for (int k = 0; k < a.warmup_steps; k++) {
            for (auto &s : in) s.tokens = tokens(1);
            if (!(st = eng.step_sampled(in, &out, &picks)).is_ok())
                return fmt::print(stderr, "bench: decode: {}\n", st.to_string()), 1;
        }
        // Timed with the device sections off (their events cost launches of their own); the
        // host's issue time comes either way. C1 then runs again with the sections on.
        // Each step returns once its picks are on the host, so its wall time is the step's.
        std::vector<double> step_ms;
        auto decode = [&](bool profile) -> Status {
            eng.set_profile(profile);
            eng.reset_op_times();
            step_ms.clear();
            for (int k = 0; k < a.decode_steps; k++) {
                for (auto &s : in) s.tokens = tokens(1);
                const auto s0 = clock::now();
                DS41RT_RETURN_IF_ERROR(eng.step_sampled(in, &out, &picks));
                step_ms.push_back(secs(clock::now() - s0) * 1e3);
            }
            return Status::ok();
        };
        auto d0 = clock::now();
        if (!(st = decode(false)).is_ok()) return fmt::print(stderr, "bench: decode: {}\n", st.to_string()), 1;
        const double ms = secs(clock::now() - d0) * 1e3 / a.decode_steps;
        std::vector<double> sorted = step_ms;
        std::sort(sorted.begin(), sorted.end());
        const double median_ms = sorted[sorted.size() / 2], min_ms = sorted.front(), max_ms = sorted.back();
        const double p90_ms = sorted[std::min(sorted.size() - 1, sorted.size() * 9 / 10)];
        const std::vector<double> graph_step_ms = step_ms;  // in step order: a slow step's period says what it is
        double issue_ms = 0;
        for (auto &t : eng.op_times())
            if (t.name == "host.issue") issue_ms = t.ms / a.decode_steps;
        // The same steps with every kernel launched eagerly (no CUDA graphs), for comparison.
        eng.set_cuda_graphs(false);
        auto e0 = clock::now();
        if (!(st = decode(false)).is_ok()) return fmt::print(stderr, "bench: decode: {}\n", st.to_string()), 1;
        const double eager_ms = secs(clock::now() - e0) * 1e3 / a.decode_steps;
        const std::vector<double> eager_step_ms = step_ms;
        eng.set_cuda_graphs(true);
        // Every concurrency's steps once more with the sections on (eager, one stream: the
        // sections are events on it, so side branches run in line there).
        if (C == 1) c1_step_ms = ms;
        if (!(st = decode(true)).is_ok()) return fmt::print(stderr, "bench: decode: {}\n", st.to_string()), 1;
        double total = 0;
        for (auto &t : eng.op_times())
            if (t.name != "host.issue") total += t.ms;
        nlohmann::json sec = nlohmann::json::array();
        for (auto &t : eng.op_times())
            if (t.name != "host.issue")
                sec.push_back({{"name", t.name}, {"ms_per_step", t.ms / a.decode_steps}, {"share", total > 0 ? t.ms / total : 0}});
        if (C == 1) {
            j["c1_sections"] = sec;
            j["c1_sections_ms_per_step"] = total / a.decode_steps;
        }
        const nlohmann::json products = products_json(eng.product_times(), a.decode_steps, copy.value(), fp8_tflops);
        j["decode"].push_back({{"concurrency", C}, {"ms_per_step", ms}, {"median_ms_per_step", median_ms},
                               {"min_ms_per_step", min_ms}, {"tok_s", C * 1e3 / ms},
                               {"ms_per_layer", ms / c.n_layers}, {"host_issue_ms_per_step", issue_ms},
                               {"eager_ms_per_step", eager_ms}, {"p90_ms_per_step", p90_ms},
                               {"max_ms_per_step", max_ms}, {"step_ms", graph_step_ms}, {"eager_step_ms", eager_step_ms},
                               {"sections", sec}, {"products", products}});
        fmt::print(stderr,
                   "bench: decode C{}: {:.2f} ms per step ({:.3f} ms per layer), {:.1f} tok/s; steps median {:.2f}, "
                   "min {:.2f}, p90 {:.2f}, max {:.2f} ms; host issue {:.2f} ms per step; without CUDA graphs {:.2f} ms "
                   "per step\n",
                   C, ms, ms / c.n_layers, C * 1e3 / ms, median_ms, min_ms, p90_ms, max_ms, issue_ms, eager_ms);
        fmt::print(stderr, "bench: decode C{} steps, ms: graphs {:.2f}; eager {:.2f}\n", C, fmt::join(graph_step_ms, " "),
                   fmt::join(eager_step_ms, " "));
        for (auto &s : in) eng.free_sequence(s.seq);
    }
    auto plan = model::plan_dummy_weights(cfg, c.n_layers);
    if (plan && c1_step_ms > 0) {
        const step_bytes b = c1_bytes(cfg, plan.value());
        const double bytes = double(b.per_layer_sum + b.head);
        const double roof_ms = bytes / (copy.value() * 1e9) * 1e3;
        j["c1_bytes_per_step"] = bytes;
        j["c1_bytes_per_layer_mean"] = double(b.per_layer_sum) / c.n_layers;
        j["c1_roofline_ms"] = roof_ms;
        j["c1_roofline_fraction"] = roof_ms / c1_step_ms;
        fmt::print(stderr, "bench: C1 reads {:.2f} GB per step ({:.1f} MB per layer): roofline {:.3f} ms, {:.1f}% of it\n",
                   bytes / 1e9, double(b.per_layer_sum) / c.n_layers / 1e6, roof_ms, 100 * roof_ms / c1_step_ms);
    }
    int prefill_rc = 0;
    for (int P : parse_list(a.prefill)) {
        engine::seq_id s = eng.create_sequence();
        const std::vector<int32_t> ids = tokens(P);
        const int chunk = a.prefill_chunk > 0 ? a.prefill_chunk : P;
        eng.set_profile(true);
        eng.reset_op_times();
        auto p0 = clock::now();
        // In steps of at most `chunk` tokens, as the server feeds a prompt; the last row's logits
        // only, as the server asks for them (the head over every prompt row was up to a tenth of a
        // long prefill until session 6).
        Status st;
        for (int done = 0; done < P && st.is_ok();) {
            const int n = std::min(chunk, P - done);
            st = eng.step({{s, std::vector<int32_t>(ids.begin() + done, ids.begin() + done + n),
                            done + n == P ? engine::logit_rows::LAST : engine::logit_rows::NONE}},
                          &out);
            done += n;
        }
        const double sec = secs(clock::now() - p0);
        eng.free_sequence(s);
        if (!st.is_ok()) {  // recorded, and the longer prompts are not tried (out of memory, most likely)
            fmt::print(stderr, "bench: prefill {}: {}\n", P, st.to_string());
            j["prefill_failed"] = {{"tokens", P}, {"error", st.to_string()}};
            prefill_rc = 1;
            break;
        }
        nlohmann::json sec_ms = nlohmann::json::object();
        for (auto &t : eng.op_times()) sec_ms[t.name] = t.ms;
        j["prefill"].push_back({{"tokens", P}, {"chunk", std::min(chunk, P)}, {"seconds", sec}, {"tok_s", P / sec}, {"sections_ms", sec_ms},
                                {"products", products_json(eng.product_times(), 1, copy.value(), fp8_tflops)}});
        fmt::print(stderr, "bench: prefill {} tokens ({} a step): {:.2f} s, {:.0f} tok/s\n", P, std::min(chunk, P), sec, P / sec);
    }

    std::filesystem::create_directories(a.out);
    std::ofstream(a.out + "/bench.json") << j.dump(2) << "\n";
    std::ofstream md(a.out + "/bench.md");
    md << fmt::format("# ds41rt bench\n\nDevice {} ({} SMs), driver CUDA {}, commit {}, {} numerics, {} layers "
                      "({} weights).\nCommand: `{}`\n\nMeasured copy bandwidth: {:.0f} GB/s. Load: {:.1f} s.\n\n",
                      dev->name, dev->sm_count, backend::cuda::driver_cuda_version(), a.commit, a.numerics,
                      c.n_layers, a.load_format, command_line, copy.value(), load_s);
    const auto rate = [&](const char *key) {
        return j.contains(key) ? fmt::format("{:.0f} TFLOP/s", double(j[key])) : std::string("not measured");
    };
    md << fmt::format("Measured dense matrix rates (cuBLASLt, 8192^3, random operands): FP8 {}, BF16 {}.\n\n",
                      rate("fp8_tflops"), rate("bf16_tflops"));
    md << "| concurrency | ms / step | median / min ms | ms / layer | tok/s | host issue ms / step | ms / step "
          "without graphs |\n|---|---|---|---|---|---|---|\n";
    for (auto &d : j["decode"])
        md << fmt::format("| {} | {:.2f} | {:.2f} / {:.2f} | {:.3f} | {:.1f} | {:.2f} | {:.2f} |\n", int(d["concurrency"]),
                          double(d["ms_per_step"]), double(d["median_ms_per_step"]), double(d["min_ms_per_step"]),
                          double(d["ms_per_layer"]), double(d["tok_s"]), double(d["host_issue_ms_per_step"]),
                          double(d["eager_ms_per_step"]));
    if (j.contains("c1_roofline_fraction"))
        md << fmt::format("\nC1 step reads {:.2f} GB ({:.1f} MB per layer on average): {:.3f} ms at copy speed, "
                          "{:.1f}% of the roofline.\n",
                          double(j["c1_bytes_per_step"]) / 1e9, double(j["c1_bytes_per_layer_mean"]) / 1e6,
                          double(j["c1_roofline_ms"]), 100 * double(j["c1_roofline_fraction"]));
    if (!j["decode"].empty()) {  // sections by concurrency: ms a step (share), profiled steps
        std::vector<std::string> names;
        for (auto &d : j["decode"])
            for (auto &s : d["sections"])
                if (std::find(names.begin(), names.end(), std::string(s["name"])) == names.end()) names.push_back(s["name"]);
        std::sort(names.begin(), names.end());
        md << "\n| section (profiled steps) |";
        for (auto &d : j["decode"]) md << fmt::format(" C{} ms / step (share) |", int(d["concurrency"]));
        md << "\n|---|";
        for (size_t i = 0; i < j["decode"].size(); i++) md << "---|";
        md << "\n";
        for (const std::string &n : names) {
            md << "| " << n << " |";
            for (auto &d : j["decode"]) {
                std::string cell = " - |";
                for (auto &s : d["sections"])
                    if (s["name"] == n)
                        cell = fmt::format(" {:.3f} ({:.1f}%) |", double(s["ms_per_step"]), 100 * double(s["share"]));
                md << cell;
            }
            md << "\n";
        }
    }
    // The weight products per kernel: each product's launches (a GEMV; a GEMM with its
    // pre-passes; a layer's routed experts, five launches) between two events of a profiled
    // (eager) step, summed over the layers under one label.
    for (auto &d : j["decode"])
        if (int(d["concurrency"]) == 1 && !d["products"].empty())
            md << "\nWeight products of a C1 step (profiled steps, eager; bytes: weights once, plus the input and "
                  "output rows):\n\n"
               << products_md(d["products"], 24, true);
    if (j.contains("prefill"))
        for (auto &p : j["prefill"])
            if (!p["products"].empty())
                md << fmt::format("\nWeight products of the {}-token prefill ({} tokens a step):\n\n", int(p["tokens"]),
                                  int(p["chunk"]))
                   << products_md(p["products"], 16, false);
    if (j.contains("prefill")) {
        md << "\n| prefill tokens | tokens a step | seconds | tok/s | largest sections (ms) |\n|---|---|---|---|---|\n";
        for (auto &p : j["prefill"]) {
            std::vector<std::pair<double, std::string>> v;
            for (auto &[k, ms] : p["sections_ms"].items()) v.push_back({double(ms), k});
            std::sort(v.rbegin(), v.rend());
            std::string top;
            for (size_t i = 0; i < std::min<size_t>(4, v.size()); i++)
                top += fmt::format("{}{} {:.0f}", i ? ", " : "", v[i].second, v[i].first);
            md << fmt::format("| {} | {} | {:.2f} | {:.0f} | {} |\n", int(p["tokens"]), int(p["chunk"]), double(p["seconds"]),
                              double(p["tok_s"]), top);
        }
    }
    if (j.contains("prefill_failed"))
        md << fmt::format("\nPrefill of {} tokens failed: {}\n", int(j["prefill_failed"]["tokens"]),
                          std::string(j["prefill_failed"]["error"]));
    fmt::print(stderr, "bench: wrote {}/bench.json and bench.md\n", a.out);
    return prefill_rc;
#endif
}

}  // namespace

void register_bench(CLI::App &app, command_list &cmds) {
    auto args = std::make_shared<bench_args>();
    auto *sub = app.add_subcommand("bench", "decode and prefill speed on the GPU against the measured copy roofline");
    auto *mt = sub->add_option("--model-type", args->model_type, "built-in full-size config: v41 (or v4)")
                   ->check(CLI::IsMember({"v41", "v4"}));
    sub->add_option("--model", args->model, "checkpoint directory (or a directory with a config.json)")->excludes(mt);
    sub->add_option("--quant", args->quant,
                    "with --model-type: routed experts as official (MXFP4, default), nvfp4 (ModelOpt) or exl3 "
                    "(K=2 MCG), the publication's quantization_config")
        ->check(CLI::IsMember({"official", "nvfp4", "exl3"}))
        ->needs(mt);
    sub->add_option("--load-format", args->load_format, "dummy (random full-size weights, default) or checkpoint")
        ->check(CLI::IsMember({"dummy", "checkpoint"}));
    sub->add_option("--layers", args->layers, "dummy weights: the first N layers only (-1: all)");
    sub->add_option("--numerics", args->numerics, "official (default) or transformers")
        ->check(CLI::IsMember({"transformers", "official"}));
    sub->add_option("--context", args->context, "tokens prefilled before decoding")->check(CLI::Range(1, 1 << 20));
    sub->add_option("--decode-steps", args->decode_steps, "timed decode steps")->check(CLI::Range(1, 100000));
    sub->add_option("--warmup-steps", args->warmup_steps, "untimed decode steps first (graphs are captured on the second)")
        ->check(CLI::Range(0, 1000));
    sub->add_option("--concurrency", args->concurrency, "comma-separated decode concurrencies");
    sub->add_option("--prefill", args->prefill, "comma-separated prefill prompt lengths (empty: none)");
    sub->add_option("--prefill-chunk", args->prefill_chunk,
                    "most prompt tokens a prefill step takes, as serve's --prefill-chunk (0: the whole prompt in one step)")
        ->check(CLI::Range(0, 1 << 20));
    sub->add_option("--seed", args->seed, "dummy weights and token ids");
    sub->add_option("--commit", args->commit, "commit label recorded in the report");
    sub->add_option("--out", args->out, "directory for bench.json and bench.md");
    cmds.push_back({sub, [args, sub] {
                        if (args->model.empty() && args->model_type.empty()) {
                            fmt::print(stderr, "bench: give --model-type or --model\n");
                            return 2;
                        }
                        std::string cl = "ds41rt bench";
                        for (const auto &o : sub->get_options())
                            if (o->count() > 0 && !o->get_lnames().empty())
                                cl += " --" + o->get_lnames()[0] + " " + o->as<std::string>();
                        return run_bench(*args, cl);
                    }});
}

}  // namespace ds41rt::app
