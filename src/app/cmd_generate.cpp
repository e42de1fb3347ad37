#include <CLI/CLI.hpp>

#include "app/commands.h"

namespace ds41rt::app {

void register_generate(CLI::App &app, command_list &cmds) {
    auto *sub = app.add_subcommand("generate", "not built yet");
    cmds.push_back({sub, [] { return 1; }});
}

}  // namespace ds41rt::app
