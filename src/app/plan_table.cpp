#include "app/plan_table.h"

#include <fmt/format.h>

#include <set>

#include "dist/byte_size.h"

namespace ds41rt::app {

namespace {

using dist::format_size;

// Charges in the order a reader follows a GPU's memory: weights, state, per-step buffers, the
// runtime, then the margin.
const std::vector<std::string> CHARGE_ORDER = {
    "weights.experts", "weights.dense", "weights.embed", "weights.head", "weights.vision", "weights.drafter",
    "weights.engram", "kv.window", "kv.compressed", "kv.index_keys", "kv.carry", "workspace", "logits",
    "transport", "graphs", "request", "runtime", "headroom"};

const char *charge_note(const std::string &k) {
    if (k == "weights.experts") return "routed experts of the layers held here";
    if (k == "weights.dense") return "attention, norms, mHC, routers, shared experts, compressors, indexers";
    if (k == "weights.embed") return "token embedding";
    if (k == "weights.head") return "vocabulary head and final norm";
    if (k == "weights.vision") return "vision tower and aligner";
    if (k == "weights.drafter") return "MTP / DSpark stages (their experts stay MXFP4)";
    if (k == "weights.engram") return "Engram tables on the device";
    if (k == "kv.window") return "sliding-window rings (and drafter rings)";
    if (k == "kv.compressed") return "compressed KV entries";
    if (k == "kv.index_keys") return "indexer keys";
    if (k == "kv.carry") return "compressor state between calls";
    if (k == "workspace") return "activations of the largest step";
    if (k == "logits") return "fp32 logits of the sampled rows";
    if (k == "transport") return "remote-layer frames, double-buffered";
    if (k == "graphs") return "CUDA graphs of the captured row buckets";
    if (k == "request") return "sampler / grammar scratch, one state snapshot per request";
    if (k == "runtime") return "CUDA context and module images";
    if (k == "headroom") return "1/8 of per-step buffers + 64 MiB per sequence";
    return "";
}

void print_owner(std::string &o, const std::string &title, const dist::DeviceBudget &b) {
    const uint64_t charged = b.charged();
    if (b.budget_bytes == 0)
        o += fmt::format("  {:<34} budget unchecked   charged {:>11}\n", title, format_size(charged));
    else
        o += fmt::format("  {:<34} budget {:>11}   charged {:>11}   free {:>11}\n", title, format_size(b.budget_bytes),
                         format_size(charged), format_size(b.budget_bytes - std::min(b.budget_bytes, charged)));
    if (b.charges.empty()) o += "      (idle: no remote layer)\n";
    std::set<std::string> shown;
    auto line = [&](const std::string &k, uint64_t v) {
        o += fmt::format("      {:<17} {:>11}   {}\n", k, format_size(v), charge_note(k));
    };
    for (const auto &k : CHARGE_ORDER) {
        auto it = b.charges.find(k);
        if (it == b.charges.end()) continue;
        line(k, it->second);
        shown.insert(k);
    }
    for (const auto &[k, v] : b.charges)
        if (!shown.count(k)) line(k, v);
}

std::string format_label(dist::expert_format f, int bits) {
    return f == dist::expert_format::EXL3 ? fmt::format("exl3 K{}", bits) : model::expert_quant_name(f);
}

}  // namespace

std::string plan_table(const dist::placement_input &in, const dist::placement &p) {
    const auto &c = in.config;
    const dist::Plan &plan = p.plan;
    std::string o;
    const int gpus = in.cpu_coordinator ? 0 : int(in.gpu_budgets.size());
    o += fmt::format("plan {:016x}: {} ({} layers), routed experts {}, coordinator {}, {} worker{}{}\n", plan.version(),
                     plan.model_type, c.n_layers, format_label(in.format, in.exl3_bits),
                     in.cpu_coordinator ? std::string("on the CPU backend") : fmt::format("{} GPU{}", gpus, gpus == 1 ? "" : "s"),
                     in.workers.size(), in.workers.size() == 1 ? "" : "s",
                     in.workers.empty() ? "" : fmt::format(" at TP{}", p.tp));
    o += fmt::format("load: context {} tokens x {} sequences, prefill batch {}, drafts verified per sequence and step: {}\n",
                     in.load.context, in.load.concurrency, in.load.prefill_batch, p.draft_tokens);
    o += fmt::format("state: {} per {}-token page per sequence, {} per sequence at the planned context\n",
                     format_size(p.kv_bytes_per_page), dist::KV_PAGE_TOKENS, format_size(p.kv_bytes_per_sequence));

    // ---- per-format cost of one layer's routed experts ----
    o += fmt::format("\nrouted experts per layer: {} experts x (w1, w3 [{}, {}] + w2 [{}, {}])\n", c.n_routed_experts,
                     c.moe_inter_dim, c.dim, c.dim, c.moe_inter_dim);
    const int tp = in.workers.empty() ? 1 : p.tp;
    std::string head = fmt::format("  {:<10} {:>12}", "format", "full width");
    if (tp > 1) head += fmt::format("   TP{} per rank", tp);
    o += head + "\n";
    for (dist::expert_format f : {dist::expert_format::OFFICIAL, dist::expert_format::NVFP4, dist::expert_format::EXL3}) {
        auto full = dist::layer_slice_bytes(f, c, c.moe_inter_dim, in.exl3_bits);
        std::string row = fmt::format("  {:<10} {:>12}", format_label(f, in.exl3_bits),
                                      full ? format_size(*full) : std::string("n/a"));
        if (tp > 1) {
            std::string ranks;
            for (int r = 0; r < tp; r++) {
                auto s = dist::tp_slice(c.moe_inter_dim, tp, r, dist::expert_slice_align(c, f));
                if (!s) {
                    ranks = "   " + s.status().message();
                    break;
                }
                int width = s->width();
                if (in.kernel_extent > 0) width = (width + in.kernel_extent - 1) / in.kernel_extent * in.kernel_extent;
                auto b = dist::layer_slice_bytes(f, c, width, in.exl3_bits);
                ranks += fmt::format("{}{} ({} ch)", r ? " | " : "   ", b ? format_size(*b) : std::string("n/a"), width);
            }
            row += ranks;
        }
        o += row + (f == in.format ? "   <- this plan" : "") + "\n";
    }

    // ---- owners ----
    o += "\nowners (budget, charges)\n";
    for (const auto &d : plan.coordinator) print_owner(o, d.name, d);
    for (const auto &w : plan.workers)
        print_owner(o, fmt::format("{} {} {}", w.budget.name, w.endpoint, w.device < 0 ? "cpu" : fmt::format("cuda:{}", w.device)),
                    w.budget);

    // ---- layers, as runs of identical placement ----
    o += "\nlayers (routed experts)\n";
    size_t i = 0;
    while (i < plan.layers.size()) {
        size_t j = i + 1;
        const auto &a = plan.layers[i];
        while (j < plan.layers.size() && plan.layers[j].remote == a.remote &&
               plan.layers[j].local_device == a.local_device && plan.layers[j].ranks == a.ranks)
            j++;
        const std::string range = j - i == 1 ? fmt::format("{}", a.layer)
                                             : fmt::format("{}-{}", a.layer, plan.layers[j - 1].layer);
        if (!a.remote) {
            o += fmt::format("  {:<8} {:<24} full width ({} ch)       {} per layer\n", range,
                             plan.coordinator[size_t(a.local_device)].name, c.moe_inter_dim, format_size(p.full_layer_bytes));
        } else {
            std::string who, widths, bytes;
            for (size_t r = 0; r < a.ranks.size(); r++) {
                const auto &share = p.ranks[size_t(a.ranks[r])];
                if (r) {
                    who += "+";
                    widths += "|";
                    bytes += " | ";
                }
                who += plan.workers[size_t(a.ranks[r])].budget.name;
                widths += std::to_string(share.padded_width);
                bytes += format_size(share.layer_bytes);
            }
            o += fmt::format("  {:<8} {:<24} TP{} ({} ch)   {} per layer and rank\n", range, who, a.ranks.size(), widths,
                             bytes);
        }
        i = j;
    }
    if (p.host_mapped_bytes) {
        std::string layers;
        for (int l : c.engram_layer_ids) {
            if (!layers.empty()) layers += ", ";
            layers += std::to_string(l);
        }
        o += fmt::format("\nhost memory (no device budget): Engram tables of layers {}, memory-mapped: {}\n", layers,
                         format_size(p.host_mapped_bytes));
    }
    return o;
}

}  // namespace ds41rt::app
