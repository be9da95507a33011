"""Events from the engine to whoever watches it (widgets, the CLI's live log, tests).

The search publishes small, JSON-serialisable events on an :class:`EventBus`; widgets subscribe and redraw. The
store is the record; events are the notification, so a widget that missed one re-reads the store.

Kinds and their ``data`` fields (``REQUIRED_FIELDS`` lists the ones ``publish`` insists on; the rest are
optional, and publishers may add more):

``proposal``             a proposal entered the approval gate.
                         proposal_id, name, source, parent_id; optional: second_parent_id, tags, rationale.
``decision``             a proposal was approved, rejected or edited.
                         proposal_id, decision ("approved" | "rejected" | "edited"), by ("auto" or a person);
                         optional: program_id, note.
``evaluation_started``   an evaluation was stored as in flight.
                         evaluation_id, program_id, world_size, backend, badge; optional: remeasure ("best" |
                         "migrant": a program measured again before that promotion, search/remeasure.py).
``evaluation_progress``  a step inside an evaluation (the evaluator's Progress dict, flattened).
                         evaluation_id; optional: program_id, level ("L0".."L3"), rank, step, done, total; from
                         a slot executor, steps slot_start / slot_done / slot_lost with slot, slot_label, gpus.
``evaluation_finished``  an evaluation's result was committed.
                         evaluation_id, program_id, level_reached, verdict, median_ms, speedup, badge
                         (median_ms and speedup are None when it did not pass); optional: reason, flagged,
                         remeasure (as for evaluation_started).
``new_best``             the run's best passing program changed.
                         program_id, median_ms, speedup; optional: evaluation_id, previous_median_ms.
``run_state``            a run started, paused, resumed, stopped or finished.
                         state ("running" | "paused" | "stopped" | "finished"); optional: reason.
``log``                  a line for the activity log.
                         message; optional: level ("info" | "warning" | "error"), source.

Delivery: callbacks run in the publishing thread (often the search's worker thread), after the event is in the
history and outside the bus's lock, so a callback may publish or subscribe. A callback that raises is reported
(``on_error``, by default the ``cuco_kit.events`` logger, and ``EventBus.failures``) and never reaches the
publisher or the other subscribers. Subscribers share one ``data`` dict: treat it as read-only. Widgets
must marshal to their own lock and keep callbacks short.
"""
from __future__ import annotations

import collections
import itertools
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cuco_kit.errors import BadInput

EVENT_SCHEMA_VERSION = 1

REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "proposal": ("proposal_id", "name", "source", "parent_id"),
    "decision": ("proposal_id", "decision", "by"),
    "evaluation_started": ("evaluation_id", "program_id", "world_size", "backend", "badge"),
    "evaluation_progress": ("evaluation_id",),
    "evaluation_finished": ("evaluation_id", "program_id", "level_reached", "verdict", "median_ms", "speedup",
                            "badge"),
    "new_best": ("program_id", "median_ms", "speedup"),
    "run_state": ("state",),
    "log": ("message",),
}
KINDS: tuple[str, ...] = tuple(REQUIRED_FIELDS)

_log = logging.getLogger("cuco_kit.events")


@dataclass(frozen=True)
class Event:
    kind: str
    run_id: int | None
    data: dict[str, Any]
    ts: float
    version: int = EVENT_SCHEMA_VERSION
    seq: int = 0  # per-bus publication order; callbacks of concurrent publishers may run out of this order

    def __post_init__(self) -> None:
        if self.kind not in REQUIRED_FIELDS:
            raise BadInput(f"unknown event kind {self.kind!r}; known kinds: {', '.join(KINDS)}")
        if self.version > EVENT_SCHEMA_VERSION:
            raise BadInput(f"event schema v{self.version} is newer than this cuco_kit (v{EVENT_SCHEMA_VERSION}); "
                           "upgrade cuco_kit")
        if not isinstance(self.data, dict):
            raise BadInput(f"event {self.kind!r}: data must be a dict, got {type(self.data).__name__}")
        missing = [k for k in REQUIRED_FIELDS[self.kind] if k not in self.data]
        if missing:
            raise BadInput(f"event {self.kind!r} lacks data field(s) {', '.join(missing)}; "
                           f"it needs {', '.join(REQUIRED_FIELDS[self.kind])}")

    def to_json(self) -> str:
        try:
            return json.dumps({"kind": self.kind, "run_id": self.run_id, "data": self.data, "ts": self.ts,
                               "version": self.version, "seq": self.seq}, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise BadInput(f"event {self.kind!r}: data is not JSON-serialisable ({e})") from None

    @classmethod
    def from_json(cls, text: str) -> Event:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise BadInput(f"event is not JSON: {e}") from None
        if not isinstance(d, dict) or "kind" not in d or "data" not in d or "ts" not in d:
            raise BadInput("event JSON needs at least 'kind', 'data' and 'ts'")
        return cls(kind=d["kind"], run_id=d.get("run_id"), data=d["data"], ts=float(d["ts"]),
                   version=int(d.get("version", EVENT_SCHEMA_VERSION)), seq=int(d.get("seq", 0)))


Callback = Callable[[Event], None]


@dataclass
class SubscriberFailure:
    """A callback that raised: which one, on which event, and the traceback text."""

    callback: str
    event: Event
    error: str
    traceback: str = field(repr=False, default="")


def _default_on_error(failure: SubscriberFailure) -> None:
    _log.error("event subscriber %s failed on %s: %s\n%s", failure.callback, failure.event.kind, failure.error,
               failure.traceback)


class EventSink(Protocol):
    """Where a publisher sends events: the EventBus, or anything with the same ``publish``."""

    def publish(self, kind: str, run_id: int | None = None, **data: Any) -> Any: ...


@runtime_checkable
class EventSource(Protocol):
    """Events a view can follow: what was published so far, and a callback for what comes next (the
    EventBus)."""

    def subscribe(self, callback: Callback) -> Callable[[], None]: ...

    def history(self, kind: str | None = None) -> list[Event]: ...


class EventBus:
    """Thread-safe publish/subscribe with a bounded history (ring buffer of the last ``maxlen`` events)."""

    def __init__(self, maxlen: int = 2000, on_error: Callable[[SubscriberFailure], None] | None = None) -> None:
        if maxlen < 1:
            raise BadInput(f"EventBus maxlen must be at least 1, got {maxlen}")
        self._lock = threading.Lock()
        self._history: collections.deque[Event] = collections.deque(maxlen=maxlen)
        self._subscribers: dict[int, Callback] = {}
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._on_error = on_error or _default_on_error
        self.failures: collections.deque[SubscriberFailure] = collections.deque(maxlen=100)

    def publish(self, kind: str, run_id: int | None = None, **data: Any) -> Event:
        """Validate, record and deliver one event; returns it. Raises BadInput only for a bad event (unknown
        kind, missing field, data that is not JSON-serialisable), never for a subscriber's failure."""
        payload = dict(data)
        # Refuse, at the publisher, what could not reach a browser or a log file.
        Event(kind=kind, run_id=run_id, data=payload, ts=0.0).to_json()
        with self._lock:  # seq and ts taken together, so both grow in history order
            event = Event(kind=kind, run_id=run_id, data=payload, ts=time.time(), seq=next(self._seq))
            self._history.append(event)
            subscribers = list(self._subscribers.values())
        for cb in subscribers:
            try:
                cb(event)
            except Exception as e:  # noqa: BLE001 - a widget's bug must not stop the search
                failure = SubscriberFailure(callback=getattr(cb, "__qualname__", repr(cb)), event=event,
                                            error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
                self.failures.append(failure)
                try:
                    self._on_error(failure)
                except Exception:  # noqa: BLE001 - the reporter failing must not stop the search either
                    _log.exception("event on_error handler failed")
        return event

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Call ``callback(event)`` for every later event. Returns a function that unsubscribes (idempotent)."""
        if not callable(callback):
            raise BadInput(f"subscribe needs a callable, got {type(callback).__name__}")
        with self._lock:
            sid = next(self._ids)
            self._subscribers[sid] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(sid, None)

        return unsubscribe

    def history(self, kind: str | None = None) -> list[Event]:
        """Recorded events, oldest first; only those of ``kind`` when given."""
        if kind is not None and kind not in REQUIRED_FIELDS:
            raise BadInput(f"unknown event kind {kind!r}; known kinds: {', '.join(KINDS)}")
        with self._lock:
            events = list(self._history)
        return events if kind is None else [e for e in events if e.kind == kind]
