// The HELLO / HELLO_REPLY exchange that opens every connection to an expert worker: the
// coordinator (experts/remote) runs it before its first request, the launcher to tell that a
// worker is up and runs the same plan. One function, so both ask the same questions.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "dist/tcp_transport.h"

namespace ds41rt::dist {

// Sends HELLO with our placement version and reads the reply before d. OK when the worker
// answers HELLO_REPLY with the same placement version and says it is worker `executor`;
// otherwise the worker's ERROR, CORRUPTION for another kind of frame, UNAVAILABLE for another
// version ("started from another plan.json?") or another executor, or the channel's failure.
Status hello(channel &ch, uint64_t placement_version, uint32_t executor, deadline d);

}  // namespace ds41rt::dist
