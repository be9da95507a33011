"""Evaluations on a Ray cluster: one warm evaluator actor per GPU set, a CPU build pool, results back to the
driver, which alone writes the store (one SQLite file on the driver's machine).

``ray_executor(spec, world_size, backend, address=...)`` connects to the cluster (or starts a private one on
127.0.0.1, `start_private_cluster`), checks
before anything runs that it has GPUs enough for the world (one line if not), reserves one placement group per
GPU set (a single STRICT_PACK bundle of W GPUs under ``nccl``, one GPU under ``symm``: the ranks of a world share
a node) and starts an ``EvaluatorActor`` in each. Ray gives each actor its GPUs as CUDA_VISIBLE_DEVICES; the actor
makes its evaluator from the spec (JSON) on those GPUs and keeps it warm. Requests and results travel as JSON.
Builds: the actor builds what it evaluates from the candidate's source into its node's build cache (keyed by the
source's hash, so a build made ahead on the same node is found); ``prebuild`` sends upcoming candidates to Ray
tasks of one CPU each. Every node needs the kit installed and the workload folder at the driver's path (a shared
file system or the same checkout); the actors check the folder before the search starts.

The slots are ``RaySlot`` objects run by ``cuco_kit.search.slots.SlotExecutor``: an actor (or its node) that dies
mid-evaluation is a lost slot, so the evaluation is retried on another actor, then recorded as an infrastructure
error; the dead actor is started again in its placement group before it takes more work. Ray is imported inside
the functions (a heavy, optional package: the ``cluster`` extra).

The private cluster listens on 127.0.0.1 only. ``ray.init(_node_ip_address="127.0.0.1")`` alone does not do it:
Ray replaces a loopback node address with the machine's external one, so its servers bind that address or every
interface. With Ray's own switch for "local Ray only" off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, named for the
platforms where it is the default) the node address stays 127.0.0.1, and every listening socket of the cluster is
on it: the GCS, the raylet (node and object manager), each worker's and the driver's core-worker server, the
runtime-env agent and the autoscaler's metrics endpoint (the dashboard is not started). The switch is set for the
cluster's life, in this process and in the processes it starts, and put back when it ends.
tests/unit/search/test_ray_executor.py lists the listening sockets during a search on such a cluster.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalRequest, EvalResult, Progress
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.search.slots import SlotExecutor, SlotLost, build_workers_default

log = logging.getLogger("cuco_kit.search")

INSTALL_HINT = "install the cluster extra (pip install 'cuco-kit[cluster]') or use --executor local"
# Ray's "local Ray only" switch (see the module doc): "0" keeps a cluster's node address on 127.0.0.1.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class EvaluatorActor:
    """The body of a Ray actor: one warm evaluator on the GPUs Ray assigned to this process."""

    def __init__(self, spec_json: str) -> None:
        self.spec = EvaluatorSpec.from_json(spec_json)
        self.gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.evaluator = self.spec.make(self.gpus or None)

    def describe(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "gpus": self.gpus}

    def missing(self, workload_dir: str) -> str:
        """"" when this node has the workload folder, else a note naming it."""
        return "" if Path(workload_dir).is_dir() else f"workload folder {workload_dir} is not on this node"

    def evaluate(self, request_json: str) -> dict[str, Any]:
        return self.evaluator.evaluate(EvalRequest.from_json(request_json)).to_dict()


def prebuild_remote(spec_json: str, request_json: str) -> None:
    """A build-pool task: L1 of one request into the node's build cache."""
    EvaluatorSpec.from_json(spec_json).prebuild(EvalRequest.from_json(request_json))


class RaySlot:
    """A slot that is an EvaluatorActor in its own placement group; restarted there after it is lost."""

    def __init__(self, index: int, actor_cls: Any, spec_json: str, pg: Any, gpus_per_set: int, *,
                 start_timeout_s: float, eval_timeout_s: float) -> None:
        self.index = index
        self._cls, self._spec, self._pg, self._w = actor_cls, spec_json, pg, gpus_per_set
        self.start_timeout_s, self.eval_timeout_s = start_timeout_s, eval_timeout_s
        self._actor: Any = None
        self.pid = 0
        self.gpus = ""
        self.label = f"actor {index}"
        self._start()

    def _start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=0)
        actor = self._cls.options(num_gpus=self._w, num_cpus=1, max_restarts=0,
                                  scheduling_strategy=strategy).remote(self._spec)
        try:
            info = ray.get(actor.describe.remote(), timeout=self.start_timeout_s)
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        self._actor, self.pid, self.gpus = actor, int(info["pid"]), str(info["gpus"])
        self.label = f"actor {self.index} [GPU {self.gpus}]"

    def missing(self, workload_dir: str) -> str:
        import ray

        return str(ray.get(self._actor.missing.remote(workload_dir), timeout=self.start_timeout_s))

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        import ray
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError

        if self._actor is None:
            try:
                self._start()
            except (RayError, OSError) as exc:
                raise SlotLost(f"could not start the actor again: {_first_line(exc)}") from exc
        try:
            d = ray.get(self._actor.evaluate.remote(request.to_json()), timeout=self.eval_timeout_s)
        except RayTaskError as exc:  # the evaluator itself raised: an error result, the actor is fine
            raise RuntimeError(_first_line(exc.cause if exc.cause is not None else exc)) from None
        except GetTimeoutError as exc:
            self.close()
            raise SlotLost(f"no answer within {self.eval_timeout_s:.0f} s") from exc
        except RayError as exc:  # the actor, its worker or its node died
            self._actor = None
            raise SlotLost(f"{type(exc).__name__}: {_first_line(exc)}") from exc
        return EvalResult.from_dict(d)

    def close(self) -> None:
        import ray

        if self._actor is not None:
            ray.kill(self._actor, no_restart=True)
            self._actor = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def cluster_gpus() -> list[int]:
    """GPUs of each live node of the connected cluster (Ray's GPU resource, logical or real)."""
    import ray

    return [int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]


def check_gpus(per_node: list[int], world_size: int, backend: str) -> int:
    """How many GPU sets the cluster holds for a world; BadInput (one line) when none."""
    per_set = world_size if backend == "nccl" else 1
    if sum(per_node) == 0:
        raise BadInput("the Ray cluster has no GPUs (no live node offers the GPU resource): start its nodes on GPU "
                       "machines (ray start ... --num-gpus N), or run here with --executor local")
    sets = sum(g // per_set for g in per_node)
    if sets == 0:
        raise BadInput(f"a world of {world_size} ranks under nccl needs {world_size} GPUs on one node; the Ray "
                       f"cluster's nodes have at most {max(per_node)}: use fewer --ranks or --backend symm")
    return sets


def start_private_cluster(**resources: Any) -> Callable[[], None]:
    """Start a Ray cluster of this machine that listens on 127.0.0.1 only (the module doc says how) and return
    the function that ends it. ``resources``: ray.init's ``num_cpus`` / ``num_gpus`` (default: what Ray finds)."""
    saved_env = os.environ.get(LOCAL_ONLY_ENV)
    os.environ[LOCAL_ONLY_ENV] = "0"  # for the processes the cluster starts, and for ray if imported now
    import ray
    from ray._private import ray_constants  # read when ray was imported: flipped here for this process

    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False

    def restore() -> None:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = saved_env

    def stop() -> None:
        try:
            ray.shutdown()
        finally:
            restore()

    try:
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, **resources)
    except BaseException:
        stop()  # a failed start leaves neither a half-connected driver nor the switch behind
        raise
    return stop


def ray_executor(spec: EvaluatorSpec, world_size: int, backend: str, *, address: str | None = None,
                 workload_dir: str | None = None, max_slots: int | None = None, build_workers: int | None = None,
                 start_timeout_s: float = 120.0, eval_timeout_s: float = 3600.0) -> SlotExecutor:
    """A SlotExecutor over evaluator actors of the Ray cluster this process is connected to, else the one at
    ``address`` ("auto": the cluster this machine belongs to, or "HOST:PORT"), else (None) a private cluster of
    this machine that listens on 127.0.0.1 only (`start_private_cluster`)."""
    try:
        import ray
        from ray.exceptions import RayError
        from ray.util.placement_group import placement_group, remove_placement_group
    except ImportError:
        raise BadInput(f"--executor ray: ray is not installed; {INSTALL_HINT}") from None
    end_cluster: Callable[[], None] | None = None  # the cluster this call connected to or started
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
                end_cluster = ray.shutdown
            else:
                end_cluster = start_private_cluster()
        except (ConnectionError, RuntimeError, ValueError) as exc:
            if not address:
                raise BadInput(f"--executor ray: a private Ray cluster of this machine did not start "
                               f"({_first_line(exc)}); start one with `ray start --head` and pass --ray-address"
                               ) from None
            raise BadInput(f"--ray-address {address}: no Ray cluster answers ({_first_line(exc)}); start one with "
                           "`ray start --head` and pass its address") from None
    per_set = world_size if backend == "nccl" else 1
    sets = check_gpus(cluster_gpus(), world_size, backend)
    if max_slots is not None:
        sets = min(sets, max_slots)
    pgs = [placement_group([{"GPU": per_set, "CPU": 1}], strategy="STRICT_PACK") for _ in range(sets)]
    ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=start_timeout_s)
    slots: list[RaySlot] = []

    def close() -> None:
        for pg in pgs:
            remove_placement_group(pg)
        if end_cluster is not None:
            end_cluster()

    try:
        if len(ready) < len(pgs):
            raise BadInput(f"the Ray cluster placed {len(ready)} of {len(pgs)} GPU sets of {per_set} GPU(s) within "
                           f"{start_timeout_s:.0f} s (other jobs hold its GPUs?); free them or ask for fewer slots")
        actor_cls = ray.remote(EvaluatorActor)
        spec_json = spec.to_json()
        for i, pg in enumerate(pgs):
            try:
                slots.append(RaySlot(i, actor_cls, spec_json, pg, per_set, start_timeout_s=start_timeout_s,
                                     eval_timeout_s=eval_timeout_s))
            except RayError as exc:
                raise BadInput(f"evaluator actor {i} did not start ({_first_line(exc)}); is the kit installed on "
                               "every node?") from None
        if workload_dir is not None:
            folder = str(Path(workload_dir).resolve())
            missing = [f"{s.label}: {m}" for s in slots if (m := s.missing(folder))]
            if missing:
                raise BadInput(f"{missing[0]}: every node needs the workload at the driver's path (a shared file "
                               "system or the same checkout)")
    except BaseException:
        for s in slots:
            s.close()
        close()
        raise
    build_task = ray.remote(num_cpus=1)(prebuild_remote)

    def build(request: EvalRequest) -> None:
        build_task.remote(spec_json, request.to_json())  # fire and forget: the evaluation builds if it must

    log.info("Ray executor: %d evaluator actor(s) of %d GPU(s) each", len(slots), per_set)
    return SlotExecutor(slots, badge=spec.badge, build=build, build_workers=build_workers or build_workers_default(),
                        on_close=close)
