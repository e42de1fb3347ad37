// Starts and supervises the local processes of a deployment: `ds41rt launch` without --dry-run.
//
// Order: remote workers are probed (they cannot be started from here and must already run the
// same plan); every local port is checked free; local workers start in rank order, each awaited
// until it answers the worker handshake with this plan's version; then the coordinator, awaited
// until /health is 200. SIGINT / SIGTERM (and SIGHUP: the terminal closed) stop the coordinator
// first (it drains), then the workers; a second signal kills what is left. A child that dies
// during startup, a port in use, or a timeout stops everything already started and fails with a
// message naming it. A worker that dies later is reported and restarted (the coordinator answers
// 503 for its layers meanwhile and reconnects by itself); the coordinator exiting ends the
// deployment.
//
// Children run in their own process groups (a terminal's Ctrl-C reaches only the launcher, which
// then stops them in order) and get SIGTERM from the kernel if the launcher itself dies
// (PR_SET_PDEATHSIG), so no path leaves them behind.
//
// Threading: call from the main thread of a process that has started no other thread; it blocks
// SIGINT, SIGTERM, SIGHUP and SIGCHLD in that thread (for good) and waits for them synchronously.
#pragma once

#include <string>
#include <vector>

#include "dist/deployment.h"
#include "dist/plan.h"

namespace ds41rt::app {

struct launch_options {
    std::string self_binary;      // what to exec for the default binary "ds41rt" (this executable)
    int startup_timeout_s = 600;  // per process: loading a full-size checkpoint takes minutes
    int stop_timeout_s = 30;      // per process, after SIGTERM, before SIGKILL
};

// Runs the deployment until a signal or the coordinator's exit; returns the launcher's exit
// status: 0 after a requested stop in which every child exited cleanly, 1 otherwise.
int run_deployment(const dist::deployment &d, const dist::Plan &plan, const std::vector<dist::launch_command> &cmds,
                   const launch_options &o);

}  // namespace ds41rt::app
