"""Ends a private MPS daemon whose owner died without stopping it.

`MpsDaemon` stops the daemon it started when its evaluator closes; a process killed with SIGKILL (a Ray actor, a
notebook kernel) cannot. So each private daemon gets this watcher, in a session of its own: it polls the owner's
PID and, once the owner is gone, quits the daemon and ends what is left of it (matched by its private pipe
directory, never anyone else's daemon). It exits by itself as soon as the daemon is gone.

Run as ``python -m cuco_kit.evaluate.mps_reaper OWNER_PID PIPE_DIR``; stdlib only, so it starts fast.
"""
from __future__ import annotations

import os
import sys
import time

from cuco_kit.evaluate.mps import end_daemon, private_daemon_pids

POLL_S = 0.5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def watch(owner: int, pipe_dir: str, poll_s: float = POLL_S) -> bool:
    """Wait until the daemon is gone (True: its owner had stopped it) or the owner is (then end the daemon)."""
    while private_daemon_pids(pipe_dir):
        if not _alive(owner):
            end_daemon(pipe_dir)
            return False
        time.sleep(poll_s)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit():
        print("usage: python -m cuco_kit.evaluate.mps_reaper OWNER_PID PIPE_DIR", file=sys.stderr)
        return 2
    watch(int(argv[0]), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
