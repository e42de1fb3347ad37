"""Concurrency, cancellation and bounded load against `ds41rt serve` (issue 3).

One server for the module, sized for the load (--max-running 16 --max-queue 64: 16 decode
together, 64 clients never overflow the queue) and with a step budget no burst of prompts can
split (--step-tokens 2048: 16 chat prompts of ~58 tokens plus 16 decode rows fit one step, and each
prompt fits --prefill-chunk). A prompt split across steps at a timing-dependent boundary is within
the engine's chunking tolerance, not bitwise equal, and on the random-weight fixture that can flip
a greedy near-tie; unsplit, a request's output does not depend on what runs beside it
(serving/scheduler.h), which test_16_concurrent_streaming_chats checks exactly. Every client is the official `openai` client, one
per thread. The load test runs tools/bench/serve_load.py's run_load(), the same code that writes
the docs/perf report; here it asserts correctness only (no timing thresholds) and prints the
numbers. Set DS41RT_LOAD_REPORT=PREFIX to also write PREFIX.md and PREFIX.json from this run.
"""
import os
import sys
import threading
import time

import httpx
import pytest

from conftest import API_KEY, MODEL_ID, ROOT, start_server, stop_server

sys.path.insert(0, str(ROOT / "tools" / "bench"))
import serve_load  # noqa: E402

NO_THINK = {"thinking": {"type": "disabled"}}
OUTCOMES = ("stop", "length", "cancelled", "error", "rejected")
SERVER_ARGS = ("--max-running", "16", "--max-queue", "64", "--step-tokens", "2048")


@pytest.fixture(scope="module")
def cserver(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("serve-concurrency") / "serve.log", *SERVER_ARGS)
    yield srv
    stop_server(srv)


def outcomes(srv) -> dict:
    return {o: srv.metric(f'ds41rt_requests_total{{outcome="{o}"}}') for o in OUTCOMES}


def wait_idle(srv, timeout_s: float = 20.0):
    """Polls /metrics until no request runs, no sequence is allocated and nothing is queued."""
    names = ("ds41rt_running_requests", "ds41rt_live_sequences", "ds41rt_queue_depth")
    deadline = time.time() + timeout_s
    while True:
        values = {n: srv.metric(n) for n in names}
        if all(v == 0 for v in values.values()) or time.time() > deadline:
            return values
        time.sleep(0.05)


def assert_still_serving(srv):
    assert httpx.get(srv.base + "/health", timeout=10).status_code == 200
    with srv.client() as c:
        r = c.chat.completions.create(model=MODEL_ID, messages=serve_load.prompt_of(0), max_tokens=3,
                                      extra_body={**NO_THINK, "ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def run_threads(n: int, fn):
    """Runs fn(i) on n threads released together; returns the results in order."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def body(i):
        barrier.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    return results


def test_16_concurrent_streaming_chats(cserver):
    n, max_tokens = 16, 8
    # Greedy outputs one at a time: the reference each concurrent stream must reproduce (the
    # engine computes each row independently of the batch, see serving/scheduler.h).
    with cserver.client() as solo:
        expected = [solo.chat.completions.create(model=MODEL_ID, messages=serve_load.prompt_of(i), max_tokens=max_tokens,
                                                 extra_body={**NO_THINK, "ignore_eos": True}).choices[0].message.content
                    for i in range(n)]
    before = outcomes(cserver)
    one_seq_before = cserver.metric('ds41rt_batch_sequences_bucket{le="1"}')
    steps_before = cserver.metric("ds41rt_batch_sequences_count")

    def one(i):
        with cserver.client() as client:  # its own client: its own connection pool
            return serve_load.stream_one(client, MODEL_ID, i, max_tokens)

    recs = run_threads(n, one)
    for i, rec in enumerate(recs):
        assert rec["ok"], (i, rec["error"])
        assert rec["finish_reason"] == "length"
        assert rec["completion_tokens"] == max_tokens
        assert rec["text"] == expected[i], i
    after = outcomes(cserver)
    assert after["length"] - before["length"] == n
    assert all(after[o] == before[o] for o in ("stop", "cancelled", "error", "rejected"))
    # The requests really ran together: some engine step held more than one sequence.
    steps = cserver.metric("ds41rt_batch_sequences_count") - steps_before
    one_seq_steps = cserver.metric('ds41rt_batch_sequences_bucket{le="1"}') - one_seq_before
    assert one_seq_steps < steps
    assert wait_idle(cserver) == {"ds41rt_running_requests": 0, "ds41rt_live_sequences": 0, "ds41rt_queue_depth": 0}
    assert_still_serving(cserver)


def test_cancel_mid_stream_frees_the_sequence(cserver):
    """A stream closed after a few chunks is cancelled and its sequence freed; a stream running
    beside it is not disturbed."""
    assert wait_idle(cserver)["ds41rt_running_requests"] == 0
    before = outcomes(cserver)
    client = cserver.client()
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Count forever."}], max_tokens=100000, stream=True,
        extra_body={**NO_THINK, "ignore_eos": True})
    content_chunks = 0
    for ch in stream:
        assert ch.choices and ch.choices[0].finish_reason is None
        if ch.choices[0].delta.content:
            content_chunks += 1
            if content_chunks == 3:
                break
    assert cserver.metric("ds41rt_running_requests") == 1
    assert cserver.metric("ds41rt_live_sequences") == 1
    # A neighbour decodes in the same batches as the long stream, and finishes normally.
    def run_neighbour():
        with cserver.client() as c:
            neighbour.update(serve_load.stream_one(c, MODEL_ID, 7, 6))

    neighbour = {}
    t = threading.Thread(target=run_neighbour, daemon=True)
    t.start()
    t.join(timeout=60)
    assert neighbour["ok"], neighbour["error"]
    stream.close()  # mid-stream: the connection is dropped
    # The server notices on its next write, cancels, and frees the sequence before the next step.
    deadline = time.time() + 20
    while time.time() < deadline:
        if outcomes(cserver)["cancelled"] > before["cancelled"] and wait_idle(cserver, 0)["ds41rt_live_sequences"] == 0:
            break
        time.sleep(0.05)
    assert wait_idle(cserver, 0) == {"ds41rt_running_requests": 0, "ds41rt_live_sequences": 0, "ds41rt_queue_depth": 0}
    after = outcomes(cserver)
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["length"] == before["length"] + 1  # the neighbour
    assert after["error"] == before["error"] and after["rejected"] == before["rejected"]
    assert_still_serving(cserver)


def test_load_64_clients_500_requests(cserver, tmp_path, capsys):
    """64 streaming clients loop until 500 requests were issued: none fails, none is lost."""
    workers, requests, max_tokens = 64, 500, 4
    wait_idle(cserver)
    before = outcomes(cserver)
    r = serve_load.run_load(cserver.base, API_KEY, MODEL_ID, workers=workers, requests=requests,
                            max_tokens=max_tokens)
    with capsys.disabled():
        print("\n" + serve_load.summary_text(r))
    prefix = os.environ.get("DS41RT_LOAD_REPORT")
    serve_load.write_report(r, prefix or tmp_path / "serve-load",
                            command="DS41RT_LOAD_REPORT=PREFIX pytest tests/e2e/test_concurrency.py",
                            machine=os.environ.get("DS41RT_MACHINE", serve_load.DEFAULT_MACHINE),
                            server_args=list(SERVER_ARGS))
    assert r["failures"] == [] and r["requests_failed"] == 0
    assert r["requests_lost"] == 0 and r["workers_hung"] == 0
    assert r["requests_taken"] == requests and r["requests_ok"] == requests
    assert sorted(rec["index"] for rec in r["records"]) == list(range(requests))
    assert r["completion_tokens"] == requests * max_tokens
    after = outcomes(cserver)
    assert after["length"] - before["length"] == requests
    assert all(after[o] == before[o] for o in ("stop", "cancelled", "error", "rejected"))
    assert r["server"]["generation_tokens"] == requests * max_tokens
    assert wait_idle(cserver) == {"ds41rt_running_requests": 0, "ds41rt_live_sequences": 0, "ds41rt_queue_depth": 0}
    assert_still_serving(cserver)
