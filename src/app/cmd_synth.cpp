// ds41rt synth: write a tiny V4.1-architecture checkpoint with deterministic random weights in
// the official storage formats (model/synth.h). scripts/run.sh serves the one it makes with the
// real DeepSeek vocabulary; the compressed token map for that vocabulary comes from
// tools/synth/engram_token_map.py (--token-map). Without --token-map every id is its own class.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>

#include "app/commands.h"
#include "model/synth.h"

namespace ds41rt::app {

namespace {

struct synth_args {
    std::string out;
    std::string token_map;
    model::synth_options opt;
    bool no_mtp = false;
    bool vocab_given = false;
};

int run_synth(synth_args a) {
    if (!a.token_map.empty()) {
        const int64_t asked = a.opt.vocab_size;
        Status st = model::load_synth_token_map(a.token_map, &a.opt);
        if (!st.is_ok()) {
            fmt::print(stderr, "synth: {}\n", st.to_string());
            return 1;
        }
        if (a.vocab_given && asked != a.opt.vocab_size) {
            fmt::print(stderr, "synth: --vocab-size {} disagrees with the token map's {} entries\n", asked,
                       a.opt.vocab_size);
            return 2;
        }
    }
    a.opt.mtp = !a.no_mtp;
    Status st = model::synthesize(a.out, a.opt);
    if (!st.is_ok()) {
        fmt::print(stderr, "synth: {}\n", st.to_string());
        return 1;
    }
    uint64_t bytes = 0;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(a.out, ec))
        if (e.is_regular_file(ec)) bytes += e.file_size(ec);
    fmt::print("synth: wrote {} (vocab {}, dim {}, seed {}, {:.1f} MB)\n", a.out, a.opt.vocab_size, a.opt.dim,
               a.opt.seed, double(bytes) / 1e6);
    return 0;
}

}  // namespace

void register_synth(CLI::App &app, command_list &cmds) {
    auto args = std::make_shared<synth_args>();
    auto *sub = app.add_subcommand("synth", "write a tiny random-weight V4.1 checkpoint (official storage formats)");
    sub->add_option("--out", args->out, "output directory")->required();
    sub->add_option("--seed", args->opt.seed, "random seed (same seed, same bytes)");
    sub->add_option("--dim", args->opt.dim, "hidden size (multiple of 32; default 64)");
    sub->add_option("--moe-intermediate", args->opt.moe_intermediate,
                    "routed experts' intermediate size (multiple of 32; default 32; 96 gives TP2 and TP3 slices)");
    CLI::Option *vocab = sub->add_option("--vocab-size", args->opt.vocab_size, "vocabulary size (default 129280, DeepSeek's)")
                             ->check(CLI::Range(int64_t(8), int64_t(1) << 24));
    sub->add_option("--engram-vocab-size", args->opt.engram_vocab_size,
                    "Engram prime search start (table rows ~ 6x this per layer; default 5000)")
        ->check(CLI::Range(int64_t(2), int64_t(1) << 30));
    sub->add_option("--token-map", args->token_map,
                    "engram token map from tools/synth/engram_token_map.py (sets the vocabulary size)");
    sub->add_flag("--no-mtp", args->no_mtp, "leave out the DSpark stages (mtp.*)");
    cmds.push_back({sub, [args, vocab] {
                        args->vocab_given = vocab->count() > 0;
                        return run_synth(*args);
                    }});
}

}  // namespace ds41rt::app
