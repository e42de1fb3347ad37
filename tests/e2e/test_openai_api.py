"""The OpenAI-compatible API of `ds41rt serve` through the official `openai` client.

The model is the tiny random-weight V4.1 fixture: its output is gibberish, but deterministic, so
the tests compare the server with itself (stream vs whole, seed vs seed, stop vs no stop) and check
the shape of every response. `ignore_eos` (a vLLM extension the server accepts) keeps outputs at
max_tokens where a test needs a known length.
"""
import json
import math
import time

import httpx
import openai
import pytest

from conftest import API_KEY, MODEL_ID

NO_THINK = {"thinking": {"type": "disabled"}}
MSGS = [{"role": "user", "content": "Tell me a story about a robot."}]


def chat(client, **kw):
    args = dict(model=MODEL_ID, messages=MSGS, max_tokens=8)
    args.update(kw)
    return client.chat.completions.create(**args)


def test_health_models_metrics(server, client):
    assert httpx.get(server.base + "/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    text = httpx.get(server.base + "/metrics").text
    for name in ("ds41rt_requests_total", "ds41rt_queue_depth", "ds41rt_time_to_first_token_seconds_bucket",
                 "ds41rt_inter_token_latency_seconds_count", "ds41rt_batch_sequences_sum"):
        assert name in text


def test_chat_non_stream(client):
    r = chat(client, extra_body={**NO_THINK, "ignore_eos": True})
    assert r.object == "chat.completion"
    assert r.model == MODEL_ID
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    # Greedy (temperature omitted) is deterministic.
    assert chat(client, extra_body={**NO_THINK, "ignore_eos": True}).choices[0].message.content == c.message.content


def test_chat_thinking_goes_to_reasoning_content(client):
    # Thinking is on by default: the prompt ends in <think>, so output is reasoning until </think>.
    r = chat(client, extra_body={"ignore_eos": True})
    extra = r.choices[0].message.model_extra or {}
    assert isinstance(extra.get("reasoning_content"), str) and extra["reasoning_content"]


def test_chat_stream_equals_whole(client):
    whole = chat(client, max_tokens=10, extra_body={**NO_THINK, "ignore_eos": True})
    chunks = list(chat(client, max_tokens=10, stream=True, extra_body={**NO_THINK, "ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    assert all(ch.usage is None for ch in chunks)


def test_stream_include_usage_final_chunk(client):
    chunks = list(chat(client, max_tokens=5, stream=True, stream_options={"include_usage": True},
                       extra_body={**NO_THINK, "ignore_eos": True}))
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 5
    assert last.usage.total_tokens == last.usage.prompt_tokens + 5
    assert last.usage.prompt_tokens_details.cached_tokens == 0  # no prefix cache yet
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_text_and_token_ids(client):
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=6,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    text = r.choices[0].text
    streamed = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=6, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == text
    ids = client.completions.create(model=MODEL_ID, prompt=[5, 17, 42, 99, 100], max_tokens=4,
                                    extra_body={"ignore_eos": True})
    assert ids.usage.prompt_tokens == 5
    assert ids.usage.completion_tokens == 4


def test_seed_reproducibility(client):
    def run(seed):
        return client.completions.create(model=MODEL_ID, prompt="The weather today", max_tokens=12, temperature=1.0,
                                         seed=seed, extra_body={"ignore_eos": True}).choices[0].text
    a, b, c = run(1234), run(1234), run(1235)
    assert a == b
    assert a != c


def test_stop_strings(client):
    def run(**kw):
        return client.completions.create(model=MODEL_ID, prompt="A list of colors:", max_tokens=16,
                                         extra_body={"ignore_eos": True}, **kw).choices[0]
    full = run().text
    stop = next((full[i:i + 2] for i in range(2, len(full) - 1)
                 if full[i:i + 2].isascii() and full[i:i + 2].isprintable() and full[i:i + 2].strip() == full[i:i + 2]),
                None)
    if stop is None:
        pytest.skip(f"no ASCII pair to stop on in {full!r}")
    c = run(stop=[stop, "never-appears-xyz"])
    assert c.finish_reason == "stop"
    assert c.text == full[:full.find(stop)]
    streamed = client.completions.create(model=MODEL_ID, prompt="A list of colors:", max_tokens=16, stop=stop,
                                         stream=True, extra_body={"ignore_eos": True})
    chunks = list(streamed)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = chat(client, max_tokens=6, logprobs=True, top_logprobs=3, extra_body={**NO_THINK, "ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for e in content:
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy picks the most likely raw token, so its logprob is the best one.
        assert math.isclose(e.logprob, tops[0], abs_tol=1e-6)
        assert bytes(e.bytes).decode("utf-8", errors="replace") == e.token or "\ufffd" in e.token
    # Streamed logprobs cover the same tokens.
    chunks = list(chat(client, max_tokens=6, logprobs=True, top_logprobs=3, stream=True,
                       extra_body={**NO_THINK, "ignore_eos": True}))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    # Completions: the legacy format.
    c = client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=4, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_max_tokens_length(client):
    r = chat(client, max_tokens=3, extra_body={**NO_THINK, "ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    r = chat(client, max_completion_tokens=2, extra_body={**NO_THINK, "ignore_eos": True})
    assert r.usage.completion_tokens == 2


def test_bad_input_then_success(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, temperature=-1)
    assert e.value.status_code == 400
    err = e.value.body
    assert err["param"] == "temperature" and "temperature" in err["message"] and err["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        chat(client, top_p=1.5)
    with pytest.raises(openai.BadRequestError):
        chat(client, max_tokens=0)
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=2_000_000)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=2)
    # Raw HTTP: malformed JSON, wrong types, invalid UTF-8, a body over the limit.
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    url = server.base + "/v1/chat/completions"
    for body in [b"{not json", b'{"model": "%s", "messages": "hi"}' % MODEL_ID.encode(),
                 b'{"model": "%s", "messages": [{"role": "user", "content": "\xff\xfe"}]}' % MODEL_ID.encode(),
                 b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}' % MODEL_ID.encode()]:
        resp = httpx.post(url, content=body, headers=headers)
        assert resp.status_code == 400, body
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    resp = httpx.post(url, content=b"x" * (17 << 20), headers=headers, timeout=60)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"
    # The server is fine afterwards.
    r = chat(client, max_tokens=2, extra_body=NO_THINK)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_api_key_required(server):
    with pytest.raises(openai.AuthenticationError) as e:
        chat(server.client(api_key="wrong"), max_tokens=2)
    assert e.value.status_code == 401
    assert httpx.get(server.base + "/v1/models").status_code == 401


def test_client_disconnect_cancels(server):
    before = server.metric('ds41rt_requests_total{outcome="cancelled"}')
    body = {"model": MODEL_ID, "prompt": "Count forever:", "max_tokens": 200000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: {"):
                json.loads(line[6:])
                got += 1
                if got == 3:
                    break
    # The connection is closed: the server notices on its next write and cancels.
    deadline = time.time() + 20
    while time.time() < deadline:
        if server.metric('ds41rt_requests_total{outcome="cancelled"}') > before and server.metric("ds41rt_live_sequences") == 0:
            break
        time.sleep(0.05)
    assert server.metric('ds41rt_requests_total{outcome="cancelled"}') == before + 1
    assert server.metric("ds41rt_live_sequences") == 0


def test_queue_full_is_429_with_retry_after(tmp_path):
    """One request running, one waiting (--max-running 1 --max-queue 1): the third is refused with
    429 and Retry-After, before any stream starts; closing the streams cancels both."""
    from conftest import start_server, stop_server

    srv = start_server(tmp_path / "serve.log", "--max-running", "1", "--max-queue", "1")
    try:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        body = {"model": MODEL_ID, "prompt": "Go on:", "max_tokens": 200000, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=srv.base, headers=headers, timeout=30) as h1, \
                httpx.Client(base_url=srv.base, headers=headers, timeout=30) as h2:
            with h1.stream("POST", "/v1/completions", json=body) as running:
                assert running.status_code == 200
                # Keep the line iterator referenced: dropping it would close the connection (and
                # the server would rightly cancel the request).
                running_lines = running.iter_lines()
                next(line for line in running_lines if line.startswith("data: {"))  # it is decoding
                with h2.stream("POST", "/v1/completions", json=body) as waiting:
                    assert waiting.status_code == 200
                    deadline = time.time() + 10
                    while srv.metric("ds41rt_queue_depth") != 1 and time.time() < deadline:
                        time.sleep(0.05)
                    assert srv.metric("ds41rt_queue_depth") == 1
                    with pytest.raises(openai.RateLimitError) as e:
                        srv.client().completions.create(model=MODEL_ID, prompt="x", max_tokens=2, stream=True)
                    assert e.value.status_code == 429
                    assert e.value.response.headers.get("retry-after") == "1"
                    assert e.value.body["code"] == "queue_full"
        deadline = time.time() + 20
        while time.time() < deadline and (srv.metric("ds41rt_live_sequences") != 0 or srv.metric("ds41rt_queue_depth") != 0):
            time.sleep(0.05)
        assert srv.metric("ds41rt_live_sequences") == 0
        assert srv.metric("ds41rt_queue_depth") == 0
        assert srv.metric('ds41rt_requests_total{outcome="cancelled"}') == 2
        assert srv.metric('ds41rt_requests_total{outcome="rejected"}') == 1
    finally:
        stop_server(srv)
