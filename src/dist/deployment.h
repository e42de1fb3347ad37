// A deployment described by one JSON file (docs/deployment.md): the model, the coordinator's
// GPUs, the workers with their endpoints, devices and budgets, and the load targets. Parsing it
// yields the planner's input; with the plan, the commands that start the coordinator and the
// workers. `ds41rt launch` prints them (--dry-run) or starts the local ones (app/launcher).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "dist/placement.h"

namespace ds41rt::dist {

struct deployment {
    std::string model_path;           // checkpoint directory (every host holds its own copy there)
    placement_input input;            // what the planner gets
    std::vector<int> gpu_devices;     // CUDA device of each coordinator GPU
    std::string listen_host = "0.0.0.0";
    int listen_port = 8000;
    std::string plan_path = "plan.json";
    std::string binary = "ds41rt";
    std::vector<std::string> serve_args;  // coordinator.args: more `ds41rt serve` options
    std::vector<std::string> notes;   // what the reader should know (e.g. built-in shapes used)
};

// Parses and checks a deployment file. Unknown keys, bad sizes, bad endpoints and duplicate
// endpoints are INVALID_ARGUMENT naming the key path ("workers[1].endpoint"). When model.path
// holds no config.json on this machine, model.type selects the built-in full-size shapes (with a
// note saying so); without either it is an error.
Result<deployment> parse_deployment(std::string_view json_text);
Result<deployment> load_deployment(const std::string &path);

struct launch_command {
    std::string role;                // "worker 0", "coordinator"
    int worker = -1;                 // index in the plan's workers; -1 for the coordinator
    std::string host;                // where it runs ("local" for this machine)
    bool local = true;               // started by the launcher; remote ones are printed for their host
    std::string endpoint;            // what it listens on: a worker's control channel, the API's host:port
    std::vector<std::string> argv;   // argv[0] is the deployment's binary
    std::vector<std::pair<std::string, std::string>> env;  // set on top of the launcher's environment
    std::string line;                // the same as one shell command (env, then argv, quoted where needed)
};

// Workers first, in rank order (the coordinator connects to them), then the coordinator, which
// gets the deployment's serve_args and then `extra_serve_args` (the launcher's own command line).
std::vector<launch_command> launch_commands(const deployment &d, const Plan &plan,
                                            const std::vector<std::string> &extra_serve_args = {});

// Quotes a word for a POSIX shell when it needs it ("a b" -> 'a b').
std::string shell_quote(const std::string &word);

// Whether host:port names this machine (loopback names).
bool is_local_endpoint(const std::string &endpoint);

}  // namespace ds41rt::dist
