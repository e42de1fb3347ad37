// The literal text of DeepSeek's chat special tokens and DSML tool-call tags, shared by the
// prompt encoder and the output parser so both always agree on spelling.
//
// Special tokens are written as their literal strings (full-width bars, U+2581 "▁"); the
// tokenizer maps each literal to its single id. The DSML tag names are the one spelling that
// differs between the two model lines: V4.1 prefixes each tag name with a space
// ("<｜DSML｜ calls>") where V4 wrote "<｜DSML｜tool_calls>" (V4 spec §6.2, V4.1 spec §9.2 item 3).
#pragma once

#include <string_view>

namespace ds41rt::text {

// Which official encoder a prompt follows: encoding/encoding_dsv4.py (V4 Flash) or
// encoding/encoding.py "encoding_dsv41" (V4.1 Flash, the default model).
enum class chat_encoding { DSV41 = 0, DSV4 };
const char *chat_encoding_name(chat_encoding e);  // "encoding_dsv41" / "encoding_dsv4"

inline constexpr std::string_view BOS_TEXT = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view EOS_TEXT = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view USER_TEXT = "<｜User｜>";
inline constexpr std::string_view ASSISTANT_TEXT = "<｜Assistant｜>";
inline constexpr std::string_view SYSTEM_TEXT = "<｜System｜>";  // V4.1 only
inline constexpr std::string_view LATEST_REMINDER_TEXT = "<｜latest_reminder｜>";
inline constexpr std::string_view THINK_OPEN_TEXT = "<think>";
inline constexpr std::string_view THINK_CLOSE_TEXT = "</think>";
inline constexpr std::string_view DSML_TEXT = "｜DSML｜";

// The three DSML tag names of one encoding, e.g. "tool_calls" / "invoke" / "parameter" (V4).
struct dsml_tag_names {
    std::string_view calls;
    std::string_view invoke;
    std::string_view parameter;
};

inline constexpr dsml_tag_names dsml_tags(chat_encoding e) {
    return e == chat_encoding::DSV4 ? dsml_tag_names{"tool_calls", "invoke", "parameter"}
                                    : dsml_tag_names{" calls", " invoke", " parameter"};
}

}  // namespace ds41rt::text
