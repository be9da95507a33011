"""The runtime's bounded waits, harness side, on the CPU with fakes for the GPU (runtime/cuco_waits.h,
evaluate/rank/waits.py): the verdict names the word a wait gave up on from the windows the harness made; the
watchdog raises the abort word before it ends a process, and a step that ends after that fails without ending it;
the parent reports that rank's own reason and does not count it as fatal. The device side builds in the compile tier
(tests/compile/test_bounded_waits_build.py); a candidate that waits forever runs in the gpu tier
(tests/gpu/test_bounded_waits_gpu.py)."""
from __future__ import annotations

import ctypes
import re
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from cuco_kit.evaluate.gpu_evaluator import merge_replies
from cuco_kit.evaluate.rank import abi, harness, waits
from cuco_kit.evaluate.rank.harness import CandidateFailure, _Evaluation

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "cuco_kit" / "runtime"

USER_WORDS = 65536  # the harness's default flag words per rank; its own 64 barrier words follow
FLAGS = NS(nbytes=(USER_WORDS + 64) * 8, peers_host=[0x1000_0000, 0x2000_0000])
Y = NS(nbytes=1 << 20, peers_host=[0x3000_0000, 0x4000_0000])
ACKS = NS(nbytes=4096, peers_host=[0x5000_0000, 0x6000_0000])
STAGING = NS(nbytes=32 << 20, peers_host=[0x7000_0000, 0x9000_0000])
WHERE = waits.regions(FLAGS, USER_WORDS, {"y": Y}, [("acks", ACKS, 4096)], STAGING)


def _gave_up(word: int, *, kind: int = abi.CUCO_WAIT_FLAG, target: int = 12, seen: int = 11,
             ended_by: int = abi.CUCO_WAIT_ABORT, peer: int = -1, index: int = -1) -> abi.CucoWaitCtl:
    ctl = abi.CucoWaitCtl()
    waits.reset(ctl, 2.0)
    ctl.gave_up, ctl.kind, ctl.ended_by, ctl.word, ctl.target, ctl.seen = 1, kind, ended_by, word, target, seen
    ctl.waited_ns, ctl.peer, ctl.index, ctl.thread = 2_000_000_000, peer, index, 0
    ctl.block[0] = 3
    return ctl


def test_a_user_flag_is_named_by_peer_slot_and_epoch() -> None:
    ctl = _gave_up(FLAGS.peers_host[1] + (waits.CUCO_FLAGS_RESERVED + 3) * 8)
    assert waits.verdict(ctl, WHERE, "verification trial 1/3") == (
        "timeout: waited on user flag (peer 1, slot 3) epoch 12 for 2.0 s in verification trial 1/3 (it held 11; "
        "block 3,0,0 thread 0; the harness aborted it at the step limit)")


@pytest.mark.parametrize("word, named", [
    (FLAGS.peers_host[0] + 70 * 8, "runtime flag word 70 (peer 0;"),
    (FLAGS.peers_host[1] + (USER_WORDS + 2) * 8, "the harness's barrier word 2 (peer 1)"),
    (Y.peers_host[1] + 128, "a word of tensor 'y' (peer 1, byte 128)"),
    (ACKS.peers_host[0] + 8, "a word of scratch 'acks' (peer 0, byte 8)"),
    (STAGING.peers_host[0] + (abi.CUCO_MAX_RANKS + 1) * 8, "host NCCL word: chunks rank 1 put in its slot (peer 0's"),
    (STAGING.peers_host[1] + (2 * abi.CUCO_MAX_RANKS) * 8, "host NCCL word: chunks rank 0 consumed (peer 1's"),
    (STAGING.peers_host[1] + 8, "host NCCL word: collective barriers reached by rank 1 (peer 1's"),
    (0xdead_0000, "a word at 0xdead0000 outside the harness's windows (the candidate's own memory)"),
])
def test_every_window_names_its_words(word: int, named: str) -> None:
    assert f"waited on {named}" in waits.verdict(_gave_up(word), WHERE, "timed iteration 1/20")


def test_a_barrier_names_the_peer_that_never_arrived_and_host_nccl_waits_count() -> None:
    bar = _gave_up(FLAGS.peers_host[0] + 80 * 8, kind=abi.CUCO_WAIT_LSA_BARRIER, target=7, peer=1, index=5,
                   ended_by=abi.CUCO_WAIT_LIMIT)
    text = waits.verdict(bar, WHERE, "capture pass")
    assert text.startswith("timeout: waited on LSA barrier 5 (peer 1 never arrived) epoch 7 for 2.0 s in capture")
    assert text.endswith("the waits' limit, the step limit)")
    nccl = _gave_up(STAGING.peers_host[0] + 8, kind=abi.CUCO_WAIT_HOST_NCCL, target=4)
    assert "(peer 0's staging window) count 4 for" in waits.verdict(nccl, WHERE, "trial")


def test_gin_waits_name_the_signal_or_counter_and_its_count() -> None:
    sig = _gave_up(FLAGS.peers_host[0] + 80 * 8, kind=abi.CUCO_WAIT_GIN_SIGNAL, target=24, index=1)
    assert waits.verdict(sig, WHERE, "trial").startswith("timeout: waited on GIN signal 1 count 24 for")
    ctr = _gave_up(FLAGS.peers_host[0] + 90 * 8, kind=abi.CUCO_WAIT_GIN_COUNTER, target=3, index=0)
    assert "waited on GIN counter 0 count 3" in waits.verdict(ctr, WHERE, "trial")


def test_no_verdict_while_no_wait_gave_up_and_reset_and_abort_set_the_harness_words() -> None:
    ctl = _gave_up(FLAGS.peers_host[0])
    ctl.abort = 1
    waits.reset(ctl, 1.5)
    assert (ctl.version, ctl.struct_size, ctl.limit_ns) == (abi.CUCO_WAITS_VERSION, 88, 1_500_000_000)
    assert not (ctl.gave_up or ctl.word or ctl.abort or ctl.kind)
    assert waits.verdict(ctl, WHERE, "trial") == ""
    waits.abort(ctl)
    assert ctl.abort == 1


def test_the_word_layout_constants_are_the_headers() -> None:
    lsa = (RUNTIME / "cuco_lsa.h").read_text()
    assert re.search(rf"#define CUCO_FLAGS_RESERVED {waits.CUCO_FLAGS_RESERVED}\b", lsa)
    compat = (RUNTIME / "host_nccl_compat.h").read_text()
    assert f"constexpr size_t kHeaderBytes = {waits.HOST_NCCL_FLAG_BYTES};" in compat
    assert "kCollWords = 0, kReadyWords = kMaxRanks, kAckWords = 2 * kMaxRanks;" in compat
    assert "constexpr int kMaxRanks = CUCO_MAX_RANKS;" in compat


# ---- the harness: bind, watchdog, verdict ------------------------------------------------------------------------

def _evaluation(bound: bool = True, limit_s: float = 0.05) -> tuple[_Evaluation, list[str]]:
    notes: list[str] = []
    ev = _Evaluation.__new__(_Evaluation)
    ev.h = NS(rank=1, wait_ctl=abi.CucoWaitCtl(), chan=NS(note_failure=notes.append), flags=FLAGS,
              flag_words=USER_WORDS, windows={"y": Y}, scratch_pool=[ACKS], host_nccl_staging=None,
              _host_agree=lambda failed: bool(failed))
    ev.ctx = abi.new_ctx()
    ev.step_limit_s = limit_s
    ev.waits_bound, ev.waits_aborted = bound, False
    return ev, notes


class _Event:
    """A step's end event on a fake stream: done once ``ends()`` says so."""

    def __init__(self, ends: Any) -> None:
        self.ends = ends

    def query(self) -> bool:
        return bool(self.ends())


@pytest.mark.timeout(30)
def test_the_watchdog_aborts_the_waits_first_and_a_step_that_then_ends_is_not_fatal(monkeypatch) -> None:
    monkeypatch.setattr(harness, "WAIT_ABORT_GRACE_S", 5.0)
    ev, notes = _evaluation()
    t0 = time.monotonic()
    ev._wait_event(_Event(lambda: ev.h.wait_ctl.abort), "verification trial 1/3", ev.step_limit_s)
    assert time.monotonic() - t0 < 2.0 and ev.h.wait_ctl.abort == 1 and ev.waits_aborted and not notes
    # nothing gave up, yet it only ended once told to: still the step's timeout, without ending the process
    assert ev._wait_verdict("verification trial 1/3") == (
        "timeout: verification trial 1/3 did not finish within 0.05 s; it ended after the runtime's waits were told "
        "to give up")


@pytest.mark.timeout(30)
def test_a_step_that_still_runs_after_the_abort_is_a_hang_that_ends_the_process(monkeypatch) -> None:
    monkeypatch.setattr(harness, "WAIT_ABORT_GRACE_S", 0.1)
    ev, notes = _evaluation()
    with pytest.raises(CandidateFailure) as raised:
        ev._wait_event(_Event(lambda: False), "verification trial 1/3", ev.step_limit_s)
    assert raised.value.fatal and raised.value.level == "L2" and ev.h.wait_ctl.abort == 1
    assert "a spin of its own" in raised.value.reason and notes


@pytest.mark.timeout(30)
def test_without_bound_waits_the_watchdog_ends_the_process_at_once() -> None:
    ev, _ = _evaluation(bound=False)
    t0 = time.monotonic()
    with pytest.raises(CandidateFailure) as raised:
        ev._wait_event(_Event(lambda: False), "timed iteration 2/20", ev.step_limit_s)
    assert raised.value.fatal and raised.value.level == "L3" and time.monotonic() - t0 < 1.0
    assert "spin of its own" not in raised.value.reason and ev.h.wait_ctl.abort == 0
    assert ev._wait_verdict("timed iteration 2/20") == ""


def test_the_verdict_after_a_step_reads_the_record_with_the_candidates_scratch_names() -> None:
    ev, _ = _evaluation()
    abi.set_name(ev.ctx.scratch[0], "name", "acks")
    ev.ctx.scratch[0].capacity_bytes = 4096
    ev.ctx.n_scratch = 1
    ctypes.memmove(ctypes.addressof(ev.h.wait_ctl), ctypes.addressof(_gave_up(ACKS.peers_host[1] + 16)),
                   ctypes.sizeof(abi.CucoWaitCtl))
    assert ev._wait_verdict("timed iteration 2/20").startswith(
        "timeout: waited on a word of scratch 'acks' (peer 1, byte 16) epoch 12 for 2.0 s in timed iteration 2/20")


def test_binding_resets_the_block_with_the_step_limit_and_refuses_another_layout() -> None:
    ev, _ = _evaluation(bound=False, limit_s=2.5)
    seen: list[tuple[int, int, int]] = []

    def bind(addr: int) -> int:
        ctl = abi.CucoWaitCtl.from_address(addr)
        seen.append((ctl.version, ctl.struct_size, ctl.limit_ns))
        return rc

    ev.h.wait_ctl.gave_up = 1  # a record left by the previous candidate
    rc = 0
    ev.lib = NS(cuco_waits_bind=bind)
    ev._bind_waits()
    assert ev.waits_bound and not ev.h.wait_ctl.gave_up
    assert seen == [(abi.CUCO_WAITS_VERSION, ctypes.sizeof(abi.CucoWaitCtl), 2_500_000_000)]
    rc = 1
    with pytest.raises(CandidateFailure, match="cuco_waits_bind returned CUCO_ERR_ABI"):
        ev._bind_waits()
    assert not ev.waits_bound
    ev.lib = NS()  # a library without the runtime's waits: nothing to bind
    ev._bind_waits()
    assert not ev.waits_bound


def test_the_parent_reports_the_waiting_ranks_own_verdict_and_keeps_the_world() -> None:
    verdict = ("rank 1: timeout: waited on user flag (peer 1, slot 3) epoch 1 for 2.0 s in verification trial 1/3 "
               "(it held 0; block 0,0,0 thread 0; the harness aborted it at the step limit)")
    replies = [{"verdict": "fail", "level": "L2", "reason": "a peer failed in verification trial 1/3", "fatal": False},
               {"verdict": "fail", "level": "L2", "reason": verdict, "fatal": False}]
    res = merge_replies(replies, {})
    assert res.verdict == "fail" and res.level_reached == "L2" and res.reason == verdict
    # gpu_evaluator recovers MPS only after a fault: a fatal flag, or a watchdog's reason ("timeout: ..." first)
    assert res.provenance["_flags"] == "" and not res.reason.startswith("timeout")
