"""`cuco search WORKLOAD ...`: a headless search with a live log (or a JSON summary).

On a terminal, a progress bar on stderr counts generations, evaluations and the best speed-up so far. Every flag,
the workload, its baseline and seed, the evaluator and (with an LLM mutator) the LLM server are checked before the
search starts: bad input is one line and exit code 2. The search ends after --generations (at most 10000), or
earlier when it has nothing new to propose ("design space exhausted" for the offline mutator). The LLM dollar
budget is per run (--llm-budget, default $10; a resumed run counts what it spent before) and the run stops cleanly
when it is spent; a search whose LLM answered none of its calls, or stopped answering, exits 1 with one line saying
so. `--record DIR` keeps every LLM call and its answer in DIR; `--replay DIR` answers them from there without a
server (a call the recording lacks stops the search with one line naming it). Names and reasons from the LLM and the
candidates are printed cleaned of control characters.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (pyproject installs tomli there)
    import tomli as tomllib

from tqdm import tqdm

from cuco_kit.commands.executor_options import (
    add_executor_arguments,
    check_executor_arguments,
    make_executor,
    slot_printer,
)
from cuco_kit.commands.llm_options import (
    DEFAULT_BUDGET_DOLLARS,
    DEFAULT_TOKEN_BUDGET,
    PROBE_TIMEOUT_S,
    LLMBreaker,
    add_llm_arguments,
    check_llm_arguments,
    check_llm_reachable,
    llm_config,
    llm_failure,
    unanswered,
)
from cuco_kit.commands.llm_recording import add_recording_arguments, call_log, replay_miss
from cuco_kit.commands.model_options import add_model_arguments, apply_role_switches, models_from_args
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import close_evaluator
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.evaluate.recordings import RecordedConfig, catalogue, miss_hint
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.events import Event, EventBus
from cuco_kit.llm import CallLog, LLMClient, LLMConfig, OpenAICompatibleClient
from cuco_kit.search import islands
from cuco_kit.search.config import TIMELINE_CHOICES, SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import WHY, SearchEngine
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.models import ModelsConfig
from cuco_kit.search.proposal import ProposalSource
from cuco_kit.search.start_point import FROM_HINT, read_baseline, read_start, start_from
from cuco_kit.source import markers
from cuco_kit.source.source_file import read_source
from cuco_kit.store import Store
from cuco_kit.terminal import clean, one_line
from cuco_kit.workbench import recorded_runs
from cuco_kit.workload import MAX_RANKS, Workload, load_workload, parse_overrides

HELP = "evolutionary search over a workload"
# Far beyond any search we run (a few hundred generations at most); a larger number is a typo. A search whose
# sources have nothing new to propose ends before its generations anyway ("design space exhausted").
MAX_GENERATIONS = 10_000
MAX_SEED = 2**32 - 1  # what every seeded generator the search uses accepts (numpy's included)
# The flags that set a SearchConfig value: flag dest -> (the value's key, dotted for a table's; the flag's default).
# A flag given on the command line wins over --config's file, the file over the default.
FLAG_KEYS: dict[str, tuple[str, Any]] = {
    "ranks": ("world_size", 1), "backend": ("backend", "nccl"), "seed": ("seed", 0),
    "generations": ("budget.generations", 10), "llm_budget": ("budget.llm_dollars", DEFAULT_BUDGET_DOLLARS),
    "llm_token_budget": ("budget.llm_tokens", DEFAULT_TOKEN_BUDGET), "target": ("target_ratio", None),
    "timeline": ("timeline", "every")}
NO_GPU_HINT = ("use --evaluator simulated (a synthetic landscape, numbers badged SIMULATED) or --evaluator replay "
               "(real measurements recorded on a GPU machine)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload directory (sample_kernels/<name>)")
    parser.add_argument("--mutator", choices=["offline", "llm", "mixed"], default="offline")
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--db", required=True, help="SQLite database of the run (resumed if it exists)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--backend", choices=["nccl", "symm"], default="nccl")
    parser.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                        help="override a workload parameter (repeatable), e.g. --size M=4096")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search")
    parser.add_argument("--evaluator", choices=["gpu", "replay", "simulated"], default="gpu")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--config", type=Path, metavar="RUN.toml",
                        help="search settings: SearchConfig's fields, with tables [budget], [islands], [selection], "
                             "[phases], [novelty], [meta], [design_space], [remeasure], [models], [params] "
                             "(docs/llm_search.md, docs/islands.md); a flag given here wins over the file, the file "
                             "over the defaults; [islands] file paths are read from the file's folder")
    parser.add_argument("--target", type=float, metavar="RATIO",
                        help="stop once a program is faster than the seed by this ratio (e.g. 1.2) with its 95%% "
                             "interval clear of it (the interval's lower bound above RATIO)")
    parser.add_argument("--from", dest="from_result", metavar="RESULT.cu", action="append", default=[],
                        help="start from this program (a fast-path result: its frozen bytes are the L0 parent, its "
                             "knob block the design space) instead of the workload's baseline; repeat it to start "
                             "from several: the first is the root, each further one is evaluated at generation 0 "
                             "on an island of its own in turn")
    parser.add_argument("--timeline", choices=list(TIMELINE_CHOICES),
                        help="record each evaluation's per-rank kernel timeline (the overlap column; one more untimed "
                             "profiled step per evaluation) or not")
    add_llm_arguments(parser, scope="run")
    add_recording_arguments(parser)
    add_model_arguments(parser)
    add_executor_arguments(parser)
    # None: not given on the command line (resolve_config then takes the file's value, else the default).
    parser.set_defaults(**dict.fromkeys(FLAG_KEYS))


MAX_RUN_FILE_BYTES = 1 << 20  # far beyond any settings file; a larger one is not one


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The settings of a run file (TOML: SearchConfig's fields and tables), checked strictly: a key SearchConfig
    does not know is refused by name. BadInput (one line) for a file that cannot be read or is not TOML."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_RUN_FILE_BYTES:
            raise BadInput(f"--config {p}: larger than {MAX_RUN_FILE_BYTES >> 10} KiB; is it a settings file?")
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"--config {p}: cannot read it ({exc.strerror or exc}); pass a TOML file") from None
    except UnicodeDecodeError:
        raise BadInput(f"--config {p}: not UTF-8 text; pass a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"--config {p}: not TOML ({exc})") from None
    try:
        SearchConfig.from_dict(data, strict=True)
    except BadInput as exc:
        raise BadInput(f"--config {p}: {exc}") from None
    return data


def _get(d: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _put(d: dict[str, Any], key: str, value: Any) -> None:
    *tables, last = key.split(".")
    for part in tables:
        d = d.setdefault(part, {})
    d[last] = value


def resolve_config(args: argparse.Namespace) -> SearchConfig:
    """The run's SearchConfig, every value resolved here: from the command line when given there, else from
    --config's file, else the default (the flag's for FLAG_KEYS and --size, SearchConfig's for the rest). The
    flags' resolved values are written back to ``args``, which the checks and the evaluator read; --size overrides
    the file's [params] one by one; --models replaces the file's [models] and --mutation-model adds to them. A key
    the file has that SearchConfig does not know is refused by name."""
    data = read_run_file(args.config) if args.config is not None else {}
    if args.config is not None and isinstance(data.get("islands"), dict):
        islands.resolve_paths(data["islands"], Path(args.config).parent)  # the file's paths are relative to it
    for dest, (key, default) in FLAG_KEYS.items():
        if getattr(args, dest) is None:
            from_file = _get(data, key)
            setattr(args, dest, default if from_file is None else from_file)
        _put(data, key, getattr(args, dest))
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise BadInput(f"--config {args.config}: [params] must be a table of NAME = VALUE, got {params!r}")
    _check_arguments(args)  # the flags' values, from wherever they came, named by their flag
    data["params"] = {**params, **parse_overrides(args.size)}
    models = models_from_args(args)
    if args.models is None and isinstance(data.get("models"), dict):
        try:
            from_file = ModelsConfig.from_dict(data["models"], strict=True)
        except (BadInput, TypeError, ValueError) as exc:
            raise BadInput(f"--config {args.config}: {exc}") from None
        from_file.mutation += [m for m in models.mutation if m.name not in {f.name for f in from_file.mutation}]
        models = from_file
    data["models"] = models
    try:
        return SearchConfig.from_dict(data, strict=True)
    except BadInput as exc:
        raise BadInput(f"--config {args.config}: {exc}" if args.config is not None else str(exc)) from None


def _check_arguments(args: argparse.Namespace) -> None:
    if not 0 <= args.generations <= MAX_GENERATIONS:
        raise BadInput(f"--generations {args.generations}: must be between 0 and {MAX_GENERATIONS}")
    if not 0 <= args.seed <= MAX_SEED:
        raise BadInput(f"--seed {args.seed}: must be between 0 and {MAX_SEED}")
    if not 1 <= args.ranks <= MAX_RANKS:
        raise BadInput(f"--ranks {args.ranks}: must be between 1 and {MAX_RANKS}")
    target = getattr(args, "target", None)
    if target is not None and not (math.isfinite(target) and target > 0):
        raise BadInput(f"--target {target:g}: must be a speed-up over the seed, a number above 0 (e.g. 1.2)")
    check_llm_arguments(args)
    check_executor_arguments(args)
    if args.mutator == "offline" and (getattr(args, "record", None) or getattr(args, "replay", None)):
        raise BadInput("--record / --replay keep LLM calls, and --mutator offline makes none: use --mutator llm or "
                       "mixed")


def _check_workload(wl: Workload, args: argparse.Namespace, params: dict[str, int]) -> None:
    """The workload's sizes (``params``: the file's and --size's overrides) suit --ranks, the baseline is checked
    like a --from file (markers, blocks, knob block; with the offline mutator it needs knobs) and the seed is
    readable source text."""
    wl.check(params, args.ranks)
    starts = _starts(args)
    if starts:
        for path in starts:  # now, before --db exists; the engine reads them again
            read_start(path, "--from", FROM_HINT)
    else:
        start = read_baseline(wl)
        if args.mutator == "offline" and not markers.knobs(start):
            raise BadInput(f"workload {wl.name}: baseline {wl.baseline} has no knob block, and the offline search "
                           "only moves knobs; add one (docs/contracts.md) or use --mutator llm")
    if args.backend in wl.seeds:
        read_source(wl.seed_for(args.backend), f"workload {wl.name}: {args.backend} seed")


def _starts(args: argparse.Namespace) -> list[str]:
    """The --from files in order (none: the workload's baseline is the root)."""
    given = getattr(args, "from_result", None) or []
    return [given] if isinstance(given, str) else list(given)


def _recorded(wl: Workload) -> list[RecordedConfig]:
    return [c for c in catalogue(recorded_runs(), {wl.name: wl.params}) if c.workload == wl.name]


def _replay_command(wl: Workload, workload_dir: Path, config: RecordedConfig) -> str:
    sizes = " ".join(f"--size {k}={v}" for k, v in config.params)
    return (f"cuco search {workload_dir} --evaluator replay --ranks {config.world_size} --backend {config.backend} "
            f"{sizes}")


def _no_gpu_hint(wl: Workload, workload_dir: Path) -> str:
    recorded = _recorded(wl)
    if recorded:
        return (f"{NO_GPU_HINT}; recorded for {wl.name}: {recorded[0].label()}, e.g. "
                f"`{_replay_command(wl, workload_dir, recorded[0])} --db run.sqlite`")
    return NO_GPU_HINT


def _evaluator_spec(args: argparse.Namespace, workload_dir: Path, wl: Workload,
                    params: dict[str, int]) -> EvaluatorSpec:
    if args.evaluator == "simulated":
        return EvaluatorSpec("simulated", {"seed": args.seed})
    if args.evaluator == "replay":
        named = os.environ.get("CUCO_REPLAY_DB")
        if named and not Path(named).is_file():
            raise BadInput(f"--evaluator replay: CUCO_REPLAY_DB={named}: no such file; point it at a recording, or "
                           "unset it to use the recordings found by name")
        explicit = [c for c in (named, workload_dir / "replay.db") if c]
        for c in explicit:
            if Path(c).is_file():
                return EvaluatorSpec("replay", {"path": str(c)})
        # Found by name: the recordings that hold this workload at this configuration.
        want = wl.resolve(params)
        recorded = _recorded(wl)
        match = [c for c in recorded if (c.world_size, c.backend, c.sizes) == (args.ranks, args.backend, want)]
        if match:
            return EvaluatorSpec("replay", {"path": sorted({p for c in match for p in c.paths})})
        if recorded:
            raise BadInput(f"--evaluator replay: {miss_hint(recorded, wl.name, args.ranks, args.backend, want)}; "
                           f"e.g. `{_replay_command(wl, workload_dir, recorded[0])}`")
        raise BadInput(f"--evaluator replay: no recording of {wl.name} (set CUCO_REPLAY_DB to a replay database, "
                       f"or record one on a GPU machine: recordings/README.md); --evaluator simulated needs none")
    if args.executor == "local" and not gpu_present():
        # Without a GPU the GPU evaluator measures nothing: every program would end "unavailable" at L1.
        raise BadInput(f"--evaluator gpu: this machine has no GPU (nvidia-smi lists none); "
                       f"{_no_gpu_hint(wl, workload_dir)}")
    return EvaluatorSpec("gpu")


def _sources(mutator: str, llm: LLMConfig | None, models: ModelsConfig,
             breakers: list[LLMBreaker], calls: CallLog | None = None) -> list[ProposalSource]:
    """The proposal sources; every LLM client is wrapped in a breaker (appended to ``breakers``), and recorded or
    replayed through ``calls`` when given."""
    out: list[ProposalSource] = []
    if mutator in ("offline", "mixed"):
        out.append(DesignSpaceSource())
    if llm is None:
        return out

    def via_log(client: LLMClient) -> LLMClient:
        return calls.wrap(client) if calls is not None else client

    if not models.mutation:
        breakers.append(LLMBreaker(via_log(OpenAICompatibleClient(llm))))
        out.append(LLMSource(breakers[-1]))
        return out
    source = LLMSource.from_models(models, llm)
    for name, client in list(source.clients.items()):
        breakers.append(LLMBreaker(via_log(client)))
        source.clients[name] = breakers[-1]
    if source.meta_client is not None:
        source.meta_client = via_log(source.meta_client)
    for role, client in list(source.role_clients.items()):  # recorded and replayed like the others
        source.role_clients[role] = via_log(client)
    out.append(source)
    return out


def _printer(as_json: bool) -> Callable[[Event], None]:
    out = sys.stderr if as_json else sys.stdout

    def show(event: Event) -> None:
        d = event.data
        if event.kind == "evaluation_finished":
            extra = (f"{d['median_ms']:.4f} ms, {d['speedup']:.3f}x" if d.get("median_ms") is not None and
                     d.get("speedup") is not None else f"{d.get('reason', '')[:100]}")
            oracle = f" (oracle: {d['oracle']})" if d.get("oracle") else ""
            again = f" (measured again before {WHY[d['remeasure']]})" if d.get("remeasure") in WHY else ""
            line = f"eval {d['evaluation_id']} program {d['program_id']}: {d['verdict']} at " \
                   f"{d['level_reached']} [{d['badge']}] {extra}{oracle}{again}"
        elif event.kind == "proposal":
            line = f"proposal {d['proposal_id']} ({d['source']}) from program {d['parent_id']}: {d['name']}"
        elif event.kind == "new_best":
            sp = d.get("speedup")
            line = (f"NEW BEST program {d['program_id']}: {sp:.3f}x the seed" if sp is not None and sp > 1.0 else
                    f"best so far program {d['program_id']}: {sp:.3f}x the seed (not faster than the seed)"
                    if sp is not None else f"best so far program {d['program_id']}")
        elif event.kind in ("run_state", "log"):
            line = f"{event.kind}: {d.get('state', '')}{d.get('message', '')} {d.get('reason', '')}".rstrip()
        else:
            return
        tqdm.write(clean(line), file=out)  # above the progress bar, when there is one; names come from the LLM
        out.flush()

    return show


def _progress_bar(engine: SearchEngine, bar: tqdm) -> Callable[[Event], None]:
    evaluations = 0
    best = "-"

    def show(event: Event) -> None:
        nonlocal evaluations, best
        if event.kind == "evaluation_finished":
            evaluations += 1
        elif event.kind == "new_best":
            best = f"{event.data['speedup']:.3f}x"
        bar.update(max(0, engine.generation - bar.n))
        bar.set_postfix_str(f"{evaluations} evaluations, best {best}")

    return show


def run(args: argparse.Namespace) -> int:
    config = resolve_config(args)  # checks the flags' values too
    workload_dir = Path(args.workload)
    wl = load_workload(workload_dir)
    params = config.params
    _check_workload(wl, args, params)
    islands.read_files(config.islands)  # the islands' own programs and prompts, now, before --db exists
    llm: LLMConfig | None = None
    calls = call_log(args)
    if args.mutator != "offline":
        llm = llm_config(args)
        if calls is None or calls.mode != "replay":  # a replay asks no server
            check_llm_reachable(llm.base_url or "", min(args.llm_timeout, PROBE_TIMEOUT_S))
    spec = _evaluator_spec(args, workload_dir, wl, params)
    db = Path(args.db)
    if not db.parent.exists():
        raise BadInput(f"--db {db}: folder {db.parent} does not exist; create it first")
    models = config.models
    executor = make_executor(args, spec, str(workload_dir))
    evaluator = executor or spec.make()  # a replay recording that is no store is refused here, before --db exists
    try:
        store = Store(db)
    except BaseException:
        if executor is not None:
            executor.shutdown(wait=True)
        else:
            close_evaluator(evaluator)
        raise
    starts = _starts(args)
    start = start_from(starts[0], store) if starts else None
    if len(starts) > 1:  # the first --from is the root; the rest start at generation 0 beside it
        config.initial_programs = [str(p) for p in starts[1:]]
    apply_role_switches(args, config)
    if args.mutator == "offline":
        # Only the design-space source serves: every slot is a knob move.
        config.phases.explore.mix = {"design_space": 1.0}
        config.phases.exploit.mix = {"design_space": 1.0}
    events = EventBus()
    events.subscribe(_printer(args.json))
    events.subscribe(slot_printer(sys.stderr if args.json else sys.stdout))
    breakers: list[LLMBreaker] = []
    engine = SearchEngine(workload_dir, store, evaluator, _sources(args.mutator, llm, models, breakers, calls),
                          config, events, executor=executor, start=start)
    for breaker in breakers:
        breaker.on_trip = engine.stop  # a dead LLM ends the search after this round, resumable later
    if calls is not None:
        calls.on_miss = engine.stop  # a replay that cannot answer ends the search: its proposals would differ
    bar = tqdm(total=args.generations, unit="gen", desc=wl.name, file=sys.stderr, leave=False,
               disable=args.json or not sys.stderr.isatty())
    events.subscribe(_progress_bar(engine, bar))
    try:
        summary = engine.run()
    except KeyboardInterrupt:
        engine.stop()
        raise
    finally:
        bar.close()
        store.close()
    miss = replay_miss(calls)
    if miss is not None:
        print(f"cuco search: run {engine.run_id} stopped: {clean(miss)}", file=sys.stderr)
        return 1
    if llm is not None and engine.ledger is not None:
        failed = _llm_failed(engine, next((b for b in breakers if b.tripped), None), llm.base_url or "")
        if failed is not None:
            print(f"cuco search: {failed}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        s = summary
        best = (f"best program {s.best_program_id} at {s.best_speedup:.3f}x the seed"
                if s.best_program_id is not None else "no passing program")
        print(clean(f"run {s.run_id} {s.state} ({s.reason}): {s.generations} generations, {s.evaluations} "
                    f"evaluations [{s.badge}], {best}; database {db}"))
    return 0


def _llm_failed(engine: SearchEngine, breaker: LLMBreaker | None, base_url: str) -> str | None:
    """One line when the LLM answered none of this session's calls, or stopped answering (the breaker ended the
    search); None when it did its part."""
    assert engine.ledger is not None
    entries = engine.ledger.entries
    never = llm_failure(entries, base_url)
    if never is not None:
        return f"run {engine.run_id}: {never}"
    if breaker is not None and breaker.tripped:
        last = one_line(unanswered(entries)[-1].error)[:300]
        return (f"run {engine.run_id} stopped after generation {engine.generation}: the LLM at {base_url} stopped "
                f"answering ({breaker.limit} calls in a row got no answer, last: {last}); run the same command "
                "again to resume once it answers")
    return None
