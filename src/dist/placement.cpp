// The placement planner (rules in placement.h). Weights other than routed experts are priced
// from the tensor catalog in the official storage; routed experts per format and TP slice from
// dist/expert_bytes (which asks the catalog too).
#include "dist/placement.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "dist/byte_size.h"
#include "model/catalog.h"
#include "model/flash_configs.h"

namespace ds41rt::dist {

namespace {

constexpr uint64_t UNLIMITED = ~0ull;

// Non-expert weights of the target, grouped by who holds them.
struct weight_groups {
    std::vector<uint64_t> layer_dense;   // per layer: everything but routed experts and Engram tables
    std::vector<uint64_t> engram_table;  // per layer: the Engram table and its scales
    uint64_t embed = 0, head = 0, drafter = 0, vision = 0;
};

bool ends_with(const std::string &s, std::string_view suffix) {
    return s.size() >= suffix.size() && std::string_view(s).substr(s.size() - suffix.size()) == suffix;
}

weight_groups group_weights(const model::model_config &c) {
    weight_groups g;
    g.layer_dense.assign(size_t(c.n_layers), 0);
    g.engram_table.assign(size_t(c.n_layers), 0);
    for (const model::catalog_entry &e : model::build_catalog(c, model::catalog_scope::ALL)) {
        uint64_t bytes = 0;
        for (const auto &s : model::stored_tensors(e, c)) bytes += dtype_bytes(s.type, size_t(shape_numel(s.shape)));
        if (e.part == model::model_part::MTP) {
            g.drafter += bytes;  // its routed experts stay MXFP4 in every release (quant-formats.md 0)
        } else if (e.part == model::model_part::VISION) {
            g.vision += bytes;
        } else if (e.role == model::tensor_role::EMBED) {
            g.embed += bytes;
        } else if (e.layer < 0) {
            g.head += bytes;  // head, final norm, V4's hc_head
        } else if (e.role == model::tensor_role::ROUTED_EXPERT) {
            continue;  // priced per format by expert_bytes
        } else if (e.role == model::tensor_role::ENGRAM && ends_with(e.name, "engram.embed.weight")) {
            g.engram_table[size_t(e.layer)] += bytes;
        } else {
            g.layer_dense[size_t(e.layer)] += bytes;
        }
    }
    return g;
}

// Appends x to a separated list.
void append(std::string &list, const char *sep, const std::string &x) {
    if (!list.empty()) list += sep;
    list += x;
}

std::string owner_name(bool cpu, int g) { return cpu ? std::string("cpu") : "gpu" + std::to_string(g); }

std::string layer_range(int first, int last) {
    return first == last ? "layer " + std::to_string(first)
                         : "layers " + std::to_string(first) + "-" + std::to_string(last);
}

// Charges of one coordinator owner before routed experts, given which of its layers are remote.
struct gpu_fixed {
    std::map<std::string, uint64_t> charges;
    uint64_t total() const {
        uint64_t t = 0;
        for (const auto &[k, v] : charges) t += v;
        return t;
    }
};

}  // namespace

Result<placement> place(const placement_input &in) {
    const model::model_config &c = in.config;
    const int n = c.n_layers;
    if (n < 1) return Status::invalid_argument("plan: the model has no layers");
    if (in.load.context < 1) return Status::invalid_argument("plan: context must be at least 1 token");
    if (in.load.concurrency < 1) return Status::invalid_argument("plan: concurrency must be at least 1");
    if (in.load.prefill_batch < 1) return Status::invalid_argument("plan: prefill batch must be at least 1 token");
    if (!in.cpu_coordinator && in.gpu_budgets.empty())
        return Status::invalid_argument("plan: no coordinator GPU (give at least one, or the CPU backend)");
    if (in.cpu_coordinator && in.gpu_budgets.size() > 1)
        return Status::invalid_argument("plan: the CPU backend is one owner; got " +
                                        std::to_string(in.gpu_budgets.size()) + " budgets");
    const int W = int(in.workers.size());
    const int tp = in.tp > 0 ? in.tp : std::max(W, 1);
    if (W > 0 && W % tp != 0)
        return Status::invalid_argument("plan: " + std::to_string(W) + " workers cannot form groups of TP " +
                                        std::to_string(tp));
    if (in.kernel_extent < 0) return Status::invalid_argument("plan: kernel extent must not be negative");

    placement out;
    out.tp = tp;
    load_targets load = in.load;
    const bool drafter = in.drafter && c.n_mtp_layers > 0;
    load.draft_tokens = !drafter ? 0 : c.model_arch == model::arch::V41 ? c.dspark_block_size : c.n_mtp_layers;
    out.draft_tokens = load.draft_tokens;

    Result<uint64_t> full = layer_slice_bytes(in.format, c, c.moe_inter_dim, in.exl3_bits);
    if (!full) return full.status();
    out.full_layer_bytes = *full;

    // ---- rule 1: who owns which layers' non-expert weights and state ----
    const int G = in.cpu_coordinator ? 1 : int(in.gpu_budgets.size());
    out.dense_owner.resize(size_t(n));
    {
        const int base = n / G, extra = n % G;
        int l = 0;
        for (int g = 0; g < G; g++)
            for (int k = 0; k < base + (g < extra ? 1 : 0); k++) out.dense_owner[size_t(l++)] = g;
    }
    const weight_groups w = group_weights(c);
    const int64_t tokens = kv_tokens(in.load.context);
    {
        uint64_t page = 0, seq = drafter ? drafter_state_bytes(c) : 0;
        for (int l = 0; l < n; l++) {
            layer_state p = layer_state_bytes(c, l, KV_PAGE_TOKENS);
            page += p.compressed + p.index_keys;
            layer_state s = layer_state_bytes(c, l, tokens);
            seq += s.window + s.compressed + s.index_keys + s.carry;
        }
        out.kv_bytes_per_page = page;
        out.kv_bytes_per_sequence = seq;
    }
    if (!in.engram_on_device)
        for (uint64_t t : w.engram_table) out.host_mapped_bytes += t;

    // ---- rule 2: fixed charges per coordinator owner ----
    auto fixed_charges = [&](int g, bool has_remote) {
        gpu_fixed f;
        auto add = [&](const std::string &k, uint64_t v) {
            if (v) f.charges[k] += v;
        };
        const bool first = g == 0, last = g == G - 1;
        int owned = 0;
        layer_state kv;
        for (int l = 0; l < n; l++) {
            if (out.dense_owner[size_t(l)] != g) continue;
            owned++;
            add("weights.dense", w.layer_dense[size_t(l)]);
            if (in.engram_on_device) add("weights.engram", w.engram_table[size_t(l)]);
            layer_state s = layer_state_bytes(c, l, tokens);
            kv.window += s.window;
            kv.compressed += s.compressed;
            kv.index_keys += s.index_keys;
            kv.carry += s.carry;
        }
        const uint64_t seqs = uint64_t(load.concurrency);
        if (first) add("weights.embed", w.embed);
        if (first && in.vision) add("weights.vision", w.vision);
        if (last) add("weights.head", w.head);
        if (last && drafter) add("weights.drafter", w.drafter);
        add("kv.window", seqs * (kv.window + (last && drafter ? drafter_state_bytes(c) : 0)));
        add("kv.compressed", seqs * kv.compressed);
        add("kv.index_keys", seqs * kv.index_keys);
        add("kv.carry", seqs * kv.carry);
        uint64_t dynamic = 0;
        auto add_dynamic = [&](const std::string &k, uint64_t v) {
            add(k, v);
            dynamic += v;
        };
        add_dynamic("workspace", coordinator_workspace_bytes(c, load));
        if (last) add_dynamic("logits", logits_bytes(c, load));
        if (has_remote) add_dynamic("transport", coordinator_transport_bytes(c, in.format, load, tp));
        // The head counts as one more "layer" of the captured step.
        if (!in.cpu_coordinator)
            add_dynamic("graphs", graph_bytes(load, double(owned + (last ? 1 : 0)) / double(n + 1)));
        if (last) add_dynamic("request", request_bytes(c, load));
        if (!in.cpu_coordinator) add("runtime", runtime_bytes());
        add("headroom", headroom_bytes(dynamic, load));
        return f;
    };
    auto budget_of = [&](int g) -> uint64_t {
        if (in.gpu_budgets.empty()) return 0;
        return in.gpu_budgets[size_t(g)];
    };

    // ---- rule 3: fill bottom-up, each layer on the GPU that runs its attention when it has room
    // (its rows then never cross to another GPU for the experts), else on the first GPU with
    // room; the first layer that finds none ends the local run. Two passes: the first charges
    // transport staging to every GPU when there are workers; the second only to GPUs that own
    // the attention of a layer the first pass left remote (rooms only grow, so the remote layers
    // of the second pass are a subset and every GPU that needs staging still has it). ----
    std::vector<bool> remote_owner(size_t(G), W > 0);
    std::vector<gpu_fixed> fixed;
    std::vector<int> local_device;  // per local layer
    for (int pass = 0; pass < 2; pass++) {
        fixed.clear();
        for (int g = 0; g < G; g++) fixed.push_back(fixed_charges(g, remote_owner[size_t(g)]));
        std::vector<uint64_t> room(static_cast<size_t>(G), 0);
        std::string overfull;
        for (int g = 0; g < G; g++) {
            const uint64_t b = budget_of(g), t = fixed[size_t(g)].total();
            if (b == 0) {
                room[size_t(g)] = UNLIMITED;
            } else if (t > b) {
                std::string list;
                for (const auto &[k, v] : fixed[size_t(g)].charges)
                    append(list, ", ", k + " " + format_gib(v));
                append(overfull, "; ", owner_name(in.cpu_coordinator, g) +
                            " (budget " + format_gib(b) + ") is charged " + format_gib(t) +
                            " before any routed expert (" + list + "); short by " + format_gib(t - b));
                room[size_t(g)] = 0;
            } else {
                room[size_t(g)] = b - t;
            }
        }
        if (!overfull.empty()) return Status::invalid_argument("infeasible: " + overfull);
        local_device.clear();
        auto fits = [&](int g) { return room[size_t(g)] == UNLIMITED || room[size_t(g)] >= out.full_layer_bytes; };
        for (int l = 0; l < n; l++) {
            if (in.max_local_layers >= 0 && int(local_device.size()) >= in.max_local_layers) break;
            int g = out.dense_owner[size_t(l)];
            if (!fits(g)) {
                g = 0;
                while (g < G && !fits(g)) g++;
            }
            if (g == G) break;
            if (room[size_t(g)] != UNLIMITED) room[size_t(g)] -= out.full_layer_bytes;
            local_device.push_back(g);
        }
        const int local = int(local_device.size());
        if (local < n && W == 0 && in.max_local_layers >= 0 && local >= in.max_local_layers)
            return Status::invalid_argument("plan: at most " + std::to_string(in.max_local_layers) +
                                            " local expert layers leaves " + layer_range(local, n - 1) +
                                            " to workers, but there are none");
        if (local < n && W == 0) {
            const uint64_t need = uint64_t(n - local) * out.full_layer_bytes;
            uint64_t have = 0, largest = 0;
            std::string pieces;
            for (int k = 0; k < G; k++) {
                have += room[size_t(k)];
                largest = std::max(largest, room[size_t(k)]);
                append(pieces, ", ", owner_name(in.cpu_coordinator, k) + " " + format_gib(room[size_t(k)]));
            }
            const uint64_t short_by = need > have ? need - have : out.full_layer_bytes - largest;
            return Status::invalid_argument(
                "infeasible: the routed experts of " + layer_range(local, n - 1) + " (" + std::to_string(n - local) +
                " x " + format_gib(out.full_layer_bytes) + " = " + format_gib(need) +
                ") do not fit on the coordinator (left after its fixed charges and local layers: " + pieces +
                ") and there are no workers; short by " + format_gib(short_by));
        }
        if (pass == 0) {
            std::fill(remote_owner.begin(), remote_owner.end(), false);
            for (int l = local; l < n; l++) remote_owner[size_t(out.dense_owner[size_t(l)])] = true;
        }
    }
    const int local = int(local_device.size());

    // ---- the plan: coordinator owners ----
    Plan &p = out.plan;
    p.model_type = model::arch_name(c.model_arch);
    p.format = model::expert_quant_name(in.format);
    p.num_layers = n;
    for (int g = 0; g < G; g++) {
        DeviceBudget d;
        d.name = in.cpu_coordinator ? "cpu" : "gpu" + std::to_string(g);
        d.budget_bytes = budget_of(g);
        d.charges = fixed[size_t(g)].charges;
        p.coordinator.push_back(std::move(d));
    }
    for (int l = 0; l < local; l++) {
        p.coordinator[size_t(local_device[size_t(l)])].charges["weights.experts"] += out.full_layer_bytes;
        p.layers.push_back({l, false, local_device[size_t(l)], {}});
    }

    // ---- rule 4: the remaining layers to worker groups ----
    const int remote = n - local;
    const int groups = W / tp;
    std::vector<int> group_first(size_t(std::max(groups, 1)) + 1, local);
    for (int k = 0; k < groups; k++)
        group_first[size_t(k) + 1] = group_first[size_t(k)] + remote / groups + (k < remote % groups ? 1 : 0);
    for (int k = 0; k < groups; k++)
        for (int l = group_first[size_t(k)]; l < group_first[size_t(k) + 1]; l++) {
            LayerPlacement lp{l, true, 0, {}};
            for (int r = 0; r < tp; r++) lp.ranks.push_back(k * tp + r);
            p.layers.push_back(std::move(lp));
        }
    const int align = expert_slice_align(c, in.format);
    std::string short_workers;
    for (int i = 0; i < W; i++) {
        const worker_spec &ws = in.workers[size_t(i)];
        const int k = i / tp, r = i % tp;
        rank_share share;
        share.worker = i;
        Result<Slice> s = tp_slice(c.moe_inter_dim, tp, r, align);
        if (!s)
            return Status::invalid_argument("plan: the experts' intermediate dimension (" + std::to_string(c.moe_inter_dim) +
                                            " channels, " + model::expert_quant_name(in.format) + " blocks of " +
                                            std::to_string(align) + ") cannot be split over TP" + std::to_string(tp) +
                                            ": " + s.status().message());
        share.slice = *s;
        share.padded_width = in.kernel_extent > 0
                                 ? (s->width() + in.kernel_extent - 1) / in.kernel_extent * in.kernel_extent
                                 : s->width();
        Result<uint64_t> lb = layer_slice_bytes(in.format, c, share.padded_width, in.exl3_bits);
        if (!lb) return Status::invalid_argument("plan: TP" + std::to_string(tp) + " rank " + std::to_string(r) + ": " +
                                                 lb.status().message());
        share.layer_bytes = *lb;
        for (int l = group_first[size_t(k)]; l < group_first[size_t(k) + 1]; l++) share.layers.push_back(l);

        WorkerSlot slot;
        slot.endpoint = ws.endpoint;
        slot.device = ws.device;
        slot.transport = ws.transport;
        slot.budget.name = "worker" + std::to_string(i);
        slot.budget.budget_bytes = ws.budget;
        if (!share.layers.empty()) {
            auto &ch = slot.budget.charges;
            ch["weights.experts"] = uint64_t(share.layers.size()) * share.layer_bytes;
            uint64_t dynamic = 0;
            auto add_dynamic = [&](const char *key, uint64_t v) {
                ch[key] = v;
                dynamic += v;
            };
            add_dynamic("workspace", worker_workspace_bytes(c, load, share.padded_width));
            add_dynamic("transport", worker_transport_bytes(c, in.format, load));
            if (ws.device >= 0) {
                add_dynamic("graphs", graph_bytes(load, double(share.layers.size()) / double(n + 1)));
                ch["runtime"] = runtime_bytes();
            }
            ch["headroom"] = headroom_bytes(dynamic, load);
            const uint64_t t = slot.budget.charged();
            if (ws.budget != 0 && t > ws.budget) {
                std::string list;
                for (const auto &[key, v] : ch) append(list, ", ", key + " " + format_gib(v));
                append(short_workers, "; ", slot.budget.name + " (" + ws.endpoint +
                                 ", budget " + format_gib(ws.budget) + ") holds TP" + std::to_string(tp) + " slices (" +
                                 std::to_string(share.padded_width) + " channels) of " +
                                 layer_range(share.layers.front(), share.layers.back()) + " (" +
                                 std::to_string(share.layers.size()) + " x " + format_gib(share.layer_bytes) +
                                 ") and is charged " + format_gib(t) + " (" + list + "); short by " +
                                 format_gib(t - ws.budget));
            }
        }
        p.workers.push_back(std::move(slot));
        out.ranks.push_back(std::move(share));
    }
    if (!short_workers.empty()) return Status::invalid_argument("infeasible: " + short_workers);
    Status st = validate(p);
    if (!st) return Status::internal("planner produced an invalid plan: " + st.message());
    return out;
}

// ---- model sources ----

Result<model_source> load_model_source(const std::string &dir) {
    const std::string path = dir + "/config.json";
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::not_found(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    Result<model::model_config> c = model::parse_config(ss.str());
    if (!c) return Status(c.status().code(), path + ": " + c.status().message());
    Status st = model::validate(*c);
    if (!st) return Status(st.code(), path + ": " + st.message());
    // The model room read the quantization_config (model/quant_config): it refuses publications we
    // do not run, and both quantized releases keep the non-expert tensors in the official storage,
    // which is how the catalog then prices them.
    model_source src;
    src.config = *c;
    src.format = c->routed_quant;
    if (c->routed_quant == model::expert_quant::EXL3) src.exl3_bits = c->exl3_bits;
    return src;
}

Result<model_source> builtin_model_source(const std::string &model_type) {
    model::arch a;
    if (model_type == "deepseek_v41") a = model::arch::V41;
    else if (model_type == "deepseek_v4") a = model::arch::V4;
    else return Status::invalid_argument("model type '" + model_type + "': expected deepseek_v41 or deepseek_v4");
    Result<model::model_config> c = model::flash_config(a);
    if (!c) return c.status();
    model_source src;
    src.config = *c;
    return src;
}

}  // namespace ds41rt::dist
