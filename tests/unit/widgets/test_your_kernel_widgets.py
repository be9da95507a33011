"""The import and fast-path widgets without a browser: the plan form refuses an inconsistent plan, a draft
review writes only what passes the checks, and the stepper takes a reject with its note, a user's edit (a
labelled FIXTURE) and approvals (the search it then starts is driven in the browser tier)."""
from __future__ import annotations

import json
from pathlib import Path

from cuco_kit.evaluate.build import BuildResult
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.importer.session import ImportSession
from cuco_kit.llm import Completion, fixtures
from cuco_kit.store import Store
from cuco_kit.widgets.attempt_review import FastPathStepper
from cuco_kit.widgets.plan_form import DraftReview, PlanForm

ROOT = Path(__file__).resolve().parents[3]
PROGRAM = ROOT / "cuco_kit" / "importer" / "examples" / "allreduce_norm.cu"


class Keyed:
    """LLMClient double: the first unused FIXTURE answer whose key is in the prompt."""

    def __init__(self, *script: tuple[str, str]) -> None:
        self.script = list(script)
        self.prompts: list[str] = []

    def complete(self, messages, *, purpose, temperature=None, max_tokens=None):
        text = messages[-1]["content"]
        self.prompts.append(text)
        i = next(i for i, (k, _) in enumerate(self.script) if k in text)
        return Completion(self.script.pop(i)[1], "fixture-keyed", 1, 1, 0.0, "stop", fixture=True)


def cuda(name: str) -> str:
    return f"FIXTURE\n```cuda\n{fixtures.load(name)}```\n"


def no_build(code, backend, cfg=None, cache_dir=None):
    return BuildResult(True, Path("/nonexistent/fake.so"), "TEST DOUBLE: nothing compiled", 0.0, False, "fake")


def test_plan_form_and_draft_review(tmp_path):
    llm = Keyed(("Port a host", cuda("own_norm_port_drops_buffer.cu")), ("Port a host", cuda("own_norm_port.cu")))
    session = ImportSession(PROGRAM, tmp_path / "wl", llm=llm, builder=no_build)
    form = PlanForm(session)
    bad = json.loads(session.plan.to_json())
    bad["buffers"][3]["role"] = "scratch"
    bad["todo"] = ["which loop is the step"]
    assert not form.apply_text(json.dumps(bad))  # every problem is listed, not the first with a count
    assert "no buffer is an output" in form.problems.value and "TODO: which loop is the step" in form.problems.value
    assert session.plan.buffers[3].role == "output"  # the refused plan was not taken
    session.write()
    review = DraftReview(session, "port")
    assert "dropped a buffer" in review.status.value
    review.review.approve.click()  # approving a draft that fails the checks writes nothing
    assert not review.accepted and "not accepted" in review.status.value
    review.note.value = "look gamma up"
    review.propose(review.note.value)
    assert "look gamma up" in llm.prompts[-1] and review.draft.ok
    review.review.approve.click()
    assert review.accepted and review.review.decision == "approved"


def test_stepper_reject_edit_approve(tmp_path):
    d = tmp_path / "wl"
    session = ImportSession(PROGRAM, d)
    session.write()
    session.accept_reference(fixtures.load("own_norm_reference.txt"))
    llm = Keyed(("# Stage A", cuda("own_norm_stage_a.cu")), ("# Stage A", cuda("own_norm_stage_a.cu")),
                ("# Stage B", cuda("own_norm_stage_b_lsa.cu")), ("# Annotate", cuda("own_norm_annotated.cu")))
    store = Store(tmp_path / "road.sqlite")
    fp = FastPath((d / "seed_nccl.cu").read_text(), d, llm, None, store,
                  FastPathConfig(gpu=False, manual=True, max_attempts=2, judge=False), builder=no_build)
    stepper = FastPathStepper(fp)
    stepper.start()

    def wait_for(stage: str, number: int) -> None:
        for _ in range(200):
            a = fp.pending
            if a is not None and (a.stage, a.number) == (stage, number) and stepper.current.children:
                return
            stepper.done.wait(0.05)
        raise AssertionError(f"stage {stage} attempt {number} never came: {stepper.status.value}")

    wait_for("A", 1)
    stepper.note.value = "keep the harness stream"
    stepper.review.reject.click()
    wait_for("A", 2)
    assert "keep the harness stream" in llm.prompts[-1]
    stepper.review.approve.click()
    wait_for("B", 1)
    stepper.review.edit.click()
    stepper.review.editor.value = fixtures.load("own_norm_stage_b_edit.cu")  # a user's edit (FIXTURE)
    stepper.review.submit_edit.click()
    stepper.approve_all(timeout=30)
    assert stepper.result is not None and stepper.result.ok, stepper.status.value
    assert [a.verdict for a in fp.outcomes["A"].attempts] == ["rejected", "pass_l1"]
    edited = fp.outcomes["B"].attempts[0]
    assert edited.source == "human" and "kThreads = 128;" in (edited.code or "")
    assert stepper.done.is_set() and "passed_l1" in stepper.status.value
    # every decided attempt, with its verdict: the scripted annotation was of the unedited Stage B, so it is
    # refused (stripping its markers does not give back the edit) and the deterministic annotator steps in
    assert len(stepper.history.children) == 5 and "fallback" in stepper.history.children[-1].value
    store.close()
