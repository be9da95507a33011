"""The deterministic port: a host-driven program + its import plan -> a seed in the candidate ABI.

Everything outside ``main()`` (kernels, helpers, macros) is kept as written, minus the MPI include. ``main()``
is split along the plan: its per-step loop body becomes ``cuco_step``, verbatim, after a prologue that binds the
program's own names to what the harness owns (the communicator, rank and world size, the tensors, the harness
stream, the sizes as parameters); scratch buffers, side streams and events become the seed's state, made in
``cuco_setup`` and released in ``cuco_teardown``. Work on a side stream is forked from and joined back to the
harness stream, as the ABI requires. The result is also the skeleton an LLM port starts from (`port.py`).
"""
from __future__ import annotations

import re

from cuco_kit.cuda_parse import Node, node_text, parse, walk
from cuco_kit.importer.plan import ImportPlan, file_constants, find_step_loop, loop_body
from cuco_kit.importer.size_expr import WORLD

TODO = "TODO(cuco init)"
_MPI_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]mpi\.h[>\"][^\n]*\n", re.MULTILINE)
# A function-like macro, its continuation lines included.
_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", re.MULTILINE)
# What an error-check macro of a stand-alone program does that a candidate may not (L0's host-call allow-list).
_PROCESS_CALLS = re.compile(r"\b(exit|abort|_exit|MPI_Abort|fprintf|printf|puts|perror)\s*\(")


def error_macros_returning(text: str) -> str:
    """Error-check macros that print and exit() (fine in a program, refused in a candidate) rewritten to return
    the ABI's error code from the entry point instead."""
    def sub(m: re.Match[str]) -> str:
        name, params, body = m.group(1), m.group(2), m.group(3)
        arg = params.split(",")[0].strip()
        if not arg or not _PROCESS_CALLS.search(body):
            return m.group(0)
        code = "CUCO_ERR_NCCL" if "nccl" in (name + body).lower() else "CUCO_ERR_CUDA"
        return (f"#define {name}({params}) do {{ if ((int)({arg}) != 0) return {code}; }} while (0)  "
                "// cuco init: returns an error code (the program ended the process)")

    return _MACRO.sub(sub, text)


def _c_count(plan: ImportPlan, count: str) -> str:
    return re.sub(rf"\b{WORLD}\b", "ctx->world_size", count)


def _identifier(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z_]\w*", text) is not None


def _main_node(root: Node) -> Node:
    for n in walk(root):
        if n.type == "function_definition" and re.search(r"\bmain\s*\(", node_text(n).split("{", 1)[0]):
            return n
    raise AssertionError("make_plan accepted a program without main()")


def _local_declaration(main: Node, name: str) -> str:
    """`name`'s declaration in main() as one statement declaring `name` only (``float a = 1, b;`` -> ``float
    a = 1;``)."""
    for n in walk(main):
        if n.type != "declaration":
            continue
        for d in n.children_by_field_name("declarator"):
            inner: Node | None = d
            while inner is not None and inner.type != "identifier":
                inner = inner.child_by_field_name("declarator")
            if inner is not None and node_text(inner) == name:
                # the qualifiers and type only: everything up to the first declarator
                first = n.children_by_field_name("declarator")[0]
                head = node_text(n)[:first.start_byte - n.start_byte]
                return f"{head.strip()} {node_text(d)};"
    raise AssertionError(f"plan local {name!r} has no declaration in main()")


def _create_call(code_main: Node, call_names: tuple[str, ...], handle: str) -> str | None:
    """The text of the call in main() that creates `handle` (``cudaStreamCreate(&s)``), first argument
    rewritten to the state member (``&st->s``)."""
    for n in walk(code_main):
        if n.type != "call_expression":
            continue
        fn = n.child_by_field_name("function")
        args = n.child_by_field_name("arguments")
        if fn is None or args is None or node_text(fn) not in call_names:
            continue
        named = [a for a in args.children if a.is_named]
        if named and node_text(named[0]).replace(" ", "") == f"&{handle}":
            rest = ", ".join(node_text(a) for a in named[1:])
            return f"{node_text(fn)}(&st->{handle}{', ' + rest if rest else ''})"
    return None


def write_seed(plan: ImportPlan, code: str) -> str:
    """The seed's source text (candidate ABI, `nccl` backend: it keeps the host NCCL calls)."""
    tree = parse(code)
    main = _main_node(tree.root_node)
    loop = find_step_loop(code, plan)
    body = loop_body(loop)
    constants = file_constants(tree.root_node, code)
    before = error_macros_returning(_MPI_INCLUDE.sub("", code[:main.start_byte])).rstrip() + "\n"
    after = code[main.end_byte:].strip()
    tensors, scratch = plan.tensors(), plan.scratch()
    runtime_sizes = [k for k in plan.sizes if k not in plan.fixed_sizes and not constants.get(k, (0, "", True))[2]]
    todo = [f" * {TODO}: {n}" for n in plan.notes]
    if not _identifier(plan.main_stream):
        todo.append(f" * {TODO}: the step runs on stream {plan.main_stream!r}; make it use ctx->stream")

    def size_lines(indent: str) -> list[str]:
        out = []
        for k in runtime_sizes:
            ctype = constants[k][1] if k in constants else "int64_t"
            out.append(f'{indent}const {ctype} {k} = ({ctype})cuco_param(ctx, "{k}");')
        return out

    def harness_lines(indent: str) -> list[str]:
        out = []
        if _identifier(plan.rank):
            out.append(f"{indent}const int {plan.rank} = ctx->rank;")
        if _identifier(plan.world):
            out.append(f"{indent}const int {plan.world} = ctx->world_size;")
        out.append(f"{indent}ncclComm_t {plan.comm} = (ncclComm_t)ctx->nccl_comm;")
        return out

    # The seed's state: (C type, member, how teardown releases it).
    members = [(f"{b.ctype}*", b.name, "cudaFree") for b in scratch]
    members += [("cudaStream_t", s, "cudaStreamDestroy") for s in plan.side_streams]
    members += [("cudaEvent_t", e, "cudaEventDestroy") for e in plan.events]
    if plan.side_streams:
        members += [("cudaEvent_t", n, "cudaEventDestroy")
                    for n in ["cuco_fork", *(f"cuco_join_{s}" for s in plan.side_streams)]]
    state = ["struct CucoState {", *(f"  {t} {n} = nullptr;" for t, n, _ in members), "};"]

    setup = ["CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {", "  CUCO_CHECK_ABI(ctx);",
             "  if (ctx->backend != CUCO_BACKEND_NCCL || ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;"]
    for k in plan.fixed_sizes:
        setup.append(f'  if (cuco_param(ctx, "{k}") != (int64_t)({k})) return CUCO_ERR_PARAM;  '
                     f"// compiled in: {k} = {plan.sizes[k]}")
    setup += size_lines("  ")
    for b in tensors:
        setup.append(f'  const cuco_tensor_t* t_{b.name} = cuco_tensor(ctx, "{b.name}");')
        setup.append(f"  if (t_{b.name} == NULL || t_{b.name}->capacity_bytes < (size_t)({_c_count(plan, b.count)}) "
                     f"* sizeof({b.ctype})) return CUCO_ERR_PARAM;")
    setup += ["  CucoState* st = new CucoState();", "  ctx->user = st;"]
    for b in scratch:
        setup.append(f"  CUCO_CUDA_TRY(cudaMalloc(&st->{b.name}, (size_t)({_c_count(plan, b.count)}) "
                     f"* sizeof({b.ctype})));")
    for s in plan.side_streams:
        call = _create_call(main, ("cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority"),
                            s) or f"cudaStreamCreateWithFlags(&st->{s}, cudaStreamNonBlocking)"
        setup.append(f"  CUCO_CUDA_TRY({call});")
    for e in plan.events:
        call = _create_call(main, ("cudaEventCreate", "cudaEventCreateWithFlags"), e) or \
            f"cudaEventCreateWithFlags(&st->{e}, cudaEventDisableTiming)"
        setup.append(f"  CUCO_CUDA_TRY({call});")
    if plan.side_streams:
        setup.append("  CUCO_CUDA_TRY(cudaEventCreateWithFlags(&st->cuco_fork, cudaEventDisableTiming));")
        setup += [f"  CUCO_CUDA_TRY(cudaEventCreateWithFlags(&st->cuco_join_{s}, cudaEventDisableTiming));"
                  for s in plan.side_streams]
    setup += ["  return CUCO_OK;", "}"]

    step = ["CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {", "  CucoState* st = (CucoState*)ctx->user;"]
    step += harness_lines("  ") + size_lines("  ")
    step += [f'  {b.ctype}* {b.name} = ({b.ctype}*)cuco_tensor(ctx, "{b.name}")->local;' for b in tensors]
    step += [f"  {b.ctype}* {b.name} = st->{b.name};" for b in scratch]
    if _identifier(plan.main_stream):
        step.append(f"  cudaStream_t {plan.main_stream} = ctx->stream;")
    step += [f"  cudaStream_t {s} = st->{s};" for s in plan.side_streams]
    step += [f"  cudaEvent_t {e} = st->{e};" for e in plan.events]
    if plan.loop_var:
        step.append(f"  const int {plan.loop_var} = (int)(ctx->epoch - 1);  // the original loop's counter")
    step += [f"  {_local_declaration(main, n)}" for n in plan.locals]
    if plan.side_streams:
        step.append("  // side streams start after the harness stream's work and join it before returning (ABI)")
        step.append("  CUCO_CUDA_TRY(cudaEventRecord(st->cuco_fork, ctx->stream));")
        step += [f"  CUCO_CUDA_TRY(cudaStreamWaitEvent({s}, st->cuco_fork, 0));" for s in plan.side_streams]
    step.append(f"  // the per-step work: {plan.program} lines {plan.step_start}-{plan.step_end}, as written")
    body_text = node_text(body)
    indent = " " * body.start_point[1]
    step.append("  " + body_text.replace("\n" + indent, "\n  "))
    for s in plan.side_streams:
        step.append(f"  CUCO_CUDA_TRY(cudaEventRecord(st->cuco_join_{s}, {s}));")
        step.append(f"  CUCO_CUDA_TRY(cudaStreamWaitEvent(ctx->stream, st->cuco_join_{s}, 0));")
    step += ["  return CUCO_OK;", "}"]

    teardown = ["CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) {", "  CucoState* st = (CucoState*)ctx->user;",
                "  if (st == NULL) return CUCO_OK;"]
    teardown += [f"  {release}(st->{n});" for _, n, release in members]
    teardown += ["  delete st;", "  ctx->user = NULL;", "  return CUCO_OK;", "}"]

    head = ["// cuco: backends=nccl", "/*",
            f" * {plan.name}: the seed in the candidate ABI, ported by `cuco init` from {plan.program} with the",
            " * deterministic plan (cuco_plan.json). main()'s per-step loop body became cuco_step, verbatim; the",
            " * harness owns the communicator, the tensors, the stream, timing and verification.", *todo, " */",
            '#include "cuco_abi.h"']
    parts = ["\n".join(head), before.rstrip(), "\n".join(state), "\n".join(setup), "\n".join(step),
             "\n".join(teardown)]
    if after:
        parts.append(after)
    return "\n\n".join(parts) + "\n"
