// ds41rt launch --config deploy.json: a deployment from one file (dist/deployment). Validates the
// file, computes the plan, prints it and the commands that start every worker and the
// coordinator. --dry-run stops there (exit 0). Starting the processes needs `ds41rt worker` and
// `serve --plan`, which are not in this build yet: without --dry-run it says so and exits 3
// after the same checks, so a script can tell "not yet" from "bad config" (2) and "does not
// fit" (1).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "app/commands.h"
#include "app/plan_table.h"
#include "dist/deployment.h"

namespace ds41rt::app {

namespace {

struct launch_args {
    std::string config;
    bool dry_run = false;
};

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
    fmt::print("\nwould write {} (plan version {:016x})\n", d->plan_path, p->plan.version());
    fmt::print("\ncommands, in start order (workers listen before the coordinator connects):\n");
    for (const auto &c : dist::launch_commands(*d, p->plan))
        fmt::print("  [{:<11} {}] {}\n", c.role, c.local ? "local" : "on " + c.host, c.line);
    if (a.dry_run) {
        fmt::print("\ndry run: nothing started\n");
        return 0;
    }
    fmt::print(stderr,
               "ds41rt launch: starting processes is not supported yet (ds41rt worker and serve --plan are still "
               "being built); run the commands above on their hosts, or use --dry-run\n");
    return 3;
}

}  // namespace

void register_launch(CLI::App &app, command_list &cmds) {
    auto a = std::make_shared<launch_args>();
    auto *sub = app.add_subcommand("launch", "start a deployment described by a JSON file (docs/deployment.md)");
    sub->add_option("--config", a->config, "deployment file")->required();
    sub->add_flag("--dry-run", a->dry_run, "validate, plan and print the commands; start nothing");
    cmds.push_back({sub, [a] { return run_launch(*a); }});
}

}  // namespace ds41rt::app
