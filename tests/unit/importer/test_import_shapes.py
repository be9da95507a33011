"""cuco init on the shapes host programs actually take (tests/data/own_programs/, one program per shape, written
for these tests): the plan of each (where the step is, the buffers' roles through every call, the sizes and their
defaults, what the step leaves out, the notes and TODOs), the deterministic seed's structure, the tolerance of
the seed as oracle, and what `cuco check-workload` leaves to do (the reference and the tolerance only; the
compile tier builds the seeds)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from cuco_kit.importer.check import check_workload, reference_worlds
from cuco_kit.importer.derive import make_plan
from cuco_kit.importer.plan import ImportPlan, check_plan
from cuco_kit.importer.seed_writer import write_seed
from cuco_kit.importer.session import ImportSession
from cuco_kit.importer.workload_writer import seed_tolerance
from cuco_kit.workload import load_workload

PROGRAMS = Path(__file__).resolve().parents[2] / "data" / "own_programs"
SHAPES = sorted(p.name for p in PROGRAMS.glob("*.cu"))


def read(name: str) -> str:
    return (PROGRAMS / name).read_text()


def line(name: str, text: str) -> int:
    """The (only) line of program `name` that holds `text`."""
    found = [i for i, ln in enumerate(read(name).splitlines(), 1) if text in ln]
    assert len(found) == 1, (text, found)
    return found[0]


def plan_of(name: str) -> ImportPlan:
    return make_plan(read(name), name)


def roles(plan: ImportPlan) -> dict[str, str]:
    return {b.name: b.role for b in plan.buffers}


def test_every_shape_has_a_consistent_plan_with_nothing_left_to_decide():
    assert len(SHAPES) == 8
    for name in SHAPES:
        plan = plan_of(name)
        assert check_plan(plan, read(name)) == [], name


def test_the_step_in_helpers_called_from_mains_loop():
    # forward() -> mlp_partial() (two kernels) and reduce_output() (the all-reduce, in place): depth 2
    name = "tp_mlp_helpers.cu"
    plan = plan_of(name)
    assert (plan.step_function, plan.step_kind, plan.step_start) == ("main", "loop", line(name, "for (int it = 0"))
    assert roles(plan) == {"x": "input", "w1": "input", "w2": "input", "h": "scratch", "y": "scratch",
                           "out": "output"}  # y: written by matmul() inside mlp_partial, reduced, then read
    assert plan.sizes == {"kTokens": 256, "kHidden": 1024, "kFfn": 4096} and plan.fixed_sizes == []
    assert plan.multiple_of == {"kFfn": 4}  # kFfn / world: the small preset keeps it divisible by 2 and 4
    assert plan.small_sizes() == {"kTokens": 32, "kHidden": 128, "kFfn": 512}
    assert plan.buffers[1].count == "(size_t)kHidden * (kFfn / world)"  # ffn_local = kFfn / world, in sizes
    assert plan.locals == ["ffn_local"] and plan.left_out == []  # the timing is around the loop, not in it
    assert any("fill_from_host()" in n for n in plan.notes)
    seed = write_seed(plan, read(name))
    assert "forward(x, w1, w2, h, y, out, ffn_local, comm, stream);" in seed  # the call is the step
    assert "static void mlp_partial(" in seed and "static void reduce_output(" in seed
    assert "static void fill_from_host(" not in seed and "fill_from_host() is left out" in seed
    # the helpers read the sizes: they are file-scope variables cuco_setup sets, not compiled-in constants
    assert "static int kTokens = 256;" in seed and 'kTokens = (int)cuco_param(ctx, "kTokens");' in seed
    # an error check in a void helper cannot return a code: it records it, and cuco_step returns it
    assert "cuco_recorded_error = CUCO_ERR_NCCL" in seed and "return cuco_recorded_error;" in seed


def test_no_loop_one_allreduce_between_creation_and_synchronisation():
    name = "single_allreduce.cu"
    plan = plan_of(name)
    at = line(name, "ncclAllReduce(")
    assert (plan.step_kind, plan.step_start, plan.step_end) == ("statements", at, at)
    assert roles(plan) == {"send_buf": "input", "recv_buf": "output"}
    assert plan.sizes == {"count": 4 * 1024 * 1024}  # main()'s own local, written as an expression
    assert (plan.comm, plan.rank, plan.world, plan.main_stream) == ("comm", "my_rank", "n_ranks", "s")
    assert plan.summed_terms == {"collective": 8, "kernel": 1}
    seed = write_seed(plan, read(name))
    assert 'size_t count = (size_t)cuco_param(ctx, "count");' in seed
    assert "host_hash() is left out" in seed and "node_local_rank() is left out" in seed
    assert "MPI_" not in seed.replace("MPI_CHECK", "") and "gethostname" not in seed
    # the seed is its own oracle: a few f32 rounding units per term of the all-reduce over up to 8 ranks
    rel, how = seed_tolerance(plan)
    assert rel == pytest.approx(4 * 2.0**-23 * (math.sqrt(8) + 1), rel=1e-2) and "sqrt(8) ranks" in how


def test_the_timed_loop_is_the_step_and_the_warm_up_is_left_out():
    name = "sharded_sgd_timed.cu"
    plan = plan_of(name)
    assert (plan.step_kind, plan.step_start) == ("loop", line(name, "for (int i = 0; i < iters; ++i)"))
    assert any(f"lines {line(name, 'i < warmup')}-" in n and "the same work" in n for n in plan.notes)
    assert [(x.line, x.why.split(" ")[0]) for x in plan.left_out] == [
        (line(name, "const double t0"), "timing"), (line(name, "    CUDA_OK(cudaStreamSynchronize(stream));"), "host"),
        (line(name, "step_ms[i] ="), "timing")]
    # the size comes from argv with the program's default; iterations and warm-up only bound loops
    assert plan.sizes == {"n_params": 1 << 24} and plan.multiple_of == {"n_params": 4}
    assert any("reads it from the command line" in n for n in plan.notes)
    assert roles(plan) == {"grads": "input", "grad_shard": "scratch", "param_shard": "inout", "params": "output"}
    assert plan.buffers[1].count == "(n_params / world)" and plan.locals == ["shard", "lr"]
    seed = write_seed(plan, read(name))
    step = seed[seed.index("int cuco_step"):seed.index("int cuco_teardown")]
    assert "MPI_Wtime" not in step and "cudaStreamSynchronize" not in step and "step_ms" not in step
    assert "train_step(grads, grad_shard, param_shard, params, shard, lr, world, comm, stream);" in step


def test_one_process_driving_every_device_runs_its_rank_only():
    name = "single_process_devices.cu"
    plan = plan_of(name)
    assert (plan.devices, plan.comm, plan.rank, plan.world, plan.main_stream) == ("ndev", "comms", "", "ndev",
                                                                                   "streams")
    assert roles(plan) == {"shard": "input", "scores": "scratch", "probs": "output"}
    assert [x.why.split(" ")[0] for x in plan.left_out] == ["device"]  # cudaSetDevice inside the step
    seed = write_seed(plan, read(name))
    assert "comms[ctx->rank] = (ncclComm_t)ctx->nccl_comm;" in seed and "streams[ctx->rank] = ctx->stream;" in seed
    assert seed.count("for (int d = ctx->rank; d == ctx->rank; ++d)") == 2
    assert "cudaSetDevice" not in seed[seed.index("int cuco_step"):]


def test_sizes_as_expressions_declarations_of_several_names_and_a_step_dependent_kernel():
    name = "heat_halo.cu"
    plan = plan_of(name)
    assert plan.sizes == {"NX": 1 << 20, "kHalo": 128, "threads": 256, "t": 0}
    assert plan.fixed_sizes == ["threads"]  # a launch's block shape
    assert plan.loop_var == "t" and plan.small_sizes()["t"] == 0  # the reference is told the step
    assert (plan.main_stream, plan.side_streams, plan.events) == ("compute", ["halo_stream"],
                                                                  ["cells_ready", "halos_ready"])
    assert roles(plan) == {"u": "inout", "u_next": "scratch"}
    assert plan.locals == ["left", "right", "blocks", "alpha"]
    seed = write_seed(plan, read(name))
    # `const int threads = 256, blocks = (NX + threads - 1) / threads;`: each name after what it reads
    assert seed.index("const int threads = 256;") < seed.index("const int blocks = (NX + threads - 1) / threads;")
    assert seed.index("const int left = (rank + world - 1) % world;") < seed.index("const int right =")
    assert 'int t = (int)cuco_param(ctx, "t");' in seed
    assert "static int cuco_size_NX = 1048576;" in seed and "#define NX (cuco_size_NX)" in seed
    assert "share_unique_id() is left out" in seed and "fopen" not in seed


def test_a_driver_function_called_once_holds_set_up_warm_up_and_a_timed_step():
    name = "expert_layer_driver.cu"
    plan = plan_of(name)
    assert (plan.step_function, plan.call_lines, plan.step_kind) == ("run_layer", [line(name, "run_layer(rank")],
                                                                     "statements")
    # the straight-line step after the timing starts: dispatch, the experts, combine
    assert (plan.step_start, plan.step_end) == (line(name, "CK(cudaEventRecord(t_begin") + 2,
                                                line(name, "CK(cudaEventRecord(t_end") - 2)
    assert [x.why for x in plan.left_out] == ["timing", "timing"]
    assert any("part of the step's work, e.g. a warm-up" in n for n in plan.notes)
    assert roles(plan) == {"tokens": "input", "routed": "scratch", "weights": "input", "expert_out": "scratch",
                           "combined": "output"}
    assert plan.worlds == [1, 2, 3, 4]  # main() refuses more than 4 ranks
    assert plan.fixed_sizes == ["TILE"] and plan.multiple_of == {"HIDDEN": 16}  # HIDDEN / TILE
    small = plan.small_sizes()
    # one factor for every free size: rows that are real never outgrow the padded rows per peer
    assert small["tokens_per_peer"] == 64 and max(small[f"real_rows_{i}"] for i in range(4)) == 64
    assert small["HIDDEN"] % 16 == 0 and small["TILE"] == 16
    seed = write_seed(plan, read(name))
    assert "{  // run_layer(), called at line" in seed
    assert 'int real_rows[4] = {(int)cuco_param(ctx, "real_rows_0"),' in seed
    assert "if (!(ctx->world_size == 1 || ctx->world_size == 2 || ctx->world_size == 3 || ctx->world_size == 4))" \
        in seed


def test_a_step_function_handed_to_a_launcher_in_another_file():
    # main() only names damp_and_reduce(); the program's own header (error macros, the launcher's declaration)
    # is inlined; the work is on the default stream; a while loop counts the iterations and the kernel reads it
    name = "framework_callback.cu"
    plan = plan_of(name)
    assert (plan.step_function, plan.call_lines, plan.step_kind) == ("damp_and_reduce", [], "loop")
    assert (plan.comm, plan.rank, plan.world, plan.main_stream) == ("comm", "rank", "nranks", "0")
    assert roles(plan) == {"field": "inout"} and plan.buffers[0].ctype == "float"  # using scalar_t = float
    assert plan.loop_var == "iteration" and plan.sizes == {"n": 256 * 1024, "iteration": 0}
    s = ImportSession(PROGRAMS / name, Path("unused"))
    seed = s.skeleton
    assert "// cuco init: the program's header framework_callback_common.h, inlined" in seed
    assert "#define CHECK_NCCL(cmd) do { if ((int)(cmd) != 0) return CUCO_ERR_NCCL; }" in seed
    assert "damp<<<(n + 255) / 256, 256, 0, ctx->stream>>>(field, n, iteration);" in seed
    assert "ncclAllReduce(field, field, n, ncclFloat, ncclSum, comm, ctx->stream)" in seed
    assert 'int iteration = (int)cuco_param(ctx, "iteration");' in seed and seed.count("int iteration =") == 1
    assert "main() is left out" in seed


def test_several_devices_per_process_become_one_per_rank():
    name = "devices_per_process.cu"
    plan = plan_of(name)
    assert (plan.devices, plan.comm, plan.world) == ("ndev", "comms", "nranks * ndev")
    assert roles(plan) == {"grads": "input", "grad_shard": "scratch", "velocity": "inout", "weights": "inout"}
    assert plan.buffers[0].count == "kShard * world * 1"  # the harness's world: one device per rank
    seed = write_seed(plan, read(name))
    assert "const int ndev = 1;  // cuco init: one device per rank under the harness" in seed
    assert seed.count("for (int d = ctx->rank; d == ctx->rank; ++d)") == 2
    step = seed[seed.index("int cuco_step"):]
    assert "ncclCommInitRank" not in step and "cudaSetDevice" not in step


def test_a_left_out_statement_the_person_keeps_stays_in_the_seed():
    name = "expert_layer_driver.cu"
    plan = plan_of(name)
    kept = plan.left_out.pop(0)
    assert "cudaEventRecord(t_dispatched" in kept.code
    seed = write_seed(plan, read(name))
    assert "cudaEventRecord(t_dispatched" in seed and "cudaEventRecord(t_computed" not in seed


def test_two_loops_doing_different_work_are_a_todo(tmp_path):
    code = read("single_allreduce.cu").replace(
        "  // the all-reduce has finished once the stream has\n",
        "  for (int k = 0; k < 3; ++k) NCCL_CHECK(ncclBroadcast(recv_buf, recv_buf, count, ncclFloat, 0, comm, s));\n")
    plan = make_plan(code, "two_parts.cu")
    assert len(plan.todo) == 1 and "which part of main() is the step" in plan.todo[0]
    assert check_plan(plan, code)[0].startswith("TODO: which part of main() is the step")


@pytest.mark.parametrize("name", SHAPES)
def test_check_workload_leaves_only_the_reference_and_the_tolerance(tmp_path, name):
    d = tmp_path / "wl"
    ImportSession(PROGRAMS / name, d).write()
    report = check_workload(d, compile_seed=False)
    assert [f.what for f in report.problems()] == ["reference", "tolerance"], report.text()
    wl = load_workload(d)
    assert wl.oracle == "seed" and wl.seeds == {"nccl": "seed_nccl.cu", "symm": "seed_nccl.cu"}
    assert (d / "seed_nccl.cu").read_text().startswith("// cuco: backends=nccl,symm\n")
    assert "if (ctx->nccl_comm == NULL) return CUCO_ERR_BACKEND;" in (d / "seed_nccl.cu").read_text()
    plan = json.loads((d / "cuco_plan.json").read_text())
    assert plan["version"] == 2 and wl.tolerance.rel > 0  # float outputs: never exact


def test_an_approved_reference_makes_the_reference_the_oracle(tmp_path):
    d = tmp_path / "wl"
    s = ImportSession(PROGRAMS / "single_allreduce.cu", d)
    s.write()
    s.accept_reference("def reference(inputs, params, world):\n"
                       "    total = sum(i['send_buf'].double() for i in inputs)\n"
                       "    return [{'recv_buf': total.float()} for _ in range(world)]\n\n\n"
                       "TOLERANCE = Tolerance(rel=1e-6)  # f32 sums of up to 8 ranks\n")
    assert load_workload(d).oracle == "reference"
    report = check_workload(d, compile_seed=False)
    assert report.ok, report.text()
    assert "reference on 2 rank(s): runs on the CPU" in report.text()


def test_a_reference_is_tried_on_the_world_sizes_the_program_runs_on() -> None:
    assert reference_worlds(None) == [1, 2]
    assert reference_worlds(NS(worlds=[])) == [1, 2]
    assert reference_worlds(NS(worlds=[2])) == [2]  # e.g. a program that routes to one expert a rank
    assert reference_worlds(NS(worlds=[4, 8])) == [4]
