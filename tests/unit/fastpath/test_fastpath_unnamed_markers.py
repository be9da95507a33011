"""`cuco fastpath` on a seed marked the way CUCo's and ShinkaEvolve's files are (EVOLVE blocks without names,
tests/data/cuco_style/, written for these tests): the file is accepted, its blocks are named block_1, block_2 in
file order, the mapping is printed and kept for the notebook, and the stages rewrite the code without the markers
(a stage's output may not carry them). The LLM is the local fake server."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import Completion
from cuco_kit.llm.fake_server import FakeOpenAIServer, answer
from cuco_kit.source import markers

SEED = Path(__file__).resolve().parents[2] / "data" / "cuco_style" / "allgather_scale_evolve.cu"


class Silent:
    """An LLMClient that is never asked (the test stops before any stage)."""

    def complete(self, messages, *, purpose, temperature=None, max_tokens=None) -> Completion:
        raise AssertionError("no LLM call expected")


def test_unnamed_blocks_are_named_and_set_aside_for_the_stages():
    code = SEED.read_text()
    fp = FastPath(code, None, Silent(), config=FastPathConfig(gpu=False))
    assert [b.name for b in fp.seed_blocks] == ["block_1", "block_2"]
    assert fp.block_names == ("unnamed EVOLVE blocks named by their place in the file: block_1 = lines 8-13, "
                              "block_2 = lines 24-29")
    assert fp.current_code == markers.strip_markers(code) and "EVOLVE-BLOCK" not in fp.current_code
    assert fp.seed_code == code  # the seed itself is kept as given


def test_cuco_fastpath_accepts_the_file_and_prints_the_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer([answer("no-code", "FIXTURE: an answer without a code block", times=0)]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "fixture-key")
        monkeypatch.setenv("CUCO_MODEL", "fixture")
        rc = main(["fastpath", str(SEED), "--max-attempts", "1", "--db", str(tmp_path / "fp.db"),
                   "--llm-retries", "0"])
        prompts = [str(r.body) for r in srv.chat_requests()]
    out, err = capsys.readouterr()
    assert rc == 1, err  # accepted (bad input would be 2); the FIXTURE answer has no code, so the stage fails
    assert "block_1 = lines 8-13, block_2 = lines 24-29" in out
    assert prompts and all("EVOLVE-BLOCK" not in p for p in prompts)
