"""L1 build cache and version checks, without nvcc: a fake compiler stands in so the unit tier stays fast.
Real nvcc builds are in tests/compile/test_compile_samples.py."""
from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate import build as B

ROOT = Path(__file__).resolve().parents[3]
FAKE_NVCC = textwrap.dedent(
    """\
    #!{python}
    # Stands in for nvcc: '--version' prints a version; otherwise '#error' in the source fails like a compile
    # error, 'SLEEP_FOREVER' hangs, 'SLOW' takes a second, anything else writes the -o file. Each compile
    # appends a line to $FAKE_NVCC_LOG.
    import os, sys, time
    args = sys.argv[1:]
    if args == ["--version"]:
        print("Cuda compilation tools, release 99.9, fake"); sys.exit(0)
    out = args[args.index("-o") + 1]
    src = [a for a in args if a.endswith(".cu")][0]
    with open(os.environ["FAKE_NVCC_LOG"], "a") as f:
        f.write(" ".join(args) + "\\n")
    code = open(src).read()
    if "#error" in code:
        print(src + "(1): error: forced failure for the test"); sys.exit(2)
    if "SLEEP_FOREVER" in code:
        time.sleep(600)
    if "SLOW" in code:
        time.sleep(1)
    open(out, "wb").write(b"ELF-fake " + code.encode())
    """
)


@pytest.fixture()
def fake_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> B.BuildConfig:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_NVCC_LOG", str(tmp_path / "calls.log"))
    nccl = tmp_path / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "lib").mkdir()
    (nccl / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_VERSION_CODE 22809\n")
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "cuco_abi.h").write_text("/* abi */\n")
    B._nvcc_version.cache_clear()
    return B.BuildConfig(nvcc=str(nvcc), nccl_include=nccl / "include", nccl_lib=nccl / "lib",
                         cublas_include=None, cublas_lib=None, runtime_dir=runtime, timeout_s=30)


def _calls(tmp_path: Path) -> int:
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


CODE = '#include "cuco_abi.h"\nextern "C" int cuco_step(void*) { return 0; }\n'


def test_identical_content_hits_the_cache(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = B.build(CODE, "nccl", fake_cfg, cache)
    second = B.build(CODE, "nccl", fake_cfg, cache)
    assert first.ok and not first.cached
    assert second.ok and second.cached
    assert second.so_path == first.so_path and second.key == first.key
    assert first.so_path is not None and first.so_path.read_bytes().startswith(b"ELF-fake")
    assert _calls(tmp_path) == 1
    assert (cache / f"{first.key}.log").exists()  # the compiler log sits next to the .so


def test_threads_building_the_same_code_at_once_all_succeed(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: B.build(CODE, "nccl", fake_cfg, cache), range(8)))
    assert all(r.ok for r in results), [r.log for r in results]
    assert [p.name for p in cache.iterdir()] and not list(cache.glob("*.tmp")) and not list(cache.glob(".build-*"))
    assert _calls(tmp_path) == 1 and sum(not r.cached for r in results) == 1  # the others waited for that one


BUILD_IN_A_PROCESS = """
import json, sys
from pathlib import Path
from cuco_kit.evaluate import build as B
paths = json.loads(sys.argv[1])
cfg = B.BuildConfig(nvcc=paths["nvcc"], nccl_include=Path(paths["nccl_include"]), nccl_lib=Path(paths["nccl_lib"]),
                    cublas_include=None, cublas_lib=None, runtime_dir=Path(paths["runtime_dir"]), timeout_s=30)
r = B.build(sys.argv[2], "nccl", cfg, sys.argv[3])
print(int(r.ok), int(r.cached))
"""


def test_processes_sharing_a_cache_compile_a_key_once(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    paths = json.dumps({f: str(getattr(fake_cfg, f)) for f in ("nvcc", "nccl_include", "nccl_lib", "runtime_dir")})
    slow = "// SLOW: the compiles overlap\n" + CODE
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_IN_A_PROCESS, paths, slow, str(tmp_path / "cache")],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0] and [o[0] for o in outs] == ["1", "1", "1"]
    assert _calls(tmp_path) == 1 and sorted(o[1] for o in outs) == ["0", "1", "1"]


def test_harness_helpers_build_like_a_candidate(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    so = B.build_helpers(tmp_path / "cache", fake_cfg)
    assert so.read_bytes() == b"ELF-fake " + (B.RUNTIME_DIR / "harness_helpers.cu").read_bytes()
    assert B.build_helpers(tmp_path / "cache", fake_cfg) == so and _calls(tmp_path) == 1  # cached


def test_one_changed_byte_or_backend_misses(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    base = B.build(CODE, "nccl", fake_cfg, cache)
    edited = B.build(CODE.replace("return 0", "return 1"), "nccl", fake_cfg, cache)
    other_backend = B.build(CODE, "symm", fake_cfg, cache)
    assert not edited.cached and not other_backend.cached
    assert len({base.key, edited.key, other_backend.key}) == 3
    assert _calls(tmp_path) == 3
    assert len(list(cache.glob("*.so"))) == 3


def test_runtime_header_change_invalidates(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    before = B.cache_key(CODE, "nccl", fake_cfg)
    (fake_cfg.runtime_dir / "cuco_abi.h").write_text("/* abi, edited */\n")
    assert B.cache_key(CODE, "nccl", fake_cfg) != before


def test_symm_nccl_header_change_invalidates(fake_cfg: B.BuildConfig) -> None:
    compat = fake_cfg.runtime_dir / "symm_nccl"
    compat.mkdir()
    (compat / "nccl.h").write_text("/* compat */\n")
    before = B.cache_key(CODE, "symm", fake_cfg)
    (compat / "nccl.h").write_text("/* compat, edited */\n")
    assert B.cache_key(CODE, "symm", fake_cfg) != before


def test_nccl_header_version_is_part_of_the_key(fake_cfg: B.BuildConfig) -> None:
    before = B.cache_key(CODE, "nccl", fake_cfg)
    assert fake_cfg.nccl_include is not None
    (fake_cfg.nccl_include / "nccl.h").write_text("#define NCCL_VERSION_CODE 22900\n")
    assert B.cache_key(CODE, "nccl", fake_cfg) != before


def test_compile_error_gives_log_and_no_library(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    res = B.build("#error broken\n" + CODE, "nccl", fake_cfg, cache)
    assert not res.ok and res.so_path is None and not res.cached
    assert "forced failure for the test" in res.log
    assert list(cache.glob("*.so")) == []
    assert [p.name for p in cache.iterdir() if p.name.startswith(".build-")] == []  # work dir cleaned up
    again = B.build("#error broken\n" + CODE, "nccl", fake_cfg, cache)
    assert not again.ok and _calls(tmp_path) == 2  # failures are not cached


def test_timeout_kills_the_compiler(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    fake_cfg.timeout_s = 1.0
    res = B.build("// SLEEP_FOREVER\n" + CODE, "nccl", fake_cfg, tmp_path / "cache")
    assert not res.ok and "timed out" in res.log
    assert res.seconds < 30


def test_nvcc_command_per_backend(fake_cfg: B.BuildConfig) -> None:
    nccl = B.nvcc_command("a.cu", "a.so", "nccl", fake_cfg)
    symm = B.nvcc_command("a.cu", "a.so", "symm", fake_cfg)
    for cmd in (nccl, symm):
        assert cmd[0] == fake_cfg.nvcc
        assert "-gencode=arch=compute_90a,code=sm_90a" in cmd
        for flag in ("-O3", "-std=c++17", "-shared", "-fPIC", "-lineinfo"):
            assert flag in cmd
        assert f"-I{fake_cfg.runtime_dir}" in cmd
        assert cmd[cmd.index("-o") + 1] == "a.so"
    assert "-DCUCO_BUILD_SYMM=1" in symm and "-DCUCO_BUILD_SYMM=1" not in nccl
    assert "-l:libnccl.so.2" in nccl and f"-rpath={fake_cfg.nccl_lib}" in nccl
    assert not any("nccl.so" in a for a in symm)
    # under symm, <nccl.h> is the compat header: its folder comes before every other include dir (the wheel's)
    compat = f"-I{fake_cfg.runtime_dir / 'symm_nccl'}"
    includes = [a for a in symm if a.startswith("-I")]
    assert includes[0] == compat and f"-I{fake_cfg.nccl_include}" in includes and compat not in nccl
    with pytest.raises(BadInput, match="unknown backend"):
        B.nvcc_command("a.cu", "a.so", "mpi", fake_cfg)


def test_cublas_links_by_soname_with_rpath_when_the_wheel_has_it(fake_cfg: B.BuildConfig, tmp_path: Path) -> None:
    assert "-lcublas" in B.nvcc_command("a.cu", "a.so", "symm", fake_cfg)  # no wheel: the toolkit's
    lib = tmp_path / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcublas.so.13").write_bytes(b"")
    fake_cfg.cublas_lib = lib
    cmd = B.nvcc_command("a.cu", "a.so", "symm", fake_cfg)
    assert "-l:libcublas.so.13" in cmd and f"-rpath={lib}" in cmd and "-lcublas" not in cmd


def test_default_config_finds_the_installed_wheels() -> None:
    cfg = B.BuildConfig()
    if cfg.nccl_include is None:
        pytest.skip("nvidia-nccl wheel not installed")
    assert (cfg.nccl_include / "nccl.h").exists()
    assert (cfg.runtime_dir / "cuco_abi.h").exists()


def test_header_version_parsing(tmp_path: Path) -> None:
    (tmp_path / "nccl.h").write_text("#define NCCL_PATCH 9\n#define NCCL_VERSION_CODE 22809\n")
    assert B.nccl_header_version(tmp_path) == 22809
    assert B.nccl_version_string(22809) == "2.28.9"
    assert B.nccl_version_string(22900) == "2.29.0"
    assert B.nccl_version_string(2704) == "2.7.4"
    (tmp_path / "nccl.h").write_text("/* no version here */\n")
    with pytest.raises(CucoError, match="NCCL_VERSION_CODE"):
        B.nccl_header_version(tmp_path)
    with pytest.raises(CucoError, match="cannot read"):
        B.nccl_header_version(tmp_path / "missing")


def test_installed_headers_are_2_28_9() -> None:
    inc = B._wheel_subdir("nccl", "include")
    if inc is None:
        pytest.skip("nvidia-nccl wheel not installed")
    assert B.nccl_header_version(inc) == 22809


def test_version_mismatch_is_refused() -> None:
    B.check_nccl_version(22809, 22809)
    with pytest.raises(CucoError) as e:
        B.check_nccl_version(22809, 22903)
    assert "2.28.9" in str(e.value) and "2.29.3" in str(e.value)


def test_supported_backends() -> None:
    assert B.supported_backends('#include "cuco_lsa.h"\n') == ("nccl", "symm")
    assert B.supported_backends('#include "cuco_abi.h"\n') == ("nccl", "symm")
    assert B.supported_backends("#include <nccl.h>\n") == ("nccl", "symm")  # symm: runtime/symm_nccl/nccl.h
    assert B.supported_backends("// cuco: backends=nccl\n#include <nccl.h>\n") == ("nccl",)
    assert B.supported_backends("// cuco: backends=symm\n#include <nccl.h>\n") == ("symm",)
    assert B.supported_backends("// cuco: backends=nccl, symm\n") == ("nccl", "symm")
    with pytest.raises(BadInput, match="backends"):
        B.supported_backends("// cuco: backends=mpi\n")


def test_build_file_missing_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="cannot read candidate"):
        B.build_file(tmp_path / "nope.cu", "nccl")
