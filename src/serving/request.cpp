// Names of request outcomes (see request.h).
#include "serving/request.h"

namespace ds41rt::serving {

const char *finish_reason_name(finish_reason r) {
    switch (r) {
    case finish_reason::NONE: return "none";
    case finish_reason::STOP: return "stop";
    case finish_reason::LENGTH: return "length";
    case finish_reason::CANCELLED: return "cancelled";
    case finish_reason::ERROR: return "error";
    }
    return "none";
}

}  // namespace ds41rt::serving
