"""Fault injection on the LLM side, over real HTTP: spend limits that hold (a reservation before every call,
concurrent calls included, a budget per database or per run, unknown prices never free), and a dead LLM that is reported
as one line instead of looking like success (nothing listening, a server that never answers, a server that
fails every call). The fake server reports usage as it pleases; prices come from the table."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.commands import search as search_command
from cuco_kit.llm import Completion, Ledger, LedgeredClient, LLMBudgetExceeded, LLMUnavailable, OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer, server_error, slow
from cuco_kit.llm.ledger import prompt_tokens_bound
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.store import Store

MSGS = [{"role": "system", "content": "You rewrite CUDA kernels."},
        {"role": "user", "content": "Replace the host AllGather with LSA stores to peers."}]
PROMPT_WORDS = sum(len(m["content"].split()) for m in MSGS)
PER_TOKEN = {"fixture": (1e3, 1e3)}  # $0.001 per token, in and out, for the model the client asks for


def words(n: int) -> str:
    return "w " * n


def client_for(srv: FakeOpenAIServer, ledger: Ledger, **cfg: object) -> LedgeredClient:
    return LedgeredClient(OpenAICompatibleClient(srv.config(timeout_s=5.0, max_retries=0, **cfg)), ledger)


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


@pytest.fixture
def llm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environment the CLI reads its LLM server from, restored afterwards."""
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CUCO_MODEL"):
        monkeypatch.delenv(k, raising=False)
    yield


def point_at(monkeypatch: pytest.MonkeyPatch, base_url: str, model: str = "fixture") -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "fixture-key")
    monkeypatch.setenv("CUCO_MODEL", model)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---- spend limits -------------------------------------------------------------------------------------------

def test_a_call_whose_worst_case_does_not_fit_is_refused_before_sending(store: Store) -> None:
    run = store.create_run(workload="w", config={})
    prices = {**PER_TOKEN, "fixture-big": PER_TOKEN["fixture"]}
    with FakeOpenAIServer([answer("big", words(5000), times=0)]) as srv:
        ledger = Ledger(store, run, budget_dollars=1.0, prices=prices)
        client = client_for(srv, ledger)
        # 5000 completion tokens would cost $5; 2000 allowed ones could cost $2: more than the $1 budget
        with pytest.raises(LLMBudgetExceeded, match="could cost up to"):
            client.complete(MSGS, purpose="mutate", max_tokens=2000)
        assert srv.chat_requests() == []  # never sent: the budget cannot be overshot by this call
    assert ledger.spent_dollars == 0 and store.llm_dollars() == 0
    (row,) = store.llm_calls()
    assert not row["ok"] and row["error"].startswith("refused")


def test_a_paid_call_without_max_tokens_gets_a_cap_and_is_reserved_by_it(store: Store) -> None:
    with FakeOpenAIServer([answer("a", "x y", times=0)]) as srv:
        ledger = Ledger(store, None, budget_dollars=5.0, prices={"fixture": (1.0, 1.0)})
        client_for(srv, ledger).complete(MSGS, purpose="judge")  # the fast path sends no max_tokens
        unpriced = Ledger(store, None, budget_dollars=5.0)
        client_for(srv, unpriced).complete(MSGS, purpose="judge")
        paid, local = srv.chat_requests()
    # a cap is sent to the priced model (so the call has a worst case), and the real cost is what was counted
    assert paid.body["max_tokens"] > 0
    assert ledger.spent_dollars == pytest.approx((PROMPT_WORDS + 2) * 1e-6)
    # a model of unknown price keeps its server's default (a local context may be short), its tokens count
    assert "max_tokens" not in local.body and unpriced.spent_tokens == PROMPT_WORDS + 2


def test_concurrent_calls_reserve_so_together_they_stay_within_budget(store: Store) -> None:
    max_tokens = 100
    worst = (prompt_tokens_bound(MSGS) + max_tokens) * 1e-3
    budget = worst * 1.5  # one call in flight fits, two do not
    with FakeOpenAIServer([slow("a", words(max_tokens), delay_s=0.4, times=0)]) as srv:
        ledger = Ledger(store, None, budget_dollars=budget, prices={**PER_TOKEN, "fixture-a": PER_TOKEN["fixture"]})
        client = client_for(srv, ledger)
        start = threading.Barrier(8)
        outcomes: list[str] = []

        def call() -> None:
            start.wait()
            try:
                client.complete(MSGS, purpose="mutate", max_tokens=max_tokens)
                outcomes.append("sent")
            except LLMBudgetExceeded:
                outcomes.append("refused")

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        sent = len(srv.chat_requests())
    assert sorted(outcomes) == ["refused"] * 7 + ["sent"] and sent == 1
    assert store.llm_dollars() <= budget
    assert "held by calls in flight" in next(r["error"] for r in store.llm_calls() if not r["ok"])


def test_a_server_that_reports_more_than_a_call_allowed_never_passes_the_budget(store: Store) -> None:
    """The server ignores max_tokens and bills 9000 completion tokens ($9 at $0.001 a token) against a $5 budget:
    the call is counted at its reservation (what it allowed), the reported figures are kept in the error column,
    and the next call is refused without being sent."""
    run = store.create_run(workload="w", config={})
    with FakeOpenAIServer([answer("greedy", words(9000), times=0)]) as srv:
        ledger = Ledger(store, run, budget_dollars=5.0, prices={**PER_TOKEN, "fixture-greedy": PER_TOKEN["fixture"]})
        client = client_for(srv, ledger)
        reply = client.complete(MSGS, purpose="mutate", max_tokens=100)
        worst = (prompt_tokens_bound(MSGS) + 100) * 1e-3
        assert reply.completion_tokens == 9000  # what the server said, for whoever reads the answer
        assert ledger.spent_dollars == pytest.approx(worst) == store.llm_dollars() and worst <= 5.0
        with pytest.raises(LLMBudgetExceeded, match="reported more than call 'mutate' allowed"):
            client.complete(MSGS, purpose="mutate", max_tokens=100)
        assert ledger.exhausted("fixture") is not None
        assert len(srv.chat_requests()) == 1  # the second call was never sent
    first, second = store.llm_calls(run)
    assert first["ok"] and first["completion_tokens"] == 100 and "reported" in first["error"] \
        and "9000 completion tokens, $9.0" in first["error"] and "counted as allowed" in first["error"]
    assert not second["ok"] and second["error"].startswith("refused")


def test_cuco_search_against_an_overbilling_server_stays_within_its_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llm_env: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The probe that ended at $9.00 of a $5 budget: now the run's ledger stays within $5 and the LLM's part ends
    with the reason in the log."""
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "s.db"
    with FakeOpenAIServer([answer("greedy/gpt-4o", words(900_000), times=0)]) as srv:
        point_at(monkeypatch, srv.base_url, "gpt-4o")
        rc = main(["search", str(wl), "--mutator", "llm", "--generations", "5", "--db", str(db), "--evaluator",
                   "simulated", "--llm-budget", "5", "--json"])
        sent = len(srv.chat_requests())
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out + err
    assert sent == 1 and "reported more than call" in err
    with Store(db) as st:
        assert 0 < st.llm_dollars() <= 5.0
        (run,) = st.runs()
        assert run["state"] == "finished"


def test_the_budget_is_per_database_not_per_run(store: Store) -> None:
    earlier = store.create_run(workload="w", config={})
    store.add_llm_call(run_id=earlier, model="fixture", purpose="fastpath.stage_a", prompt_tokens=10,
                       completion_tokens=10, latency_s=0.1, dollars=0.95, ok=True)
    later = store.create_run(workload="w", config={})
    with FakeOpenAIServer([answer("a", "x", times=0)]) as srv:
        ledger = Ledger(store, later, budget_dollars=1.0, prices=PER_TOKEN)  # a new run: no fresh budget
        assert ledger.spent_dollars == pytest.approx(0.95)
        with pytest.raises(LLMBudgetExceeded):
            client_for(srv, ledger).complete(MSGS, purpose="fastpath.stage_a", max_tokens=100)
        assert srv.chat_requests() == []


def test_an_unknown_price_counts_tokens_never_nothing(store: Store) -> None:
    with FakeOpenAIServer([answer("local", words(40), times=0)]) as srv:
        ledger = Ledger(store, None, budget_dollars=5.0, budget_tokens=500)  # no price for "fixture"
        client = client_for(srv, ledger)
        client.complete(MSGS, purpose="a", max_tokens=100)
        assert ledger.spent_tokens == PROMPT_WORDS + 40 and ledger.spent_dollars == 0
        with pytest.raises(LLMBudgetExceeded, match="no known price, so its calls count tokens"):
            client.complete(MSGS, purpose="b", max_tokens=400)
        assert len(srv.chat_requests()) == 1
    # a dollar budget alone still limits such a model: by the default token budget
    assert Ledger(None, None, budget_dollars=1.0).budget_tokens is not None


def test_fastpath_runs_share_the_database_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llm_env: None,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # "big/gpt-4o" answers as model "fixture-big/gpt-4o": the price of gpt-4o ($2.50 / $10 per Mtok)
    db = tmp_path / "fp.db"
    seed = Path(__file__).resolve().parents[3] / "sample_kernels" / "gemm_allgather" / "seed_nccl.cu"
    with FakeOpenAIServer([answer("big/gpt-4o", words(12000), times=0)]) as srv:
        point_at(monkeypatch, srv.base_url, "gpt-4o")
        # each run's one call costs $0.13 and may cost up to $0.21: a fresh budget per run would send all three
        codes = [main(["fastpath", str(seed), "--db", str(db), "--max-attempts", "1", "--llm-budget", "0.3",
                       "--json"]) for _ in range(3)]
        sent = len(srv.chat_requests())
    capsys.readouterr()
    with Store(db) as st:
        spent = st.llm_dollars()
        refused = [c for c in st.llm_calls() if c["error"].startswith("refused")]
        runs = len(st.runs())
    assert 0.1 < spent <= 0.3 and sent == 1 and codes == [1, 1, 1]  # three runs, one budget
    assert runs == 3 and len(refused) == 2 and "of $0.3000 is spent" in refused[0]["error"]


def test_cuco_search_with_an_llm_mutator_has_a_dollar_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             llm_env: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "s.db"
    with FakeOpenAIServer([answer("big/gpt-4o", words(8000), times=0)]) as srv:
        point_at(monkeypatch, srv.base_url, "gpt-4o")
        rc = main(["search", str(wl), "--mutator", "llm", "--generations", "5", "--db", str(db), "--evaluator",
                   "simulated", "--llm-budget", "0.3", "--json"])
        sent = len(srv.chat_requests())
    capsys.readouterr()
    assert rc == 0
    with Store(db) as st:
        assert 0 < st.llm_dollars() <= 0.3
        assert any(c["error"].startswith("refused") for c in st.llm_calls())
    assert sent < 5 * 4  # the budget, not the generations, ended the LLM's part


def test_the_search_budget_is_the_runs_and_a_spent_run_stops_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     llm_env: None,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "s.db"
    with Store(db) as st:  # another command spent $2 in this database: not this run's money
        st.add_llm_call(run_id=None, model="gpt-4o", purpose="x", prompt_tokens=1, completion_tokens=1,
                        latency_s=0.0, dollars=2.0, ok=True)
    argv = ["search", str(wl), "--mutator", "llm", "--db", str(db), "--evaluator", "simulated", "--llm-budget", "1.5",
            "--generations", "1"]
    with FakeOpenAIServer([answer("a", "x", times=0)]) as srv:
        point_at(monkeypatch, srv.base_url, "gpt-4o")
        assert main(argv) == 0 and srv.chat_requests()
    with Store(db) as st:  # now the run itself has spent more than its budget
        rid = st.runs()[-1]["id"]
        st.add_llm_call(run_id=rid, model="gpt-4o", purpose="x", prompt_tokens=1, completion_tokens=1,
                        latency_s=0.0, dollars=2.0, ok=True)
    capsys.readouterr()
    with FakeOpenAIServer([answer("a", "x", times=0)]) as srv:
        point_at(monkeypatch, srv.base_url, "gpt-4o")
        assert main([*argv[:-1], "3"]) == 0
        assert srv.chat_requests() == []  # resumed, not given a fresh budget
    assert "LLM budget" in capsys.readouterr().out


# ---- a dead LLM -----------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def search_args(wl: Path, db: Path, *extra: str) -> list[str]:
    return ["search", str(wl), "--mutator", "llm", "--generations", "3", "--db", str(db), "--evaluator",
            "simulated", *extra]


def test_nothing_listening_is_one_line_before_the_search_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                llm_env: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    point_at(monkeypatch, f"http://127.0.0.1:{free_port()}/v1")
    t0 = time.monotonic()
    assert main(search_args(wl, tmp_path / "s.db")) == 2
    assert time.monotonic() - t0 < 5
    line = one_error_line(capsys)
    assert "no LLM server reachable" in line and "OPENAI_BASE_URL" in line
    assert not (tmp_path / "s.db").exists()  # refused before anything was written


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.mark.parametrize("command", ["search", "fastpath"])
def test_a_server_that_never_answers_is_found_within_the_timeout(command: str, silent_server: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, llm_env: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    point_at(monkeypatch, silent_server)
    seed = Path(__file__).resolve().parents[3] / "sample_kernels" / "gemm_allgather" / "seed_nccl.cu"
    args = search_args(write_synthetic_workload(tmp_path / "wl"), tmp_path / "s.db") if command == "search" \
        else ["fastpath", str(seed)]
    t0 = time.monotonic()
    assert main([*args, "--llm-timeout", "1"]) == 2
    assert time.monotonic() - t0 < 5
    assert "did not answer within 1 s" in one_error_line(capsys)


def test_llm_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    for flag, value, says in [("--llm-timeout", "0", "--llm-timeout 0"), ("--llm-timeout", "nan", "--llm-timeout"),
                              ("--llm-retries", "-1", "--llm-retries -1"), ("--llm-budget", "-5", "--llm-budget"),
                              ("--llm-budget", "inf", "--llm-budget"), ("--llm-token-budget", "0", "token")]:
        assert main(search_args(wl, tmp_path / "s.db", flag, value)) == 2
        assert says in one_error_line(capsys)


@pytest.mark.parametrize("failure", ["server_error", "timeout"])
def test_a_search_whose_llm_answers_nothing_exits_1_with_one_line(failure: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, llm_env: None,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    wl = write_synthetic_workload(tmp_path / "wl")
    db = tmp_path / "s.db"
    script = [server_error("down", times=0)] if failure == "server_error" else [slow("hang", "x", delay_s=30, times=0)]
    with FakeOpenAIServer(script) as srv:  # it answers GET /v1/models, so the reachability check passes
        url = srv.base_url
        point_at(monkeypatch, url)
        t0 = time.monotonic()
        rc = main(search_args(wl, db, "--generations", "10", "--llm-timeout", "1", "--llm-retries", "0"))
        elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out + err
    (line,) = err.strip().splitlines()
    assert "was unreachable" in line and "no LLM proposal was made" in line and url in line
    assert elapsed < 9  # the breaker stopped asking after a few calls; 10 generations were not spent waiting
    with Store(db) as st:
        (run,) = st.runs()
        assert run["state"] == "stopped"  # not "finished": running the command again resumes it
        assert st.get_meta(run["id"], "state")["generation_done"] <= 1


class _Down:
    """An LLMClient whose server is gone."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, messages: list[dict], *, purpose: str, temperature: float | None = None,
                 max_tokens: int | None = None) -> Completion:
        self.calls += 1
        raise LLMUnavailable("down")


def test_the_breaker_stops_sending_after_calls_in_a_row_got_no_answer() -> None:
    down, tripped = _Down(), []
    breaker = search_command.LLMBreaker(down, limit=2, on_trip=lambda: tripped.append(True))
    for _ in range(4):
        with pytest.raises(LLMUnavailable):
            breaker.complete(MSGS, purpose="p")
    assert down.calls == 2 and tripped == [True]
