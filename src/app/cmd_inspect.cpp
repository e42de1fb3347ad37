// ds41rt inspect DIR: what a checkpoint directory holds, seen through the tensor catalog.
//
// Prints the architecture and its key shape numbers, then tensor counts and bytes by part, role
// and stored format (counting weights and .scale companions separately, as the index does), then
// the verdict of weights::check(): missing or malformed tensors and unexpected extras. Exit code
// 0 when the checkpoint is complete for the text path, 1 otherwise.
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "app/commands.h"
#include "model/catalog.h"
#include "model/config.h"
#include "model/weights.h"

namespace ds41rt::app {

namespace {

using model::catalog_entry;
using model::model_part;
using model::storage_format;
using model::tensor_role;

std::string human_bytes(uint64_t b) {
    if (b >= 1000000000ull) return fmt::format("{:.2f} GB", double(b) / 1e9);
    if (b >= 1000000ull) return fmt::format("{:.2f} MB", double(b) / 1e6);
    if (b >= 1000ull) return fmt::format("{:.2f} kB", double(b) / 1e3);
    return fmt::format("{} B", b);
}

void print_arch(const model::model_config &c, const std::string &dir) {
    fmt::print("checkpoint   {}\n", dir);
    fmt::print("arch         {}\n", model::arch_name(c.model_arch));
    fmt::print("trunk        vocab {}, dim {}, layers {} (+{} mtp), heads {} x {} (rope {}), q_lora {}, "
               "o {} x {}, window {}, norm eps {:g}\n",
               c.vocab_size, c.dim, c.n_layers, c.n_mtp_layers, c.n_heads, c.head_dim, c.rope_head_dim,
               c.q_lora_rank, c.o_groups, c.o_lora_rank, c.window, c.norm_eps);
    if (c.original_seq_len > 0)
        fmt::print("rope         theta {:g}, compressed layers {:g} with yarn x{:g} from {} (beta {:g}/{:g})\n",
                   c.rope_theta, c.compress_rope_theta, c.rope_factor, c.original_seq_len, c.beta_fast, c.beta_slow);
    else
        fmt::print("rope         theta {:g}, compressed layers {:g}, no yarn\n", c.rope_theta, c.compress_rope_theta);
    fmt::print("compression  ratios {}\n", c.compress_ratios);
    fmt::print("indexer      {} heads x {}, top-{}\n", c.index_n_heads, c.index_head_dim, c.index_topk);
    if (c.model_arch == model::arch::V41)
        fmt::print("sharing      kv sources {}, index sources {}, candidate source {} ({} blocks x {})\n",
                   c.kv_source_layers, c.index_source_layers, c.candidate_source_layer, c.candidate_topk_blocks,
                   c.candidate_block_size);
    fmt::print("moe          {} experts top-{}, inter {}, shared {}, route scale {:g}, hash layers {}\n",
               c.n_routed_experts, c.n_activated_experts, c.moe_inter_dim, c.n_shared_experts, c.route_scale,
               c.n_hash_layers);
    fmt::print("mhc          {} streams, {} sinkhorn iterations\n", c.hc_mult, c.hc_sinkhorn_iters);
    if (!c.engram_layer_ids.empty())
        fmt::print("engram       layers {}, rows {}, {}-gram x {} heads x {}\n", c.engram_layer_ids,
                   c.engram_num_embeddings, c.engram_max_ngram, c.engram_n_heads, c.engram_head_dim);
    if (c.dspark_block_size > 0)
        fmt::print("dspark       block {}, taps {}, {} experts top-{}, markov rank {}\n", c.dspark_block_size,
                   c.dspark_target_layers, c.dspark_n_routed_experts, c.dspark_n_activated_experts,
                   c.dspark_markov_rank);
    if (c.has_vision())
        fmt::print("vision       {} layers x {}, {} heads, patch {}, downsample {}\n", c.vision_n_layers,
                   c.vision_dim, c.vision_n_heads, c.vision_patch_size, c.vision_downsample_ratio);
    fmt::print("storage      {} (blocks {} x {}), experts {}\n", c.quant_method.empty() ? "bf16" : c.quant_method,
               c.fp8_block_out, c.fp8_block_in, c.expert_dtype.empty() ? "same" : c.expert_dtype);
}

struct tally {
    uint64_t tensors = 0, bytes = 0;
};

void print_table(const char *title, const std::map<std::tuple<std::string, std::string>, tally> &rows) {
    fmt::print("\n{:<8} {:<16} {:>9} {:>16}\n", "part", title, "tensors", "bytes");
    for (const auto &[key, t] : rows)
        fmt::print("{:<8} {:<16} {:>9} {:>16}\n", std::get<0>(key), std::get<1>(key), t.tensors, human_bytes(t.bytes));
}

void print_list(const char *title, const std::vector<std::string> &items, size_t limit = 20) {
    fmt::print("\n{}: {}\n", title, items.size());
    for (size_t i = 0; i < items.size() && i < limit; i++) fmt::print("  {}\n", items[i]);
    if (items.size() > limit) fmt::print("  ... and {} more\n", items.size() - limit);
}

int run_inspect(const std::string &dir) {
    Result<std::unique_ptr<model::weights>> opened = model::weights::open(dir);
    if (!opened) {
        fmt::print(stderr, "inspect: {}\n", opened.status().to_string());
        return 1;
    }
    model::weights &w = *opened.value();
    print_arch(w.config(), dir);

    // Count what is stored, by the format it is actually stored in.
    std::map<std::tuple<std::string, std::string>, tally> by_role, by_format;
    tally all;
    std::set<std::string> files;
    for (const catalog_entry &e : w.catalog()) {
        Result<storage_format> f = w.format(e.name);
        const char *fmt_name = model::storage_format_name(f ? *f : e.format);
        for (const std::string &name : {e.name, model::scale_name(e.name)}) {
            const io::tensor_info *info = w.files().find(name);
            if (!info) continue;
            if (name != e.name && f && (*f == storage_format::BF16 || *f == storage_format::F32)) continue;
            for (auto *m : {&by_role, &by_format}) {
                auto &t = (*m)[{model::model_part_name(e.part),
                                m == &by_role ? model::tensor_role_name(e.role) : fmt_name}];
                t.tensors++;
                t.bytes += info->nbytes;
            }
            all.tensors++;
            all.bytes += info->nbytes;
            files.insert(info->file);
        }
    }
    std::vector<std::string> parts;
    for (model_part p : w.parts_present()) parts.push_back(model::model_part_name(p));
    fmt::print("parts        {}\n", fmt::join(parts, ", "));
    fmt::print("stored       {} tensors ({} catalogued), {} ({} B) in {} file(s)\n", w.files().size(), all.tensors,
               human_bytes(all.bytes), all.bytes, files.size());
    print_table("role", by_role);
    print_table("format", by_format);

    Status st = w.check();
    const model::check_report &r = w.report();
    print_list("missing", r.missing);
    std::vector<std::string> malformed;
    for (const std::string &p : r.problems)
        if (p.find(": missing (") == std::string::npos) malformed.push_back(p);
    print_list("malformed", malformed);
    print_list("unexpected (not an error)", r.unexpected);
    fmt::print("\ncheck        {}\n", st.is_ok() ? "OK" : st.to_string());
    return st.is_ok() ? 0 : 1;
}

}  // namespace

void register_inspect(CLI::App &app, command_list &cmds) {
    auto *sub = app.add_subcommand("inspect", "Checkpoint inventory: architecture, tensors by role and format, "
                                              "missing and unexpected tensors");
    auto dir = std::make_shared<std::string>();
    sub->add_option("dir", *dir, "checkpoint directory (config.json + *.safetensors)")->required();
    cmds.push_back({sub, [dir] { return run_inspect(*dir); }});
}

}  // namespace ds41rt::app
