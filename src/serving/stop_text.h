// Output text of one request, token by token: detokenized bytes in, text that is final out.
//
// Two things hold text back: an incomplete UTF-8 character at the end (a byte-level BPE token can
// end mid-character), and a tail that could still grow into a stop string. When a stop string
// appears, the text before it is released, the stop string and everything after it are dropped,
// and stopped() turns true. Released text is complete UTF-8; bytes that can never form a
// character are replaced by U+FFFD (text/utf8.h), so what leaves here is always valid JSON text.
//
// Threading: one per request, used by one thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds41rt::serving {

class stop_text {
public:
    explicit stop_text(std::vector<std::string> stops);

    // Appends a token's bytes; returns the text that is now final (may be empty).
    std::string push(std::string_view bytes);
    // End of output: releases what was held back (nothing after a stop string).
    std::string finish();

    bool stopped() const { return stopped_; }

private:
    std::string release(size_t upto);  // text_[emitted_, upto) made valid UTF-8

    std::vector<std::string> stops_;
    std::string text_;     // every byte so far (truncated at a stop string)
    size_t emitted_ = 0;   // bytes of text_ already released
    bool stopped_ = false;
};

}  // namespace ds41rt::serving
