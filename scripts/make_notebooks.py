"""Generates notebooks/*.ipynb from the cell texts below (nbformat v4), so notebook changes are reviewed as
Python diffs. The notebooks are committed WITHOUT outputs; run this after editing a cell here:

    .venv/bin/python scripts/make_notebooks.py          # writes notebooks/*.ipynb
    .venv/bin/python scripts/make_notebooks.py --check  # exits 1 when a committed notebook differs

Rules every notebook keeps: the first cell says what it shows, the last what to do next; logic lives in the
packages (cuco_kit.workbench with its smoke, teaching and report modules, cuco_kit.widgets); nothing
waits for a click; under CUCO_SMOKE=1 it runs headless in CI with tiny budgets and ends with nothing left running.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "notebooks"

# The display name ipykernel installs: any other makes JupyterLab mark every notebook modified on open.
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def md(text: str) -> nbformat.NotebookNode:
    return new_markdown_cell(text.strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
    return new_code_cell(text.strip("\n"))


SETUP = """
from IPython.display import display
from cuco_kit import workbench as wb
from cuco_kit.workbench import report, smoke
from cuco_kit.widgets import banner, short_errors
short_errors()  # the kit's errors show as their one line, not a traceback
"""

# ------------------------------------------------------------------------------------------------------------
QUICKSTART = [
    md("""
# Quickstart: a compute-communication co-design search in five minutes

This notebook **shows** what cuco-kit does on its main sample, tensor-parallel **GEMM + AllGather**
(`Y_r = AllGather(X) @ W_r`): the host-driven seed (`ncclAllGather`, then cuBLAS), what the communication
analysis finds in it, and a search over the device-initiated baseline's design space drawn as a lineage tree, a
latency curve and a design-space map.

Where the numbers come from is always on screen, as a badge on every view:

* **real**: measured now, on this machine's GPU;
* **replayed (GPU, date)**: measured on a GPU earlier and shown from a recording committed under
  `recordings/` (every run read back from its database shows this way);
* **SIMULATED**: a made-up landscape, used only while no recorded run exists yet. It demonstrates the flow and
  says nothing about any kernel;
* **FIXTURE**: a recorded LLM answer standing in for a live model; **MODEL**: a formula, not a measurement.

Run the cells from the top (Shift+Enter). Nothing here needs a GPU.
"""),
    code(SETUP + """
from cuco_kit.source.analysis import analyze_file
from cuco_kit.widgets import AnalysisView, DesignSpaceMap, FailureView, LatencyPlot, LineageTree, RunDashboard
from cuco_kit.workload import load_workload

SAMPLE = wb.main_sample()
workload = load_workload(SAMPLE)
print(workload.name, "-", workload.description)
choice = wb.pick_evaluator()
banner(choice.note)
"""),
    md("""
## 1. The seed and its communication

The seed is a normal host program: an `ncclAllGather` on the harness stream, then the GEMM. The analysis
(tree-sitter over the CUDA source) lists the collectives, launches, kernels and buffers, and draws which call
waits for which buffer. The fast path (notebook `01_fast_path`) rewrites exactly these host collectives into
device-initiated code.
"""),
    code("""
AnalysisView(analyze_file(workload.seed_for("nccl")))
"""),
    md("""
## 2. A search over the design space

The device-initiated baseline has a *knob block*: chunk count, placement (sequential, two-stream, fused),
synchronisation scope and issuer granularity. The search proposes knob moves (offline, with Optuna) and, with
an LLM configured, code diffs; each candidate is checked (L0), built (L1), verified against a torch reference
(L2) and timed against the seed measured in the same run (L3).

The next cell opens the recorded real run if one is committed; otherwise it starts a small SIMULATED search in
the background (the cell returns at once) and the dashboard below follows it live.
"""),
    code("""
store, recorded = wb.open_recorded()
engine = None
if recorded is not None:
    display(banner(f"recorded real run: {recorded.evaluations} evaluations of {recorded.workload} on "
                   f"{recorded.detail} ({recorded.path.name}); nothing runs now", "replayed"))
    run_id = recorded.run_id
else:
    display(banner("No recorded real run exists yet under recordings/. Below is a SIMULATED demo "
                   "search: made-up numbers from a synthetic landscape, not measurements.", "simulated"))
    demo = wb.simulated_evaluator()
    engine, store = wb.new_search(SAMPLE, demo.evaluator, db=wb.run_db("00_quickstart"), gate="auto",
                                  generations=3 if smoke.enabled() else 8, world_size=2, backend="symm")
    wb.start_search(engine)
    run_id = engine.run_id
"""),
    code("""
if engine is not None:
    dashboard = RunDashboard(engine, key="00_quickstart")
    display(dashboard)
else:
    display(LineageTree(store, run_id), LatencyPlot(store, run_id), DesignSpaceMap(store, run_id))
"""),
    md("""
## 3. What won

`cuco_kit.workbench.report` turns the run into pandas tables: one row per evaluation, the best per design-space cell,
and what failed and why. (The demo search runs for a few seconds; the next cell waits for it to finish.)
"""),
    code("""
if engine is not None:
    print(wb.end_search(engine))  # the dashboard stays, its controls off with the reason
frame = report.run_frame(store, run_id)
display(banner(wb.what_won(store, run_id).note))
report.cell_summary(frame, top=8)
"""),
    md("""
### What failed and why
"""),
    code("""
FailureView(frame)
"""),
    md("""
## 4. A run bundle

A bundle is one file with a whole run (its database, where and when each number was measured, kernel
timelines, LLM recordings), made with `cuco bundle RUN.sqlite -o run.cucobundle` wherever the run happened and
opened here with no GPU and no LLM. Set `CUCO_BUNDLE` to its path before starting Jupyter, or type the path and
press Open; its numbers are badged **replayed** with the GPU, driver and date they were measured on.
"""),
    code("""
import os
from cuco_kit.widgets import BundlePanel
BundlePanel(os.environ.get("CUCO_BUNDLE", ""))
"""),
    md("""
## Next

* **`06_your_kernel`: bring your own host-driven CUDA + NCCL program**: import it as a workload, review the
  port and the reference, step through the fast path approving each attempt, and search from its result.
* `01_fast_path`: step through the host-to-device rewrite (analyze, Stage A, Stage B, annotate), deciding on
  each LLM attempt as a side-by-side diff.
* `02_search`: run a live search yourself and approve, edit or reject every proposal before it is evaluated.
* `03_multi_gpu_eval`: evaluate one kernel on 1, 2 or 4 ranks, on both backends, across sizes.
* `04_run_analysis`: dig into a finished run with pandas; `05_teaching`: why chunking and overlap pay off.
* On a machine with NVIDIA GPUs the same notebooks measure for real: the badges then read **real**.
* The run's database stays open for the views above; `store.close(); choice.close()` when you are done.
"""),
]

# ------------------------------------------------------------------------------------------------------------
FAST_PATH = [
    md("""
# The fast path: from host collectives to device-initiated communication

This notebook **shows** the fast path step by step on the GEMM + AllGather seed:

1. **analyze** the host-side communication;
2. **Stage A**: add the device-side infrastructure (devComm, scratch windows) while the host collectives stay;
3. **Stage B**: replace the host collectives with device-initiated NCCL (LSA) code;
4. **annotate**: mark the mutable regions with EVOLVE blocks and the knob block for the search.

Each step is an LLM rewrite -> build -> run -> judge loop, and **every attempt stops for your decision**,
shown as a side-by-side diff against the stage's input: **Approve** checks and evaluates it as proposed,
**Reject** drops it and sends the note you typed into the next prompt, **Edit** checks and evaluates your version
instead. Under `CUCO_SMOKE=1` (CI) the LLM is a local fake server answering with recorded **fixture** answers,
said so on screen, and with nobody to click the notebook approves each attempt itself; otherwise set
`OPENAI_API_KEY` (and optionally `OPENAI_BASE_URL`, `CUCO_MODEL`) for a real model.
"""),
    code(SETUP + """
from cuco_kit.source import markers
from cuco_kit.widgets import AnalysisView, LedgerView
from cuco_kit.widgets.attempt_review import FastPathStepper

SAMPLE = wb.main_sample()
choice = wb.pick_evaluator()
fp, llm_note = wb.fast_path(SAMPLE, choice, manual=True)
display(banner(choice.note), banner(llm_note))
"""),
    md("""
## 1. Analyze

What the seed communicates, on which streams, and which buffers each call reads and writes.
"""),
    code("""
analysis = fp.analyze()
AnalysisView(analysis)
"""),
    md("""
## 2. The three stages, one attempt at a time

* **Stage A** adds the device-side infrastructure (devComm, scratch windows) while the host collectives stay;
* **Stage B** replaces the host collective with LSA stores into the peers' windows;
* **annotate** adds the EVOLVE blocks and the knob block, accepted only if removing the markers gives back the
  code byte for byte (else a deterministic annotator does it).

The stepper below runs in the background: each attempt appears as a diff with Approve / Reject / Edit. Type a
note before Reject and it goes into the next prompt; an edit is checked (L0, L1, and L2 on a GPU) like any
attempt. Decided attempts move up into the history with the harness's verdict.
"""),
    code("""
stepper = FastPathStepper(fp).start()
stepper
"""),
    code("""
# Nobody clicks in a headless smoke run: approve every attempt (a person never needs this cell).
if smoke.auto_approve():
    stepper.approve_all()
"""),
    md("""
## What the LLM cost

Every call is in the ledger: tokens, dollars (fixture answers cost nothing) and failures.
"""),
    code("""
display(LedgerView(fp.store, fp.run_id))
if stepper.done.is_set():
    if stepper.result is not None and stepper.result.ok:
        print("final candidate:", len(fp.current_code.splitlines()), "lines;", "blocks:",
              ", ".join(b.name for b in markers.blocks(fp.current_code)))
    else:  # failed, or stopped by an error: say so, never a "final candidate" that is only the last input
        print("no final candidate: the fast path",
              f"{stepper.result.status}: {stepper.result.message}" if stepper.result is not None
              else f"stopped: {stepper.error}")
    smoke.cleanup()
    fp.store.close()
    choice.close()
else:
    print("the fast path is waiting for your decisions above; run this cell again when it has finished")
"""),
    md("""
## Next

* Start a search from the annotated result: `06_your_kernel` shows how (`cuco search DIR --from RESULT.cu` on the
  command line), with the fast-path stages as the lineage's first nodes.
* Your own program instead of the sample: `06_your_kernel` imports it first.
* `03_multi_gpu_eval` evaluates the result on several ranks and backends.
"""),
]

# ------------------------------------------------------------------------------------------------------------
SEARCH = [
    md("""
# A live search with manual approval

This notebook **shows** the slow path: an evolutionary search over the GEMM + AllGather design space that you
steer. Every proposal (an offline knob move, or an LLM diff when a model is configured) stops at the
**approval queue** as a side-by-side diff: **Approve** sends it to evaluation, **Reject** drops it, **Edit**
lets you change the code first (your edit becomes a human proposal). The lineage tree, latency curve and
design-space map update about once a second while the search runs in a background thread; no cell waits for
your clicks. Pause, Resume and Stop are on the dashboard.

The evaluator is chosen for this machine and named below: a GPU when present, else the recorded real run
(replayed), else the SIMULATED landscape, labelled. Under `CUCO_SMOKE=1` the budget is tiny and, with nobody
to click, the notebook approves automatically once the dashboard is shown.
"""),
    code(SETUP + """
from cuco_kit.widgets import RunDashboard

SAMPLE = wb.main_sample()
choice = wb.pick_evaluator()
banner(choice.note)
"""),
    md("""
## Set up the search

Two ranks on the `symm` backend (ranks share one GPU) at the small sizes, so it also works on a one-GPU machine.
When replaying the recorded run, its own settings are used so the same proposals come back, and the banner
says which settings those are. Running this cell again stops the search it started before.
"""),
    code("""
SMOKE = smoke.enabled()
settings, settings_note = wb.search_settings(choice, SAMPLE, world_size=2, backend="symm", preset="small")
display(banner(settings_note))
engine, store = wb.new_search(
    SAMPLE, choice.evaluator, db=wb.run_db("02_search"), gate="manual",
    generations=2 if SMOKE else 20, proposals_per_generation=2 if SMOKE else 4,
    iters=5 if SMOKE else 20, **settings)
wb.start_search(engine)
dashboard = RunDashboard(engine, key="02_search")  # running this cell again stops the search it replaces
dashboard
"""),
    code("""
# Nobody clicks in a headless smoke run: approve everything from here on (a person never needs this cell).
if smoke.auto_approve():
    engine.gate.set_mode("auto")
"""),
    md("""
## Your own edit

To try an idea yourself, queue an edit of any program in the run (its id is in the lineage tree's hover):

```python
engine.submit_human(parent_id, code=edited_source, name="my idea", rationale="why it should be faster")
```

It goes through the same queue, checks and evaluation as every other proposal.
"""),
    md("""
## Ending the run

In a headless run this waits for the budget and then stops the engine and joins its thread. In an interactive
session the search keeps running until you press **Stop** on the dashboard.
"""),
    code("""
print(wb.end_search(engine, close=[choice]))  # the dashboard stays: its controls off, saying why
"""),
    md("""
## Next

* Press **Stop** when you are done; the run is in `runs/` and resumes from there with the same settings.
* Open it in `04_run_analysis` to see, with pandas, what won and what failed and why.
* Configure an LLM (`OPENAI_API_KEY`) and pass `llm=` to `wb.new_search` to add diff, rewrite and crossover
  proposals next to the offline ones.
"""),
]

# ------------------------------------------------------------------------------------------------------------
MULTI_GPU = [
    md("""
# Evaluating a kernel on several ranks

This notebook **shows** how to evaluate one kernel the way the search does, from a cell that returns at once:
pick the candidate, the number of ranks, the backend (`nccl`: one GPU per rank, NCCL device API; `symm`: ranks
sharing one GPU through symmetric memory) and the sizes, press **Evaluate**, and watch the cascade level and
per-rank progress; results collect in a pandas table. Then a size sweep, and a kernel timeline: what overlapped
with what.

`symm` numbers say nothing about NVLink (ranks share one L2 and one clock); they check correctness at 2-4 ranks
on one GPU. The evaluator in use, and so the meaning of every number, is named below.
"""),
    code(SETUP + """
from cuco_kit.workbench import teaching
from cuco_kit.widgets import EvalCell, TimelineView

SAMPLE = wb.main_sample()
choice = wb.pick_evaluator()
banner(choice.note)
"""),
    code("""
# Replaying, the "recorded" menu lists the measured configurations and the first is chosen.
cell = EvalCell(choice.evaluator, SAMPLE, ranks=(1, 2, 4), backends=("nccl", "symm"))
cell
"""),
    code("""
# Headless smoke run: press Evaluate for the reader (device_lsa.cu at the first recorded configuration, else
# 2 ranks, symm, small sizes) and wait for the result.
if smoke.enabled():
    cell.candidate.value = "device_lsa.cu"
    if cell.recorded.value < 0:
        cell.ranks.value, cell.backend.value, cell.preset.value = 2, "symm", "small"
    cell.run()
    cell.join(120)
cell.table_frame()  # cell.frame() has every field: device and end-to-end times, spread, the whole reason
"""),
    md("""
## A size sweep

The same kernel at several sizes, one evaluation after another (this cell blocks while it runs: seconds on
the simulator or a replay, minutes on a GPU). The SIMULATED landscape ignores sizes, so under that badge the
rows only show the mechanics.
"""),
    code("""
presets, ranks, backend, plan = wb.sweep_plan(choice, SAMPLE, world_size=2, backend="symm",
                                              presets=["small"] if smoke.enabled() else ["small", "4096", "8192"])
display(banner(plan))
sweep = wb.sweep(choice.evaluator, SAMPLE, "device_lsa.cu", presets, world_size=ranks, backend=backend,
                 iters=5 if smoke.enabled() else 20).round(4)
sweep.drop(columns=["checked", "reason"])  # sweep.loc[:, "reason"] says why a row has no number
"""),
    md("""
## Timelines

A per-rank, per-stream kernel Gantt of one evaluated candidate (recorded with `torch.profiler` on a GPU).
When no measured timeline is committed, the cell says so and draws the *model* schedule of a 4-chunk pipeline
instead, badged as a model.
"""),
    code("""
timelines = teaching.recorded_timelines()
if timelines:
    t = timelines[-1]
    display(TimelineView(t["events"], badge=t.get("badge", "real"), detail=t.get("detail", "")))
else:
    print("No measured kernel timeline is recorded yet (recordings/MANIFEST.json lists none); on a GPU machine the "
          "evaluator records one. Below: the model schedule, not a measurement.")
    display(TimelineView(teaching.model_schedule(compute=1.0, comm=1.0, chunks=4, ranks=2), badge="model",
                         detail="formula schedule, not measured"))
"""),
    md("""
## Next

* The Evaluate button above stays live: try another candidate, rank count or size (`cell.close();
  choice.close()` when you are done).
* Evaluate your own kernel: `EvalCell(choice.evaluator, SAMPLE, candidates={"mine.cu": source})`.
* On a multi-GPU machine choose the `nccl` backend with 2, 4 or 8 ranks for NVLink numbers.
* `02_search` evaluates whole populations like this; `05_teaching` explains what the timeline shows.
"""),
]

# ------------------------------------------------------------------------------------------------------------
ANALYSIS = [
    md("""
# Analysing a finished run with pandas

This notebook **shows** how to read a finished search: which program won and by how much, what its knobs
changed, the best latency per design-space cell, and what failed, at which level and why (log tails included).
It opens the recorded real run committed under `recordings/`; while none exists it runs a small
SIMULATED search first and says so. Every table comes from `cuco_kit.workbench.report`, so the same analysis works on
any run database (`runs/*.sqlite` from `02_search`, or `cuco search --db ...`).
"""),
    code(SETUP + """
import pandas as pd
from IPython.display import HTML
from cuco_kit.widgets import DesignSpaceMap, FailureView, LatencyPlot, side_by_side_html

SAMPLE = wb.main_sample()
store, run_id, note = wb.finished_run(SAMPLE, generations=3 if smoke.enabled() else 10)
banner(note)
"""),
    code("""
frame = report.run_frame(store, run_id)
print(len(frame), "evaluations of", frame["program_id"].nunique(), "programs")
pd.set_option("display.max_colwidth", 36)  # long names end in "...", so the table fits the notebook
frame[["evaluation_id", "program_id", "name", "source", "level_reached", "verdict", "median_ms",
       "speedup", "badge"]].head(15).round(3).rename(columns={"evaluation_id": "evaluation", "program_id": "program",
                                                              "level_reached": "level"})
"""),
    md("""
## What won
"""),
    code("""
won = wb.what_won(store, run_id)
display(banner(won.note))
won.knobs
"""),
    code("""
# The winner's code against the baseline it descends from (only the knob block should differ for offline moves)
HTML(side_by_side_html(won.baseline["code"], won.program["code"])) if won.program else None
"""),
    code("""
LatencyPlot(store, run_id)
"""),
    code("""
DesignSpaceMap(store, run_id)
"""),
    md("""
## What failed and why
"""),
    code("""
display(frame.groupby(["level_reached", "verdict"]).size().unstack(fill_value=0))
FailureView(frame, run="recorded run" if note.badge == "replayed" else "run")
"""),
    code("""
failed = frame[frame["verdict"].isin(["fail", "error"])]
if failed.empty:
    print(f"no failures in this {'recorded run' if note.badge == 'replayed' else 'run'}: each failed "
          "evaluation of a run would be listed here with its reason and log tail")
for eid in failed["evaluation_id"].head(3):
    ev = store.evaluation(int(eid))
    print(f"evaluation {eid} ({ev['level_reached']}): {ev['reason']}")
    for name, tail in (ev.get("logs") or {}).items():
        print(f"  [{name}] {tail[-300:]}")
"""),
    code("""
store.close()
"""),
    md("""
## Next

* Point `wb.finished_run(SAMPLE, db="runs/<your run>.sqlite")` at your own run from `02_search`.
* Take the best program's code (`best["code"]`) to `03_multi_gpu_eval` and measure it at more sizes and ranks.
* Failures at L2 usually mean a missing wait or a wrong offset: look at the diff that introduced them.
"""),
]

# ------------------------------------------------------------------------------------------------------------
TEACHING = [
    md("""
# Chunking and overlap, explained with measured data

This notebook **shows** why device-initiated communication helps GEMM + AllGather. Done one after the other, a
step costs *compute + communication*. Cut the gathered matrix into chunks and start each chunk's GEMM as soon
as that chunk has landed, and the two overlap: the step approaches *max(compute, communication)*. So overlap
can at most halve the time, and it pays most when the two are about equal.

First the model (formulas, no measurements), then the workload's own counts, then the measured numbers
recorded under `recordings/` (its `MANIFEST.json` lists them) when they exist.
"""),
    code(SETUP + """
import pandas as pd
from cuco_kit.workbench import teaching
from cuco_kit.widgets import ChunkExplorer, TimelineView

SAMPLE = wb.main_sample()
"""),
    md("""
## The model

With compute time *c*, communication time *m* and *k* chunks, the pipeline takes about
*max(c, m) + min(c, m) / k*: the first chunk's transfer (or the last chunk's compute) cannot overlap anything.
The table gives the speed-up over sequential for a few ratios *m / c*, in units of the compute time.
"""),
    code("""
rows = []
for ratio in (0.25, 0.5, 1.0, 2.0, 4.0):
    for chunks in (1, 2, 4, 8, 16):
        b = teaching.overlap_bound(compute_ms=1.0, comm_ms=ratio, chunks=chunks)
        rows.append({"comm / compute": ratio, "chunks": chunks, "speed-up": b["speedup_pipelined"],
                     "bound": b["speedup_bound"]})
pd.DataFrame(rows).pivot(index="comm / compute", columns="chunks", values="speed-up").round(2)
"""),
    md("""
The same model as a schedule: one transfer stream and one compute stream, 1 chunk versus 4 chunks (model time
units, badged as a model).
"""),
    code("""
display(TimelineView(teaching.model_schedule(compute=1.0, comm=1.0, chunks=1), badge="model", detail="1 chunk"))
display(TimelineView(teaching.model_schedule(compute=1.0, comm=1.0, chunks=4), badge="model", detail="4 chunks"))
"""),
    md("""
## The workload's counts

From the formulas in the sample's `workload.py`: flops per rank and bytes each rank receives, at the paper's
shape M = N = K = 8192. More ranks means less compute per rank but more to receive, so communication weighs
more as the world grows.
"""),
    code("""
teaching.workload_counts(SAMPLE, {"M": 8192, "N": 8192, "K": 8192})
"""),
    md("""
## Measured, next to the model

Move the **chunks** slider: the model (left) and the measured variants of the device-initiated baseline
(right, one line per placement, for the size and world size picked in **measured**) mark that chunk count.
"""),
    code("""
measured = teaching.load_benchmarks("gemm_allgather")
if measured:
    table = teaching.benchmark_frame(measured)
    gpu, date = table["provenance.gpu"].dropna(), table["provenance.date"].dropna()
    detail = ", ".join(x for x in (gpu.iloc[0] if len(gpu) else "", str(date.max())[:10] if len(date) else "") if x)
    display(banner(f"{len(table)} measured rows from {len(measured)} recorded file(s), "
                   f"measured on {detail}", "replayed"))
    display(ChunkExplorer(table, badge="replayed", detail=detail))
else:
    print("No measured GEMM + AllGather benchmark is recorded yet (recordings/MANIFEST.json lists none).\\n"
          "When it is, this cell shows, per size and world size, cuBLAS alone, the host-NCCL seed, the copy-engine "
          "seed and every knob setting of the device-initiated baseline, with the GPU, driver, NCCL and date; "
          "compare them with the model above. Nothing here invents those numbers.")
"""),
    md("""
## Exercise: place the wait

`sample_kernels/gemm_allgather/exercise_wait.cu` pushes each rank's rows to its peer in 4 chunks on a side stream
and raises one flag per landed chunk; the GEMMs of those rows run on the compute stream. Its `schedule()` has two
gaps, before the own-rows GEMM and before each chunk's GEMM, and no wait at all. Read the file's header (which
flag says which chunk has landed, and the one helper you may call), then type the code for either gap or both and
press **Grade**.

It is graded at 2 ranks sharing one GPU (`symm`): **correct** means it passes the harness's verification with
fresh inputs, a late rank and random pauses around every signal and wait; **overlapped** means the overlap
fraction of its kernel timeline (how much of the transfer hides behind the GEMMs) reaches the pass mark, which the
recording of the exercise sets halfway between a schedule that hides the transfer and a correct one that hides
none of it. A wrong or slow answer gets a hint. With a GPU your answer is evaluated now; without one, only answers
recorded on a GPU can be graded (badged replayed), and the cell says so.
"""),
    code("""
from cuco_kit.workbench import exercise
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.widgets import ExerciseCell

ExerciseCell(gpu=gpu_present(), recording=exercise.load_recording())
"""),
    md("""
## Next

* Move the chunk slider and watch the bound: past a few chunks the gain flattens, and the measured variants
  show where synchronising more chunks costs more than it hides.
* `03_multi_gpu_eval`: measure the baseline's chunk settings yourself and draw their timelines.
* `02_search`: let the search find the chunking, placement and synchronisation that win on your machine.
"""),
]

# ------------------------------------------------------------------------------------------------------------
YOUR_KERNEL = [
    md("""
# Your own kernel: import, fast path with you in the loop, search

This notebook **shows** the main road with a host-driven CUDA + NCCL program of your own (here: the example
program, an all-reduce followed by an RMS normalisation; point `PROGRAM` at yours):

1. **import**: the analysis proposes a plan (inputs, outputs, scratch buffers, sizes, where the step is) that
   you correct before anything is written; then a workload folder with a seed in the candidate ABI;
2. **port and reference**: the LLM's port is checked (every tensor used, every NCCL call kept, it compiles) and
   shown as a diff against your program; its torch reference runs on the CPU and is shown too. The reference
   defines correctness, so **nothing is accepted until you approve it**;
3. **fast path**: the seed becomes device-initiated code, each attempt waiting for your decision;
4. **search**: generation 0 is the fast path's approved result; its stages are the lineage's first nodes.

Under `CUCO_SMOKE=1` (CI) the LLM is a local fake server answering with **FIXTURE** answers written for the
example program, said so on screen. Without a GPU, L2 is not evaluated (said so) and the search's numbers are
**SIMULATED**.
"""),
    code(SETUP + """
from cuco_kit.workbench import your_kernel as yk
from cuco_kit.widgets.attempt_review import FastPathStepper
from cuco_kit.widgets.plan_form import DraftReview, PlanForm

PROGRAM = yk.example_program()  # your program: PROGRAM = "path/to/program.cu"
session, llm_note = yk.import_session(PROGRAM, yk.workload_folder("my_kernel"))
choice = wb.pick_evaluator()
display(banner(llm_note), banner(choice.note))
"""),
    md("""
## 1. The plan

What the analysis read from the program: each device buffer's role (an **input** the harness fills, an **output**
it verifies, **scratch** the seed keeps to itself), the sizes that become workload parameters, where the step is
(a loop, or statements, of `main()` or of the function it calls) and what the step leaves out (timing, printing).
What it could not decide is marked **TODO**. Correct the JSON and press **Apply**: a plan with an open TODO or an
inconsistency is refused with one line per problem. (`cuco init PROGRAM.cu --workload DIR --plan-only` does the
same on the command line.)
"""),
    code("""
form = PlanForm(session)
form
"""),
    md("""
## 2. The workload folder

The plan, your program, the deterministic port (`seed_nccl.cu`) and `workload.py`, whose reference is a marked
TODO until you approve one; until then the seed is the **oracle** (a candidate is checked against the seed's
outputs on the same inputs). `cuco check-workload DIR` lists what is still missing: the reference and the tolerance.
"""),
    code("""
session.write(overwrite=True)
print(session.check(compile_seed=False).text())
"""),
    md("""
## 3. The LLM's port

Checked before you see it: every tensor of the plan looked up, every NCCL call of the step kept, it compiles.
The first FIXTURE answer drops a buffer, so the checks refuse it; reject it with a note and the next answer
comes back with that note in its prompt.
"""),
    code("""
port = DraftReview(session, "port")
port
"""),
    code("""
if smoke.auto_approve():  # nobody reviews in CI: reject failing drafts with a note, approve the first that passes
    port.auto("you dropped the gamma buffer: look every tensor of the plan up with cuco_tensor")
"""),
    md("""
## 4. The torch reference

It defines what "correct" means for every later candidate: read it as carefully as the kernel. The draft has
already run on the CPU at the small size preset on 1 and 2 ranks.
"""),
    code("""
reference = DraftReview(session, "reference")
reference
"""),
    code("""
if smoke.auto_approve():
    reference.auto("compute in float64 and return one flat tensor per rank")
"""),
    md("""
## 5. Is the folder ready?

The reference runs on the CPU, its shapes agree with the specs, the tolerance is set, the seed compiles. On a
GPU the seed must also pass L2 against the reference before the fast path starts.

**Run All stops here** until you have approved the port and the reference above: this cell and the fast path
below say what is missing and do nothing. Once both are approved, run this cell and section 6 again.
"""),
    code("""
waiting = yk.reviews_missing(port=port.accepted, reference=reference.accepted, run_again="this cell and section 6")
if waiting is None:
    print(session.check().text())
    gate, gate_note = yk.seed_l2(session, choice)
display(banner(waiting or gate_note))
"""),
    md("""
## 6. The fast path, with you in the loop

Each attempt waits for you: **Approve**, **Reject** with a note (it goes into the next prompt) or **Edit**. When
the last stage passes, the search starts from the approved result below the stepper.
"""),
    code("""
stepper = None
waiting = yk.reviews_missing(port=port.accepted, reference=reference.accepted, run_again="section 5 and this cell")
if waiting is None:
    fp, fp_note = yk.fast_path(session, choice)
    stepper = FastPathStepper(fp, search=yk.searcher(fp, yk.search_evaluator(choice), generations=2))
    display(banner(fp_note), stepper)
    stepper.start()
else:
    display(banner(waiting))
"""),
    code("""
# Nobody clicks in a headless smoke run: approve every attempt (a person never needs this cell).
if smoke.auto_approve() and stepper is not None:
    stepper.approve_all()
"""),
    md("""
## 7. The search from the approved result

Generation 0 is the fast path's result (its frozen bytes are every child's L0 parent; its knob block is the
design space); the lineage shows the fast-path stages first, at negative generations.
"""),
    code("""
if stepper is not None and stepper.engine is not None and smoke.auto_approve():
    print(wb.end_search(stepper.engine, close=[stepper.dashboard, stepper.search_store]))
    smoke.cleanup()
    fp.store.close()
    choice.close()
elif stepper is None:
    print("no fast path yet: approve the port and the reference, then run sections 5 and 6 again")
else:
    print("the search starts when you approve the fast path's last stage above; press Stop on its dashboard "
          "when you are done")
"""),
    md("""
## Next

* On the command line: `cuco init PROGRAM.cu --workload DIR`, `cuco check-workload DIR`,
  `cuco fastpath DIR/seed_nccl.cu --workload DIR --manual --db run.db --out result.cu`, then
  `cuco search DIR --from result.cu --db run.db --ranks 2 --backend symm`.
* `04_run_analysis` reads the run's database with pandas.
"""),
]

NOTEBOOKS = {
    "00_quickstart": QUICKSTART,
    "01_fast_path": FAST_PATH,
    "02_search": SEARCH,
    "03_multi_gpu_eval": MULTI_GPU,
    "04_run_analysis": ANALYSIS,
    "05_teaching": TEACHING,
    "06_your_kernel": YOUR_KERNEL,
}


def build(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives the same file
    nbformat.validate(nb)
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when a committed notebook is out of date")
    args = ap.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    stale = []
    for name, cells in NOTEBOOKS.items():
        text = nbformat.writes(build(cells)) + "\n"
        path = OUT / f"{name}.ipynb"
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date (run scripts/make_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
