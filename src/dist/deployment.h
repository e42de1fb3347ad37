// A deployment described by one JSON file (docs/deployment.md): the model, the coordinator's
// GPUs, the workers with their endpoints, devices and budgets, and the load targets. Parsing it
// yields the planner's input; with the plan, the commands that start the coordinator and the
// workers. `ds41rt launch` prints them (--dry-run) and will start the local ones.
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
    std::vector<std::string> notes;   // what the reader should know (e.g. built-in shapes used)
};

// Parses and checks a deployment file. Unknown keys, bad sizes, bad endpoints and duplicate
// endpoints are INVALID_ARGUMENT naming the key path ("workers[1].endpoint"). When model.path
// holds no config.json on this machine, model.type selects the built-in full-size shapes (with a
// note saying so); without either it is an error.
Result<deployment> parse_deployment(std::string_view json_text);
Result<deployment> load_deployment(const std::string &path);

struct launch_command {
    std::string role;   // "worker 0", "coordinator"
    std::string host;   // where it runs ("local" for this machine)
    bool local = true;  // started by the launcher; remote ones are printed for their host
    std::string line;   // the shell command
};

// Workers first, in rank order (the coordinator connects to them), then the coordinator.
std::vector<launch_command> launch_commands(const deployment &d, const Plan &plan);

// Whether host:port names this machine (loopback names).
bool is_local_endpoint(const std::string &endpoint);

}  // namespace ds41rt::dist
