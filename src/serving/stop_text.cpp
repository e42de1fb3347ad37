// Stop strings and UTF-8 hold-back over a request's output text (see stop_text.h).
#include "serving/stop_text.h"

#include <algorithm>

#include "text/utf8.h"

namespace ds41rt::serving {

stop_text::stop_text(std::vector<std::string> stops) {
    for (auto &s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string stop_text::release(size_t upto) {
    if (upto <= emitted_) return {};
    std::string out = text::utf8_lossy(std::string_view(text_).substr(emitted_, upto - emitted_));
    emitted_ = upto;
    return out;
}

std::string stop_text::push(std::string_view bytes) {
    if (stopped_) return {};
    const size_t old = text_.size();
    text_.append(bytes);
    // A stop string that ends in the new bytes starts at most len-1 bytes before them; it cannot
    // start inside released text, since a tail that might begin one is never released.
    size_t first = std::string::npos;
    for (const auto &s : stops_) {
        size_t from = old >= s.size() - 1 ? old - (s.size() - 1) : 0;
        from = std::max(from, emitted_);
        size_t at = text_.find(s, from);
        if (at != std::string::npos) first = std::min(first, at);
    }
    if (first != std::string::npos) {
        text_.resize(first);
        stopped_ = true;
        return release(first);
    }
    // Hold back the longest tail that is a proper prefix of some stop string.
    size_t hold = 0;
    std::string_view tv(text_);
    for (const auto &s : stops_) {
        for (size_t k = std::min(s.size() - 1, tv.size() - emitted_); k > hold; k--)
            if (tv.substr(tv.size() - k) == std::string_view(s).substr(0, k)) {
                hold = k;
                break;
            }
    }
    size_t upto = text_.size() - hold;
    upto -= text::utf8_incomplete_tail(tv.substr(emitted_, upto - emitted_));
    return release(upto);
}

std::string stop_text::finish() { return release(text_.size()); }

}  // namespace ds41rt::serving
