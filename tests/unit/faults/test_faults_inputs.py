"""Fault injection on the command line's inputs: every bad candidate, workload, size and flag is one line on
stderr and exit code 2, checked before anything is built, with the refused files untouched; the GPU evaluator
without a GPU is never badged "real"; and what an LLM or a candidate wrote reaches the terminal without its
control characters."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.commands import search as search_command
from cuco_kit.evaluate import gpu_evaluator
from cuco_kit.evaluate.build import BuildResult
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store
from cuco_kit.terminal import clean, one_line
from cuco_kit.workload import MAX_RANKS

ROOT = Path(__file__).resolve().parents[3]
GEMM = ROOT / "sample_kernels" / "gemm_allgather"
ALLGATHER = ROOT / "sample_kernels" / "allgather"
CANDIDATE = ALLGATHER / "device_lsa.cu"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `cuco ARGV` in this process; it must exit 2 with one stderr line, which is returned."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors exit
        rc = exc.code
    assert rc == 2
    return one_error_line(capsys)


REAL_EVALUATE = gpu_evaluator.GpuEvaluator.evaluate


@pytest.fixture(autouse=True)
def nothing_is_evaluated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input is refused before any build or run: an evaluation here is a failure of the test."""
    def evaluate(self: object, request: object, progress: object = None) -> None:
        raise AssertionError("an evaluation started although the input was bad")

    monkeypatch.setattr(gpu_evaluator.GpuEvaluator, "evaluate", evaluate)


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


# ---- candidates and workloads ---------------------------------------------------------------------------

@pytest.mark.parametrize("content, says", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "is binary, not CUDA source"),
    (b"\xff\xfe__global__ void k() {}\n", "is not UTF-8 text"),
])
def test_eval_with_a_binary_or_non_utf8_candidate(tmp_path: Path, content: bytes, says: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cand = tmp_path / "cand.cu"
    cand.write_bytes(content)
    before = snapshot(cand)
    line = refused(["eval", str(cand), "--workload", str(ALLGATHER)], capsys)
    assert says in line and str(cand) in line
    assert snapshot(cand) == before


def broken_workload(tmp_path: Path, body: str) -> Path:
    wl = write_synthetic_workload(tmp_path / "wl")
    (wl / "workload.py").write_text(body, encoding="utf-8")
    return wl


@pytest.mark.parametrize("body, says", [
    ("WORKLOAD = (\n", "line 1"),
    ("import math\n\nraise RuntimeError('no such GPU table')\n", "line 3: RuntimeError: no such GPU table"),
    ("from cuco_kit.workload import Workload\nWORKLOAD = Workload(name='x')\n", "TypeError"),
])
@pytest.mark.parametrize("command", ["eval", "search"])
def test_a_workload_py_that_does_not_load(tmp_path: Path, body: str, says: str, command: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    wl = broken_workload(tmp_path, body)
    argv = ["eval", str(CANDIDATE), "--workload", str(wl)] if command == "eval" else \
        ["search", str(wl), "--db", str(tmp_path / "s.db"), "--evaluator", "simulated"]
    line = refused(argv, capsys)
    assert str(wl / "workload.py") in line and "cannot be loaded" in line and says in line
    assert not (tmp_path / "s.db").exists()


def test_search_with_a_non_utf8_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    baseline = wl / "baseline.cu"
    baseline.write_bytes(baseline.read_bytes().replace(b"kThreads", b"kThr\xe9ads", 1))
    before = snapshot(baseline)
    line = refused(["search", str(wl), "--db", str(tmp_path / "s.db"), "--evaluator", "simulated"], capsys)
    assert "baseline" in line and "is not UTF-8 text" in line
    assert snapshot(baseline) == before and not (tmp_path / "s.db").exists()


def test_search_with_a_missing_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    (wl / "seed_nccl.cu").unlink()
    assert "nccl seed" in refused(["search", str(wl), "--db", str(tmp_path / "s.db"), "--evaluator",
                                   "simulated"], capsys)


# ---- numbers ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks", ["10000", "0", "-3", str(MAX_RANKS + 1)])
@pytest.mark.parametrize("command", ["eval", "search"])
def test_nonsense_ranks(tmp_path: Path, ranks: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", str(CANDIDATE), "--workload", str(ALLGATHER)] if command == "eval" else \
        ["search", str(write_synthetic_workload(tmp_path / "wl")), "--db", str(tmp_path / "s.db"), "--evaluator",
         "simulated"]
    assert f"--ranks {ranks}: must be between 1 and {MAX_RANKS}" in refused([*argv, "--ranks", ranks], capsys)


@pytest.mark.parametrize("workload, size, says", [
    (GEMM, "M=-5", "a size is an integer from 0 to"),
    (GEMM, "M=0", "M must be positive"),
    (GEMM, "M=99999999999999999999", "a size is an integer from 0 to"),
    (GEMM, "M=" + "9" * 5000, "a size is an integer from 0 to"),
    (GEMM, "M=1099511627776", "GiB per rank"),
    (GEMM, "M=abc", "expected NAME=INTEGER"),
    (GEMM, "Q=5", "unknown parameter 'Q'"),
    (ALLGATHER, "N_PER_RANK=0", "sizes must make every dimension positive"),
])
def test_nonsense_sizes_are_refused_before_any_build(workload: Path, size: str, says: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cand = workload / ("seed_nccl.cu" if workload == GEMM else "device_lsa.cu")
    line = refused(["eval", str(cand), "--workload", str(workload), "--size", size], capsys)
    assert says in line


@pytest.mark.parametrize("flag, value", [("--iters", "0"), ("--iters", "99999999999")])
def test_nonsense_iterations(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"{flag} {value}" in refused(["eval", str(CANDIDATE), "--workload", str(ALLGATHER), flag, value], capsys)


@pytest.mark.parametrize("argv, says", [
    (["eval", str(CANDIDATE), "--workload", str(ALLGATHER), "--ranks", "two"], "invalid int value: 'two'"),
    (["search"], "the following arguments are required"),
    (["fastpath", str(CANDIDATE), "--max-attempts", "0"], "--max-attempts 0"),
    (["fastpath", str(CANDIDATE), "--out", "/nonexistent-folder/x.cu"], "--out /nonexistent-folder/x.cu"),
    (["eval", str(CANDIDATE), "--workload", str(ALLGATHER), "--db", "/nonexistent-folder/e.db"], "--db"),
])
def test_flags_argparse_or_ours_are_one_line(argv: list[str], says: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert says in refused(argv, capsys)


# ---- no GPU -----------------------------------------------------------------------------------------------

def test_search_with_the_gpu_evaluator_on_a_machine_without_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(search_command, "gpu_present", lambda: False)
    wl = write_synthetic_workload(tmp_path / "wl")
    line = refused(["search", str(wl), "--db", str(tmp_path / "s.db")], capsys)  # --evaluator gpu is the default
    assert "no GPU" in line and "--evaluator simulated" in line and "--evaluator replay" in line
    assert not (tmp_path / "s.db").exists()


def test_the_gpu_evaluator_without_gpu_is_unmeasured_not_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # L1 passes (a stand-in for nvcc) and nvidia-smi lists no GPU: nothing is measured
    monkeypatch.setattr(gpu_evaluator.GpuEvaluator, "evaluate", REAL_EVALUATE)  # this input is good: it evaluates
    monkeypatch.setattr(gpu_evaluator, "build", lambda *a, **k: BuildResult(True, tmp_path / "c.so", "", 0.0,
                                                                             True, "k"))
    monkeypatch.setattr(gpu_evaluator, "detect_gpu", lambda *a, **k: [])
    db = tmp_path / "e.db"
    assert main(["eval", str(CANDIDATE), "--workload", str(ALLGATHER), "--ranks", "2", "--backend", "symm",
                 "--db", str(db), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"badge": "unmeasured"' in out and '"verdict": "unavailable"' in out
    with Store(db) as st:
        (run,) = st.runs()
        (ev,) = st.evaluations(run_id=run["id"])
        assert run["badge"] == ev["badge"] == "unmeasured" and ev["median_ms"] is None


# ---- the terminal -----------------------------------------------------------------------------------------

ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\r\x00"


def test_clean_drops_control_characters_but_keeps_lines_and_tabs() -> None:
    assert clean(f"a{ESCAPES}b\n\tc") == "a[2J]0;owned31mb\n\tc"
    assert one_line("x\ny\tz \x1b[0m") == "x y z [0m"


def test_llm_names_reach_the_terminal_without_escape_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    diff = (f"NAME: streaming{ESCAPES} stores\nRATIONALE: r\nTAGS: memory\n<<<<<<< SEARCH\n    y[j] = x[j];\n"
            "=======\n    float v = __ldg(&x[j]);\n    __stcs(&y[j], v);\n>>>>>>> REPLACE\n")
    with FakeOpenAIServer([answer("diff", diff, times=0)]) as srv:
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        rc = main(["search", str(wl), "--mutator", "llm", "--generations", "1", "--db", str(tmp_path / "s.db"),
                   "--evaluator", "simulated", "--llm-retries", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "streaming[2J]0;owned31m stores" in out  # the name is shown, its control characters are not
    assert not any(c in out + err for c in "\x1b\x07\x9b\r\x00")
    with Store(tmp_path / "s.db") as st:  # the store keeps what the LLM said, byte for byte
        assert any(ESCAPES in p["name"] for p in st.programs(st.runs()[0]["id"]))


def test_an_error_quoting_a_file_name_is_cleaned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["check", str(tmp_path / "\x1b[31mred.cu")], capsys)
    assert "no such file" in line and "\x1b" not in line and "[31mred.cu" in line


# ---- the real process -------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda d: ["eval", str(_write(d / "b.cu", b"\x00\x01\x02")), "--workload", str(ALLGATHER)],
    lambda d: ["eval", str(CANDIDATE), "--workload", str(GEMM), "--size", "M=99999999999999999999"],
])
def test_through_python_m_cuco_kit(tmp_path: Path, make: Callable[[Path], list[str]]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cuco_kit", *make(tmp_path)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
