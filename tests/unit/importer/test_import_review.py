"""`cuco init --llm`: the port and the reference each wait for a person's decision on the terminal; a draft the
checks refuse cannot be approved, a rejection's note reaches the next request, an edit is checked like a draft,
and nothing the person did not approve reaches the folder."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.commands.import_review import review_import
from cuco_kit.errors import BadInput
from cuco_kit.importer.session import ImportSession
from cuco_kit.importer.workload_writer import SEED_FILE
from cuco_kit.llm import Completion, fixtures
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer

EXAMPLES = Path(__file__).resolve().parents[3] / "cuco_kit" / "importer" / "examples"
PORT, PORT_DROPS = fixtures.load("own_norm_port.cu"), fixtures.load("own_norm_port_drops_buffer.cu")
REFERENCE = fixtures.load("own_norm_reference.txt")


class Scripted:
    """An LLMClient answering with labelled FIXTURE texts, in order."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.prompts: list[str] = []

    def complete(self, messages, *, purpose, temperature=None, max_tokens=None):
        self.prompts.append(messages[-1]["content"])
        return Completion(self.texts.pop(0), "fixture-import", 1, 1, 0.0, "stop", fixture=True)


def _ok_build(code, backend, cfg=None, cache_dir=None):
    class R:
        ok, log = True, ""
    return R()


def cuda(code: str) -> str:
    return f"FIXTURE \x1b[2J answer\n```cuda\n{code}```\n"


def python(code: str) -> str:
    return f"FIXTURE answer\n```python\n{code}```\n"


def test_refused_draft_then_note_then_approve_and_an_edited_reference(tmp_path: Path) -> None:
    d = tmp_path / "wl"
    mine = tmp_path / "my_reference.py"
    mine.write_text(REFERENCE)
    llm = Scripted(cuda(PORT_DROPS), cuda(PORT), python("def reference(inputs, params, world):\n    raise "
                                                         "ValueError('drafted wrong')\n\nTOLERANCE = None\n"))
    session = ImportSession(EXAMPLES / "allreduce_norm.cu", d, llm=llm, builder=_ok_build)
    session.write()
    deterministic = (d / SEED_FILE).read_text()
    out = io.StringIO()
    lines = review_import(session, io.StringIO(f"a\nr keep the scratch buffer summed\na\na\ne {mine}\n"), out)
    shown = out.getvalue()
    assert "the checks refuse this port" in shown and "FIXTURE answer" in shown and "\x1b" not in shown
    assert "keep the scratch buffer summed" in llm.prompts[1]
    assert lines[0].startswith("port: approved draft 2") and lines[1].startswith("reference: your edit")
    assert (d / SEED_FILE).read_text().strip() == PORT.strip() != deterministic.strip()
    assert "the checks refuse this reference" in shown  # the draft that raises could not be approved
    assert "inputs[r][\"gamma\"]" in (d / "workload.py").read_text()


def test_keep_leaves_the_folder_as_the_deterministic_import_wrote_it(tmp_path: Path) -> None:
    d = tmp_path / "wl"
    session = ImportSession(EXAMPLES / "allreduce_norm.cu", d, llm=Scripted(cuda(PORT), python(REFERENCE)),
                            builder=_ok_build)
    session.write()
    before = {f.name: f.read_text() for f in d.iterdir()}
    lines = review_import(session, io.StringIO("k\nk\n"), io.StringIO())
    assert [ln.split(":")[1].strip() for ln in lines] == ["kept the deterministic port (seed_nccl.cu)",
                                                          "kept workload.py's TODO reference"]
    assert {f.name: f.read_text() for f in d.iterdir()} == before
    with pytest.raises(BadInput, match="no decision on the port"):
        review_import(ImportSession(EXAMPLES / "allreduce_norm.cu", tmp_path / "w2", llm=Scripted(cuda(PORT)),
                                    builder=_ok_build), io.StringIO(""), io.StringIO())


def test_cuco_init_llm_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "wl"
    with FakeOpenAIServer([answer("port", cuda(PORT_DROPS)), answer("reference", python(REFERENCE))]) as srv:
        for k, v in srv.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sys, "stdin", io.StringIO("k\na\n"))
        rc = main(["init", str(EXAMPLES / "allreduce_norm.cu"), "--workload", str(d), "--llm", "--llm-retries", "0"])
        prompts = [r.body["messages"][-1]["content"][:200] for r in srv.chat_requests()]
    out = capsys.readouterr().out
    assert rc == 0 and len(prompts) == 2
    assert "port: kept the deterministic port" in out and "reference: approved draft 1" in out
    assert "cuco check-workload" in out
    assert "inputs[r][\"gamma\"]" in (d / "workload.py").read_text()


def test_cuco_init_llm_without_a_server_is_one_line_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "probe-unreachable")
    rc = main(["init", str(EXAMPLES / "allreduce_norm.cu"), "--workload", str(tmp_path / "wl"), "--llm"])
    err = capsys.readouterr().err
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "OPENAI_BASE_URL" in err
    assert not (tmp_path / "wl").exists()
