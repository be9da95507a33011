"""The `cuco` CLI answers bad input with one clear line and exit code 2, never a traceback."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PARENT = ROOT / "tests" / "data" / "l0" / "parent.cu"


def cuco(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuco_kit", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def assert_one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert pattern in lines[0], lines[0]


def png_bytes() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\x00"))
            + chunk(b"IEND", b""))


def test_missing_file(tmp_path):
    assert_one_line_error(cuco("check", tmp_path / "nope.cu"), "no such file")


def test_missing_parent(tmp_path):
    assert_one_line_error(cuco("check", PARENT, "--parent", tmp_path / "nope.cu"), "parent")


def test_png_is_not_cuda(tmp_path):
    f = tmp_path / "picture.cu"
    f.write_bytes(png_bytes())
    assert_one_line_error(cuco("check", f), "is binary, not CUDA source")


def test_python_file_is_not_cuda(tmp_path):
    f = tmp_path / "script.py"
    f.write_text((ROOT / "cuco_kit" / "cli.py").read_text())
    assert_one_line_error(cuco("check", f, "--json"), "does not look like CUDA source")


def test_directory_is_not_a_file(tmp_path):
    assert_one_line_error(cuco("check", tmp_path), "not a regular file")


def test_unbalanced_markers(tmp_path):
    f = tmp_path / "cand.cu"
    f.write_text(PARENT.read_text().replace("  // EVOLVE-BLOCK-END\n  return", "  return"))
    assert_one_line_error(cuco("check", f, "--parent", PARENT), "block 'step' is never closed")


def test_unknown_command():
    assert_one_line_error(cuco("frobnicate", "x"), "unknown command 'frobnicate'")


def test_accepted_candidate_prints_json_and_exits_0():
    proc = cuco("check", PARENT, "--parent", PARENT, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["reasons"] == []
    assert report["knobs"] == {"kChunks": "4", "kThreads": "256", "kPlacement": "Placement::kTwoStream"}


@pytest.mark.parametrize("as_json", [True, False])
def test_rejected_candidate_exits_1_with_reasons(tmp_path, as_json):
    f = tmp_path / "cand.cu"
    text = PARENT.read_text().replace("  // EVOLVE-BLOCK-END\n  return",
                                      '  system("id");\n  // EVOLVE-BLOCK-END\n  return')
    f.write_text(text.replace("kChunks = 4;", "kChunks = 3;"))
    proc = cuco("check", f, "--parent", PARENT, *(["--json"] if as_json else []))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    if as_json:
        report = json.loads(proc.stdout)
        assert report["ok"] is False and len(report["reasons"]) == 2
        out = "\n".join(report["reasons"])
    else:
        out = proc.stderr
        assert out.startswith("rejected (2 reason(s)):")
    assert "process/syscall call 'system'" in out and "knob kChunks = 3 is not in its allowed set" in out


def test_check_imports_only_its_own_command():
    # The registry imports a command's module when that command runs: `cuco check` must not pay for torch.
    code = ("import sys\nfrom cuco_kit.cli import main\n"
            f"rc = main(['check', {str(PARENT)!r}, '--json'])\n"
            "print(rc, 'torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('cuco_kit.commands.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 False ['cuco_kit.commands.check']"
