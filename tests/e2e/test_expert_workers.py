"""Expert workers over TCP (issue 5): a coordinator with 2 `ds41rt worker` processes at TP2 on
loopback, started as a user starts them, against the single-process server on the same model.

The model is synthesized here (`ds41rt synth --moe-intermediate 96`: three MXFP4 blocks, so TP2
ranks hold 64 + 32 channels and TP3 ranks 32 each) with the fixtures' 512-id vocabulary and
tokenizer. Layers 0-1 stay on the coordinator, layers 2-11 go to every worker. Worker 1 sits behind a small frame-aware TCP proxy
(below) that can flip a payload byte or rewrite the placement version of the next response,
re-sealing the header checksum so only the version is wrong.

Checks: the same greedy continuation through the HTTP API as the single-process server, at TP2
and (3 more worker processes, a second coordinator) at TP3; and the
four faults of the issue (a worker killed mid-request, a stalled worker (SIGSTOP), a corrupted
frame, a frame with a stale placement version), each giving the affected request a 503 naming
the reason within a bounded time, the server staying up, and service resuming once the worker
is back. The coordinator runs with --worker-timeout-ms 1500; every failure must arrive within
that plus a margin for the step in progress.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import zlib
from pathlib import Path

import httpx
import pytest

from conftest import API_KEY, ROOT, _binary, _free_port, start_server, stop_server

TOKENIZER = ROOT / "tests" / "fixtures" / "deepseek-v41-flash-quant" / "tokenizer.json"
TIMEOUT_MS = 1500
BOUND_S = TIMEOUT_MS / 1000 + 2.0  # the timeout, plus the step in progress and HTTP
PROMPTS = ["The expert workers", "Hello, tiny model"]
HEADER = 64


class FrameProxy:
    """Forwards bytes between the coordinator and a worker; on the way back it parses frames
    (64-byte header, payload length at offset 52) so it can damage the next EXPERT_RESPONSE."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.mode = None  # None | "corrupt" | "stale"
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, mode: str):
        with self.lock:
            self.mode = mode

    def _take_mode(self):
        with self.lock:
            m, self.mode = self.mode, None
            return m

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream), timeout=2)
                up.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, up), daemon=True).start()
            threading.Thread(target=self._frames, args=(up, client), daemon=True).start()

    @staticmethod
    def _recv_exact(s, n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise OSError("closed")
            buf += chunk
        return buf

    def _pipe(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _frames(self, src, dst):
        try:
            while True:
                head = bytearray(self._recv_exact(src, HEADER))
                (n,) = struct.unpack_from("<I", head, 52)
                payload = bytearray(self._recv_exact(src, n))
                (kind,) = struct.unpack_from("<H", head, 6)
                if kind == 4:  # EXPERT_RESPONSE
                    mode = self._take_mode()
                    if mode == "corrupt":
                        payload[len(payload) // 2] ^= 0x40
                    elif mode == "stale":
                        (v,) = struct.unpack_from("<Q", head, 8)
                        struct.pack_into("<Q", head, 8, v ^ 1)
                        struct.pack_into("<I", head, 60, zlib.crc32(bytes(head[:60])))
                dst.sendall(bytes(head) + bytes(payload))
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"worker exited with {proc.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"worker not listening on {port}:\n{log.read_text()}")


class Deployment:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.model = tmp / "model"
        subprocess.run([str(_binary()), "synth", "--out", str(self.model), "--seed", "3", "--vocab-size", "512",
                        "--engram-vocab-size", "50", "--moe-intermediate", "96", "--no-mtp"],
                       check=True, capture_output=True)
        self.worker_ports = [_free_port(), _free_port()]
        self.proxy = FrameProxy(self.worker_ports[1])
        endpoints = [f"127.0.0.1:{self.worker_ports[0]}", f"127.0.0.1:{self.proxy.port}"]
        self.plan = tmp / "plan.json"
        write_plan(self.plan, endpoints)
        self.workers = [None, None]
        for r in (0, 1):
            self.start_worker(r)

    def start_worker(self, rank: int):
        self.workers[rank] = start_worker(self.tmp, self.model, self.plan, rank, self.worker_ports[rank])

    def stop(self):
        stop_workers(self.workers)


def write_plan(path: Path, endpoints):
    """Layers 0-1 on the coordinator, 2-11 on every worker; odd layers take the ranks in reverse
    worker order (TP-rank order is the plan's, not the workers')."""
    n = len(endpoints)
    plan = {
        "model_type": "deepseek_v41", "format": "official", "num_layers": 12,
        "coordinator": [{"name": "cpu", "budget_bytes": 0}],
        "workers": [{"endpoint": e, "device": -1, "budget": {"name": f"worker{i}", "budget_bytes": 0}}
                    for i, e in enumerate(endpoints)],
        "layers": [{"layer": l, "remote": False, "local_device": 0} if l < 2 else
                   {"layer": l, "remote": True, "ranks": list(range(n))[::-1] if l % 2 else list(range(n))}
                   for l in range(12)],
    }
    path.write_text(json.dumps(plan))


def start_worker(tmp: Path, model: Path, plan: Path, rank: int, port: int) -> subprocess.Popen:
    log = tmp / f"{plan.stem}-worker{rank}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(_binary()), "worker", "--model", str(model), "--plan", str(plan), "--rank", str(rank),
             "--listen", f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    _wait_port(port, proc, log)
    return proc


def stop_workers(procs):
    for p in procs:
        if p and p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("workers"))
    single = start_server(d.tmp / "single.log", "--tokenizer", str(TOKENIZER), model_dir=d.model)
    coord = start_server(d.tmp / "coord.log", "--tokenizer", str(TOKENIZER), "--plan", str(d.plan),
                         "--worker-timeout-ms", str(TIMEOUT_MS), model_dir=d.model)
    d.single, d.coord = single, coord
    yield d
    stop_server(coord)
    stop_server(single)
    d.stop()


def complete(srv, prompt: str, max_tokens: int = 12, timeout: float = 30):
    return httpx.post(srv.base + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=timeout,
                      json={"model": "deepseek-ai/DeepSeek-V4.1-Flash", "prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0})


def expect_503(d, what: str, max_tokens: int = 4):
    t0 = time.time()
    r = complete(d.coord, PROMPTS[0], max_tokens)
    took = time.time() - t0
    assert r.status_code == 503, r.text
    msg = r.json()["error"]["message"]
    assert what in msg, msg
    assert took < BOUND_S, f"{took:.2f} s"
    print(f"\n[workers] 503 after {took * 1000:.0f} ms: {msg}")
    return took


def expect_resumed(d):
    want = complete(d.single, PROMPTS[0]).json()["choices"][0]["text"]
    r = complete(d.coord, PROMPTS[0])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want
    assert httpx.get(d.coord.base + "/health", timeout=5).status_code == 200


def test_tp2_same_greedy_continuation_as_single_process(deployment):
    for p in PROMPTS:
        a = complete(deployment.single, p, 16)
        b = complete(deployment.coord, p, 16)
        assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
        ta, tb = a.json()["choices"][0]["text"], b.json()["choices"][0]["text"]
        assert ta == tb
        assert a.json()["usage"]["completion_tokens"] == b.json()["usage"]["completion_tokens"]


def test_tp3_same_greedy_continuation_as_single_process(deployment):
    d = deployment
    ports = [_free_port() for _ in range(3)]
    plan = d.tmp / "plan3.json"
    write_plan(plan, [f"127.0.0.1:{p}" for p in ports])
    procs = []
    try:
        for r in range(3):
            procs.append(start_worker(d.tmp, d.model, plan, r, ports[r]))
        coord = start_server(d.tmp / "coord3.log", "--tokenizer", str(TOKENIZER), "--plan", str(plan),
                             model_dir=d.model)
        try:
            for p in PROMPTS:
                a, b = complete(d.single, p, 16), complete(coord, p, 16)
                assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
                assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]
        finally:
            stop_server(coord)
    finally:
        stop_workers(procs)


def test_worker_killed_mid_request(deployment):
    d = deployment
    t_kill = None
    error = None
    chunks = 0
    with httpx.stream("POST", d.coord.base + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30, json={"model": "deepseek-ai/DeepSeek-V4.1-Flash", "prompt": PROMPTS[1],
                                        "max_tokens": 4000, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                error = ev["error"]
                break
            chunks += 1
            if chunks == 3:  # tokens are flowing: the request is mid-generation
                d.workers[0].kill()
                t_kill = time.time()
    assert t_kill is not None, "the generation ended before the worker could be killed"
    assert error is not None, "the stream ended without an error"
    took = time.time() - t_kill
    assert "expert worker 0" in error["message"], error
    assert took < BOUND_S
    print(f"\n[workers] killed mid-request: error after {took * 1000:.0f} ms: {error['message']}")
    expect_503(d, "expert worker 0")  # still down: clean 503, server up
    d.workers[0].wait()
    d.start_worker(0)
    expect_resumed(d)


def test_worker_stalled(deployment):
    d = deployment
    d.workers[1].send_signal(signal.SIGSTOP)
    try:
        took = expect_503(d, "timed out")
        assert took >= TIMEOUT_MS / 1000 * 0.8
        assert httpx.get(d.coord.base + "/health", timeout=5).status_code == 200
    finally:
        d.workers[1].send_signal(signal.SIGCONT)
    expect_resumed(d)


def test_corrupted_frame(deployment):
    d = deployment
    d.proxy.arm("corrupt")
    expect_503(d, "payload checksum mismatch")
    expect_resumed(d)


def test_stale_placement_version(deployment):
    d = deployment
    d.proxy.arm("stale")
    expect_503(d, "stale placement version")
    expect_resumed(d)
