"""The README's first command as a user runs it: `scripts/run.sh` sets up, builds, synthesizes the
default model (tiny V4.1, the real DeepSeek vocabulary) once, and serves it; the official openai
client then chats with it, including a forced tool call parsed back into tool_calls.

DS41RT_BUILD_DIR passes through, so the script finds the build the other tests use (its build
step is then a no-op) and keeps the default model under that build directory.
"""
import json
import os
import signal
import subprocess
import time

import httpx
import jsonschema
import openai
import pytest

from conftest import API_KEY, MODEL_ID, ROOT, _free_port

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def test_readme_run_command(tmp_path):
    port = _free_port()
    env = dict(os.environ, DS41RT_PORT=str(port))
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        # Extra arguments go to `ds41rt serve`, as the README says.
        proc = subprocess.Popen([str(ROOT / "scripts" / "run.sh"), "--api-key", API_KEY], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600  # a fresh clone synthesizes the default model first
        while True:
            if proc.poll() is not None:
                pytest.fail(f"scripts/run.sh exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail(f"scripts/run.sh not healthy within 600 s:\n{log.read_text()}")
            time.sleep(0.2)
        assert "curl -s http://127.0.0.1:%d/v1/chat/completions" % port in log.read_text()

        client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [MODEL_ID]
        r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=8, extra_body={"thinking": {"type": "disabled"}})
        assert r.choices[0].finish_reason in ("length", "stop")
        assert r.usage.completion_tokens >= 1

        r = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}], max_tokens=300,
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
            tool_choice="required", parallel_tool_calls=False, extra_body={"thinking": {"type": "disabled"}})
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), WEATHER)
    finally:
        # run.sh execs the server, so this is the server's pid: SIGTERM must stop it cleanly.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("the server started by scripts/run.sh did not stop on SIGTERM within 15 s")
    assert proc.returncode == 0, log.read_text()
