// Deployment files (see deployment.h; the fields are documented in docs/deployment.md).
#include "dist/deployment.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "dist/byte_size.h"

namespace ds41rt::dist {

namespace {

using nlohmann::json;

// Reads the fields of one object, keeps the first error and refuses keys it was not asked for.
class object_reader {
public:
    object_reader(const json &j, std::string path) : j_(j), path_(std::move(path)) {
        if (!j_.is_object()) fail(where("") + " must be an object");
    }
    const Status &status() const { return st_; }

    bool has(const char *key) {
        seen_.insert(key);
        return j_.is_object() && j_.contains(key) && !j_.at(key).is_null();
    }
    std::string str(const char *key, std::string dflt) {
        if (!has(key)) return dflt;
        if (!j_.at(key).is_string()) return fail(where(key) + " must be a string"), dflt;
        return j_.at(key).get<std::string>();
    }
    int64_t integer(const char *key, int64_t dflt, int64_t lo, int64_t hi) {
        if (!has(key)) return dflt;
        const json &v = j_.at(key);
        if (!v.is_number_integer()) return fail(where(key) + " must be an integer"), dflt;
        const int64_t x = v.get<int64_t>();
        if (x < lo || x > hi)
            return fail(where(key) + " = " + std::to_string(x) + " is outside " + std::to_string(lo) + ".." +
                        std::to_string(hi)),
                   dflt;
        return x;
    }
    bool boolean(const char *key, bool dflt) {
        if (!has(key)) return dflt;
        if (!j_.at(key).is_boolean()) return fail(where(key) + " must be true or false"), dflt;
        return j_.at(key).get<bool>();
    }
    // "32GiB", "141GB" or a number of bytes.
    uint64_t size(const char *key, uint64_t dflt) {
        if (!has(key)) return dflt;
        const json &v = j_.at(key);
        if (v.is_number_unsigned()) return v.get<uint64_t>();
        if (!v.is_string()) return fail(where(key) + " must be a size such as \"32GiB\" or a byte count"), dflt;
        auto b = parse_size(v.get<std::string>());
        if (!b) return fail(where(key) + ": " + b.status().message()), dflt;
        return *b;
    }
    // A CUDA device number, or "cpu" (-1) for the CPU backend.
    int device(const char *key, int dflt) {
        if (!has(key)) return dflt;
        const json &v = j_.at(key);
        if (v.is_string() && v.get<std::string>() == "cpu") return -1;
        if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > 1023)
            return fail(where(key) + " must be a CUDA device number or \"cpu\""), dflt;
        return int(v.get<int64_t>());
    }
    const json *array(const char *key) {
        if (!has(key)) return nullptr;
        if (!j_.at(key).is_array()) return fail(where(key) + " must be an array"), nullptr;
        return &j_.at(key);
    }
    const json *object(const char *key) {
        if (!has(key)) return nullptr;
        if (!j_.at(key).is_object()) return fail(where(key) + " must be an object"), nullptr;
        return &j_.at(key);
    }
    // Call last: any key nobody asked for is a typo or a field this version does not know.
    void no_other_keys() {
        if (!j_.is_object()) return;
        for (auto it = j_.begin(); it != j_.end(); ++it)
            if (!seen_.count(it.key())) fail(where(it.key().c_str()) + ": unknown field");
    }
    void fail(const std::string &m) {
        if (st_.is_ok()) st_ = Status::invalid_argument("deployment: " + m);
    }
    std::string where(const char *key) const {
        if (!*key) return path_.empty() ? "the file" : path_;
        return path_.empty() ? key : path_ + "." + key;
    }

private:
    const json &j_;
    std::string path_;
    std::set<std::string> seen_;
    Status st_;
};

#define DEPLOY_TRY(reader)                     \
    do {                                       \
        if (!(reader).status().is_ok()) return (reader).status(); \
    } while (0)

// "host:port" with a port in 1..65535; returns the host.
Result<std::string> endpoint_host(const std::string &endpoint, int *port) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size())
        return Status::invalid_argument("'" + endpoint + "' is not host:port");
    int p = 0;
    try {
        size_t used = 0;
        p = std::stoi(endpoint.substr(colon + 1), &used);
        if (used != endpoint.size() - colon - 1) throw std::invalid_argument("port");
    } catch (const std::exception &) {
        return Status::invalid_argument("'" + endpoint + "': the port is not a number");
    }
    if (p < 1 || p > 65535) return Status::invalid_argument("'" + endpoint + "': port outside 1..65535");
    if (port) *port = p;
    return endpoint.substr(0, colon);
}

}  // namespace

bool is_local_endpoint(const std::string &endpoint) {
    auto host = endpoint_host(endpoint, nullptr);
    if (!host) return false;
    return *host == "127.0.0.1" || *host == "localhost" || *host == "::1" || *host == "[::1]";
}

Result<deployment> parse_deployment(std::string_view text) {
    json root = json::parse(text, nullptr, false);
    if (root.is_discarded()) return Status::invalid_argument("deployment: not valid JSON");
    deployment d;
    placement_input &in = d.input;
    object_reader r(root, "");
    DEPLOY_TRY(r);

    // ---- model ----
    const json *model = r.object("model");
    DEPLOY_TRY(r);
    if (!model) return Status::invalid_argument("deployment: model is missing");
    object_reader m(*model, "model");
    d.model_path = m.str("path", "");
    const std::string type = m.str("type", "");
    const std::string format = m.str("format", "");
    const int64_t bits = m.integer("exl3_bits", 0, 1, 8);
    m.no_other_keys();
    DEPLOY_TRY(m);
    Result<model_source> src = Status::invalid_argument("deployment: model needs a path or a type");
    if (!d.model_path.empty() && std::filesystem::exists(d.model_path + "/config.json")) {
        src = load_model_source(d.model_path);
    } else if (!type.empty()) {
        src = builtin_model_source(type);
        if (src)
            d.notes.push_back((d.model_path.empty() ? std::string("no model.path")
                                                    : "model.path " + d.model_path + " has no config.json here") +
                              "; planned with the built-in full-size " + type + " shapes");
    } else if (!d.model_path.empty()) {
        return Status::not_found("deployment: model.path " + d.model_path +
                                 " has no config.json (give model.type to plan with built-in shapes)");
    }
    if (!src) return Status(src.status().code(), "deployment: model: " + src.status().message());
    in.config = src->config;
    in.format = src->format;
    in.exl3_bits = src->exl3_bits;
    if (!format.empty()) {
        auto f = parse_expert_format(format);
        if (!f) return Status::invalid_argument("deployment: model." + f.status().message());
        in.format = *f;
    }
    if (bits > 0) in.exl3_bits = int(bits);

    // ---- coordinator ----
    const json *coord = r.object("coordinator");
    DEPLOY_TRY(r);
    if (!coord) return Status::invalid_argument("deployment: coordinator is missing");
    object_reader c(*coord, "coordinator");
    const std::string listen = c.str("listen", "0.0.0.0:8000");
    in.cpu_coordinator = c.boolean("cpu", false);
    const uint64_t cpu_budget = c.size("budget", 0);
    const json *gpus = c.array("gpus");
    const json *serve_args = c.array("args");
    c.no_other_keys();
    DEPLOY_TRY(c);
    {
        auto host = endpoint_host(listen, &d.listen_port);
        if (!host) return Status::invalid_argument("deployment: coordinator.listen: " + host.status().message());
        d.listen_host = *host;
    }
    for (size_t i = 0; serve_args && i < serve_args->size(); i++) {
        if (!(*serve_args)[i].is_string())
            return Status::invalid_argument("deployment: coordinator.args[" + std::to_string(i) + "] must be a string");
        d.serve_args.push_back((*serve_args)[i].get<std::string>());
    }
    if (in.cpu_coordinator) {
        if (gpus && !gpus->empty()) return Status::invalid_argument("deployment: coordinator.cpu is true but gpus are listed");
        if (cpu_budget) in.gpu_budgets = {cpu_budget};
    } else {
        if (cpu_budget) return Status::invalid_argument("deployment: coordinator.budget is for the CPU backend; give each GPU its budget");
        if (!gpus || gpus->empty())
            return Status::invalid_argument("deployment: coordinator.gpus is empty (or set coordinator.cpu)");
        std::set<int> devices;
        for (size_t i = 0; i < gpus->size(); i++) {
            object_reader g((*gpus)[i], "coordinator.gpus[" + std::to_string(i) + "]");
            const int dev = int(g.integer("device", int64_t(i), 0, 1023));
            const uint64_t budget = g.size("budget", DEFAULT_GPU_BUDGET);
            g.no_other_keys();
            DEPLOY_TRY(g);
            if (!devices.insert(dev).second)
                return Status::invalid_argument("deployment: coordinator.gpus[" + std::to_string(i) + "].device " +
                                                std::to_string(dev) + " is listed twice");
            if (budget == 0)
                return Status::invalid_argument("deployment: coordinator.gpus[" + std::to_string(i) + "].budget is 0");
            d.gpu_devices.push_back(dev);
            in.gpu_budgets.push_back(budget);
        }
    }

    // ---- workers ----
    // "transport" at the top level is every worker's default; a worker's own key overrides it.
    const std::string default_transport = r.str("transport", "tcp");
    if (default_transport != "tcp" && default_transport != "nccl")
        return Status::invalid_argument("deployment: transport: '" + default_transport + "' is not \"tcp\" or \"nccl\"");
    const json *workers = r.array("workers");
    DEPLOY_TRY(r);
    std::set<std::string> endpoints;
    for (size_t i = 0; workers && i < workers->size(); i++) {
        const std::string path = "workers[" + std::to_string(i) + "]";
        object_reader w((*workers)[i], path);
        worker_spec ws;
        ws.endpoint = w.str("endpoint", "");
        ws.device = w.device("device", 0);
        ws.budget = w.size("budget", DEFAULT_GPU_BUDGET);
        ws.transport = w.str("transport", default_transport);
        w.no_other_keys();
        DEPLOY_TRY(w);
        if (ws.endpoint.empty()) return Status::invalid_argument("deployment: " + path + ".endpoint is missing");
        if (ws.transport != "tcp" && ws.transport != "nccl")
            return Status::invalid_argument("deployment: " + path + ".transport: '" + ws.transport +
                                            "' is not \"tcp\" or \"nccl\"");
        if (ws.transport == "nccl" && ws.device < 0)
            return Status::invalid_argument("deployment: " + path + ".transport: nccl needs a GPU worker (device)");
        auto host = endpoint_host(ws.endpoint, nullptr);
        if (!host) return Status::invalid_argument("deployment: " + path + ".endpoint: " + host.status().message());
        if (!endpoints.insert(ws.endpoint).second)
            return Status::invalid_argument("deployment: " + path + ".endpoint " + ws.endpoint + " is listed twice");
        in.workers.push_back(ws);
    }

    // ---- load targets and switches ----
    in.tp = int(r.integer("tp", 0, 0, 64));
    in.load.context = r.integer("context", in.load.context, 1, int64_t(1) << 24);
    in.load.concurrency = int(r.integer("concurrency", in.load.concurrency, 1, 4096));
    in.load.prefill_batch = int(r.integer("prefill_batch", in.load.prefill_batch, 1, 1 << 20));
    in.max_local_layers = int(r.integer("local_layers", -1, -1, 1024));
    in.kernel_extent = int(r.integer("kernel_extent", 0, 0, 4096));
    in.drafter = r.boolean("drafter", true);
    in.vision = r.boolean("vision", true);
    const std::string engram = r.str("engram", "host");
    d.plan_path = r.str("plan", d.plan_path);
    d.binary = r.str("binary", d.binary);
    r.no_other_keys();
    DEPLOY_TRY(r);
    if (engram != "host" && engram != "device")
        return Status::invalid_argument("deployment: engram: '" + engram + "' is not \"host\" or \"device\"");
    in.engram_on_device = engram == "device";
    if (d.model_path.empty()) d.model_path = "<model path>";
    return d;
}

Result<deployment> load_deployment(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::not_found(path + ": cannot open");
    std::stringstream ss;
    ss << f.rdbuf();
    Result<deployment> d = parse_deployment(ss.str());
    if (!d) return Status(d.status().code(), path + ": " + d.status().message());
    return d;
}

std::string shell_quote(const std::string &word) {
    if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                "@%_+=:,./-") == std::string::npos)
        return word;
    std::string q = "'";
    for (char ch : word) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

namespace {

std::string command_line(const launch_command &c) {
    std::string line;
    for (const auto &[k, v] : c.env) line += k + "=" + shell_quote(v) + " ";
    for (size_t i = 0; i < c.argv.size(); i++) {
        if (i) line += ' ';
        line += shell_quote(c.argv[i]);
    }
    return line;
}

}  // namespace

std::vector<launch_command> launch_commands(const deployment &d, const Plan &plan,
                                            const std::vector<std::string> &extra_serve_args) {
    std::vector<launch_command> out;
    for (size_t i = 0; i < plan.workers.size(); i++) {
        const WorkerSlot &w = plan.workers[i];
        launch_command c;
        c.role = "worker " + std::to_string(i);
        c.worker = int(i);
        c.local = is_local_endpoint(w.endpoint);
        auto host = endpoint_host(w.endpoint, nullptr);
        c.host = c.local ? "local" : (host ? *host : w.endpoint);
        c.endpoint = w.endpoint;
        c.argv = {d.binary, "worker", "--plan", d.plan_path, "--rank", std::to_string(i), "--listen", w.endpoint,
                  "--model", d.model_path};
        if (w.transport == "nccl") {  // the NCCL data path needs the slices on the worker's GPU
            c.argv.insert(c.argv.end(), {"--device", std::to_string(w.device)});
            c.env.push_back({"NCCL_NVLS_ENABLE", "0"});
        }
        c.line = command_line(c);
        out.push_back(std::move(c));
    }
    launch_command c;
    c.role = "coordinator";
    c.host = "local";
    c.endpoint = d.listen_host + ":" + std::to_string(d.listen_port);
    std::string devices;
    for (int dev : d.gpu_devices) {
        if (!devices.empty()) devices += ",";
        devices += std::to_string(dev);
    }
    if (!devices.empty()) c.env.emplace_back("CUDA_VISIBLE_DEVICES", devices);
    c.argv = {d.binary, "serve", "--model", d.model_path, "--plan", d.plan_path, "--host", d.listen_host, "--port",
              std::to_string(d.listen_port), "--max-running", std::to_string(d.input.load.concurrency),
              "--max-context", std::to_string(d.input.load.context)};
    c.argv.insert(c.argv.end(), d.serve_args.begin(), d.serve_args.end());
    c.argv.insert(c.argv.end(), extra_serve_args.begin(), extra_serve_args.end());
    c.line = command_line(c);
    out.push_back(std::move(c));
    return out;
}

}  // namespace ds41rt::dist
