"""`cuco search --config run.toml`: every value resolved in one place, command line > file > defaults; a key the
file has that SearchConfig does not know is refused by name in one line, at the top or in any table."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cuco_kit.commands import search
from cuco_kit.commands.search import read_run_file
from cuco_kit.errors import BadInput
from cuco_kit.search.config import SearchConfig

WL = str(Path(__file__).resolve().parents[3] / "sample_kernels" / "gemm_allgather")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    search.add_arguments(parser)
    return parser.parse_args([WL, "--db", "run.sqlite", *argv])


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_command_line_wins_over_the_file_and_the_file_over_the_defaults(tmp_path: Path):
    run = _file(tmp_path, """
seed = 3
world_size = 2
backend = "symm"
proposals_per_generation = 6
[budget]
generations = 25
wall_s = 60.0
[params]
M = 256
N = 512
[islands]
islands = 3
""")
    args = _args("--config", run, "--seed", "7", "--size", "N=1024")
    cfg = search.resolve_config(args)
    assert cfg.seed == 7 and args.seed == 7  # the command line
    assert (cfg.world_size, cfg.backend, args.ranks, args.backend) == (2, "symm", 2, "symm")  # the file
    assert cfg.budget.generations == args.generations == 25 and cfg.budget.wall_s == 60.0
    assert cfg.params == {"M": 256, "N": 1024}  # --size overrides the file's [params] one by one
    assert cfg.proposals_per_generation == 6 and cfg.islands.islands == 3
    assert cfg.islands.migrants == SearchConfig().islands.migrants  # the default where neither says
    assert args.llm_budget == search.FLAG_KEYS["llm_budget"][1] == cfg.budget.llm_dollars


def test_without_a_file_the_flags_defaults_hold():
    args = _args()
    cfg = search.resolve_config(args)
    assert (args.ranks, args.backend, args.seed, args.generations) == (1, "nccl", 0, 10)
    assert (cfg.world_size, cfg.backend, cfg.seed, cfg.budget.generations, cfg.params) == (1, "nccl", 0, 10, {})


def test_a_flag_equal_to_its_default_still_wins_over_the_file(tmp_path: Path):
    args = _args("--config", _file(tmp_path, "[budget]\ngenerations = 40\n"), "--generations", "10")
    assert search.resolve_config(args).budget.generations == 10


@pytest.mark.parametrize("text, named", [
    ("sed = 3\n", "search config: unknown key(s) 'sed'"),
    ("[budget]\ngeneratons = 3\n", "[budget]: unknown key(s) 'generatons'; known: generations"),
    ("[phases.explore]\nmixx = {}\n", "[phases.explore]: unknown key(s) 'mixx'"),
    ("[models]\nmutations = []\n", "models: unknown key(s) 'mutations'"),
    ("budget = 3\n", "[budget] must be a table"),
    ("[budget]\ngenerations = \"ten\"\n", "a value is missing or of the wrong kind"),
    ("gate = \"sometimes\"\n", "gate 'sometimes' is not one of auto, manual"),
])
def test_a_bad_file_is_refused_in_one_line_naming_the_key(tmp_path: Path, text: str, named: str):
    run = _file(tmp_path, text)
    with pytest.raises(BadInput) as exc:
        search.resolve_config(_args("--config", run))
    msg = str(exc.value)
    assert msg.startswith(f"--config {run}: ") and named in msg and "\n" not in msg


def test_a_file_that_is_not_toml_or_not_there(tmp_path: Path):
    with pytest.raises(BadInput, match="not TOML"):
        read_run_file(_file(tmp_path, "seed = = 3\n"))
    with pytest.raises(BadInput, match="cannot read it"):
        read_run_file(tmp_path / "missing.toml")


def test_models_come_from_the_file_and_mutation_models_add_to_them(tmp_path: Path):
    run = _file(tmp_path, '[models]\nmutation = ["model-a", {name = "model-b", reasoning_effort = "low"}]\n')
    cfg = search.resolve_config(_args("--config", run, "--mutation-model", "model-c"))
    assert [m.name for m in cfg.models.mutation] == ["model-a", "model-b", "model-c"]


def test_a_stored_config_stays_lenient():
    stored = {**SearchConfig().to_dict(), "from_a_newer_version": 1}
    stored["budget"] = {**stored["budget"], "also_newer": 2}
    assert SearchConfig.from_dict(stored) == SearchConfig()
    with pytest.raises(BadInput, match="unknown key"):
        SearchConfig.from_dict(stored, strict=True)
