"""`cuco fake-llm`: a labelled fixture server on 127.0.0.1 that the LLM commands of the terminal road talk to."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_kernels" / "gemm_allgather"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fake_llm_serves_fixtures_to_cuco_fastpath(tmp_path: Path):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "cuco_kit", "fake-llm", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = [server.stdout.readline() for _ in range(3)] if server.stdout else []
        assert f"http://127.0.0.1:{port}/v1" in banner[0] and "FIXTURE" in banner[0] and "NOT a live model" in \
            banner[0], banner
        assert f"export OPENAI_BASE_URL=http://127.0.0.1:{port}/v1" in banner[2], banner
        env = {**os.environ, "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "fixture-key",
               "CUCO_MODEL": "fixture"}
        # --manual shows Stage A's answer for a decision before anything is built; "q" stops there.
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "cuco_kit", "fastpath", str(SAMPLE / "seed_nccl.cu"),
                              "--workload", str(SAMPLE), "--manual", "--db", str(tmp_path / "road.sqlite")],
                             input="q\n", capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
        assert out.returncode == 2 and "stopped at stage A by the user" in out.stdout + out.stderr, out
        assert "stage A, attempt 1 (FIXTURE answer)" in out.stdout + out.stderr, out
        assert time.monotonic() - t0 < 60
    finally:
        server.send_signal(signal.SIGINT)
        rest, _ = server.communicate(timeout=30)
    assert server.returncode == 0 and "stopped after 1 chat request(s)" in rest, rest


def test_fake_llm_refuses_a_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "cuco_kit", "fake-llm", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr + out.stdout, out
