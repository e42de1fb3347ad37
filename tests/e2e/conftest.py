"""End-to-end fixtures: `ds41rt serve` started as a user starts it, on the tiny V4.1 fixture model.

The binary is $DS41RT_BUILD_DIR/ds41rt (default: build/ds41rt under the repository root). The
server gets a free port and an API key; tests talk to it with the official `openai` client.
"""
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "tests" / "fixtures" / "deepseek-v41-flash-quant"
API_KEY = "e2e-test-key"
MODEL_ID = "deepseek-ai/DeepSeek-V4.1-Flash"


def _binary() -> Path:
    build = Path(os.environ.get("DS41RT_BUILD_DIR", ROOT / "build"))
    if not build.is_absolute():
        build = ROOT / build
    return build / "ds41rt"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path):
        self.port = port
        self.proc = proc
        self.log = log
        self.base = f"http://127.0.0.1:{port}"

    def client(self, api_key: str = API_KEY, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=60, **kw)

    def metric(self, line_prefix: str) -> float:
        text = httpx.get(self.base + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.split()[-1])
        raise KeyError(line_prefix)


def start_server(log: Path, *extra: str, model_dir: Path = MODEL_DIR) -> Server:
    """Starts `ds41rt serve` on the fixture model (or model_dir) and waits for /health 200."""
    binary = _binary()
    if not binary.exists():
        pytest.fail(f"{binary} not found: build first (scripts/build.sh) or set DS41RT_BUILD_DIR")
    if not (model_dir / "config.json").exists():
        pytest.fail(f"model {model_dir} is missing")
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary), "serve", "--model", str(model_dir), "--port", str(port), "--api-key", API_KEY, *extra],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    srv = Server(port, proc, log)
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"ds41rt serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(srv.base + "/health", timeout=2).status_code == 200:
                return srv
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"ds41rt serve not healthy within 60 s:\n{log.read_text()}")
        time.sleep(0.1)


def stop_server(srv: Server):
    """SIGTERM, and the server must exit 0 within 15 s."""
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait()
        pytest.fail("ds41rt serve did not stop on SIGTERM within 15 s")
    assert srv.proc.returncode == 0, srv.log.read_text()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("serve") / "serve.log", "--max-queue", "8", "--max-running", "4")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def client(server):
    return server.client()
