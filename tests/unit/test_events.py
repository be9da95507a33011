"""The event bus: kinds and fields enforced, JSON round trip, isolation of failing subscribers, threads."""
from __future__ import annotations

import json
import sys
import threading

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.events import EVENT_SCHEMA_VERSION, KINDS, REQUIRED_FIELDS, Event, EventBus

SAMPLE_DATA = {
    "proposal": {"proposal_id": 1, "name": "split put", "source": "llm_diff", "parent_id": None},
    "decision": {"proposal_id": 1, "decision": "approved", "by": "auto", "program_id": 4},
    "evaluation_started": {"evaluation_id": 2, "program_id": 4, "world_size": 2, "backend": "nccl",
                           "badge": "real"},
    "evaluation_progress": {"evaluation_id": 2, "level": "L2", "rank": 1, "step": "verify", "done": 3,
                            "total": 10},
    "evaluation_finished": {"evaluation_id": 2, "program_id": 4, "level_reached": "L3", "verdict": "pass",
                            "median_ms": 1.25, "speedup": 1.8, "badge": "simulated"},
    "new_best": {"program_id": 4, "median_ms": 1.25, "speedup": 1.8},
    "run_state": {"state": "paused"},
    "log": {"message": "generation 3 done", "level": "info"},
}


def test_every_kind_has_sample_data_and_documentation() -> None:
    import cuco_kit.events as ev

    assert set(SAMPLE_DATA) == set(KINDS) == {"proposal", "decision", "evaluation_started", "evaluation_progress",
                                              "evaluation_finished", "new_best", "run_state", "log"}
    for kind, fields in REQUIRED_FIELDS.items():
        assert f"``{kind}``" in ev.__doc__
        for f in fields:
            assert f in ev.__doc__, (kind, f)


@pytest.mark.parametrize("kind", sorted(SAMPLE_DATA))
def test_json_round_trip(kind: str) -> None:
    bus = EventBus()
    e = bus.publish(kind, run_id=3, **SAMPLE_DATA[kind])
    assert (e.kind, e.run_id, e.data, e.version) == (kind, 3, SAMPLE_DATA[kind], EVENT_SCHEMA_VERSION)
    text = e.to_json()
    assert json.loads(text)["kind"] == kind
    assert Event.from_json(text) == e


def test_unknown_kinds_and_missing_fields_are_refused() -> None:
    bus = EventBus()
    with pytest.raises(BadInput, match="unknown event kind 'explosion'"):
        bus.publish("explosion", message="boom")
    with pytest.raises(BadInput, match="unknown event kind"):
        Event(kind="nope", run_id=None, data={}, ts=0.0)
    with pytest.raises(BadInput, match="lacks data field.*speedup"):
        bus.publish("new_best", program_id=1, median_ms=1.0)
    with pytest.raises(BadInput, match="JSON"):
        bus.publish("log", message=object())
    with pytest.raises(BadInput, match="newer than"):
        Event.from_json(json.dumps({"kind": "log", "data": {"message": "x"}, "ts": 1.0,
                                    "version": EVENT_SCHEMA_VERSION + 1}))
    with pytest.raises(BadInput, match="not JSON"):
        Event.from_json("{oops")
    with pytest.raises(BadInput, match="unknown event kind"):
        bus.history("nope")
    assert bus.history() == []  # nothing invalid was recorded


def test_subscribe_unsubscribe_and_history() -> None:
    bus = EventBus()
    got: list[Event] = []
    unsubscribe = bus.subscribe(got.append)
    bus.publish("log", message="one")
    bus.publish("run_state", run_id=1, state="running")
    unsubscribe()
    unsubscribe()  # idempotent
    bus.publish("log", message="three")
    assert [e.data.get("message", e.data.get("state")) for e in got] == ["one", "running"]
    assert [e.kind for e in bus.history()] == ["log", "run_state", "log"]
    assert [e.data["message"] for e in bus.history("log")] == ["one", "three"]
    seqs = [e.seq for e in bus.history()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3


def test_history_is_a_bounded_ring() -> None:
    bus = EventBus(maxlen=5)
    for i in range(12):
        bus.publish("log", message=str(i))
    assert [e.data["message"] for e in bus.history()] == ["7", "8", "9", "10", "11"]
    with pytest.raises(BadInput):
        EventBus(maxlen=0)


def test_a_failing_subscriber_is_isolated_and_reported() -> None:
    reported = []
    bus = EventBus(on_error=reported.append)
    before: list[str] = []
    after: list[str] = []

    def broken(event: Event) -> None:
        raise RuntimeError("widget bug")

    bus.subscribe(lambda e: before.append(e.kind))
    bus.subscribe(broken)
    bus.subscribe(lambda e: after.append(e.kind))
    e = bus.publish("new_best", program_id=1, median_ms=1.0, speedup=2.0)  # must not raise
    bus.publish("log", message="still alive")
    assert before == after == ["new_best", "log"]
    assert len(reported) == 2 and len(bus.failures) == 2
    f = reported[0]
    assert f.event == e and "broken" in f.callback and "RuntimeError: widget bug" in f.error
    assert "widget bug" in f.traceback


def test_a_failing_error_reporter_does_not_reach_the_publisher(caplog: pytest.LogCaptureFixture) -> None:
    def bad_reporter(failure: object) -> None:
        raise ValueError("reporter bug")

    bus = EventBus(on_error=bad_reporter)
    bus.subscribe(lambda e: 1 / 0)
    bus.publish("log", message="x")
    assert len(bus.failures) == 1
    assert "on_error handler failed" in caplog.text


def test_default_reporter_logs(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()
    bus.subscribe(lambda e: [][1])
    bus.publish("log", message="x")
    assert "IndexError" in caplog.text and "event subscriber" in caplog.text


def test_a_callback_may_publish_and_subscribe() -> None:
    bus = EventBus()
    seen: list[str] = []

    def relay(e: Event) -> None:
        seen.append(e.kind)
        if e.kind == "evaluation_finished":
            bus.publish("new_best", program_id=e.data["program_id"], median_ms=e.data["median_ms"],
                        speedup=e.data["speedup"])
            bus.subscribe(lambda _: None)

    bus.subscribe(relay)
    bus.publish("evaluation_finished", **SAMPLE_DATA["evaluation_finished"])
    assert seen == ["evaluation_finished", "new_best"]


def test_thread_safety_under_concurrent_publishers_and_subscribers() -> None:
    bus = EventBus(maxlen=100_000)
    per_thread, n_threads = 300, 4
    received: list[Event] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def collect(e: Event) -> None:
        with lock:
            received.append(e)

    bus.subscribe(collect)

    def publisher(t: int) -> None:
        try:
            for i in range(per_thread):
                bus.publish("evaluation_progress", run_id=t, evaluation_id=i, done=i, total=per_thread)
        except BaseException as e:  # noqa: BLE001 - collected for the main thread to assert on, failed asserts included
            errors.append(e)

    def churner() -> None:
        # Subscribing and unsubscribing while others publish must neither fail nor disturb delivery.
        try:
            for _ in range(200):
                bus.subscribe(lambda e: None)()
                bus.history("evaluation_progress")
        except BaseException as e:  # noqa: BLE001 - collected for the main thread to assert on, failed asserts included
            errors.append(e)

    threads = [threading.Thread(target=publisher, args=(t,)) for t in range(n_threads)]
    threads.append(threading.Thread(target=churner))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so a missing lock shows up
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    total = per_thread * n_threads
    assert len(received) == total
    hist = bus.history()
    assert len(hist) == total
    assert [e.seq for e in hist] == list(range(1, total + 1))  # no lost or duplicated sequence numbers
    for t in range(n_threads):  # each publisher's own events stay in its order
        assert [e.data["evaluation_id"] for e in hist if e.run_id == t] == list(range(per_thread))
