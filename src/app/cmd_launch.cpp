// ds41rt launch --config deploy.json [--dry-run] [-- more serve options]: a deployment from one
// file (dist/deployment). Validates the file, computes the plan and prints it with the commands
// that start every worker and the coordinator. --dry-run stops there (exit 0) and writes nothing;
// otherwise the plan is written where the file says and the local processes are started and
// supervised until SIGINT / SIGTERM (app/launcher.h). Exit: 0 stopped cleanly, 1 the plan does
// not fit or the deployment failed (the message names what), 2 bad file or arguments.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "app/commands.h"
#include "app/launcher.h"
#include "app/plan_table.h"
#include "dist/deployment.h"

namespace ds41rt::app {

namespace {

struct launch_args {
    std::string config;
    bool dry_run = false;
    int startup_timeout_s = 600;
    int stop_timeout_s = 30;
    std::vector<std::string> serve_args;  // after "--"
};

// Written beside its final name and renamed, so no process ever reads half a plan.
bool write_plan(const std::string &path, const std::string &text) {
    std::error_code ec;
    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << text;
        if (!f.flush()) return false;
    }
    std::filesystem::rename(tmp, p, ec);
    return !ec;
}

std::string self_binary() {
    std::error_code ec;
    auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string() : p.string();
}

int run_launch(const launch_args &a) {
    auto d = dist::load_deployment(a.config);
    if (!d) {
        fmt::print(stderr, "ds41rt launch: {}\n", d.status().message());
        return 2;
    }
    for (const auto &note : d->notes) fmt::print("note: {}\n", note);
    auto p = dist::place(d->input);
    if (!p) {
        const bool infeasible = p.status().message().rfind("infeasible:", 0) == 0;
        fmt::print(stderr, "ds41rt launch: {}: {}\n", a.config, p.status().message());
        return infeasible ? 1 : 2;
    }
    fmt::print("{}", plan_table(d->input, *p));
    const auto cmds = dist::launch_commands(*d, p->plan, a.serve_args);
    fmt::print("\n{} {} (plan version {:016x})\n", a.dry_run ? "would write" : "writing", d->plan_path,
               p->plan.version());
    fmt::print("\ncommands, in start order (workers listen before the coordinator connects):\n");
    for (const auto &c : cmds) fmt::print("  [{:<11} {}] {}\n", c.role, c.local ? "local" : "on " + c.host, c.line);
    if (a.dry_run) {
        fmt::print("\ndry run: nothing started\n");
        return 0;
    }
    std::fflush(stdout);
    if (!write_plan(d->plan_path, dist::to_json(p->plan))) {
        fmt::print(stderr, "ds41rt launch: cannot write the plan to {}\n", d->plan_path);
        return 1;
    }
    launch_options o;
    o.self_binary = self_binary();
    o.startup_timeout_s = a.startup_timeout_s;
    o.stop_timeout_s = a.stop_timeout_s;
    return run_deployment(*d, p->plan, cmds, o);
}

}  // namespace

void register_launch(CLI::App &app, command_list &cmds) {
    auto a = std::make_shared<launch_args>();
    auto *sub = app.add_subcommand("launch", "start a deployment described by a JSON file (docs/deployment.md)");
    sub->add_option("--config", a->config, "deployment file")->required();
    sub->add_flag("--dry-run", a->dry_run, "validate, plan and print the commands; start nothing, write nothing");
    sub->add_option("--startup-timeout", a->startup_timeout_s, "seconds each process may take to become ready")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    sub->add_option("--stop-timeout", a->stop_timeout_s, "seconds each process may take to stop before SIGKILL")
        ->check(CLI::Range(1, 3600))
        ->capture_default_str();
    sub->add_option("serve-args", a->serve_args, "after --: more `ds41rt serve` options for the coordinator "
                                                 "(e.g. -- --api-key KEY)");
    sub->footer("The deployment runs until SIGINT (Ctrl-C) or SIGTERM: the coordinator stops first, then the workers.");
    cmds.push_back({sub, [a] { return run_launch(*a); }});
}

}  // namespace ds41rt::app
