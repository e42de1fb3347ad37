// Subcommand registration: each register_* adds its CLI11 subcommand and the function to run.
#pragma once

#include <functional>
#include <vector>

namespace CLI { class App; }

namespace ds41rt::app {

struct command {
    CLI::App *sub;
    std::function<int()> run;
};
using command_list = std::vector<command>;

void register_inspect(CLI::App &app, command_list &cmds);
void register_generate(CLI::App &app, command_list &cmds);
void register_serve(CLI::App &app, command_list &cmds);
void register_synth(CLI::App &app, command_list &cmds);
void register_plan(CLI::App &app, command_list &cmds);
void register_launch(CLI::App &app, command_list &cmds);
void register_worker(CLI::App &app, command_list &cmds);
void register_chat(CLI::App &app, command_list &cmds);
void register_bench(CLI::App &app, command_list &cmds);
void register_bench_remote(CLI::App &app, command_list &cmds);

}  // namespace ds41rt::app
