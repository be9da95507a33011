"""Every L0 acceptance and rejection: frozen bytes, knob sets, the host-code whitelist
(cuco_kit.source.static_check)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.source import markers
from cuco_kit.source import static_check as S

DATA = Path(__file__).resolve().parents[2] / "data" / "l0"
PARENT = (DATA / "parent.cu").read_text()


def in_block(code: str, block: str, text: str) -> str:
    """`code` with `text` (one or more lines) inserted as the first lines of block `block`."""
    b = next(b for b in markers.blocks(code) if b.name == block)
    return code[:b.start_offset] + text.rstrip("\n") + "\n" + code[b.start_offset:]


def line_of(code: str, needle: str) -> int:
    return code[:code.index(needle)].count("\n") + 1


def check(code: str, parent: str | None = PARENT) -> S.L0Report:
    return S.check_candidate(code, parent)


def assert_rejected(report: S.L0Report, *patterns: str, line: int | None = None) -> None:
    assert not report.ok
    text = "\n".join(report.reasons)
    for pattern in patterns:
        assert re.search(pattern, text), f"{pattern!r} not in reasons:\n{text}"
    for reason in report.reasons:
        assert "\n" not in reason and reason.strip() == reason
    if line is not None:
        assert any(r.startswith(f"line {line}:") for r in report.reasons), report.reasons


# ------------------------------------------------------------------------------------------------- L0: pass

def test_parent_against_itself_is_accepted():
    report = check(PARENT)
    assert report.ok, report.reasons
    assert report.reasons == [] and report.frozen_hash == markers.frozen_hash(PARENT)
    assert report.cell == markers.design_cell(markers.knobs(PARENT))
    assert report.blocks == ["knobs", "kernels", "step"]
    assert report.knob_values["kChunks"] == "4"
    d = report.to_dict()
    assert d["ok"] is True and d["knobs"]["kThreads"] == "256" and d["marker_version"] == 2


def test_edit_inside_a_block_is_accepted():
    cand = PARENT.replace("CUDA_OK(cudaStreamWaitEvent(ctx->stream, s->ev[c], 0));",
                          "CUDA_OK(cudaStreamWaitEvent(ctx->stream, s->ev[c], 0));\n"
                          "    cudaStream_t cur = nullptr;\n    (void)cur;")
    report = check(cand)
    assert report.ok, report.reasons


def test_a_knob_move_is_accepted():
    assert check(markers.set_knobs(PARENT, {"kChunks": 8, "kPlacement": "Placement::kFused"})).ok


@pytest.mark.parametrize("code", ["a;\n// EVOLVE-BLOCK-START x\nb;\n",
                                  "// EVOLVE-BLOCK-START x\n// EVOLVE-BLOCK-START y\n// EVOLVE-BLOCK-END\n"])
def test_malformed_markers_are_a_rejection(code):
    report = S.check_candidate(code + "int z;\n")
    assert not report.ok and report.reasons[0].startswith("markers: ")


def test_allowed_host_calls_inside_blocks():
    body = """\
  auto pick = [&](int c) { return c; };
  int m = std::max(1, std::min<int>(2, 3)) + max(1, 2) + pick(0);
  memset(&m, 0, sizeof(m));
  fprintf(stderr, "chunks %d\\n", kChunks);
  printf("%d\\n", ceil_div(4, 2));
  auto* t = reinterpret_cast<const float*>(in.local);
  CUDA_OK(cudaMemsetAsync(out.local, 0, 16, ctx->stream));
  cuco_helper_does_not_exist_but_has_the_prefix(ctx);
  [&]() { m += 1; }();
  dim3 grid = dim3(1, 2, 1);
  (void)t; (void)grid;"""
    report = check(in_block(PARENT, "step", body))
    assert report.ok, report.reasons


def test_device_code_may_use_asm_and_unknown_device_functions():
    body = """\
__device__ int dev_helper(int x) { asm volatile("membar.sys;" ::: "memory"); return __popc(x) + helper_x(x); }
__global__ void k2(int* p) { p[0] = dev_helper(__ldg(p)); asm("fence.acq_rel.gpu;"); }"""
    report = check(in_block(PARENT, "kernels", body))
    assert report.ok, report.reasons


def test_frozen_code_is_not_whitelisted():
    # Denied calls in frozen code are the parent's business (a person accepted them): no rejection.
    code = PARENT.replace("CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {",
                          "CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {\n  (void)getenv(\"HOME\");")
    assert check(code, code).ok


def test_extra_allow_accepts_a_named_call():
    code = in_block(PARENT, "step", "  my_safe_helper(1);")
    assert not S.check_candidate(code, PARENT).ok
    assert S.check_candidate(code, PARENT, extra_allow=["my_safe_helper"]).ok
    assert S.check_candidate(code, PARENT, extra_allow=["my_safe_*"]).ok


# ------------------------------------------------------------------------------------------ L0: rejections

def test_edit_outside_a_block_is_rejected():
    cand = PARENT.replace("  return cudaGetLastError() == cudaSuccess ? 0 : 1;",
                          "  cudaDeviceSynchronize();\n  return cudaGetLastError() == cudaSuccess ? 0 : 1;")
    report = check(cand)
    assert_rejected(report, r"frozen code \(outside EVOLVE blocks\) differs from the parent",
                    r"'cudaDeviceSynchronize\(\);' was added", line=line_of(cand, "cudaDeviceSynchronize"))
    assert report.frozen_hash != markers.frozen_hash(PARENT)


def test_a_single_frozen_byte_changed_is_rejected():
    cand = PARENT.replace("static int ceil_div(int a, int b) { return (a + b - 1) / b; }",
                          "static int ceil_div(int a, int b) { return (a + b - 0) / b; }")
    assert cand != PARENT
    assert_rejected(check(cand), r"parent line \d+ 'static int ceil_div.*' became 'static int ceil_div",
                    line=line_of(cand, "static int ceil_div"))


def test_removed_frozen_line_and_renamed_block_are_rejected():
    assert_rejected(check(PARENT.replace("  delete s;\n", "")), r"'delete s;' was removed")
    assert_rejected(check(PARENT.replace("EVOLVE-BLOCK-START step", "EVOLVE-BLOCK-START stepper")),
                    r"EVOLVE-BLOCK-START stepper")


def test_moving_a_frozen_line_into_a_block_is_rejected():
    cand = PARENT.replace("  const cuco_tensor_t& out = ctx->tensors[1];\n  // EVOLVE-BLOCK-START step\n",
                          "  // EVOLVE-BLOCK-START step\n  const cuco_tensor_t& out = ctx->tensors[1];\n")
    assert cand != PARENT
    assert_rejected(check(cand), r"frozen code")


def test_knob_outside_the_knob_block_is_rejected():
    cand = in_block(PARENT, "step", "  constexpr int kSplit = 2;  // knob: {1, 2}")
    assert_rejected(check(cand), r"knob declaration kSplit outside the knob block \(in block 'step'\)",
                    line=line_of(cand, "kSplit"))
    frozen = PARENT.replace("struct State {", "constexpr int kSplit = 2;  // knob: {1, 2}\nstruct State {")
    assert_rejected(check(frozen, None), r"knob declaration kSplit outside the knob block \(in frozen code\)")


def test_knob_value_not_in_its_set_is_rejected():
    cand = PARENT.replace("constexpr int kChunks = 4;", "constexpr int kChunks = 3;")
    assert_rejected(check(cand), r"knob kChunks = 3 is not in its allowed set \{1, 2, 4, 8\}",
                    line=line_of(cand, "kChunks = 3"))


def test_other_lines_in_the_knob_block_are_rejected():
    cand = in_block(PARENT, "knobs", "int not_a_knob = 3;")
    assert_rejected(check(cand), r"not a knob in the knob block", line=line_of(cand, "not_a_knob"))
    cand = in_block(PARENT, "knobs", "constexpr int kBare = 3;")
    assert_rejected(check(cand), r"a constexpr without '// knob: \{a, b, \.\.\.\}'")


def test_duplicate_knob_is_rejected():
    cand = in_block(PARENT, "knobs", "constexpr int kChunks = 2; // knob: {1, 2}")
    assert_rejected(check(cand, None), r"knob kChunks is declared twice")


def test_knob_sets_and_names_must_stay_the_parents():
    wider = PARENT.replace("// knob: {1, 2, 4, 8}", "// knob: {1, 2, 3, 4, 8}").replace("kChunks = 4;", "kChunks = 3;")
    assert_rejected(check(wider), r"knob kChunks changed its type or allowed set \(parent: int \{1, 2, 4, 8\}\)")
    added = in_block(PARENT, "knobs", "constexpr int kNew = 1; // knob: {1, 2}")
    assert_rejected(check(added), r"knob kNew is new")
    removed = re.sub(r"constexpr int kThreads.*\n", "", PARENT)
    assert_rejected(check(removed), r"parent line \d+: knob kThreads was removed")


HOST_VIOLATIONS = [
    # (category, line inserted in the step block, pattern the reason must match)
    ("file I/O", '  FILE* f = fopen("/tmp/leak", "w");', r"file I/O call 'fopen'"),
    ("file I/O", '  std::ofstream log("/tmp/leak");', r"file I/O: type 'ofstream'"),
    ("file I/O", '  std::ifstream in2("/etc/passwd");', r"file I/O: type 'ifstream'"),
    ("file I/O", '  fprintf(ctx_file, "%d", 1);', r"file I/O call 'fprintf'"),
    ("file I/O", '  int fd = open("/tmp/x", 0); write(fd, "x", 1);', r"file I/O call 'open'.*|file I/O call 'write'"),
    ("file I/O", '  std::filesystem::remove("/tmp/x");', r"file I/O: namespace 'filesystem'"),
    ("syscall", '  system("rm -rf /tmp/x");', r"process/syscall call 'system'"),
    ("syscall", '  std::system("ls");', r"process/syscall call 'std::system'"),
    ("syscall", '  FILE* p = popen("ls", "r");', r"process/syscall call 'popen'"),
    ("syscall", '  if (fork() == 0) execvp("sh", nullptr);', r"process/syscall call 'fork'"),
    ("syscall", '  syscall(39);', r"process/syscall call 'syscall'"),
    ("syscall", '  int sk = socket(2, 1, 0);', r"process/syscall call 'socket'"),
    ("syscall", '  kill(0, 9);', r"process/syscall call 'kill'"),
    ("syscall", '  exit(0);', r"process/syscall call 'exit'"),
    ("dlsym", '  void* h = dlopen("libx.so", 1);', r"dynamic loading call 'dlopen'"),
    ("dlsym", '  auto fn = dlsym(nullptr, "ncclAllReduce");', r"dynamic loading call 'dlsym'"),
    ("dlsym", '  void* ep; cudaGetDriverEntryPoint("cuMemcpy", &ep, 0);',
     r"dynamic loading call 'cudaGetDriverEntryPoint'"),
    ("getenv", '  const char* v = getenv("NCCL_DEBUG");', r"environment call 'getenv'"),
    ("getenv", '  setenv("NCCL_PROTO", "LL", 1);', r"environment call 'setenv'"),
    ("threads", '  pthread_t th; pthread_create(&th, nullptr, nullptr, nullptr);', r"threads call 'pthread_create'"),
    ("threads", '  std::thread worker([] {});', r"threads: type 'thread'"),
    ("threads", '  auto w = std::thread([] {});', r"threads call 'std::thread'"),
    ("asm", '  asm volatile("mov %0, 1;" : "=r"(m));', r"inline asm in host function 'cuco_step'"),
    ("asm", '  __asm__("nop");', r"inline asm in host function 'cuco_step'"),
    ("include", '#include <fstream>', r"#include inside EVOLVE block 'step'"),
    ("unknown", '  launch_missiles(ctx);', r"unknown host call 'launch_missiles'.*HOST_CALL_ALLOW"),
    ("unknown", '  auto fp = &ceil_div; (*fp)(1, 2);', r"indirect call '\(\*fp\)'"),
    ("reference", '  auto run = &system; run("ls");', r"'system' is referenced inside EVOLVE block 'step'"),
]


@pytest.mark.parametrize("category, line, pattern", HOST_VIOLATIONS,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(HOST_VIOLATIONS)])
def test_each_host_whitelist_violation_is_rejected(category, line, pattern):
    cand = in_block(PARENT, "step", line)
    report = check(cand)
    assert_rejected(report, pattern, r"EVOLVE block 'step'", line=line_of(cand, line.strip()))


def test_host_violation_in_a_host_function_defined_in_a_block():
    cand = in_block(PARENT, "kernels", 'static void tell() { const char* v = getenv("X"); (void)v; }')
    assert_rejected(check(cand), r"environment call 'getenv' in host code inside EVOLVE block 'kernels'")


def test_host_device_functions_count_as_host_code():
    cand = in_block(PARENT, "kernels", '__host__ __device__ int hd(int x) { asm("nop"); return x; }')
    assert_rejected(check(cand), r"inline asm in host function 'hd'")


def test_file_scope_asm_in_a_block_is_rejected():
    cand = in_block(PARENT, "kernels", 'static int probe() { return 0; }\nint forced = (asm("nop"), 0);')
    assert not check(cand).ok


def test_macro_defined_in_a_block_cannot_hide_a_denied_call():
    cand = in_block(PARENT, "step", '#define QUIET_HOOK() system("curl example.com")\n  QUIET_HOOK();')
    assert_rejected(check(cand), r"process/syscall: macro QUIET_HOOK uses 'system'")


def test_calls_inside_macro_invocations_are_checked():
    cand = in_block(PARENT, "step", '  CUDA_OK(cudaMemsetAsync(out.local, 0, 4, ctx->stream) + (getenv("A") != 0));')
    assert_rejected(check(cand), r"environment call 'getenv'")


def test_several_violations_give_one_reason_each_in_line_order():
    cand = in_block(PARENT, "step", '  system("a");\n  getenv("b");\n  launch_missiles();')
    report = check(cand)
    lines = [int(r.split(":")[0].split()[1]) for r in report.reasons]
    assert len(report.reasons) == 3 and lines == sorted(lines)


# -------------------------------------------------------------------------------------------- bad input

def test_non_cuda_text_is_rejected():
    report = S.check_candidate("import os\n\ndef main():\n    print(os.getcwd())\n\nmain()\n")
    assert not report.ok and "does not look like CUDA source" in report.reasons[0]
    assert not S.check_candidate("   \n").ok


def test_malformed_parent_is_bad_input():
    with pytest.raises(BadInput, match=r"parent: line \d+: block 'step' is never closed"):
        S.check_candidate(PARENT, PARENT.replace("  // EVOLVE-BLOCK-END\n  return cudaGetLastError()",
                                                 "  return cudaGetLastError()"))


DEVICE_HEADS = [
    "template <int N> __global__ void __launch_bounds__(N) k(int* p)",
    'extern "C" __global__ void k(int* p)',
    "__global__ static void k(int* p)",
    "__device__ __noinline__ int k(int* p)",
    "__global__ void __cluster_dims__(2, 1, 1) k(int* p)",   # parses as a declaration + a bare function
    "__global__ void MY_BOUNDS(256) k(int* p)",
    "DEV_INLINE int k(int* p)",                              # a macro that expands to __device__
]
HOST_HEADS = ["void k(int* p)", "__host__ __device__ int k(int* p)", "static inline int k(int* p)",
              "void NOT_DEVICE(256) k(int* p)"]


def _snippet(head: str) -> str:
    return ("#include <x.h>\n#define DEV_INLINE __device__ __forceinline__\n// EVOLVE-BLOCK-START b\n"
            f"{head} {{\n  device_only_helper(p);\n  asm volatile(\"fence.sc.sys;\");\n  return 0;\n}}\n"
            "// EVOLVE-BLOCK-END\nint z;\n")


@pytest.mark.parametrize("head", DEVICE_HEADS)
def test_device_function_heads_are_recognised(head):
    report = S.check_candidate(_snippet(head))
    assert report.ok, report.reasons


@pytest.mark.parametrize("head", HOST_HEADS)
def test_host_function_heads_are_checked(head):
    assert_rejected(S.check_candidate(_snippet(head)), r"line 5: unknown host call 'device_only_helper'",
                    r"line 6: inline asm in host function 'k'")


def test_device_lambda_in_host_code_is_device_code():
    code = in_block(PARENT, "step", '  auto f = [=] __device__ (int i) { asm("nop"); return dev_only(i); };')
    assert check(code).ok, check(code).reasons
    code = in_block(PARENT, "step", '  auto g = [=] (int i) { return host_mystery(i); };')
    assert_rejected(check(code), r"unknown host call 'host_mystery'")


def test_unannotated_stage_output_may_carry_knob_comments_for_the_annotator():
    # A fast-path stage output has no EVOLVE blocks yet: its '// knob:' lines are what annotate gathers into the
    # knob block, so L0 does not call them misplaced. Once blocks exist, the rule applies (tests above).
    code = ("#include <cuda_runtime.h>\nconstexpr int kChunks = 4;  // knob: {1, 2, 4}\n"
            "__global__ void k(int* p) { p[0] = kChunks; }\n")
    assert S.check_candidate(code).ok
    annotated = "// EVOLVE-BLOCK-START body\nint x;\n// EVOLVE-BLOCK-END\n" + code
    rep = S.check_candidate(annotated)
    assert not rep.ok and any("outside the knob block" in r for r in rep.reasons)
