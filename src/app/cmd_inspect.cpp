#include <CLI/CLI.hpp>

#include "app/commands.h"

namespace ds41rt::app {

void register_inspect(CLI::App &app, command_list &cmds) {
    auto *sub = app.add_subcommand("inspect", "not built yet");
    cmds.push_back({sub, [] { return 1; }});
}

}  // namespace ds41rt::app
