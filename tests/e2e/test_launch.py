"""`ds41rt launch --config deploy.json` as a user runs it (issue 5): a loopback CPU deployment of a
synthesized tiny V4.1 model (moe_intermediate 96: TP2 ranks hold 64 + 32 channels) with a CPU
coordinator and 2 CPU workers at TP2, layers 2-11 remote.

Checks: the launcher writes the plan where the file says, starts both workers and the
coordinator, and /health turns 200; a chat completion through the official openai client gives
the same greedy text as a single-process `ds41rt serve` on the same model; SIGTERM to the
launcher stops the coordinator, then the workers, exits 0, and leaves no child alive. And two
failures: a worker port already taken (non-zero exit naming the port, nothing started), and a
coordinator that dies during startup (non-zero exit naming it, the already-started workers
stopped, no orphans).
"""
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import API_KEY, MODEL_ID, ROOT, _binary, _free_port, start_server, stop_server

TOKENIZER = ROOT / "tests" / "fixtures" / "deepseek-v41-flash-quant" / "tokenizer.json"
MESSAGES = [{"role": "user", "content": "Hello, launcher"}]


def children_of(pid: int):
    """Live processes whose parent is pid (from /proc, independent of what the launcher prints)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launch")
    m = tmp / "model"
    subprocess.run([str(_binary()), "synth", "--out", str(m), "--seed", "5", "--vocab-size", "512",
                    "--engram-vocab-size", "50", "--moe-intermediate", "96", "--no-mtp"],
                   check=True, capture_output=True)
    return m


def write_config(tmp: Path, model: Path, worker_ports, api_port: int, serve_args=()) -> Path:
    cfg = {
        "model": {"path": str(model)},
        "coordinator": {"listen": f"127.0.0.1:{api_port}", "cpu": True,
                        "args": ["--tokenizer", str(TOKENIZER), "--api-key", API_KEY, *serve_args]},
        "workers": [{"endpoint": f"127.0.0.1:{p}", "device": "cpu"} for p in worker_ports],
        "tp": 2,
        "local_layers": 2,
        "context": 4096,
        "concurrency": 2,
        "plan": str(tmp / "out" / "plan.json"),
    }
    path = tmp / "deploy.json"
    path.write_text(json.dumps(cfg))
    return path


def launch(config: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([str(_binary()), "launch", "--config", str(config), "--stop-timeout", "10"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ds41rt launch exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"deployment not healthy within {timeout} s:\n{log.read_text()}")


def kill_leftovers(pids):
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def chat(base: str):
    """Greedy chat completion: (reasoning, content); the random tiny model mostly "thinks"."""
    with openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=60) as c:
        r = c.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0)
    m = r.choices[0].message
    assert r.usage.completion_tokens == 16
    return (m.model_extra or {}).get("reasoning_content"), m.content


def test_launch_serves_like_one_process_and_stops_on_sigterm(model, tmp_path):
    worker_ports, api_port = [_free_port(), _free_port()], _free_port()
    config = write_config(tmp_path, model, worker_ports, api_port)
    log = tmp_path / "launch.log"
    proc = launch(config, log)
    kids = []
    try:
        wait_healthy(proc, api_port, log)
        kids = children_of(proc.pid)
        assert len(kids) == 3, (kids, log.read_text())  # two workers and the coordinator

        plan = json.loads((tmp_path / "out" / "plan.json").read_text())
        assert [w["endpoint"] for w in plan["workers"]] == [f"127.0.0.1:{p}" for p in worker_ports]
        assert [l["remote"] for l in plan["layers"]] == [False] * 2 + [True] * 10
        assert all(l["ranks"] == [0, 1] for l in plan["layers"] if l["remote"])

        single = start_server(tmp_path / "single.log", "--tokenizer", str(TOKENIZER), model_dir=model)
        try:
            want = chat(single.base)
        finally:
            stop_server(single)
        got = chat(f"http://127.0.0.1:{api_port}")
        assert got == want and any(want)

        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        text = log.read_text()
        assert rc == 0, text
        print(f"\n[launch] stopped in {(time.time() - t0) * 1000:.0f} ms; greedy text {got!r}")
        assert [k for k in kids if alive(k)] == [], text
        # Coordinator first: it shut down and its connections to both workers ended before
        # either worker stopped.
        stop = text[text.index("stopping the deployment"):]
        first_worker_stop = min(stop.index("worker 0: stopped"), stop.index("worker 1: stopped"))
        assert stop.index("serve: signal 15") < first_worker_stop, stop
        for w in (0, 1):
            assert stop.index(f"worker {w}: connection from") < first_worker_stop, stop
        assert stop.rstrip().endswith("ds41rt launch: stopped"), stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(kids)


def test_port_taken_fails_naming_it(model, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        config = write_config(tmp_path, model, [_free_port(), port], _free_port())
        log = tmp_path / "launch.log"
        proc = launch(config, log)
        rc = proc.wait(timeout=30)
        text = log.read_text()
        assert rc != 0, text
        assert f"port {port} is already in use" in text and "worker 1" in text, text
        assert "started worker" not in text, text  # refused before anything started
    finally:
        taken.close()


def test_child_dying_during_startup_stops_the_rest(model, tmp_path):
    # serve refuses an unknown --numerics after the workers are up: the launcher must name the
    # coordinator, stop both workers and exit non-zero.
    config = write_config(tmp_path, model, [_free_port(), _free_port()], _free_port(), ["--numerics", "bogus"])
    log = tmp_path / "launch.log"
    proc = launch(config, log)
    pids = []
    deadline = time.time() + 30
    while proc.poll() is None and time.time() < deadline:
        pids = sorted(set(pids) | set(children_of(proc.pid)))
        time.sleep(0.02)
    try:
        rc = proc.wait(timeout=30)
        text = log.read_text()
        assert rc == 1, text
        assert "coordinator" in text and "during startup" in text, text
        assert text.count("is up") == 2, text  # both workers had started
        assert [p for p in pids if alive(p)] == [], text
        for line in text.splitlines():
            if line.startswith("ds41rt launch: started"):
                pid = int(line.split(" as pid ")[1].split(":")[0])
                assert not alive(pid), line
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_leftovers(pids)
