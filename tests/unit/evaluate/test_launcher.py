"""Launcher: rank environment, secrets, unique-id exchange through the parent's TCP store, killing a group (and,
as root, the world's PID namespace with it)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from cuco_kit.evaluate.device import MULTICAST_OFF
from cuco_kit.evaluate.launcher import host_store, is_secret, launch, rank_env

ROOT = Path(__file__).resolve().parents[3]


def test_secret_rule() -> None:
    for name in ("OPENAI_API_KEY", "HF_TOKEN", "GITHUB_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_REGION", "MY_SECRET",
                 "DB_PASSWORD", "some_api_key", "SLACK_WEBHOOK_TOKEN", "AZURE_CLIENT_ID", "X_CREDENTIALS",
                 "TORCH_HUB_TOKEN", "NCCL_SECRET", "CUDA_API_KEY"):
        assert is_secret(name), name
    for name in ("PATH", "HOME", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                 "PYTHONPATH", "LANG", "KEYBOARD", "CUCO_STORE_PORT", "NCCL_IB_PKEY", "CUDA_MPS_PIPE_DIRECTORY"):
        assert not is_secret(name), name


def test_rank_env_sets_torchrun_vars_and_multicast_off_and_inherits_the_allow_list_only() -> None:
    base = {"PATH": "/usr/bin", "OPENAI_API_KEY": "probe-x", "HF_TOKEN": "hf", "NCCL_NVLS_ENABLE": "1",
            "AWS_SECRET_ACCESS_KEY": "a", "KEEP_ME": "yes", "NCCL_DEBUG": "INFO", "LC_ALL": "C.UTF-8"}
    env = rank_env(2, 4, 29500, base=base)
    assert env["RANK"] == "2" and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == "2"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29500"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    for k, v in MULTICAST_OFF.items():
        assert env[k] == v  # even where the parent had it on
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "KEEP_ME" not in env  # not on the allow-list
    assert env["PATH"] == "/usr/bin" and env["NCCL_DEBUG"] == "INFO" and env["LC_ALL"] == "C.UTF-8"
    with pytest.raises(ValueError):
        rank_env(0, 1, 1, base=base, extra={"OPENAI_API_KEY": "probe-y"})
    # the kit's own channel variables pass, the store token included
    assert rank_env(0, 1, 1, base=base, extra={"CUCO_STORE_TOKEN": "ab"})["CUCO_STORE_TOKEN"] == "ab"
    assert rank_env(0, 1, 1, base=base, extra={"NCCL_NVLS_ENABLE": "1"})["NCCL_NVLS_ENABLE"] == "0"


def test_launched_children_see_the_rank_env_and_no_secrets(tmp_path: Path) -> None:
    base = dict(os.environ, OPENAI_API_KEY="probe-value", MY_DB_PASSWORD="pw", GH_TOKEN="t")
    code = ("import json, os; json.dump(dict(os.environ), open(f'env{os.environ[\"RANK\"]}.json', 'w')); "
            "print('cwd', os.getcwd())")
    group = launch([sys.executable, "-c", code], 3, scratch=tmp_path, master_port=12345, base_env=base,
                   extra_env={"CUCO_EXTRA": "1"})
    try:
        assert group.wait(60), group.tails()
    finally:
        group.kill()
    assert group.returncodes() == [0, 0, 0]
    for r in range(3):
        env = json.loads((tmp_path / "run" / f"env{r}.json").read_text())
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "3" and env["LOCAL_RANK"] == str(r)
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "12345"
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["CUCO_EXTRA"] == "1"
        # the world's scratch, or a short dir of its own where that path is too long for a unix socket's name
        assert env["TMPDIR"] == str(tmp_path / "tmp") or Path(env["TMPDIR"]).name.startswith("cuco-rank-tmp-")
        assert not {"OPENAI_API_KEY", "MY_DB_PASSWORD", "GH_TOKEN"} & set(env)
    # ranks run in the scratch run dir; their output lands in per-rank logs
    assert f"cwd {tmp_path / 'run'}" in group.tails()["rank1"]
    assert len(set(group.pgids)) == 3 and all(g == p for g, p in zip(group.pgids, group.pids()))


CHILD_UID = r"""
import os, sys
from cuco_kit.evaluate.launcher import client_store
store = client_store(int(os.environ["CUCO_STORE_PORT"]), os.environ["CUCO_STORE_TOKEN"], timeout_s=60)
rank = int(os.environ["RANK"])
if rank == 0:
    store.set("nccl/unique_id", os.urandom(128))
uid = store.get("nccl/unique_id")
store.set(f"got/{rank}", uid.hex())
"""


def test_unique_id_exchange_through_the_parent_store(tmp_path: Path) -> None:
    hosted = host_store(timeout_s=60)
    store = hosted.store
    env = {"PYTHONPATH": str(ROOT), **hosted.env()}
    group = launch([sys.executable, "-c", CHILD_UID], 3, scratch=tmp_path, master_port=hosted.port, extra_env=env)
    try:
        assert group.wait(120), group.tails()
        assert group.returncodes() == [0, 0, 0], group.tails()
    finally:
        group.kill()
    got = [store.get(f"got/{r}").decode() for r in range(3)]
    sent = store.get("nccl/unique_id")
    assert len(sent) == 128
    assert got == [sent.hex()] * 3


CHILD_SPAWNS = r"""
import os, subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(100000)"])
open(f"grandchild{os.environ['RANK']}.pid", "w").write(str(g.pid))
time.sleep(100000)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)  # zombie = dead
    except FileNotFoundError:
        return True


def test_timeout_kills_the_whole_group_grandchildren_too(tmp_path: Path) -> None:
    # the pids the ranks write must be host pids: no PID namespace here (the namespace's end is tested below)
    group = launch([sys.executable, "-c", CHILD_SPAWNS], 2, scratch=tmp_path, master_port=1, pid_namespace=False)
    pidfiles = [tmp_path / "run" / f"grandchild{r}.pid" for r in range(2)]
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pidfiles) and time.monotonic() < deadline:
        time.sleep(0.05)
    grand = [int(p.read_text()) for p in pidfiles]
    assert not group.wait(0.5)  # still running: this is the timeout case
    assert not any(_gone(p) for p in grand + group.pids())
    t0 = time.monotonic()
    group.kill(grace_s=1.0)
    assert time.monotonic() - t0 < 15
    assert all(_gone(p) for p in group.pids()), "a rank survived"
    assert all(_gone(p) for p in grand), "a grandchild survived the group kill"


CHILD_ESCAPES = r"""
import os, sys, time
if os.fork() == 0:
    os.setsid()  # leaves the rank's session and process group: killpg no longer reaches it
    time.sleep(100000)
open("ns_pid", "w").write(os.readlink("/proc/self/ns/pid"))
time.sleep(100000)
"""


def _pids_in_namespace(ns: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "ns" / "pid") == ns and not _gone(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_the_namespace_ends_with_the_world_escaped_grandchildren_too(tmp_path: Path) -> None:
    group = launch([sys.executable, "-c", CHILD_ESCAPES], 1, scratch=tmp_path, master_port=1)
    try:
        if not group.isolation.pid_namespace:
            pytest.skip(f"no PID namespace here: {group.isolation.note}")
        marker = tmp_path / "run" / "ns_pid"
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        ns = marker.read_text()
        assert ns != os.readlink("/proc/self/ns/pid")
        inside = _pids_in_namespace(ns)
        assert len(inside) >= 3  # pid 1 (the holder), the rank, the escaped grandchild
    finally:
        group.kill(grace_s=1.0)
    assert _pids_in_namespace(ns) == [], "a process outlived its world's namespace"
