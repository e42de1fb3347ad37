#!/usr/bin/env python3
"""Bounded loopback load test of `ds41rt serve`: a benchmark and (through tests/e2e) a test.

W worker threads, each with its own official `openai` client, issue streaming chat completions
(thinking off, `ignore_eos`, fixed max_tokens, usage in the final chunk) until a shared counter
reaches N requests; then they stop. Every request is checked: exactly one finish_reason
("length": ignore_eos runs each to max_tokens), a final usage chunk with completion_tokens ==
max_tokens, then the end of the stream. A request that raised, or whose stream broke that
contract, is failed; a ticket that never got a result is lost.

Measured: TTFT (request sent -> first chunk with generated content; the role chunk the server
sends before any token does not count), end-to-end latency, and completion tokens/s and
requests/s over the wall time of the whole run. The server's /metrics before and after give its
own view (request outcomes, tokens, batch sizes).

Use:
  tools/bench/serve_load.py --binary build/ds41rt --model tests/fixtures/deepseek-v41-flash-quant \
      --report docs/perf/2026-11-30-serve-load        # starts its own server, writes .md + .json
  tools/bench/serve_load.py --base-url http://127.0.0.1:8000 --api-key KEY   # a running server

tests/e2e/test_concurrency.py imports run_load() and asserts correctness only (no timing).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_ID = "deepseek-ai/DeepSeek-V4.1-Flash"
DEFAULT_MACHINE = "2-core CI-class x86 VM, CPU reference backend, tiny 12-layer V4.1 fixture model"
NO_THINK = {"thinking": {"type": "disabled"}}


def prompt_of(i: int) -> list[dict]:
    """A short prompt per request (distinct, so prompts are not all the same tokens)."""
    return [{"role": "user", "content": f"Hi {i}"}]


def percentile(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))
    return s[int(k)]


def read_metrics(base_url: str) -> dict[str, float]:
    """The server's /metrics as {series: value} (comments dropped)."""
    out = {}
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def stream_one(client: openai.OpenAI, model: str, i: int, max_tokens: int) -> dict:
    """One streaming chat request; returns its record (ok or not, with the reason)."""
    rec = {"index": i, "ok": False, "error": None, "ttft_s": None, "latency_s": None,
           "completion_tokens": None, "finish_reason": None, "text": ""}
    t0 = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model, messages=prompt_of(i), max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={**NO_THINK, "ignore_eos": True})
        finishes, usage, after_usage, parts = [], None, 0, []
        with stream:
            for ch in stream:
                if usage is not None:
                    after_usage += 1
                if ch.usage is not None:
                    usage = ch.usage
                for c in ch.choices:
                    piece = c.delta.content or ""
                    if piece and rec["ttft_s"] is None:
                        rec["ttft_s"] = time.perf_counter() - t0
                    parts.append(piece)
                    if c.finish_reason:
                        finishes.append(c.finish_reason)
        rec["latency_s"] = time.perf_counter() - t0
        rec["text"] = "".join(parts)
        rec["finish_reason"] = finishes[-1] if finishes else None
        rec["completion_tokens"] = usage.completion_tokens if usage else None
        if finishes != ["length"]:
            rec["error"] = f"finish_reasons {finishes} (expected exactly ['length'])"
        elif usage is None or after_usage:
            rec["error"] = "no usage chunk at the end of the stream"
        elif usage.completion_tokens != max_tokens:
            rec["error"] = f"completion_tokens {usage.completion_tokens} != max_tokens {max_tokens}"
        elif rec["ttft_s"] is None:
            rec["error"] = "no content chunk"
        else:
            rec["ok"] = True
    except Exception as e:  # any failure is a result, never a crash of the run
        rec["latency_s"] = time.perf_counter() - t0
        chain, x = [], e
        while x is not None and len(chain) < 4:
            chain.append(f"{type(x).__name__}: {x}")
            x = x.__cause__ or x.__context__
        rec["error"] = " <- ".join(chain)
        rec["error_at_s"] = time.perf_counter() - t0
    return rec


def run_load(base_url: str, api_key: str, model: str = DEFAULT_MODEL_ID, *, workers: int = 64,
             requests: int = 500, max_tokens: int = 4, deadline_s: float = 600.0,
             request_timeout_s: float = 120.0) -> dict:
    """Runs the load; returns the summary (and the per-request records under "records").

    Stops by itself: when `requests` tickets were taken, or at `deadline_s` (then the tickets
    never started are simply not taken; a request already sent still runs to its end)."""
    before = read_metrics(base_url)
    lock = threading.Lock()
    next_ticket = [0]
    records: dict[int, dict] = {}
    start = threading.Barrier(workers)
    t_start = [0.0]
    stop_at = time.perf_counter() + deadline_s

    def take() -> int | None:
        with lock:
            if next_ticket[0] >= requests or time.perf_counter() > stop_at:
                return None
            next_ticket[0] += 1
            return next_ticket[0] - 1

    def worker(w: int):
        with openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0,
                           timeout=request_timeout_s) as client:
            if start.wait() == 0:
                t_start[0] = time.perf_counter()
            while (i := take()) is not None:
                rec = stream_one(client, model, i, max_tokens)
                rec["worker"] = w
                with lock:
                    records[i] = rec

    threads = [threading.Thread(target=worker, args=(w,), name=f"load-{w}", daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, stop_at - time.perf_counter() + request_timeout_s + 30))
    wall = time.perf_counter() - t_start[0]
    hung = sum(t.is_alive() for t in threads)
    after = read_metrics(base_url)

    with lock:
        taken = next_ticket[0]
        recs = [records[i] for i in sorted(records)]
    ok = [r for r in recs if r["ok"]]
    failed = [r for r in recs if not r["ok"]]
    lost = taken - len(recs)
    ttft = [r["ttft_s"] for r in ok]
    lat = [r["latency_s"] for r in ok]
    tokens = sum(r["completion_tokens"] for r in ok)

    def delta(series: str) -> float:
        return after.get(series, 0.0) - before.get(series, 0.0)

    def ms(x):
        return None if x is None else round(x * 1000, 2)

    bs_count = delta("ds41rt_batch_sequences_count")
    ttft_count = delta("ds41rt_time_to_first_token_seconds_count")
    return {
        "workers": workers, "requests_target": requests, "max_tokens": max_tokens,
        "requests_taken": taken, "requests_ok": len(ok), "requests_failed": len(failed),
        "requests_lost": lost, "workers_hung": hung,
        "failures": [{"index": r["index"], "worker": r.get("worker"), "error": r["error"],
                      "after_s": round(r.get("error_at_s") or r["latency_s"], 3)} for r in failed][:20],
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "completion_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
        "requests_per_s": round(len(ok) / wall, 2) if wall > 0 else None,
        "ttft_ms": {"p50": ms(percentile(ttft, 50)), "p95": ms(percentile(ttft, 95)),
                    "min": ms(min(ttft, default=None)), "max": ms(max(ttft, default=None))},
        "latency_ms": {"p50": ms(percentile(lat, 50)), "p95": ms(percentile(lat, 95)),
                       "max": ms(max(lat, default=None))},
        "server": {
            "requests_by_outcome": {o: delta(f'ds41rt_requests_total{{outcome="{o}"}}')
                                    for o in ("stop", "length", "cancelled", "error", "rejected")},
            "generation_tokens": delta("ds41rt_generation_tokens_total"),
            "prompt_tokens": delta("ds41rt_prompt_tokens_total"),
            "engine_steps": delta("ds41rt_engine_steps_total"),
            "mean_batch_sequences": round(delta("ds41rt_batch_sequences_sum") / bs_count, 2) if bs_count else None,
            "mean_ttft_ms": round(delta("ds41rt_time_to_first_token_seconds_sum") / ttft_count * 1000, 2)
            if ttft_count else None,
            "running_after": after.get("ds41rt_running_requests"),
            "live_sequences_after": after.get("ds41rt_live_sequences"),
            "queue_depth_after": after.get("ds41rt_queue_depth"),
        },
        "records": recs,
    }


def summary_text(r: dict) -> str:
    s = r["server"]
    return (
        f"serve load: {r['workers']} workers, {r['requests_taken']} requests (target {r['requests_target']}), "
        f"max_tokens {r['max_tokens']}\n"
        f"  ok {r['requests_ok']}, failed {r['requests_failed']}, lost {r['requests_lost']}, "
        f"hung workers {r['workers_hung']}\n"
        f"  wall {r['wall_s']:.2f} s: {r['completion_tokens_per_s']} completion tok/s, {r['requests_per_s']} req/s\n"
        f"  TTFT p50 {r['ttft_ms']['p50']} ms, p95 {r['ttft_ms']['p95']} ms (max {r['ttft_ms']['max']} ms); "
        f"latency p50 {r['latency_ms']['p50']} ms, p95 {r['latency_ms']['p95']} ms\n"
        f"  server: outcomes {s['requests_by_outcome']}, {s['generation_tokens']:.0f} generated tokens, "
        f"{s['engine_steps']:.0f} steps, mean batch {s['mean_batch_sequences']} sequences, "
        f"mean server TTFT {s['mean_ttft_ms']} ms")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_report(r: dict, prefix: Path, *, command: str, machine: str, server_args: list[str]) -> None:
    """prefix.json (the summary, no per-request records) and prefix.md."""
    prefix = Path(prefix)
    meta = {
        "date": datetime.date.today().isoformat(), "commit": git_commit(), "command": command,
        "machine": machine, "cpus": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "openai": openai.__version__,
        "server_args": server_args,
    }
    summary = {k: v for k, v in r.items() if k != "records"}
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps({**meta, **summary}, indent=1) + "\n")
    s = r["server"]
    mean_step_ms = round(r["wall_s"] * 1000 / s["engine_steps"], 1) if s["engine_steps"] else None
    md = f"""# `ds41rt serve` loopback load: {r['workers']} streaming clients, {r['requests_taken']} requests ({meta['date']})

- Machine: {machine} ({meta['cpus']} CPUs visible; {meta['platform']}; shared with other jobs, so
  the numbers are indicative, not a baseline to hold).
- Code: commit {meta['commit']}; client: Python {meta['python']}, openai {meta['openai']} (one client per worker thread).
- Command: `{command}`
- Server: `ds41rt serve {' '.join(server_args)}` on 127.0.0.1 (client and server share the 2 cores).
- Load: {r['workers']} worker threads loop until a shared counter reaches {r['requests_target']}; each request is a
  streaming chat completion with a short distinct prompt, thinking off, `ignore_eos`,
  max_tokens {r['max_tokens']}, `stream_options.include_usage`.
- Correctness (the same code is `tests/e2e/test_concurrency.py::test_load_64_clients_500_requests`):
  every request must end with exactly one finish_reason (`length`) and a usage chunk with
  completion_tokens == max_tokens.
- TTFT: client-side, request sent -> first chunk with generated content (includes queueing at
  the server: {r['workers']} clients against the server's max-running). Throughput: over the
  wall time from the first request to the last response.

## Results

| metric | value |
|---|---|
| requests ok / failed / lost | {r['requests_ok']} / {r['requests_failed']} / {r['requests_lost']} |
| wall time | {r['wall_s']:.2f} s |
| completion tokens | {r['completion_tokens']} |
| throughput | {r['completion_tokens_per_s']} completion tokens/s, {r['requests_per_s']} requests/s |
| TTFT p50 / p95 / max | {r['ttft_ms']['p50']} / {r['ttft_ms']['p95']} / {r['ttft_ms']['max']} ms |
| end-to-end latency p50 / p95 / max | {r['latency_ms']['p50']} / {r['latency_ms']['p95']} / {r['latency_ms']['max']} ms |
| server outcomes (delta) | {', '.join(f'{k} {v:.0f}' for k, v in s['requests_by_outcome'].items())} |
| server tokens (delta) | {s['prompt_tokens']:.0f} prompt, {s['generation_tokens']:.0f} generated, {s['engine_steps']:.0f} engine steps |
| server mean batch | {s['mean_batch_sequences']} sequences per step, {mean_step_ms} ms per step (wall / steps) |
| server mean TTFT (submit -> first token) | {s['mean_ttft_ms']} ms |
| after the run | running {s['running_after']:.0f}, live sequences {s['live_sequences_after']:.0f}, queue {s['queue_depth_after']:.0f} |

The JSON next to this file has the same numbers.
"""
    prefix.with_suffix(".md").write_text(md)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server (http://host:port); else one is started from --binary")
    ap.add_argument("--binary", default=str(ROOT / "build" / "ds41rt"))
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "deepseek-v41-flash-quant"))
    ap.add_argument("--api-key", default="bench-key")
    ap.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--step-tokens", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--report", help="write PREFIX.md and PREFIX.json")
    ap.add_argument("--machine", default=DEFAULT_MACHINE)
    a = ap.parse_args()

    proc, server_args = None, []
    base = a.base_url
    try:
        if base is None:
            port = _free_port()
            server_args = ["--model", os.path.relpath(a.model, ROOT), "--port", str(port), "--api-key", a.api_key,
                           "--max-running", str(a.max_running), "--max-queue", str(a.max_queue),
                           "--step-tokens", str(a.step_tokens)]
            proc = subprocess.Popen([a.binary, "serve", *server_args], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + 60
            while True:
                if proc.poll() is not None:
                    print(f"ds41rt serve exited with {proc.returncode}", file=sys.stderr)
                    return 2
                try:
                    if httpx.get(base + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    print("ds41rt serve not healthy within 60 s", file=sys.stderr)
                    return 2
                time.sleep(0.1)
            server_args[3] = "PORT"
        r = run_load(base, a.api_key, a.model_id, workers=a.workers, requests=a.requests, max_tokens=a.max_tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)
    print(summary_text(r))
    for f in r["failures"]:
        print(f"  failed #{f['index']}: {f['error']}")
    if a.report:
        cmd = " ".join(shlex.quote(x) for x in ["tools/bench/serve_load.py", *sys.argv[1:]])
        write_report(r, Path(a.report), command=cmd, machine=a.machine, server_args=server_args)
        print(f"wrote {a.report}.md and {a.report}.json")
    return 0 if r["requests_failed"] == 0 and r["requests_lost"] == 0 and r["workers_hung"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
