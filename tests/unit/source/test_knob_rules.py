"""Knob rules (`// knob-rule:` lines of the knob block): the grammar, evaluation with C++'s arithmetic, one-line
messages for malformed rules, counting a space's valid points, and L0 (a point that breaks a rule, a child that
drops, changes or adds a rule)."""
from __future__ import annotations

import itertools
import random
import re

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.source import knob_rules as R
from cuco_kit.source import markers, static_check

CODE = """enum class Issuer { kWarp, kCta };
// EVOLVE-BLOCK-START knobs
constexpr Issuer kIssuer = Issuer::kWarp;  // knob: {Issuer::kWarp, Issuer::kCta}
constexpr int kThreads = 512;  // knob: range 128..1024 step 128
constexpr int kTokens = 32;  // knob: pow2 8..512
constexpr bool kPrefetch = false;  // knob: {false, true}
constexpr int kChunks = 4;  // knob: {1, 2, 4, 8}
// A made-up budget for these tests: a kWarp CTA keeps kTokens ints per warp within 48 KiB.
// knob-rule: kIssuer == Issuer::kCta or kThreads / 32 * kTokens * 4 <= 48 * 1024
// A made-up limit: prefetching needs tiles of at least 16 tokens.
// knob-rule: not kPrefetch or kTokens >= 16
// EVOLVE-BLOCK-END
__global__ void k() {}
"""
KNOBS = markers.knobs(CODE)


def _brute(code: str) -> int:
    ks, rs = markers.knobs(code), R.rules(code)
    return sum(R.is_valid(rs, dict(zip((k.name for k in ks), combo)))
               for combo in itertools.product(*(k.allowed for k in ks)))


def test_rules_are_read_with_their_lines_and_knobs() -> None:
    rules = R.rules(CODE)
    assert [r.text for r in rules] == ["kIssuer == Issuer::kCta or kThreads / 32 * kTokens * 4 <= 48 * 1024",
                                       "not kPrefetch or kTokens >= 16"]
    assert [r.line for r in rules] == [9, 11]
    assert rules[0].names == ("kIssuer", "kThreads", "kTokens") and rules[1].names == ("kPrefetch", "kTokens")


def test_evaluation_at_points() -> None:
    first, second = R.rules(CODE)
    warp = {"kIssuer": "Issuer::kWarp", "kPrefetch": "false"}
    assert first.holds({**warp, "kThreads": "768", "kTokens": "512"})  # 24 * 512 * 4 = 48 KiB exactly
    assert not first.holds({**warp, "kThreads": "896", "kTokens": "512"})
    assert first.holds({**warp, "kIssuer": "Issuer::kCta", "kThreads": "1024", "kTokens": "512"})
    assert first.holds({**warp, "kThreads": 1024, "kTokens": 256})  # ints as well as source tokens
    assert not second.holds({"kPrefetch": True, "kTokens": "8"}) and second.holds({"kPrefetch": "true",
                                                                                  "kTokens": "16"})
    assert R.violated([first, second], {**warp, "kThreads": "1024", "kTokens": "512"}) == [
        "line 9: knob rule 'kIssuer == Issuer::kCta or kThreads / 32 * kTokens * 4 <= 48 * 1024' does not hold at "
        "kIssuer = Issuer::kWarp, kThreads = 1024, kTokens = 512"]
    with pytest.raises(BadInput, match="reads kTokens, which has no value"):
        first.holds({"kIssuer": "Issuer::kWarp", "kThreads": "128"})


@pytest.mark.parametrize("expr, values, expected", [
    ("-7 / 2 == -3", {}, True),  # C++ truncates toward zero (Python's // would give -4)
    ("-7 % 2 == -1", {}, True),  # the remainder takes the dividend's sign
    ("7 % -2 == 1", {}, True),
    ("kChunks / (kChunks - 4) > 0", {"kChunks": "4"}, False),  # a division by zero does not hold
    ("1 < kChunks <= 4", {"kChunks": "4"}, True),  # chained comparisons
    ("1 < kChunks <= 4", {"kChunks": "8"}, False),
    ("kChunks * 2 + 1 == 0x11", {"kChunks": "8"}, True),
    ("not (kChunks == 1 or kChunks == 2) and kChunks != 8", {"kChunks": "4"}, True),
    ("kPrefetch == false", {"kPrefetch": "false"}, True),
    ("kPrefetch", {"kPrefetch": "true"}, True),  # a bool knob alone is a condition
    ("kIssuer != Issuer::kCta", {"kIssuer": "Issuer::kCta"}, False),
])
def test_c_semantics(expr: str, values: dict[str, str], expected: bool) -> None:
    rule = R.parse_rule(expr if any(k.name in expr for k in KNOBS) else f"kChunks == kChunks and {expr}", KNOBS)
    point = {"kChunks": "4", **values}
    assert rule.holds(point) is expected


@pytest.mark.parametrize("expr, message", [
    ("kThreads ** 2 < 4", "'**' is not allowed"),
    ("kThreads // 2 < 4", "'//' is not allowed"),
    ("kThreads << 1 < 4", "'<<' is not allowed"),
    ("max(kThreads, 1) < 4", "a call is not allowed"),
    ("kThreads.bit_length() < 4", "a call is not allowed"),
    ("kThreads if kChunks else 1", "'x if c else y' is not allowed"),
    ("kThreads in (128, 256)", "'in' is not allowed"),
    ("__import__('os') == 1", "a call is not allowed"),
    ("kFoo < 4", "kFoo is not a knob of the knob block (knobs: kIssuer, kThreads"),
    ("kThreads < 1.5", "1.5 is not an integer literal"),
    ("kThreads < 'a'", "'a' is not an integer literal"),
    ("kThreads == True", "True is not an integer literal"),
    ("kThreads * 2", "a rule is a condition"),
    ("kThreads <", "not an expression"),
    ("kThreads > 1 && kChunks > 1", "write 'and' instead of '&&'"),
    ("kThreads > 1 || kChunks > 1", "write 'or' instead of '||'"),
    ("!kPrefetch", "write 'not' instead of '!'"),
    ("kIssuer < Issuer::kCta", "enumerators compare with == and != only"),
    ("kIssuer == Issuer::kCTA", "Issuer::kCTA is not a value of kIssuer"),
    ("kIssuer + 1 > 0", "kIssuer is an enumerator; '+' takes integers"),
    ("kThreads == Issuer::kCta", "compares an integer with an enumerator (kThreads == Issuer::kCta)"),
    ("Issuer::kCta == Issuer::kWarp or kThreads > 1", "compares two enumerators"),
    ("4 > 2", "reads no knob"),
    ("", "knob rule is empty"),
])
def test_malformed_rules_are_one_line_bad_input(expr: str, message: str) -> None:
    with pytest.raises(BadInput) as err:
        R.parse_rule(expr, KNOBS)
    text = str(err.value)
    assert message in text and "\n" not in text
    if expr:
        assert repr(" ".join(expr.split())) in text  # the message names the rule


def test_a_malformed_rule_in_a_file_names_its_line() -> None:
    bad = CODE.replace("kTokens >= 16", "kTokenz >= 16")
    with pytest.raises(BadInput, match=r"^line 11: knob rule 'not kPrefetch or kTokenz >= 16': kTokenz is not a "):
        R.rules(bad)
    report = static_check.check_candidate(bad)
    assert not report.ok and any(r.startswith("line 11: knob rule") and "kTokenz" in r for r in report.reasons)


def test_rule_outside_the_knob_block_and_glued_to_code_are_problems() -> None:
    outside = CODE.replace("__global__ void k() {}", "// knob-rule: kThreads > 128\n__global__ void k() {}")
    _, problems = R.scan_rules(outside, markers.blocks(outside), KNOBS)
    assert problems == ["line 13: knob rule outside the knob block (in frozen code); rules belong in "
                        "'// EVOLVE-BLOCK-START knobs'"]
    glued = CODE.replace("// knob-rule: not kPrefetch", "int x;  // knob-rule: not kPrefetch")
    _, problems = R.scan_rules(glued, markers.blocks(glued), KNOBS)
    assert problems and problems[0].startswith("line 11: a knob rule is a comment line of its own")
    assert "'// knob-rule: CONDITION' lines" in static_check.check_candidate(glued).reasons[0]  # the knob block's


def test_counting_matches_brute_force_and_reports_total() -> None:
    count = R.count_valid(CODE)
    assert count.total == markers.space_size(CODE) == 2 * 8 * 7 * 2 * 4
    # kWarp with 512 tokens and 896 or 1024 threads (x2 kPrefetch x4 kChunks), kPrefetch with 8 tokens (x2 x8 x4)
    assert count.valid == count.total - 2 * 2 * 4 - 2 * 8 * 4 == _brute(CODE)
    assert R.count_valid(CODE.replace("// knob-rule", "// no rule")).valid == count.total
    too_big = R.count_valid(CODE, limit=100)
    assert too_big.valid is None and "more than 100 to count" in too_big.note and "kTokens" in too_big.note


def test_counting_groups_knobs_that_share_rules() -> None:
    # kChunks is under no rule: it multiplies in; the two rules share kTokens, so one group of four knobs
    groups = R._groups(KNOBS, R.rules(CODE))
    assert [names for names, _ in groups] == [["kIssuer", "kThreads", "kTokens", "kPrefetch"]]
    two = CODE.replace("not kPrefetch or kTokens >= 16", "not kPrefetch or kChunks >= 2")
    assert sorted(len(names) for names, _ in R._groups(KNOBS, R.rules(two))) == [2, 3]
    assert R.count_valid(two).valid == _brute(two)


def test_corners_and_samples_are_valid() -> None:
    rules = R.rules(CODE)
    low, high = R.corner(KNOBS, rules), R.corner(KNOBS, rules, largest=True)
    assert low == {"kIssuer": "Issuer::kWarp", "kThreads": "128", "kTokens": "8", "kPrefetch": "false",
                   "kChunks": "1"}
    assert high == {"kIssuer": "Issuer::kCta", "kThreads": "1024", "kTokens": "512", "kPrefetch": "true",
                    "kChunks": "8"}
    assert R.is_valid(rules, low) and R.is_valid(rules, high)
    rng = random.Random(3)
    drawn = [R.sample(KNOBS, rules, rng) for _ in range(200)]
    assert all(p is not None and R.is_valid(rules, p) for p in drawn)
    impossible = R.rules(CODE.replace("kTokens >= 16", "kTokens >= 1024"))
    assert R.sample(KNOBS, impossible, rng, tries=50) is not None  # kPrefetch = false still works
    never = R.parse_rule("kChunks > 8", KNOBS)
    assert R.sample(KNOBS, [never], rng, tries=50) is None and R.corner(KNOBS, [never]) is None


# ------------------------------------------------------------------------------------------------------- L0

def test_l0_accepts_a_valid_move_and_rejects_a_point_that_breaks_a_rule() -> None:
    ok = static_check.check_candidate(markers.set_knobs(CODE, {"kThreads": 768, "kTokens": 512}), CODE)
    assert ok.ok, ok.reasons
    assert ok.to_dict()["knob_rules"] == [r.text for r in R.rules(CODE)]
    bad = static_check.check_candidate(markers.set_knobs(CODE, {"kThreads": 1024, "kTokens": 512}), CODE)
    assert not bad.ok and bad.reasons == [
        "line 9: knob rule 'kIssuer == Issuer::kCta or kThreads / 32 * kTokens * 4 <= 48 * 1024' does not hold at "
        "kIssuer = Issuer::kWarp, kThreads = 1024, kTokens = 512"]
    assert not static_check.check_candidate(markers.set_knobs(CODE, {"kThreads": 1024, "kTokens": 512})).ok


@pytest.mark.parametrize("edit, message", [
    (("// knob-rule: not kPrefetch or kTokens >= 16\n", ""), r"^parent line 11: knob rule 'not kPrefetch or "
                                                            r"kTokens >= 16' was dropped or changed"),
    (("kTokens >= 16", "kTokens >= 8"), r"knob rule 'not kPrefetch or kTokens >= 16' was dropped or changed"),
    (("// knob-rule: not kPrefetch", "// knob-rule: kChunks > 0\n// knob-rule: not kPrefetch"),
     r"^line 11: knob rule 'kChunks > 0' is new"),
])
def test_l0_refuses_a_child_that_drops_changes_or_adds_a_rule(edit: tuple[str, str], message: str) -> None:
    child = CODE.replace(*edit)
    assert child != CODE
    report = static_check.check_candidate(child, CODE)
    assert not report.ok and any(re.search(message, r) for r in report.reasons), report.reasons


def test_l0_ignores_whitespace_in_a_kept_rule() -> None:
    child = CODE.replace("kTokens >= 16", "kTokens   >=   16")
    assert static_check.check_candidate(child, CODE).ok


@pytest.mark.parametrize("token, value", [
    ("512", 512), ("-4", -4), ("0x1F", 31), ("16u", 16), ("1ull", 1), ("010", 8), ("true", 1), ("false", 0),
    ("Issuer::kCta", "Issuer::kCta"), ("08", "08"),  # 08 is no C++ literal: not an integer to a rule
])
def test_knob_values_read_as_cpp_literals(token: str, value: int | str) -> None:
    assert R.value_of(token) == value
