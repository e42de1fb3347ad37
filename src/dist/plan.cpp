#include "dist/plan.h"

#include <nlohmann/json.hpp>

#include <set>

namespace ds41rt::dist {

using nlohmann::ordered_json;

uint64_t DeviceBudget::charged() const {
    uint64_t sum = 0;
    for (const auto &[name, bytes] : charges) sum += bytes;
    return sum;
}

Result<Slice> tp_slice(int width, int tp, int rank, int align) {
    if (tp < 1 || rank < 0 || rank >= tp || align < 1)
        return Status::invalid_argument("tp_slice: rank " + std::to_string(rank) + " of tp " +
                                        std::to_string(tp) + " (align " + std::to_string(align) + ")");
    if (width % align != 0)
        return Status::invalid_argument("tp_slice: width " + std::to_string(width) +
                                        " is not a multiple of the format's " + std::to_string(align) +
                                        "-channel blocks");
    const int units = width / align;
    if (units < tp)
        return Status::invalid_argument("tp_slice: " + std::to_string(units) + " blocks of " +
                                        std::to_string(align) + " channels cannot feed " +
                                        std::to_string(tp) + " ranks");
    const int base = units / tp, extra = units % tp;
    const int first = rank * base + std::min(rank, extra);
    const int count = base + (rank < extra ? 1 : 0);
    return Slice{first * align, (first + count) * align};
}

static ordered_json budget_json(const DeviceBudget &b, bool with_charges) {
    ordered_json j;
    j["name"] = b.name;
    j["budget_bytes"] = b.budget_bytes;
    if (with_charges) {
        ordered_json c = ordered_json::object();
        for (const auto &[k, v] : b.charges) c[k] = v;  // std::map: sorted, so canonical
        j["charges"] = c;
    }
    return j;
}

static ordered_json plan_json(const Plan &p, bool with_charges) {
    ordered_json j;
    j["model_type"] = p.model_type;
    j["format"] = p.format;
    j["num_layers"] = p.num_layers;
    j["coordinator"] = ordered_json::array();
    for (const auto &d : p.coordinator) j["coordinator"].push_back(budget_json(d, with_charges));
    j["workers"] = ordered_json::array();
    for (const auto &w : p.workers) {
        ordered_json wj;
        wj["endpoint"] = w.endpoint;
        wj["device"] = w.device;
        if (w.transport != "tcp") wj["transport"] = w.transport;
        wj["budget"] = budget_json(w.budget, with_charges);
        j["workers"].push_back(wj);
    }
    j["layers"] = ordered_json::array();
    for (const auto &l : p.layers) {
        ordered_json lj;
        lj["layer"] = l.layer;
        if (l.remote) {
            lj["remote"] = true;
            lj["ranks"] = l.ranks;
        } else {
            lj["remote"] = false;
            lj["local_device"] = l.local_device;
        }
        j["layers"].push_back(lj);
    }
    return j;
}

uint64_t Plan::version() const {
    const std::string s = plan_json(*this, false).dump();
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

std::string to_json(const Plan &plan) {
    ordered_json j = plan_json(plan, true);
    j["version"] = plan.version();
    return j.dump(2) + "\n";
}

namespace {

// Reads one field with a message naming its path when it is missing or of the wrong type.
template <typename T>
Status field(const nlohmann::json &j, const char *key, const std::string &path, T &out) {
    auto it = j.find(key);
    if (it == j.end()) return Status::invalid_argument("plan: missing " + path + "." + key);
    try {
        out = it->get<T>();
    } catch (const nlohmann::json::exception &) {
        return Status::invalid_argument("plan: " + path + "." + key + " has the wrong type");
    }
    return Status::ok();
}

#define PLAN_TRY(expr)                  \
    do {                                \
        Status s_ = (expr);             \
        if (!s_) return s_;             \
    } while (0)

Status parse_budget(const nlohmann::json &j, const std::string &path, DeviceBudget &b) {
    if (!j.is_object()) return Status::invalid_argument("plan: " + path + " is not an object");
    PLAN_TRY(field(j, "name", path, b.name));
    PLAN_TRY(field(j, "budget_bytes", path, b.budget_bytes));
    if (j.contains("charges")) PLAN_TRY(field(j, "charges", path, b.charges));
    return Status::ok();
}

}  // namespace

Result<Plan> parse_plan(std::string_view text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Status::invalid_argument("plan: not a JSON object");
    Plan p;
    PLAN_TRY(field(j, "model_type", "plan", p.model_type));
    PLAN_TRY(field(j, "format", "plan", p.format));
    PLAN_TRY(field(j, "num_layers", "plan", p.num_layers));
    nlohmann::json coord, workers, layers;
    PLAN_TRY(field(j, "coordinator", "plan", coord));
    PLAN_TRY(field(j, "workers", "plan", workers));
    PLAN_TRY(field(j, "layers", "plan", layers));
    if (!coord.is_array() || !workers.is_array() || !layers.is_array())
        return Status::invalid_argument("plan: coordinator, workers and layers must be arrays");
    for (size_t i = 0; i < coord.size(); ++i) {
        DeviceBudget b;
        PLAN_TRY(parse_budget(coord[i], "plan.coordinator[" + std::to_string(i) + "]", b));
        p.coordinator.push_back(std::move(b));
    }
    for (size_t i = 0; i < workers.size(); ++i) {
        const std::string path = "plan.workers[" + std::to_string(i) + "]";
        WorkerSlot w;
        nlohmann::json b;
        PLAN_TRY(field(workers[i], "endpoint", path, w.endpoint));
        PLAN_TRY(field(workers[i], "device", path, w.device));
        if (workers[i].contains("transport")) PLAN_TRY(field(workers[i], "transport", path, w.transport));
        PLAN_TRY(field(workers[i], "budget", path, b));
        PLAN_TRY(parse_budget(b, path + ".budget", w.budget));
        p.workers.push_back(std::move(w));
    }
    for (size_t i = 0; i < layers.size(); ++i) {
        const std::string path = "plan.layers[" + std::to_string(i) + "]";
        LayerPlacement l;
        PLAN_TRY(field(layers[i], "layer", path, l.layer));
        PLAN_TRY(field(layers[i], "remote", path, l.remote));
        if (l.remote)
            PLAN_TRY(field(layers[i], "ranks", path, l.ranks));
        else
            PLAN_TRY(field(layers[i], "local_device", path, l.local_device));
        p.layers.push_back(std::move(l));
    }
    if (j.contains("version")) {
        uint64_t v = 0;
        PLAN_TRY(field(j, "version", "plan", v));
        if (v != p.version())
            return Status::invalid_argument("plan: version " + std::to_string(v) +
                                            " does not match its content (" +
                                            std::to_string(p.version()) + "): edited by hand?");
    }
    PLAN_TRY(validate(p));
    return p;
}

Status validate(const Plan &p) {
    if (p.num_layers < 1) return Status::invalid_argument("plan: num_layers must be positive");
    if (int(p.layers.size()) != p.num_layers)
        return Status::invalid_argument("plan: " + std::to_string(p.layers.size()) +
                                        " layer placements for " + std::to_string(p.num_layers) +
                                        " layers");
    for (int i = 0; i < p.num_layers; ++i) {
        const LayerPlacement &l = p.layers[i];
        const std::string where = "plan: layer " + std::to_string(i);
        if (l.layer != i) return Status::invalid_argument(where + " is listed as layer " + std::to_string(l.layer));
        if (!l.remote) {
            if (l.local_device < 0 || l.local_device >= int(p.coordinator.size()))
                return Status::invalid_argument(where + ": local_device " + std::to_string(l.local_device) +
                                                " is not a coordinator device");
            continue;
        }
        if (l.ranks.empty()) return Status::invalid_argument(where + ": remote with no ranks");
        // One layer, one transport: the NCCL path reduces the ranks' partials on the device.
        bool mixed = false;
        for (int r : l.ranks)
            if (r >= 0 && r < int(p.workers.size()) && p.workers[size_t(r)].transport != p.workers[size_t(l.ranks[0])].transport)
                mixed = true;
        if (mixed && l.ranks[0] >= 0 && l.ranks[0] < int(p.workers.size()))
            return Status::invalid_argument(where + ": its ranks mix transports (one layer's workers share one)");
        std::set<int> seen;
        for (int r : l.ranks) {
            if (r < 0 || r >= int(p.workers.size()))
                return Status::invalid_argument(where + ": rank " + std::to_string(r) + " is not a worker");
            if (!seen.insert(r).second)
                return Status::invalid_argument(where + ": worker " + std::to_string(r) + " listed twice");
        }
    }
    for (size_t i = 0; i < p.workers.size(); i++) {
        const WorkerSlot &w = p.workers[i];
        if (w.transport != "tcp" && w.transport != "nccl")
            return Status::invalid_argument("plan: workers[" + std::to_string(i) + "].transport '" + w.transport +
                                            "' is not \"tcp\" or \"nccl\"");
        if (w.transport == "nccl" && w.device < 0)
            return Status::invalid_argument("plan: workers[" + std::to_string(i) +
                                            "]: the nccl transport needs a GPU worker (device >= 0)");
    }
    auto check_budget = [](const DeviceBudget &b) -> Status {
        if (b.budget_bytes != 0 && b.charged() > b.budget_bytes)
            return Status::invalid_argument("plan: " + b.name + " is charged " + std::to_string(b.charged()) +
                                            " bytes over a budget of " + std::to_string(b.budget_bytes));
        return Status::ok();
    };
    for (const auto &d : p.coordinator) PLAN_TRY(check_budget(d));
    for (const auto &w : p.workers) PLAN_TRY(check_budget(w.budget));
    return Status::ok();
}

}  // namespace ds41rt::dist
