"""ExerciseCell: the graded exercise of 05_teaching (cuco_kit.workbench.exercise): a text box per gap, Grade, the
verdict.

With a GPU the answer is evaluated there (in a thread: the cell returns at once, the verdict lands when it is in);
without one it is graded from the recording when that answer was recorded (badged replayed, GPU and date), and
otherwise the cell says it cannot grade it here. A failed or under-the-mark answer gets a hint, never the answer.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from cuco_kit.errors import CucoError
from cuco_kit.workbench import exercise as ex

from ._common import badge_html, esc


class ExerciseCell(W.VBox):
    def __init__(self, *, gpu: bool, recording: dict[str, Any] | None = None,
                 grade_on_gpu: Callable[[dict[str, str]], ex.Grade] | None = None) -> None:
        self.gpu, self.recording = gpu, recording
        self._grade_on_gpu = grade_on_gpu or (lambda a: ex.grade_on_gpu(a, recording=recording))
        self.boxes = {g: W.Textarea(placeholder=f"your code for the gap '{g}' (may stay empty)",
                                    layout=W.Layout(width="100%", height="70px"), description=g,
                                    style={"description_width": "90px"}) for g in ex.GAPS}
        self.button = W.Button(description="Grade", icon="graduation-cap", button_style="primary")
        self.where = W.HTML(self._where())
        self.result = W.HTML()
        self.grade: ex.Grade | None = None
        self._thread: threading.Thread | None = None
        self.button.on_click(lambda _: self.submit())
        super().__init__([*self.boxes.values(), W.HBox([self.button, self.where]), self.result])
        self.add_class("cuco-exercise")

    def _where(self) -> str:
        if self.gpu:
            return "<i>graded on this machine's GPU at 2 symm ranks (about a minute)</i>"
        if self.recording:
            return ("<i>no GPU here: graded from the recording of "
                    f"{esc(self.recording.get('gpu'))}, {esc(str(self.recording.get('date') or '')[:10])} "
                    "(recorded answers only)</i>")
        return "<i>no GPU here and no recording: answers cannot be graded on this machine</i>"

    def answer(self) -> dict[str, str]:
        return {g: box.value for g, box in self.boxes.items()}

    def submit(self) -> None:
        answer = self.answer()
        if not self.gpu:
            self._show(ex.grade_from_recording(answer, self.recording))
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self.button.disabled = True
        self.result.value = "<i>grading on the GPU...</i>"

        def work() -> None:
            try:
                self._show(self._grade_on_gpu(answer))
            except CucoError as exc:
                self.result.value = f"<span style='color:#b71c1c'>{esc(exc)}</span>"
            finally:
                self.button.disabled = False

        self._thread = threading.Thread(target=work, name="exercise-grade", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _show(self, g: ex.Grade) -> None:
        self.grade = g
        if not g.graded:
            self.result.value = f"<div class='cuco-exercise-grade'><i>{esc(g.reason)}</i></div>"
            return
        colour = "#1b5e20" if g.passed else "#b71c1c"
        self.result.value = (f"<div class='cuco-exercise-grade'>{badge_html(g.badge, g.detail)} "
                             f"<b style='color:{colour}'>{esc(g.summary())}</b>"
                             + (f"<div>hint: {esc(g.hint)}</div>" if g.hint else "") + "</div>")
