"""Faults on the rank control channel: who can reach the parent's store, and what a process without the world's
token can do there (real TCP, real rank processes with a fake body)."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest

from cuco_kit.evaluate.launcher import host_store
from cuco_kit.evaluate.pool import GroupSpec, PoolConfig, WorkerPool
from cuco_kit.evaluate.seal import Sealer, StoreAuthError, new_token

ROOT = Path(__file__).resolve().parents[3]

BODY = r'''
import secrets

PROC = secrets.token_hex(8)

class Body:
    def __init__(self, rank, world, config, chan):
        self.rank = rank

    def info(self):
        return {"proc": PROC}

    def handle(self, cmd, index):
        return {"ok": True, "verdict": "pass", "times_ms": [2.5], "proc": PROC, "echo": cmd.get("marker")}

    def close(self):
        pass
'''


def _listeners(port: int) -> list[tuple[str, str]]:
    """(table, local address) of every listening socket on ``port``, from /proc/net/tcp and tcp6."""
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                out.append((table, local))
    return out


def _outside_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (the kernel's local routes in /proc/net/fib_trie)."""
    found, last = set(), None
    for line in Path("/proc/net/fib_trie").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("|--", "+--"):
            last = parts[1]
        elif "/32 host LOCAL" in line and last and not last.startswith("127."):
            found.add(last)
    try:
        name = socket.gethostbyname(socket.gethostname())
        if not name.startswith("127."):
            found.add(name)
    except OSError:
        pass
    return sorted(found)


def test_the_store_listens_on_loopback_only() -> None:
    """/proc/net shows one listener on the store's port, bound to 127.0.0.1 (no 0.0.0.0, no IPv6 ::), and a
    connection to each of this machine's other IPv4 addresses is refused. A machine with no address but
    loopback gets the /proc/net check only."""
    hosted = host_store(timeout_s=10)
    assert _listeners(hosted.port) == [("tcp", f"0100007F:{hosted.port:04X}")]
    outside = _outside_addresses()
    if not outside:
        warnings.warn("this machine has no IPv4 address but loopback: the store was checked in /proc/net only",
                      stacklevel=1)
    for ip in outside:
        with pytest.raises(OSError):
            socket.create_connection((ip, hosted.port), timeout=2).close()
    hosted.store.set("k", "v")  # and it serves on loopback
    assert hosted.store.get("k") == b"v"


def test_a_sealed_value_opens_only_under_its_token_and_key() -> None:
    token = new_token()
    sealer = Sealer(token)
    value = json.dumps({"op": "quit"}).encode()
    blob = sealer.seal("cmd/3", value)
    assert value not in blob and b"quit" not in blob
    assert sealer.open("cmd/3", blob) == value
    with pytest.raises(StoreAuthError):
        Sealer(new_token()).open("cmd/3", blob)  # another world's token
    with pytest.raises(StoreAuthError):
        sealer.open("cmd/4", blob)  # moved to another key
    with pytest.raises(StoreAuthError):
        sealer.open("cmd/3", blob[:-1] + bytes([blob[-1] ^ 1]))  # one bit flipped
    with pytest.raises(StoreAuthError):
        sealer.open("cmd/3", value)  # written in the clear
    with pytest.raises(ValueError):
        Sealer("not hex")


def test_a_process_without_the_token_can_neither_read_nor_inject(tmp_path: Path) -> None:
    """A plain torch client on the store's port (what any local process can open) lists the keys, but no value
    it reads holds the command or the reply; a quit it writes as the next command is not acted on, and a reply
    it forges is not accepted: the world serves the parent's next command and returns the rank's own reply."""
    from torch.distributed import TCPStore

    body_dir = tmp_path / "bodies"
    body_dir.mkdir()
    (body_dir / "channel_body.py").write_text(BODY)
    pool = WorkerPool(PoolConfig(start_timeout_s=60), tmp_path / "ranks")
    try:
        g = pool.group("k", lambda s: GroupSpec(world=1, config={}, scratch=s, body="channel_body:Body",
                                                 pythonpath=os.pathsep.join([str(body_dir), str(ROOT)]),
                                                 python=sys.executable))
        proc = g.info[0]["proc"]
        first = g.request({"op": "eval", "marker": "MARKER-7f3a"}, timeout_s=30)
        assert first[0]["echo"] == "MARKER-7f3a"

        intruder = TCPStore("127.0.0.1", g.port, is_master=False, timeout=timedelta(seconds=10))
        keys = intruder.list_keys()
        assert "cmd/0" in keys and "resp/0/0" in keys
        for k in keys:
            raw = intruder.get(k)
            assert b"MARKER-7f3a" not in raw and b"verdict" not in raw and b'"op"' not in raw, (k, raw[:80])

        n = g.commands  # the index of the parent's next command
        intruder.set(f"cmd/{n}", json.dumps({"op": "quit"}))
        forged = {"ok": True, "verdict": "pass", "times_ms": [0.001], "proc": "forged", "echo": "forged"}
        intruder.set(f"resp/{n}/0", json.dumps(forged))
        time.sleep(0.5)  # the worker reads cmd/<n> as soon as it appears
        assert g.alive(), "the world acted on a command written without the token"
        reply = g.request({"op": "eval", "marker": "second"}, timeout_s=30)[0]
        assert reply["proc"] == proc and reply["echo"] == "second" and reply["times_ms"] == [2.5]
    finally:
        pool.close()
