// ds41rt: one binary, several roles (docs/design.md section 1). Each subcommand lives in its own
// file under src/app/ and registers itself here.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "app/commands.h"
#include "core/crash_report.h"

int main(int argc, char **argv) {
    ds41rt::install_crash_report();  // a crashing worker or server logs where
    CLI::App app{"ds41rt: DeepSeek V4.1 Flash / V4 Flash inference server"};
    app.require_subcommand(1);
    ds41rt::app::command_list cmds;
    ds41rt::app::register_inspect(app, cmds);
    ds41rt::app::register_generate(app, cmds);
    ds41rt::app::register_serve(app, cmds);
    ds41rt::app::register_synth(app, cmds);
    ds41rt::app::register_plan(app, cmds);
    ds41rt::app::register_launch(app, cmds);
    ds41rt::app::register_worker(app, cmds);
    ds41rt::app::register_chat(app, cmds);
    ds41rt::app::register_bench(app, cmds);
    ds41rt::app::register_bench_remote(app, cmds);
    CLI11_PARSE(app, argc, argv);
    for (auto &c : cmds)
        if (c.sub->parsed()) return c.run();
    return 2;
}
