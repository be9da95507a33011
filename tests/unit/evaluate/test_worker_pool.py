"""Warm worker pool with a fake body (no CUDA): recycling every K evaluations, after a fatal reply, after a
hang, never after a candidate's own failure (a runtime wait that gave up); progress events reach the caller; the
world is gone afterwards.

As root the worlds run in PID namespaces (launcher), where a rank's own pid means nothing outside: a rank process
is told apart by a random id it makes at start, and looked up on the host as the child of its launcher process."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from cuco_kit.evaluate.api import EvalRequest
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.evaluate.pool import GroupSpec, PoolConfig, WorkerError, WorkerGroup, WorkerPool

ROOT = Path(__file__).resolve().parents[3]

FAKE_BODY = r'''
import os, secrets, time

PROC = secrets.token_hex(8)  # this rank process, whatever PID namespace it is in

class Body:
    def __init__(self, rank, world, config, chan):
        self.rank, self.world, self.chan = rank, world, chan
        chan.exchange("fake-init", True)  # a collective setup phase, like the communicator

    def info(self):
        return {"proc": PROC, "rank": self.rank}

    def handle(self, cmd, index):
        mode = cmd.get("mode", "ok")
        self.chan.progress({"level": "L3", "step": "timed", "done": 1, "total": 2}, limit_s=cmd.get("limit_s", 5))
        if mode == "hang" and self.rank == self.world - 1:
            time.sleep(10_000)
        if mode == "fatal" and self.rank == 0:
            return {"ok": False, "verdict": "fail", "fatal": True, "reason": "illegal memory access"}
        if mode == "fatal":
            time.sleep(10_000)  # a peer stuck waiting for the faulted rank
        if mode == "wait_gave_up":  # rank 1's runtime wait gave up: the candidate failed, the process is fine
            reason = ("rank 1: timeout: waited on user flag (peer 1, slot 3) epoch 1 for 2.0 s" if self.rank == 1
                      else "a peer failed in verification trial 1/3")
            return {"ok": False, "verdict": "fail", "level": "L2", "reason": reason, "proc": PROC}
        return {"ok": True, "verdict": "pass", "times_ms": [1.0 + self.rank], "proc": PROC}

    def close(self):
        pass
'''


@pytest.fixture()
def body_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bodies"
    d.mkdir()
    (d / "fake_body.py").write_text(FAKE_BODY)
    return d


def _spec(world: int, body_dir: Path):
    def make(scratch: Path) -> GroupSpec:
        return GroupSpec(world=world, config={}, scratch=scratch, body="fake_body:Body",
                         pythonpath=os.pathsep.join([str(body_dir), str(ROOT)]), python=sys.executable)
    return make


def rank_pids(g: WorkerGroup) -> list[int]:
    """Host pids of a world's rank processes: its launched processes, or in a PID namespace their children."""
    assert g.group is not None
    if g.group.namespace is None:
        return g.group.pids()
    return [int(c) for p in g.group.pids() for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


def test_recycled_every_k_evaluations_and_progress_arrives(tmp_path: Path, body_dir: Path) -> None:
    pool = WorkerPool(PoolConfig(recycle_every=2, start_timeout_s=120), tmp_path / "ranks")
    events: list[dict] = []
    procs_per_eval = []
    pids_per_eval = []
    try:
        for _ in range(5):
            g = pool.group("k", _spec(2, body_dir))
            replies = g.request({"op": "eval"}, timeout_s=60, progress=events.append)
            assert [r["verdict"] for r in replies] == ["pass", "pass"]
            procs_per_eval.append(tuple(r["proc"] for r in replies))
            pids_per_eval.append(rank_pids(g))
        assert pool.starts == 3  # evaluations 1-2, 3-4, 5
        assert procs_per_eval[0] == procs_per_eval[1] != procs_per_eval[2] == procs_per_eval[3] != procs_per_eval[4]
        assert any(e.get("level") == "L3" and e.get("rank") == 1 for e in events)
        assert all("limit_s" not in e and "t" not in e for e in events)
        assert len(pids_per_eval[0]) == 2
        assert not any(_alive(p) for p in pids_per_eval[0]), "a recycled world left a process behind"
    finally:
        pool.close()
    assert not any(_alive(p) for p in pids_per_eval[-1])


def test_fatal_reply_ends_the_world_and_the_next_call_starts_a_new_one(tmp_path: Path, body_dir: Path) -> None:
    pool = WorkerPool(PoolConfig(recycle_every=100, start_timeout_s=120, fatal_grace_s=0.5), tmp_path / "ranks")
    try:
        g = pool.group("k", _spec(2, body_dir))
        first, first_pids = [i["proc"] for i in g.info], rank_pids(g)
        t0 = time.monotonic()
        replies = g.request({"op": "eval", "mode": "fatal"}, timeout_s=60)
        assert time.monotonic() - t0 < 20  # the stuck peer is not waited for
        assert replies[0]["fatal"] and replies[1] is None
        assert g.broken and not any(_alive(p) for p in first_pids)
        g2 = pool.group("k", _spec(2, body_dir))
        assert pool.starts == 2 and [i["proc"] for i in g2.info] != first
        assert pool.recycles and "failed" in pool.recycles[0]
        assert [r["verdict"] for r in g2.request({"op": "eval"}, timeout_s=60)] == ["pass", "pass"]
    finally:
        pool.close()


def test_a_wait_that_gave_up_fails_the_candidate_and_keeps_the_world(tmp_path: Path, body_dir: Path) -> None:
    pool = WorkerPool(PoolConfig(recycle_every=100, start_timeout_s=120), tmp_path / "ranks")
    try:
        g = pool.group("k", _spec(2, body_dir))
        procs = [i["proc"] for i in g.info]
        replies = g.request({"op": "eval", "mode": "wait_gave_up"}, timeout_s=60)
        assert [r["verdict"] for r in replies] == ["fail", "fail"] and not g.broken
        assert pool.group("k", _spec(2, body_dir)) is g and pool.starts == 1 and not pool.recycles
        assert [r["proc"] for r in g.request({"op": "eval"}, timeout_s=60)] == procs
    finally:
        pool.close()


def test_a_hang_raises_kills_the_world_and_names_the_rank(tmp_path: Path, body_dir: Path) -> None:
    pool = WorkerPool(PoolConfig(start_timeout_s=120, hang_slack_s=0.5), tmp_path / "ranks")
    try:
        g = pool.group("k", _spec(2, body_dir))
        pids = rank_pids(g)
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as ei:
            g.request({"op": "eval", "mode": "hang", "limit_s": 1.0}, timeout_s=60)
        assert ei.value.kind == "hang" and "rank 1" in str(ei.value)
        assert time.monotonic() - t0 < 15
        assert not any(_alive(p) for p in pids)
        assert "rank0" in ei.value.logs
    finally:
        pool.close()


def test_a_changed_workload_fingerprint_starts_a_new_world(tmp_path: Path, body_dir: Path) -> None:
    pool = WorkerPool(PoolConfig(recycle_every=100, start_timeout_s=120), tmp_path / "ranks")
    try:
        g = pool.group("k", _spec(1, body_dir), fingerprint="reference-a")
        assert pool.group("k", _spec(1, body_dir), fingerprint="reference-a") is g
        g2 = pool.group("k", _spec(1, body_dir), fingerprint="reference-b")
        assert g2 is not g and pool.starts == 2
        assert pool.recycles == ["the workload changed since this world started"]
    finally:
        pool.close()


class _FakeWorld:
    """A warm world as the pool holds it: alive unless killed, closed once."""

    def __init__(self, killed: bool = False) -> None:
        self.broken, self.closed = killed, False

    def alive(self) -> bool:
        return not self.broken

    def close(self) -> None:
        self.closed = True


def _key(size: int, backend: str) -> str:
    return GpuEvaluator._world_key(EvalRequest(candidate_code="", workload_dir="/w", world_size=2,
                                               backend=backend), {"N": size})


@pytest.mark.parametrize("killed, replaced", [(True, True), (False, False)])
def test_a_killed_symm_world_takes_the_symm_worlds_beside_it_under_mps_along(tmp_path: Path, killed: bool,
                                                                             replaced: bool) -> None:
    """A rank killed mid-kernel under MPS can leave the other clients' contexts broken: after it, every other symm
    world (the race-check size's) is replaced and counted as recycled; a nccl world keeps going. A wait that ended
    in a verdict killed nothing, so nothing beside it is replaced."""
    ev = GpuEvaluator(EvaluatorConfig(scratch_root=tmp_path))
    ev._mps = NS(recover=lambda: "MPS canary ok after the fault", stop=lambda: None)  # type: ignore[assignment]
    hung, race, other = _FakeWorld(killed), _FakeWorld(), _FakeWorld()
    ev.pool.groups = {_key(1024, "symm"): hung, _key(4096, "symm"): race, _key(1024, "nccl"): other}  # type: ignore
    notes: list[str] = []
    ev._after_fault(EvalRequest(candidate_code="", workload_dir="/w", world_size=2, backend="symm"), notes)
    assert notes[0] == "MPS canary ok after the fault"
    assert race.closed is replaced and (_key(4096, "symm") in ev.pool.groups) is not replaced
    assert not hung.closed and not other.closed and _key(1024, "nccl") in ev.pool.groups
    assert len(ev.pool.recycles) == int(replaced) and any("same MPS server" in n for n in notes) is replaced
