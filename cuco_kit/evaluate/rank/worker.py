"""A rank worker process, started by pool.WorkerGroup as ``python -m cuco_kit.evaluate.rank.worker``, never by hand.

The process makes its expensive state once (the body: by default harness.RankHarness, i.e. communicator,
windows, flag region, cuBLAS handle), then serves commands until told to quit. Parent and ranks talk through the
parent's TCP store (loopback only) with JSON values, each sealed with the world's token (seal.py): a value that
does not open under it was written by a process outside the world and is never acted on.

  ready/<rank>          worker -> parent   {"ok": bool, "info": {...}} or {"ok": false, "error": "..."}
  cmd/<n>               parent -> workers  {"op": "eval" | "ping" | "quit", ...}; n = 0, 1, 2, ...
  resp/<n>/<rank>       worker -> parent   the body's reply (a dict; "fatal": true ends the worker)
  prog/<rank>           worker -> parent   the latest progress event (overwritten), with "t" and "limit_s"
  fail/<n>/<rank>       worker -> parent   a failure noted before a collective step (names the culprit of a hang)

Environment: RANK, WORLD_SIZE (launcher), CUCO_STORE_PORT, CUCO_STORE_TOKEN (pool.WorkerGroup),
CUCO_WORKER_CONFIG (a JSON file path), CUCO_WORKER_BODY ("module:factory", default the real harness). A factory is
called as ``factory(rank, world, config, channel)`` and returns an object with ``info() -> dict``, ``handle(cmd,
cmd_index) -> dict`` and ``close()``.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from cuco_kit.evaluate.launcher import client_store
from cuco_kit.evaluate.seal import StoreAuthError

DEFAULT_BODY = "cuco_kit.evaluate.rank.harness:RankHarness"
EXIT_FATAL = 4  # the body said the process is unusable (CUDA error, hang): the parent recycles it
EXIT_INIT = 3


class Channel:
    """The rank's side of the store protocol, plus store-based collectives for the setup phases."""

    def __init__(self, store: Any, rank: int, world: int, timeout_s: float = 300.0) -> None:
        self.store = store  # sealed_store.SealedStore: torch's own users (gloo, symmetric memory) go through it
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s
        self.cmd_index = -1
        self._seq = 0  # every rank makes the same collective calls in the same order, so keys match
        self._ppid = os.getppid()

    # ---- parent <-> rank
    def put(self, key: str, value: dict[str, Any]) -> None:
        self.store.set(key, json.dumps(value, default=str))

    def progress(self, event: dict[str, Any], limit_s: float | None = None) -> None:
        ev = dict(event, rank=self.rank, t=time.time(), cmd=self.cmd_index)
        if limit_s is not None:
            ev["limit_s"] = float(limit_s)
        self.put(f"prog/{self.rank}", ev)

    def note_failure(self, reason: str) -> None:
        self.put(f"fail/{self.cmd_index}/{self.rank}", {"reason": reason})

    def parent_alive(self) -> bool:
        return os.getppid() == self._ppid

    def next_command(self, n: int, idle_poll_s: float = 1.0) -> dict[str, Any] | None:
        """Block until cmd/<n> holds a command sealed by the parent; None when the parent went away (then the
        worker just exits). A value that does not open under the world's token is ignored: the parent's own
        command, written to the same key, replaces it."""
        key = f"cmd/{n}"
        warned = False
        while True:
            try:
                self.store.wait([key], timedelta(seconds=idle_poll_s))
                cmd = json.loads(self.store.get_sealed(key))
                if isinstance(cmd, dict):
                    return cmd
            except StoreAuthError as exc:
                if not warned:
                    print(f"ignored a command: {exc}", file=sys.stderr, flush=True)
                    warned = True
                time.sleep(0.05)
            except Exception as exc:  # noqa: BLE001 - a wait timeout, or the store is gone with its parent
                if not self.parent_alive() or "onnect" in str(exc) or "reset" in str(exc).lower():
                    return None

    # ---- store-based collectives (setup phases; the hot path uses gloo)
    def exchange(self, phase: str, ok: bool, message: str = "", timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Every rank posts its status for ``phase``; returns all statuses, raises if any rank failed."""
        self._seq += 1
        prefix = f"status/{self._seq}/{phase}"
        self.put(f"{prefix}/{self.rank}", {"ok": bool(ok), "message": message})
        keys = [f"{prefix}/{r}" for r in range(self.world)]
        try:
            self.store.wait(keys, timedelta(seconds=timeout_s or self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - any store failure means a rank did not report
            raise PhaseError(f"{phase}: not every rank reported within {timeout_s or self.timeout_s:.0f} s "
                             f"({exc})") from None
        statuses = [json.loads(self.store.get_sealed(k)) for k in keys]
        bad = [f"rank {r}: {s['message']}" for r, s in enumerate(statuses) if not s["ok"]]
        if bad:
            raise PhaseError(f"{phase} failed on " + "; ".join(bad))
        return statuses

    def all_gather(self, name: str, value: Any, timeout_s: float | None = None) -> list[Any]:
        self._seq += 1
        prefix = f"gather/{self._seq}/{name}"
        self.store.set(f"{prefix}/{self.rank}", json.dumps(value))
        keys = [f"{prefix}/{r}" for r in range(self.world)]
        self.store.wait(keys, timedelta(seconds=timeout_s or self.timeout_s))
        return [json.loads(self.store.get_sealed(k)) for k in keys]

    def barrier(self, name: str, timeout_s: float | None = None) -> None:
        self.all_gather(f"barrier/{name}", 1, timeout_s)


class PhaseError(RuntimeError):
    """A collective setup phase failed on some rank (all ranks raise it, then abort their communicator)."""


def _factory(spec: str) -> Callable[..., Any]:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"CUCO_WORKER_BODY={spec!r}: expected 'module:factory'")
    return getattr(importlib.import_module(module), attr)


def _short_tb(limit: int = 3000) -> str:
    return traceback.format_exc()[-limit:]


def main() -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    timeout_s = float(os.environ.get("CUCO_STORE_TIMEOUT_S", "300"))
    store = client_store(int(os.environ["CUCO_STORE_PORT"]), os.environ["CUCO_STORE_TOKEN"], timeout_s=timeout_s)
    chan = Channel(store, rank, world, timeout_s)
    cfg_path = os.environ.get("CUCO_WORKER_CONFIG")
    config: dict[str, Any] = {}
    if cfg_path:
        with open(cfg_path) as f:
            config = json.load(f)
    try:
        body = _factory(os.environ.get("CUCO_WORKER_BODY") or DEFAULT_BODY)(rank, world, config, chan)
        info = body.info()
    except Exception as exc:  # noqa: BLE001 - any init failure is reported to the parent as not ready
        print(_short_tb(), file=sys.stderr, flush=True)
        chan.put(f"ready/{rank}", {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return EXIT_INIT
    chan.put(f"ready/{rank}", {"ok": True, "info": info})
    n = 0
    while True:
        cmd = chan.next_command(n)
        if cmd is None:
            break
        chan.cmd_index = n
        if cmd.get("op") == "quit":
            try:
                body.close()
                chan.put(f"resp/{n}/{rank}", {"ok": True})
            except Exception as exc:  # noqa: BLE001 - any close failure is the quit reply
                chan.put(f"resp/{n}/{rank}", {"ok": False, "error": str(exc)})
            break
        try:
            reply = body.handle(cmd, n)
        except Exception as exc:  # noqa: BLE001 - any failure is the reply: the worker must answer
            print(_short_tb(), file=sys.stderr, flush=True)
            reply = {"ok": False, "verdict": "error", "fatal": True,
                     "reason": f"rank {rank}: {type(exc).__name__}: {exc}"[:2000]}
        chan.put(f"resp/{n}/{rank}", reply)
        if reply.get("fatal"):
            sys.stdout.flush()
            # a CUDA context after a fault (or a kernel that never ends) cannot be trusted or torn down cleanly
            os._exit(EXIT_FATAL)
        n += 1
    try:
        store.set(f"bye/{rank}", "1")
    except Exception:  # noqa: BLE001 - best effort: the parent may be gone already
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
