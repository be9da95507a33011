"""Faults around secrets: what a candidate's rank process can find in environments and /proc, and API keys in
stored or logged LLM errors."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuco_kit.evaluate.launcher import inherited_env, rank_env

ROOT = Path(__file__).resolve().parents[3]

# Secret-shaped names the old deny-list let through, plus the common ones.
SECRET_NAMES = ("OPENAI_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "GITHUB_TOKEN",
                "MYSQL_PWD", "DATABASE_URL", "HTTPS_PROXY", "https_proxy", "PIP_INDEX_URL", "SENTRY_DSN",
                "SLACK_WEBHOOK_URL", "DOCKER_AUTH_CONFIG", "GITLAB_PAT", "APIKEY", "TORCH_HUB_TOKEN",
                "NCCL_SECRET_SAUCE", "CUDA_API_KEY")


def test_a_rank_environment_is_an_allow_list() -> None:
    base = {name: f"value-of-{name}" for name in SECRET_NAMES}
    base.update({"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                 "CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "WARN", "TORCH_CUDA_ARCH_LIST": "9.0",
                 "NVSHMEM_DEBUG": "1", "OMP_NUM_THREADS": "4", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
                 "SOME_TOOL_SETTING": "x", "JUPYTER_TOKEN": "j", "GIT_AUTHOR_NAME": "me"})
    for env in (inherited_env(base), rank_env(0, 2, 1234, base=base)):
        leaked = [k for k in env if k in SECRET_NAMES or k.startswith(("JUPYTER", "GIT_", "SOME_"))]
        assert leaked == []
        assert not any(v.startswith("value-of-") for v in env.values())
        for kept in ("PATH", "HOME", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "TORCH_CUDA_ARCH_LIST",
                     "NVSHMEM_DEBUG", "OMP_NUM_THREADS", "CUDA_MPS_PIPE_DIRECTORY"):
            assert env[kept] == base[kept]


# ------------------------------------------------------------------------------ /proc from inside a rank

# The body a rank runs: looks for the planted secrets in its own environ, its parent's, its grandparent's and
# every /proc/<pid>/environ it can open, and reports what it found (names only) as its info.
SPY_BODY = r'''
import os

def _scan(pid, names, marker):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return "absent"
    except PermissionError:
        return "unreadable"
    except OSError as exc:
        return f"error {exc.errno}"
    found = set()
    for item in data.split(b"\0"):
        name = item.split(b"=", 1)[0].decode(errors="replace")
        if name in names or marker in item:
            found.add(name)
    return sorted(found)

def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0

class Body:
    def __init__(self, rank, world, config, chan):
        names, marker = set(config["names"]), config["marker"].encode()
        ppid = os.getppid()
        everyone = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                hit = _scan(d, names, marker)
                if isinstance(hit, list) and hit:
                    everyone[d] = hit
        self.report = {"self": _scan("self", names, marker), "parent_pid": ppid, "uid": os.getuid(),
                       "parent": _scan(ppid, names, marker) if ppid else "absent",
                       "grandparent": _scan(_ppid(ppid), names, marker) if ppid and _ppid(ppid) else "absent",
                       "found_in": everyone}

    def info(self):
        return self.report

    def handle(self, cmd, index):
        return {"ok": True}

    def close(self):
        pass
'''

# The parent: the process that starts the ranks (a notebook kernel or the CLI in real use).
PARENT = r'''
import json, os, sys
from pathlib import Path
from cuco_kit.evaluate.pool import GroupSpec, PoolConfig, WorkerPool

work, config, pythonpath = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
pool = WorkerPool(PoolConfig(start_timeout_s=60), work / "ranks")
try:
    g = pool.group("k", lambda s: GroupSpec(world=1, config=config, scratch=s, body="spy_body:Body",
                                             pythonpath=pythonpath, python=sys.executable))
    print("REPORT " + json.dumps({"parent": os.getpid(), "grandparent": os.getppid(), "uid": os.getuid(),
                                  "isolation": g.isolation.provenance(), "rank": g.info[0]}), flush=True)
finally:
    pool.close()
'''

# The grandparent: what started the parent (the Jupyter server or a shell); it holds the secrets too.
GRANDPARENT = ("import subprocess, sys; "
               "sys.exit(subprocess.run([sys.executable, '-c', sys.argv[1], *sys.argv[2:]]).returncode)")


@pytest.fixture()
def world_dir() -> Iterator[Path]:
    """A work dir any user can enter (the unprivileged run below writes its scratch there)."""
    d = Path(tempfile.mkdtemp(prefix="cuco-secrets-"))
    d.chmod(0o777)
    (d / "bodies").mkdir()
    (d / "bodies" / "spy_body.py").write_text(SPY_BODY)
    (d / "bodies").chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _run_chain(world_dir: Path, as_user: list[str]) -> dict:
    """grandparent -> parent -> rank, with the secrets in the grandparent's and parent's environments."""
    marker = "planted-" + secrets.token_hex(8)
    env = dict(os.environ, **{name: f"{marker}-{name}" for name in SECRET_NAMES})
    env.pop("PYTHONPATH", None)
    config = {"names": list(SECRET_NAMES), "marker": marker}
    pythonpath = os.pathsep.join([str(world_dir / "bodies"), str(ROOT)])
    p = subprocess.run([*as_user, sys.executable, "-c", GRANDPARENT, PARENT, str(world_dir), json.dumps(config),
                        pythonpath], env=dict(env, PYTHONPATH=str(ROOT)), cwd=world_dir, capture_output=True,
                       text=True, timeout=120)
    line = next((x for x in p.stdout.splitlines() if x.startswith("REPORT ")), None)
    assert line, f"no report (exit {p.returncode}): {p.stdout[-2000:]} {p.stderr[-2000:]}"
    return json.loads(line[len("REPORT "):])


def _assert_what_the_situation_guarantees(out: dict, ranks_are_root: bool) -> None:
    rank, iso = out["rank"], out["isolation"]
    assert rank["self"] == [], "a secret reached the rank's own environment"
    if iso["pid_namespace"]:
        # nothing outside the world is visible: not the parent, not the grandparent, nothing else
        assert rank["parent"] == "absent" and rank["grandparent"] == "absent"
        assert rank["found_in"] == {}, rank["found_in"]
    elif not ranks_are_root:
        assert iso["parent_undumpable"]
        assert rank["parent_pid"] == out["parent"]
        assert rank["parent"] == "unreadable", "the parent's /proc environ was readable"
        # the grandparent is a process of the same user that holds the secrets: NOT protected (see docstring)
        assert set(rank["found_in"]) <= {str(out["grandparent"])}, rank["found_in"]
    else:
        pytest.skip(f"root without a PID namespace ({iso['note']}): only the rank's environment is protected")


def test_a_rank_finds_no_secret_in_proc(world_dir: Path) -> None:
    """A fake body, started through the real pool and launcher by a parent whose environment (and whose own
    parent's) holds OPENAI_API_KEY, AWS keys and the other secret-shaped names, reads its own environ, its
    parent's, its grandparent's and every /proc/<pid>/environ it can open.

    What each situation guarantees, and what this test asserts:
      - always: none of them in the rank's own environment (the allow-list);
      - root with a PID namespace (CI): no process outside the world is visible, so nothing is found anywhere;
      - not root: the parent is non-dumpable, so its environ is unreadable to the rank.
    What it does NOT cover: not root, every other process of the same user that holds a secret stays readable
    (here the grandparent; in real use the shell or the Jupyter server that started the kernel), and so are
    files that user can read; root without a PID namespace (a container without CAP_SYS_ADMIN) can read every
    process's /proc, and the test then checks the environment only."""
    _assert_what_the_situation_guarantees(_run_chain(world_dir, []), ranks_are_root=os.geteuid() == 0)


# The unprivileged user: nobody. setpriv switches to it with no capability, or, where this Python lives in a folder
# only root may enter (a pyenv under /root, a clone in /root), with the one capability that lets it read there:
# DAC_READ_SEARCH (read and search past file permissions), else DAC_OVERRIDE where a container's bounding set
# lacks it. Neither lets a process read another's /proc/<pid>/environ: that is a ptrace access check, which needs
# CAP_SYS_PTRACE against a non-dumpable process (the guarantee under test), and the bounding set is cut to the
# one capability so nothing can gain more.
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
NOBODY_CAPS = ([], ["dac_read_search"], ["dac_override"])


def _as_nobody(world_dir: Path) -> tuple[list[str], str]:
    """The setpriv prefix that runs this Python with torch and the kit as nobody, and the capability it keeps
    ("" for none); skips the test where no such prefix works."""
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import torch, cuco_kit'], check=True)"
    why = "?"
    for caps in NOBODY_CAPS:
        prefix = NOBODY + [arg for c in caps for arg in (f"--inh-caps=+{c}", f"--ambient-caps=+{c}",
                                                          f"--bounding-set=-all,+{c}")]
        check = subprocess.run([*prefix, sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                               capture_output=True, text=True, cwd=world_dir)
        if check.returncode == 0:
            return prefix, ",".join(caps)
        why = (check.stderr.strip().splitlines() or ["?"])[-1]
    pytest.skip(f"the unprivileged user cannot run this Python with torch and the kit here: {why}")


def test_a_rank_of_an_unprivileged_user_cannot_read_its_parent(world_dir: Path) -> None:
    """The same chain run as the unprivileged user nobody, so a CI run as root also checks the non-root
    guarantee: the non-dumpable parent. (Run as non-root, the test above already is this case.)"""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the chain as another user")
    prefix, caps = _as_nobody(world_dir)
    out = _run_chain(world_dir, prefix)
    assert not out["isolation"]["pid_namespace"]
    _assert_what_the_situation_guarantees(out, ranks_are_root=False)
    assert out["uid"] == out["rank"]["uid"] == 65534, caps  # the parent and its rank ran as nobody


# ------------------------------------------------------------------------------ keys in stored LLM errors

@pytest.mark.parametrize("key", ["sk-proj-" + secrets.token_hex(20), "local-server-" + secrets.token_hex(10)],
                         ids=["sk-shaped", "configured-any-shape"])
def test_a_key_echoed_in_a_401_reaches_no_log_no_error_and_no_store_row(key: str, caplog) -> None:
    """The fake server answers 401 with the key and the whole Authorization header in its body. The raised
    error, its chain, the retry log, the ledger's entry and the store's error column hold [redacted] instead."""
    import logging

    from cuco_kit.llm import Ledger, LedgeredClient, LLMRequestRejected, OpenAICompatibleClient
    from cuco_kit.llm.fake_server import FakeOpenAIServer, unauthorized
    from cuco_kit.store import Store

    store = Store(":memory:")
    run_id = store.create_run(workload="gemm_allgather", config={})
    try:
        with FakeOpenAIServer([unauthorized("denied")]) as srv, caplog.at_level(logging.DEBUG):
            client = LedgeredClient(OpenAICompatibleClient(srv.config(api_key=key, max_retries=0)),
                                    Ledger(store, run_id))
            with pytest.raises(LLMRequestRejected) as ei:
                client.complete([{"role": "user", "content": "hi"}], purpose="mutate")
            sent = {k.lower(): v for k, v in srv.chat_requests()[0].headers.items()}
            assert sent["authorization"] == f"Bearer {key}"  # the key was sent, and is echoed back
        (row,) = store.llm_calls(run_id)
        texts = {"error": str(ei.value), "repr": repr(ei.value), "row": row["error"],
                 "entry": client.ledger.entries[0].error or "", "log": caplog.text}
        assert {name: key in text for name, text in texts.items()} == dict.fromkeys(texts, False)
        assert "HTTP 401" in texts["error"] and "[redacted]" in texts["row"] and ei.value.status == 401
        assert ei.value.__cause__ is None and ei.value.__suppress_context__  # the SDK's error is not shown
    finally:
        store.close()
