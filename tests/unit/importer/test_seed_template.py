"""The deterministic port's frame, cuco_kit/importer/templates/seed.cu.in: it renders for every program shape the
importer tests use (the two shipped examples and tests/data/own_programs/), every placeholder filled, and the seed
it makes keeps its state the samples' way: cuco_state<CucoState> and, per side stream, a cuco_side_stream_t that
setup creates, release destroys and every step forks off and joins back to the harness stream."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.importer import source_template
from cuco_kit.importer.derive import make_plan
from cuco_kit.importer.seed_writer import own_headers, write_seed

ROOT = Path(__file__).resolve().parents[3]
PROGRAMS = sorted((ROOT / "cuco_kit" / "importer" / "examples").glob("*.cu")) + sorted(
    (ROOT / "tests" / "data" / "own_programs").glob("*.cu"))


def _function(seed: str, signature: str) -> str:
    """The text of the entry point that starts with `signature`, to its closing brace at column 0."""
    start = seed.index(signature)
    return seed[start:seed.index("\n}\n", start) + 2]


def test_the_shapes_are_all_there():
    assert len(PROGRAMS) == 10  # 2 examples + 8 own programs: a new shape is picked up here without an edit


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_the_seed_template_renders_for_every_shape(path: Path):
    code = path.read_text()
    plan = make_plan(code, path.name)
    seed = write_seed(plan, code, own_headers(path, code))
    for key in source_template.placeholders("seed.cu"):
        assert not re.search(rf"\$\{{{key}\}}|\${key}\b", seed), f"placeholder {key} left in the seed"
    assert seed.startswith("// cuco: backends=nccl,symm\n") and seed.endswith("\n") and not seed.endswith("\n\n")
    assert f" * {plan.name}: the seed in the candidate ABI, ported by `cuco init` from {path.name}" in seed
    for entry in ("cuco_setup", "cuco_step", "cuco_teardown"):
        assert len(re.findall(rf"CUCO_EXPORT int {entry}\(cuco_ctx_t\* ctx\)", seed)) == 1, entry
    setup = _function(seed, "CUCO_EXPORT int cuco_setup(")
    entry = seed[seed.index("struct CucoState {"):]
    # the lifecycle is cuco_state's: nothing touches ctx->user by hand
    assert "ctx->user" not in entry and "new CucoState" not in entry and "delete " not in entry
    assert setup.rstrip().endswith("return cuco_state<CucoState>::settle(ctx, rc);\n}")
    assert setup.count("cuco_state<CucoState>::open(ctx)") == 1
    assert "cuco_state<CucoState>::get(ctx)" in _function(seed, "CUCO_EXPORT int cuco_step(")
    assert "CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<CucoState>::close(ctx); }" in seed
    state = seed[seed.index("struct CucoState {"):seed.index("\n};\n", seed.index("struct CucoState {"))]
    step = _function(seed, "CUCO_EXPORT int cuco_step(")
    for b in plan.scratch():
        member = re.sub(r"\W+", "_", b.name).strip("_")
        assert f"cuco_alloc_zeroed(&st->{member}, " in setup and f"cudaFree({member});" in state, b.name
    for s in plan.side_streams:
        member = re.sub(r"\W+", "_", s).strip("_")
        assert f"cuco_side_stream_t {member} = {{}};" in state and f"cuco_side_stream_destroy(&{member});" in state
        assert f"cuco_side_stream_create(&st->{member})" in setup
        fork = step.index(f"cuco_side_stream_fork(&st->{member}, ctx->stream)")
        join = step.index(f"cuco_side_stream_join(&st->{member}, ctx->stream)")
        assert fork < step.index("// the step:") < join, s
    if not plan.side_streams:
        assert "cuco_side_stream_t" not in state and "cuco_side_stream_fork" not in step


def test_a_placeholder_without_a_value_is_named():
    values = {k: "" for k in source_template.placeholders("seed.cu") - {"step_result"}}
    with pytest.raises(BadInput, match="step_result"):
        source_template.render("seed.cu", **values)


def test_an_empty_section_leaves_no_blank_line():
    values = {k: "x" for k in source_template.placeholders("seed.cu")}
    full = source_template.render("seed.cu", **values)
    values["state_members"] = ""
    assert source_template.render("seed.cu", **values).count("\n") == full.count("\n") - 1
