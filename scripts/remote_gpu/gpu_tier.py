"""The gpu test tier in one call of at most --budget-s seconds (device_samples.sh gpu_tier, gpu_quick).

Two parts, each one pytest run over tests/gpu/ (any test file there is picked up; only the `serial` marker decides
which part runs it):
  1. parallel: every gpu test NOT marked `serial`, by pytest-xdist one file per worker (`-n N --dist loadfile`),
     under ONE MPS control daemon in the default pipe directory, started here before pytest and stopped after it
     (a daemon that already answers is used and left running: the rule of cuco_kit/evaluate/mps.py, where every
     evaluator uses such a daemon instead of starting its own). These tests check verdicts, not times, so they
     may share the GPU: the symm ranks of every file are clients of one MPS server. They share one build cache
     (the evaluator's default, ~/.cache/cuco/builds): a key is compiled once (build.py holds a per-key lock while
     nvcc runs) and published with an atomic rename, so concurrent builds of one key are safe.
  2. serial, after: the tests marked `serial`, one at a time, on an otherwise idle GPU and with no shared daemon
     (their evaluators start and stop their own, as a user's do): the launch-bias check (a ratio of times) and the
     harness GPU check (warm against cold evaluation time; a leak check of the whole machine: rank processes, MPS
     daemons, GPU memory).
The rules a gpu test follows for this: one that measures time or looks at the whole machine is marked `serial`;
one that faults the GPU on purpose keeps its ranks out of the shared daemon (the sanitizer test of
test_fastpath_gpu.py) or is serial, since a fault may disturb the other clients of an MPS server; a module frees
the worlds it will not use again (evaluator.pool.close()), so the parallel part stays well within the server's
limit on clients (a few dozen per GPU; about 30 rank processes at most here) and the GPU's memory.

--quick (gpu_quick, 300 s): CUCO_GPU_QUICK=1, so the tests and cases marked `slow` are left out and the benchmark
scripts behind the tests run at their smaller settings (tests/gpu/conftest.py); every file still runs a check.

Writes into --out: gpu-parallel.xml and gpu-serial.xml (junit), each part's output (gpu-<part>.log), the shared
daemon's log (mps-log/) and gpu_tier.json; prints each part's output with pytest's --durations and, last, one line
per test file and part (passed, failed, errors, skipped, seconds) and the verdict. Exit code 0 when both passed.
Run from the repository root on the GPU machine: `python3 scripts/remote_gpu/gpu_tier.py --out DIR`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

# Run by path, not installed: the kit from this checkout goes first on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuco_kit.evaluate.device import MULTICAST_OFF
from cuco_kit.evaluate.launcher import inherited_env
from cuco_kit.evaluate.mps import CONTROL, daemon_answers, mps_daemon_pids, parent_pid
from cuco_kit.evaluate.pool import live_worker_pids

ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = "tests/gpu"
PARTS = (("parallel", "gpu and not serial"), ("serial", "gpu and serial"))
BUDGET_S = {"full": 540, "quick": 300}
SERIAL_RESERVE_S = {"full": 230, "quick": 120}  # kept for the serial part while the parallel part runs
CLOSING_S = 15  # stopping the daemon, the summary
OUTCOMES = ("passed", "failed", "error", "skipped")
LINE = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
NODE = re.compile(r"(tests/gpu/[\w/]+\.py)::(\S+)")


# ------------------------------------------------------------------------------------------------ the MPS daemon
class SharedMps:
    """One MPS control daemon in the default pipe directory for the parallel part; stopped by stop() only if
    started here (then by its own pids if quit does not end it)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[int] = []
        self.note = ""

    def env(self) -> dict[str, str]:
        # the rank allow-list, as mps.py gives its daemons: a rank that reads the daemon's /proc finds no secret
        return {**inherited_env(), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def start(self) -> None:
        if daemon_answers(None):
            self.note = "an MPS daemon already answered in the default pipe directory: used, left running"
            return
        exe = shutil.which(CONTROL)
        if exe is None:
            self.note = f"{CONTROL} not found: no shared daemon (evaluators start their own or run time-sliced)"
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        before = set(mps_daemon_pids())
        p = subprocess.run([exe, "-d"], env=self.env(), capture_output=True, text=True, timeout=30)
        deadline = time.monotonic() + 10
        while p.returncode == 0 and not daemon_answers(None) and time.monotonic() < deadline:
            time.sleep(0.2)
        if p.returncode != 0 or not daemon_answers(None):
            self.note = f"could not start a shared MPS daemon ({(p.stdout + p.stderr).strip()[:200]}): none shared"
            return
        self.started = sorted(set(mps_daemon_pids()) - before)
        self.note = f"started a shared MPS daemon in the default pipe directory (pids {self.started})"

    def stop(self) -> str:
        if not self.started:
            return "no shared daemon of ours to stop"
        ours = set(self.started)
        ours.update(p for p in mps_daemon_pids() if parent_pid(p) in ours)  # its server
        subprocess.run([shutil.which(CONTROL) or CONTROL], input="quit\n", env=self.env(), capture_output=True,
                       text=True, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and ours & set(mps_daemon_pids()):
            time.sleep(0.2)
        left = sorted(ours & set(mps_daemon_pids()))
        for pid in left:
            kill(pid, signal.SIGKILL)
        self.started = []
        return f"stopped the shared MPS daemon{f' (killed {left}: quit did not end them)' if left else ''}"


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------------- one part
def pytest_command(marker: str, workers: int, xml: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", marker, "-v", "-rfE", "--durations=25",
           "--durations-min=1", f"--junitxml={xml}"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadfile"]
    return cmd + [GPU_TESTS]


def run_part(name: str, marker: str, workers: int, limit_s: float, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One pytest run in a session of its own, its output copied to ours and to gpu-<name>.log; past limit_s the
    whole session is ended (TERM, then KILL), and so is any rank worker it left behind (by pid)."""
    xml, log = out / f"gpu-{name}.xml", out / f"gpu-{name}.log"
    cmd = pytest_command(marker, workers, xml)
    print(f"== gpu tier, {name} part ({workers} worker{'s' if workers > 1 else ''}, at most {limit_s:.0f} s): "
          f"{' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def ended_from_outside(signum: int, frame: Any) -> None:  # e.g. device_samples.sh's own timeout: take pytest along
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, ended_from_outside)
    lines: list[str] = []

    def copy() -> None:
        assert proc.stdout is not None
        with log.open("w") as f:
            for line in proc.stdout:
                lines.append(line)
                f.write(line)
                sys.stdout.write(line)
                sys.stdout.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=max(1.0, limit_s))
    except subprocess.TimeoutExpired:
        rc = 124
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        print(f"== gpu tier, {name} part: over its {limit_s:.0f} s, ended", flush=True)
    signal.signal(signal.SIGTERM, previous)
    reader.join(timeout=10)
    leftover = live_worker_pids()
    for pid in leftover:
        kill(pid, signal.SIGKILL)
    return {"part": name, "marker": marker, "workers": workers, "rc": rc, "limit_s": round(limit_s),
            "seconds": round(time.monotonic() - t0, 1), "killed_rank_workers": leftover,
            "cases": junit_cases(xml) if xml.exists() else cases_from_output(lines)}


# ---------------------------------------------------------------------------------------------------- reading
def file_of(classname: str) -> str:
    """junit classname (tests.gpu.test_x, or tests.gpu.test_x.TestClass) -> test_x.py."""
    parts = classname.split(".")
    return next((p + ".py" for p in parts if p.startswith("test_")), classname)


def junit_cases(xml: Path) -> list[dict[str, Any]]:
    """Every testcase of a junit file: file, name, outcome, seconds (setup, call and teardown: a module fixture
    counts in the first test that uses it)."""
    cases = []
    for tc in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in tc}
        outcome = ("failed" if "failure" in kinds else "error" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        cases.append({"file": file_of(tc.get("classname", "")), "name": tc.get("name", ""), "outcome": outcome,
                      "seconds": float(tc.get("time") or 0.0)})
    return cases


def cases_from_output(lines: list[str]) -> list[dict[str, Any]]:
    """Without a junit file (the part was ended): the outcomes pytest -v printed, seconds unknown."""
    cases = []
    for line in lines:
        node, word = NODE.search(line), LINE.search(line)
        if node and word:
            outcome = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "error"}.get(
                word.group(1), "skipped")
            cases.append({"file": Path(node.group(1)).name, "name": node.group(2), "outcome": outcome,
                          "seconds": None})
    return cases


def file_rows(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (test file, part): counts per outcome and seconds (the sum over its tests)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for part in parts:
        for c in part["cases"]:
            row = rows.setdefault((c["file"], part["part"]), {"file": c["file"], "part": part["part"], "seconds": 0.0,
                                                              **dict.fromkeys(OUTCOMES, 0)})
            row[c["outcome"]] += 1
            row["seconds"] = None if c["seconds"] is None or row["seconds"] is None else row["seconds"] + c["seconds"]
    return sorted(rows.values(), key=lambda r: (r["part"] != "parallel", r["file"]))


def summary(mode: str, parts: list[dict[str, Any]], files: list[str], wall_s: float, budget_s: float,
            notes: list[str]) -> tuple[str, bool]:
    """The lines printed last, and whether the tier passed."""
    rows = file_rows(parts)
    totals = {k: sum(r[k] for r in rows) for k in OUTCOMES}
    ran = {r["file"] for r in rows}
    missing = [f for f in files if f not in ran]
    ok = (all(p["rc"] in (0, 5) for p in parts) and totals["passed"] > 0 and not totals["failed"]
          and not totals["error"] and not missing)
    out = [f"== gpu tier ({mode}): {wall_s:.0f} s of {budget_s:.0f} s", *[f"   {n}" for n in notes],
           f"{'part':9s} {'workers':>7s} {'rc':>4s} {'seconds':>8s} {'limit':>6s}"]
    out += [f"{p['part']:9s} {p['workers']:7d} {p['rc']:4d} {p['seconds']:8.1f} {p['limit_s']:6d}"
            + (f"  killed rank workers {p['killed_rank_workers']}" if p["killed_rank_workers"] else "") for p in parts]
    out.append(f"{'file':34s} {'part':9s} {'pass':>4s} {'fail':>4s} {'err':>4s} {'skip':>4s} {'seconds':>8s}")
    for r in rows:
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
        out.append(f"{r['file']:34s} {r['part']:9s} {r['passed']:4d} {r['failed']:4d} {r['error']:4d} "
                   f"{r['skipped']:4d} {secs:>8s}")
    out += [f"{f:34s} NOT RUN (no result in either part)" for f in missing]
    slow = sorted((c for p in parts for c in p["cases"] if (c["seconds"] or 0) >= 1), key=lambda c: -c["seconds"])[:5]
    if slow:
        out.append("slowest: " + "; ".join(f"{c['file']}::{c['name']} {c['seconds']:.0f} s" for c in slow))
    out.append(f"GPU TIER {'PASSED' if ok else 'FAILED'}: {totals['passed']} passed, {totals['failed']} failed, "
               f"{totals['error']} errors, {totals['skipped']} skipped in {wall_s:.0f} s")
    return "\n".join(out), ok


# ------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the junit files, logs and gpu_tier.json")
    ap.add_argument("--quick", action="store_true", help="the quick form (CUCO_GPU_QUICK=1)")
    ap.add_argument("--budget-s", type=float, default=None, help="the whole tier's limit (540; 300 with --quick)")
    ap.add_argument("--workers", type=int, default=None, help="pytest-xdist workers of the parallel part")
    ap.add_argument("--serial-reserve-s", type=float, default=None,
                    help="seconds kept for the serial part while the parallel part runs (230; 120 with --quick)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    mode = "quick" if args.quick else "full"
    budget = args.budget_s or BUDGET_S[mode]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(p.name for p in (ROOT / GPU_TESTS).glob("test_*.py"))
    workers = args.workers or min(8, len(files), max(1, (os.cpu_count() or 2) // 2))
    notes = []
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        notes.append("pytest-xdist is not installed: the parallel part runs one test at a time")
        workers = 1
    env = {**os.environ, **MULTICAST_OFF, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    if args.quick:
        env["CUCO_GPU_QUICK"] = "1"
    parts = []
    mps = SharedMps(out / "mps-log")
    mps.start()
    notes.append(mps.note)
    reserve = min(args.serial_reserve_s or SERIAL_RESERVE_S[mode], budget / 2)
    try:
        limit = budget - reserve - CLOSING_S - (time.monotonic() - t0)
        parts.append(run_part(*PARTS[0], workers, limit, out, env))
    finally:
        notes.append(mps.stop())
    limit = budget - CLOSING_S - (time.monotonic() - t0)
    parts.append(run_part(*PARTS[1], 1, limit, out, env))
    wall = time.monotonic() - t0
    text, ok = summary(mode, parts, files, wall, budget, notes)
    (out / "gpu_tier.json").write_text(json.dumps({"mode": mode, "budget_s": budget, "wall_s": round(wall, 1),
                                                   "workers": workers, "notes": notes, "parts": parts,
                                                   "files": file_rows(parts), "passed": ok}, indent=1))
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
