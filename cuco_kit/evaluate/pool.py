"""Warm rank workers, parent side: start a world of worker processes once, send them commands, recycle them.

A ``WorkerGroup`` is N rank processes (launcher.launch) serving the store protocol of rank/worker.py over a
store of its own (launcher.host_store: loopback only, values sealed with the group's token, which the ranks get
in their environment). A value in the store that does not open under the token was not written by this world:
it is ignored, as if the key were not there yet. A ``WorkerPool`` keeps one group per key (workload, sizes,
world, backend) and recycles it after any fatal reply (CUDA error), any hang, every ``recycle_every``
commands, and when the group's ``fingerprint`` changes (the workload's files were edited: the ranks imported
the old ones when they started). The parent never creates a CUDA context: it only hosts the store and watches progress.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.evaluate.launcher import Isolation, RankGroup, host_store, launch
from cuco_kit.evaluate.seal import StoreAuthError

ProgressFn = Callable[[dict[str, Any]], None]
# What every rank process runs (`python -m`); named here only, never imported: it lives in the rank package.
WORKER_MODULE = "cuco_kit.evaluate.rank.worker"


class WorkerError(RuntimeError):
    """The world could not serve a command. kind: "died" (a rank exited), "hang" (no progress in time),
    "start" (init failed). ``logs`` holds the ranks' log tails."""

    def __init__(self, kind: str, message: str, logs: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.logs = dict(logs or {})


@dataclass
class GroupSpec:
    """What a world of workers is started with. ``config`` goes to every rank as a JSON file."""

    world: int
    config: dict[str, Any]
    scratch: Path
    body: str | None = None  # "module:factory"; None = the real harness
    extra_env: dict[str, str] = field(default_factory=dict)
    per_rank_env: list[dict[str, str]] | None = None
    local_ranks: list[int] | None = None
    python: str = sys.executable
    pythonpath: str | None = None  # prepended to PYTHONPATH so `-m WORKER_MODULE` imports
    wrapper: list[str] = field(default_factory=list)  # a tool the ranks run under (compute-sanitizer ...)
    pid_namespace: bool = True  # a PID namespace per world where possible (launcher's module docstring)


@dataclass
class PoolConfig:
    recycle_every: int = 25  # evaluations per world before it is replaced (bounds leaks from dlopen'ed code)
    start_timeout_s: float = 300.0  # torch import + communicator + windows
    quit_timeout_s: float = 20.0
    poll_s: float = 0.02
    hang_slack_s: float = 5.0  # added to a rank's announced step limit before it counts as hung
    default_limit_s: float = 120.0  # a rank that announced no limit may be silent this long
    fatal_grace_s: float = 2.0  # after a fatal reply, how long the other ranks get to reply


class WorkerGroup:
    def __init__(self, spec: GroupSpec, config: PoolConfig | None = None) -> None:
        self.spec = spec
        self.cfg = config or PoolConfig()
        self.store: Any = None  # sealed_store.SealedStore
        self.port = 0
        self.group: RankGroup | None = None
        self.isolation: Isolation | None = None
        self.info: list[dict[str, Any]] = []
        self.commands = 0
        self.evaluations = 0  # "eval" commands served (the recycle count)
        self._last_logs: dict[str, str] = {}
        self.broken = False  # set after a fatal reply or a hang: the pool replaces the group
        self.started_s = 0.0
        self.fingerprint = ""  # what the ranks loaded at start (WorkerPool.group); a change recycles the world

    # ---------------------------------------------------------------------------------------------- life
    def start(self, progress: ProgressFn | None = None) -> None:
        t0 = time.monotonic()
        spec = self.spec
        spec.scratch.mkdir(parents=True, exist_ok=True)
        hosted = host_store()
        self.store, self.port = hosted.store, hosted.port
        cfg_file = spec.scratch / "worker_config.json"
        cfg_file.write_text(json.dumps(spec.config, indent=1, default=str))
        env = dict(spec.extra_env)
        env.update({**hosted.env(), "CUCO_WORKER_CONFIG": str(cfg_file)})
        if spec.body:
            env["CUCO_WORKER_BODY"] = spec.body
        pp = [p for p in (spec.pythonpath, os.environ.get("PYTHONPATH")) if p]
        if pp:
            env["PYTHONPATH"] = os.pathsep.join(pp)
        self.group = launch([*spec.wrapper, spec.python, "-m", WORKER_MODULE], spec.world, scratch=spec.scratch,
                            master_port=self.port, extra_env=env, per_rank_env=spec.per_rank_env,
                            local_ranks=spec.local_ranks, pid_namespace=spec.pid_namespace)
        self.isolation = self.group.isolation
        keys = [f"ready/{r}" for r in range(spec.world)]
        try:
            self._wait_keys(keys, self.cfg.start_timeout_s, "start", progress)
        except WorkerError:
            self.kill()
            raise
        ready = [self._read(k) or {} for k in keys]
        bad = [f"rank {r}: {x.get('error')}" for r, x in enumerate(ready) if not x.get("ok")]
        if bad:
            logs = self.group.tails()
            self.kill()
            raise WorkerError("start", "rank workers failed to start: " + "; ".join(bad), logs)
        self.info = [x.get("info", {}) for x in ready]
        self.started_s = time.monotonic() - t0

    def alive(self) -> bool:
        return self.group is not None and self.group.alive() and not self.broken

    def close(self) -> None:
        """Ask the ranks to quit (teardown of communicator and windows), then make sure they are gone."""
        if self.group is None:
            return
        if self.group.alive() and not self.broken:
            try:
                self.request({"op": "quit"}, timeout_s=self.cfg.quit_timeout_s)
            except WorkerError:
                pass
            self.group.wait(self.cfg.quit_timeout_s)
        self.kill()

    def kill(self) -> None:
        if self.group is not None:
            self.group.kill()
        self.broken = True
        self.store = None  # the TCPStore server ends with its last reference

    def tails(self, limit: int = 4000) -> dict[str, str]:
        return self.group.tails(limit) if self.group else dict(self._last_logs)

    # -------------------------------------------------------------------------------------------- commands
    def request(self, cmd: dict[str, Any], *, timeout_s: float,
                progress: ProgressFn | None = None) -> list[dict[str, Any] | None]:
        """Send one command to every rank and return their replies (index = rank; None: a rank that did not
        reply). Raises WorkerError (and marks the group broken) when a rank dies or hangs; a missing reply or
        one with "fatal" marks it broken too."""
        if self.group is None or self.store is None:
            raise WorkerError("died", "worker group is not running")
        n = self.commands
        self.commands += 1
        self.store.set(f"cmd/{n}", json.dumps(cmd, default=str))
        keys = [f"resp/{n}/{r}" for r in range(self.spec.world)]
        if cmd.get("op") == "eval":
            self.evaluations += 1
        self._wait_keys(keys, timeout_s, "cmd", progress, cmd_index=n)
        replies: list[Any] = [self._read(k) for k in keys]  # None: no reply from that rank
        if any(r is None or r.get("fatal") for r in replies):
            # a fatal rank exits; its peers may be stuck waiting for it: end the whole world now
            self.broken = True
            self._last_logs = self.group.tails() if self.group else {}
            self.kill()
        elif any(r is not None and r.get("recycle") for r in replies):
            self.broken = True
        return replies

    def _wait_keys(self, keys: Sequence[str], timeout_s: float, what: str, progress: ProgressFn | None,
                   cmd_index: int | None = None) -> None:
        assert self.group is not None
        world = self.spec.world
        deadline = time.monotonic() + timeout_s
        last_seen = [time.monotonic()] * world
        last_event: list[dict[str, Any] | None] = [None] * world
        last_read: list[dict[str, Any] | None] = [None] * world
        replied = [False] * world
        fatal_at: float | None = None
        while True:
            for r in range(world):
                ev = self._read(f"prog/{r}")
                if ev is not None and ev != last_read[r]:
                    last_read[r] = ev
                    if cmd_index is None or ev.get("cmd") == cmd_index:
                        last_seen[r] = time.monotonic()
                        last_event[r] = ev
                        if progress is not None:
                            progress({k: v for k, v in ev.items() if k not in ("t", "cmd", "limit_s")})
                if not replied[r]:
                    reply = self._read(keys[r])
                    if reply is not None:
                        replied[r] = True
                        if what == "cmd" and fatal_at is None and reply.get("fatal"):
                            fatal_at = time.monotonic()
            if all(replied):
                return
            if fatal_at is not None and time.monotonic() - fatal_at > self.cfg.fatal_grace_s:
                return  # the others are likely stuck waiting for the fatal rank; request() ends them
            dead = [r for r in self.group.dead() if not replied[r]]
            if dead and fatal_at is not None:
                return
            if dead:
                # give the others a moment to post what they noticed, then report
                time.sleep(0.2)
                self.broken = True
                codes = self.group.returncodes()
                logs = self.group.tails()
                notes = self._failure_notes(cmd_index)
                self.kill()
                raise WorkerError("died", f"rank {', '.join(map(str, dead))} exited (codes "
                                  f"{[codes[r] for r in dead]}) during {what}{notes}", logs)
            now = time.monotonic()
            for r in range(world):
                if replied[r]:
                    continue
                ev = last_event[r]
                limit = float(ev.get("limit_s", self.cfg.default_limit_s)) if ev else self.cfg.default_limit_s
                if what == "start":
                    limit = timeout_s
                if now - last_seen[r] > limit + self.cfg.hang_slack_s or now > deadline:
                    self.broken = True
                    logs = self.group.tails()
                    notes = self._failure_notes(cmd_index)
                    self.kill()
                    step = f" in {ev.get('level', '')} {ev.get('step', '')} {ev.get('done', '')}/" \
                           f"{ev.get('total', '')}" if ev else ""
                    why = (f"rank {r} made no progress for {now - last_seen[r]:.1f} s{step} (limit {limit:.1f} s)"
                           if now <= deadline else f"no reply within {timeout_s:.0f} s (rank {r}{step})")
                    raise WorkerError("hang" if what != "start" else "start", f"hang: {why}{notes}", logs)
            time.sleep(self.cfg.poll_s)

    def _read(self, key: str) -> dict[str, Any] | None:
        """The JSON object at ``key``; None when the key is absent or its value was not sealed by this world
        (written by another process that reached the store: ignored, like a key not yet written)."""
        try:
            if not self.store.check([key]):
                return None
            value = json.loads(self.store.get_sealed(key))
        except StoreAuthError:
            return None
        return value if isinstance(value, dict) else None

    def _failure_notes(self, cmd_index: int | None) -> str:
        if cmd_index is None or self.store is None:
            return ""
        notes = [f"rank {r}: {note.get('reason')}" for r in range(self.spec.world)
                 if (note := self._read(f"fail/{cmd_index}/{r}")) is not None]
        return ("; noted before: " + "; ".join(notes)) if notes else ""


class WorkerPool:
    """One warm WorkerGroup per key; thread-safe (one command at a time per pool)."""

    def __init__(self, config: PoolConfig | None = None, scratch_root: Path | None = None) -> None:
        self.cfg = config or PoolConfig()
        self.root = Path(scratch_root or tempfile.mkdtemp(prefix="cuco-ranks-"))
        self.groups: dict[str, WorkerGroup] = {}
        self.lock = threading.RLock()
        self.starts = 0  # how many worlds were started (tests and overhead reports read it)
        self.pid_namespace = True  # False once a world failed to start in one and started without
        self.recycles: list[str] = []  # why each world was replaced

    def group(self, key: str, make_spec: Callable[[Path], GroupSpec], progress: ProgressFn | None = None,
              on_recycle: Callable[[str], None] | None = None, fingerprint: str = "") -> WorkerGroup:
        with self.lock:
            g = self.groups.get(key)
            reason = None
            if g is not None:
                if g.broken or not g.alive():
                    reason = "previous world failed (CUDA error, hang or exit)"
                elif g.fingerprint != fingerprint:
                    reason = "the workload changed since this world started"
                elif g.evaluations >= self.cfg.recycle_every:
                    reason = f"served {g.evaluations} evaluations (recycle_every={self.cfg.recycle_every})"
            if g is not None and reason:
                self.recycles.append(reason)
                g.close()
                del self.groups[key]
                if on_recycle:
                    on_recycle(reason)
                g = None
            if g is None:
                g = self._start(make_spec, progress)
                g.fingerprint = fingerprint
                self.groups[key] = g
            return g

    def _start(self, make_spec: Callable[[Path], GroupSpec], progress: ProgressFn | None) -> WorkerGroup:
        self.starts += 1
        spec = make_spec(self.root / f"w{self.starts:04d}")
        spec.pid_namespace = spec.pid_namespace and self.pid_namespace
        g = WorkerGroup(spec, self.cfg)
        try:
            g.start(progress)
            return g
        except WorkerError as exc:
            if g.isolation is None or not g.isolation.pid_namespace:
                raise
            first = str(exc)[:300]
        # A clash between the namespace and this machine (driver, MPS) must not fail evaluations: start once more
        # without one; if that fails too, the namespace was not the cause and its error is the one to report.
        spec = make_spec(self.root / f"w{self.starts:04d}-no-pidns")
        spec.pid_namespace = False
        g = WorkerGroup(spec, self.cfg)
        g.start(progress)
        self.pid_namespace = False
        assert g.isolation is not None
        g.isolation.note = (f"no PID namespace: a world failed to start in one ({first}); this pool starts its "
                            f"worlds without one. {g.isolation.note}")
        return g

    def discard(self, key: str, reason: str | None = None) -> None:
        """Close the world of ``key``; a ``reason`` counts it among the recycled worlds (``recycles``)."""
        with self.lock:
            g = self.groups.pop(key, None)
            if g is not None:
                g.close()
                if reason:
                    self.recycles.append(reason)

    def close(self) -> None:
        with self.lock:
            for key in list(self.groups):
                self.discard(key)


def live_worker_pids() -> list[int]:
    """Rank worker processes alive on this machine (leak checks: close() must have ended them all)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if WORKER_MODULE.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out
