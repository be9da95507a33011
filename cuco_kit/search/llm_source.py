"""The LLM mutation source: SEARCH/REPLACE diffs inside EVOLVE blocks, block-wise rewrites and crossovers of two
parents, from the prompt files ``search_diff``, ``search_full`` and ``search_crossover``.

Prompts carry the setting (conditioning.py: workload, hardware, the NCCL device API for the program's backend),
the parent (code and result), inspirations (elites of other islands and archive cells, their EVOLVE blocks only),
the failures of the parent's own lineage with their log tails, and the meta-summary.

Answers are taken as real models give them: SEARCH/REPLACE edits (a SEARCH text with drifted whitespace still
matches when it matches exactly one place ignoring whitespace), a unified diff (turned into edits), or EVOLVE
blocks by name, in one or several fences, with prose around, or inside the whole file (block_answer.py splices
them into the parent's frozen text). ``max_tokens`` is sized from what is asked for. What goes wrong is repaired
before it is wasted (repair.py): an answer cut at the length limit is continued, an answer that cannot be applied
gets one retry with the error and the nearest lines, a proposal the novelty filter would reject is resampled, and
a candidate that does not compile goes back to the same model once (``repair_build``, called by the engine).
What still fails is no proposal; its reason is kept, shown in later prompts and stored in the run's
``llm_notes`` metadata.

With several mutation models (``LLMSource.from_models``), a UCB bandit on improvement per dollar picks one per
proposal (bandit.py); each call's purpose carries the model (``search.mutate.diff@name``) and each program the
tag ``model:<name>``.
"""
from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuco_kit import prompts
from cuco_kit.llm.client import Completion, LLMBudgetExceeded, LLMClient, LLMError, LLMTruncated
from cuco_kit.llm.ledger import LedgeredClient, prompt_tokens_bound
from cuco_kit.llm.openai_client import LLMConfig
from cuco_kit.search import bandit, block_answer, conditioning, repair
from cuco_kit.search.archive import cell_of
from cuco_kit.search.model_stats import MODEL_TAG, model_roles, purpose_with_model
from cuco_kit.search.models import SIDE_ROLES, ModelsConfig, ModelSpec, make_clients
from cuco_kit.search.population import ProgramView
from cuco_kit.search.proposal import MUTATION_KINDS, Proposal, ProposalContext, unified_diff
from cuco_kit.source import markers, patch

if TYPE_CHECKING:
    from cuco_kit.search.engine import SearchEngine  # for the annotation only: sources sit below the engine

log = logging.getLogger("cuco_kit.search")

_HEADER_RE = {k: re.compile(rf"^\s*\**{k}\**\s*:\s*(?P<v>.+?)\s*$", re.MULTILINE | re.IGNORECASE)
              for k in ("NAME", "RATIONALE", "TAGS")}
NOTES_KEY = "llm_notes"  # run metadata: answers that became no proposal, and retries, newest last
NOTES_KEPT = 200


@dataclass
class LLMSourceConfig:
    max_tokens: int | None = None  # None: sized from what is asked for (block_answer.answer_token_cap)
    inspiration_chars: int = 4000  # per inspiration: its EVOLVE blocks, clipped
    recent_errors: int = 3  # unapplicable answers shown back
    continuations: int = 1  # an answer cut at the length limit is continued this many times, then rejected
    patch_retries: int = 1  # an answer that cannot be applied is retried this many times with the error
    novelty_resamples: int = 2  # a proposal the novelty filter would reject is resampled this many times
    build_repairs: int = 1  # a candidate that does not compile goes back to its model this many times (0: never)


class AnswerRejected(Exception):
    """An answer that became no proposal, with the reason (kept in the notes and later prompts)."""


def parse_header(text: str) -> tuple[str, str, list[str]]:
    """NAME, RATIONALE and TAGS lines of an answer ("" / [] when absent)."""
    def get(k: str) -> str:
        m = _HEADER_RE[k].search(text)
        return m.group("v").strip() if m else ""

    tags = [t.strip().lower() for t in get("TAGS").split(",") if t.strip()]
    return get("NAME"), get("RATIONALE"), tags


def evolve_blocks_text(code: str, max_chars: int) -> str:
    """The program's EVOLVE blocks with their names (what an inspiration needs to show), clipped."""
    try:
        parts = [f"// block {b.name}\n{b.text}" for b in markers.blocks(code)]
    except Exception:  # noqa: BLE001 - broken markers: show the head of the file instead
        parts = [code]
    text = "\n".join(parts)
    return text if len(text) <= max_chars else text[:max_chars] + "\n// ... (clipped)"


def apply_answer(parent_code: str, answer: str) -> tuple[str, str, list[str]]:
    """(candidate code, what the answer was: "diff" or "blocks", notes) for an answer to any prompt. Raises
    patch.PatchError or block_answer.BlockAnswerError with the reason when it cannot be applied."""
    edits = patch.parse_edits(answer)
    if not edits and "<<<<<<< SEARCH" in answer:
        raise patch.PatchError("the answer has a '<<<<<<< SEARCH' line but no complete edit; each edit needs "
                               "'=======' and '>>>>>>> REPLACE' lines")
    notes: list[str] = []
    if not edits:
        edits = patch.edits_from_unified_diff(answer)
        if edits:
            notes.append("a unified diff, applied as SEARCH/REPLACE edits")
    if edits:
        return patch.apply_edits(parent_code, edits, relaxed=True), "diff", notes
    if block_answer.has_blocks(answer):
        s = block_answer.splice(parent_code, answer)
        return s.code, "blocks", notes + list(s.notes)
    raise patch.PatchError("the answer has no SEARCH/REPLACE edit, no unified diff and no EVOLVE block")


def result_line(p: ProgramView) -> str:
    """A program's result for a prompt, with the diagnosis of it when one was made (a parent slower than its
    own parent: what the model thought held it back)."""
    if not p.diagnosis:
        return p.summary()
    return p.summary() + "\nDiagnosis of this result:\n" + "\n".join("  " + ln for ln in p.diagnosis.splitlines())


def block_names(code: str) -> str:
    try:
        return ", ".join(b.name for b in markers.blocks(code))
    except markers.MarkerError:
        return "(unreadable markers)"


class LLMSource:
    """``kinds = ("diff", "full", "crossover")``. ``client`` is any cuco_kit.llm LLMClient, or a mapping of model
    name to client (several mutation models, chosen by the bandit); ``bind`` routes them through the engine's
    ledger (dollar budget, store rows)."""

    name = "llm"
    kinds: tuple[str, ...] = ("diff", "full", "crossover")

    def __init__(self, client: LLMClient | Mapping[str, LLMClient], config: LLMSourceConfig | None = None, *,
                 specs: Mapping[str, ModelSpec] | None = None, meta_client: LLMClient | None = None,
                 bandit_c: float = 0.5) -> None:
        self.clients: dict[str | None, LLMClient] = {}
        if isinstance(client, Mapping):
            self.clients.update(client)
        else:
            self.clients[None] = client
        if not self.clients:
            raise ValueError("LLMSource needs at least one client")
        self.specs: dict[str, ModelSpec] = dict(specs or {})
        self.meta_client = meta_client
        # Clients of the other side roles ("diagnosis", "novelty_judge"); a role not here uses ``client``.
        self.role_clients: dict[str, LLMClient] = {}
        self.role_models: dict[str, str] = {}  # role -> the configured model's name (carried in call purposes)
        self.bandit_c = bandit_c
        self.config = config or LLMSourceConfig()
        self.errors: collections.deque[str] = collections.deque(maxlen=self.config.recent_errors)
        self.engine: SearchEngine | None = None

    @classmethod
    def from_models(cls, models: ModelsConfig, base: LLMConfig | None = None,
                    config: LLMSourceConfig | None = None) -> LLMSource:
        """One client per mutation model, and one per side role (meta, diagnosis, novelty judge) whose model
        differs from every mutation model."""
        if not models.mutation:
            raise ValueError("ModelsConfig.mutation is empty: name at least one mutation model")
        clients = make_clients(models.mutation, base)
        made: dict[str, LLMClient] = dict(clients)
        side: dict[str, LLMClient] = {}
        names: dict[str, str] = {}
        for role in SIDE_ROLES:
            spec = models.for_role(role)
            if spec is None:
                continue
            if spec.name not in made:
                made[spec.name] = make_clients([spec], base)[spec.name]
            side[role], names[role] = made[spec.name], spec.name
        src = cls(clients, config, specs={s.name: s for s in models.mutation}, meta_client=side.pop("meta", None),
                  bandit_c=models.bandit_c)
        src.role_clients.update(side)
        src.role_models.update(names)
        return src

    @property
    def client(self) -> LLMClient:
        """The first mutation client (the meta-summary's when no other is given)."""
        return next(iter(self.clients.values()))

    def bind(self, engine: SearchEngine) -> None:
        """Route calls through the engine's ledger (dollar budget, store rows) unless already ledgered."""
        self.engine = engine
        if engine.ledger is None:
            return
        for k, c in self.clients.items():
            if not isinstance(c, LedgeredClient):
                self.clients[k] = engine.ledger.wrap(c)
        if self.meta_client is not None and not isinstance(self.meta_client, LedgeredClient):
            self.meta_client = engine.ledger.wrap(self.meta_client)
        for role, c in self.role_clients.items():
            if not isinstance(c, LedgeredClient):
                self.role_clients[role] = engine.ledger.wrap(c)

    def role_client(self, role: str) -> tuple[LLMClient, str | None]:
        """The client of a side role ("meta", "diagnosis", "novelty_judge") and its configured model's name
        (None: the one client given); the first mutation client when the role has none of its own."""
        if role == "meta" and self.meta_client is not None:
            return self.meta_client, self.role_models.get(role)
        if role in self.role_clients:
            return self.role_clients[role], self.role_models.get(role)
        return self.client, self.role_models.get(role) or next(iter(self.models()), None)

    # -- models ---------------------------------------------------------------------------------------------
    def models(self) -> list[str]:
        return [k for k in self.clients if k is not None]

    def pick_model(self) -> str | None:
        """The mutation model for the next proposal (the bandit's choice when there are several)."""
        names = self.models()
        if len(names) <= 1 or self.engine is None or self.engine.run_id is None:
            return names[0] if names else None
        return bandit.choose(names, self.usage(), self.bandit_c)

    def usage(self) -> list[Any]:
        """Per-model, per-role usage of the bound run (model_stats.ModelRole rows)."""
        e = self.engine
        if e is None or e.run_id is None:
            return []
        progs = e.population.all()
        return model_roles(e.store.llm_calls(e.run_id), progs, {p.id: p.fitness for p in progs})

    # -- prompt ---------------------------------------------------------------------------------------------
    def _inspirations(self, ctx: ProposalContext) -> str:
        if not ctx.inspirations:
            return "none yet"
        out = []
        for p in ctx.inspirations:
            out.append(f"### program {p.id} ({p.name or p.source}), island {p.island}, cell {p.cell}: "
                       f"{p.summary()}\n```cuda\n{evolve_blocks_text(p.code, self.config.inspiration_chars)}\n```")
        return "\n\n".join(out)

    def _failures(self, ctx: ProposalContext) -> str:
        k = self.engine.config.failures_in_prompt if self.engine is not None else len(ctx.failures)
        lines = [f.render() for f in conditioning.lineage_failures(ctx.population, ctx.parent, k)]
        lines += [f"- an earlier answer could not be applied: {e}" for e in self.errors]
        return "\n".join(lines) or "none yet"

    def _context(self, ctx: ProposalContext) -> str:
        e = self.engine
        if e is None:  # a source used on its own, outside a search
            return conditioning.render_context(ctx.population, ctx.parent, workload="?", description="",
                                               backend="?", world_size=1)
        return conditioning.render_context(
            ctx.population, ctx.parent, workload=e.workload.name, description=e.workload.description,
            backend=e.config.backend, world_size=e.config.world_size)

    def build_messages(self, ctx: ProposalContext, kind: str) -> list[dict[str, Any]]:
        parent = ctx.parent
        values: dict[str, Any] = dict(
            phase=ctx.phase.name, phase_hint=ctx.phase.hint, parent_id=parent.id, parent_result=result_line(parent),
            parent_code=parent.code, meta_summary=ctx.meta_summary or "nothing yet",
            failures=self._failures(ctx), context=self._context(ctx), block_names=block_names(parent.code))
        if kind == "crossover":
            second: ProgramView = ctx.second_parent  # type: ignore[assignment]  # propose(): crossover has one
            values.update(second_parent_id=second.id, second_parent_result=result_line(second),
                          second_parent_code=second.code)
        else:
            values["inspirations"] = self._inspirations(ctx)
        name = {"diff": "search_diff", "full": "search_full", "crossover": "search_crossover"}[kind]
        wanted = prompts.placeholders(name)
        return [{"role": "system", "content": ctx.system_prompt or prompts.load("search_system")},
                {"role": "user", "content": prompts.render(name, **{k: v for k, v in values.items() if k in wanted})}]

    def max_tokens(self, ctx: ProposalContext, kind: str, model: str | None, messages: list[dict[str, Any]]) -> int:
        """The answer's cap: from the size of what is asked for (every block for a rewrite or crossover, the
        largest block for a diff), the model's thinking, and the room its context leaves."""
        if self.config.max_tokens is not None:
            return self.config.max_tokens
        if kind == "diff":
            try:
                chars = max((len(b.text) for b in markers.blocks(ctx.parent.code)), default=len(ctx.parent.code))
            except markers.MarkerError:
                chars = len(ctx.parent.code)
        else:
            chars = block_answer.evolve_chars(ctx.parent.code)
        spec = self.specs.get(model or "")
        room = spec.context_tokens - prompt_tokens_bound(messages) if spec and spec.context_tokens else None
        return block_answer.answer_token_cap(chars, spec.reasoning_tokens if spec else 0,
                                             max(256, room) if room is not None else None)

    # -- one exchange ---------------------------------------------------------------------------------------
    def _complete(self, model: str | None, messages: list[dict[str, Any]], purpose: str, temperature: float,
                  max_tokens: int) -> tuple[str, Completion]:
        """An answer, continued while it is cut at the length limit (config.continuations times at most)."""
        client = self.clients[model]
        text = ""
        asked = messages
        for n in range(self.config.continuations + 1):
            p = purpose if n == 0 else f"{purpose}.{repair.PURPOSE_CONTINUE}"
            try:
                c = client.complete(asked, purpose=purpose_with_model(p, model), temperature=temperature,
                                    max_tokens=max_tokens)
                return text + c.text, c
            except LLMTruncated as exc:
                text += exc.completion.text
                asked = repair.follow_up(messages, text, repair.continuation())
                last = exc.completion
        raise AnswerRejected(f"the answer was cut at the length limit ({last.completion_tokens} tokens) "
                             f"{self.config.continuations + 1} time(s); raise max_tokens or ask for less")

    def _novelty(self, ctx: ProposalContext, code: str, source: str) -> str | None:
        """Why the novelty filter would reject ``code`` (None when it is novel or there is no engine)."""
        e = self.engine
        if e is None:
            return None
        _, cell = cell_of(code, e.config.backend, e.config.cell_features)
        v = e.novelty.check(code, cell, source, ctx.population)
        return None if v.novel else v.reason()

    def _note(self, ctx: ProposalContext, kind: str, model: str | None, what: str, reason: str) -> None:
        """Keep an answer's fate in the run's notes (the dashboard's reasoning panel reads them)."""
        log.info("LLM %s for program %s: %s: %s", kind, ctx.parent.id, what, reason)
        e = self.engine
        if e is None or e.run_id is None:
            return
        notes = list(e.store.get_meta(e.run_id, NOTES_KEY, []) or [])
        notes.append({"at": time.time(), "generation": ctx.generation, "parent_id": ctx.parent.id, "kind": kind,
                      "model": model, "what": what, "reason": reason[:500]})
        e.store.put_meta(e.run_id, NOTES_KEY, notes[-NOTES_KEPT:])

    def _exchange(self, ctx: ProposalContext, kind: str, model: str | None, messages: list[dict[str, Any]],
                  purpose: str, *, patch_retries: int | None = None) -> Proposal:
        """Ask, then repair: continue a cut answer, retry an unapplicable one with its error, resample a
        near-duplicate. Raises AnswerRejected with the reason when nothing usable came back."""
        cap = self.max_tokens(ctx, kind, model, messages)
        temperature = ctx.phase.temperature
        patch_left = self.config.patch_retries if patch_retries is None else patch_retries
        resample_left = self.config.novelty_resamples
        asked, p, retried = messages, purpose, ""
        while True:
            text, c = self._complete(model, asked, p, temperature, cap)
            try:
                code, shape, notes = apply_answer(ctx.parent.code, text)
                if code == ctx.parent.code:
                    raise patch.PatchError("the answer changes nothing")
            except (patch.PatchError, block_answer.BlockAnswerError) as exc:
                if patch_left <= 0 or not repair.retryable(str(exc)):
                    raise AnswerRejected(str(exc)) from None
                patch_left -= 1
                self._note(ctx, kind, model, "retry: answer not applicable", str(exc))
                asked = repair.follow_up(messages, text, repair.patch_repair(str(exc), ctx.parent.code, text))
                p, retried = f"{purpose}.{repair.PURPOSE_PATCH}", repair.PURPOSE_PATCH
                continue
            actual = "diff" if shape == "diff" else ("crossover" if kind == "crossover" else "full")
            source = MUTATION_KINDS[actual]
            why = self._novelty(ctx, code, source)
            if why is not None:
                if resample_left <= 0:
                    raise AnswerRejected(f"not novel after {self.config.novelty_resamples} resample(s): {why}")
                resample_left -= 1
                self._note(ctx, kind, model, "resample: not novel", why)
                asked = repair.follow_up(messages, text, repair.resample(why))
                p, retried = f"{purpose}.{repair.PURPOSE_NOVELTY}", repair.PURPOSE_NOVELTY
                continue
            return self._proposal(ctx, actual, model, text, code, c, notes, p, retried)

    def _proposal(self, ctx: ProposalContext, actual: str, model: str | None, text: str, code: str,
                  c: Completion, notes: list[str], purpose: str, retried: str) -> Proposal:
        name, rationale, tags = parse_header(text)
        if c.fixture:
            tags = tags + ["fixture"]  # a scripted test answer, labelled so viewers can badge it
        if model:
            tags = tags + [MODEL_TAG + model]
        if retried:
            tags = tags + [retried.replace(".", ":")]  # "repair:patch", "resample:novelty"
        cross = actual == "crossover" and ctx.second_parent is not None
        return Proposal(
            name=(name or f"{actual} of program {ctx.parent.id}")[:120], rationale=rationale, tags=tags,
            diff=unified_diff(ctx.parent.code, code), source=MUTATION_KINDS[actual], parent_id=ctx.parent.id,
            code=code, second_parent_id=ctx.second_parent.id if cross and ctx.second_parent else None,
            meta={"model": model or c.model, "answered_by": c.model, "fixture": c.fixture, "purpose": purpose,
                  "temperature": ctx.phase.temperature, "dollars": c.dollars, "notes": notes,
                  "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens})

    # -- proposing ------------------------------------------------------------------------------------------
    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        kind = ctx.kind if ctx.kind in self.kinds else "diff"
        if kind == "crossover" and ctx.second_parent is None:
            kind = "diff"
        out: list[Proposal] = []
        for _ in range(max(1, ctx.n)):
            model = self.pick_model()
            try:
                out.append(self._exchange(ctx, kind, model, self.build_messages(ctx, kind), f"search.mutate.{kind}"))
            except LLMBudgetExceeded:
                raise  # the engine stops proposing; budgets are its business
            except LLMError as exc:
                log.warning("LLM %s proposal for program %s failed: %s", kind, ctx.parent.id, exc)
                self.errors.append(f"{kind}: the call failed: {exc}")
                self._note(ctx, kind, model, "rejected: the call failed", str(exc))
            except AnswerRejected as exc:
                self.errors.append(f"{kind} answer for program {ctx.parent.id}: {exc}")
                self._note(ctx, kind, model, "rejected", str(exc))
        return out

    def repair_build(self, ctx: ProposalContext, failed: ProgramView) -> list[Proposal]:
        """A child of ``ctx.parent`` that makes ``failed``'s change in a way that compiles: the same model, the
        same prompt, the failed change and the compiler's first errors (once: a repair is not repaired)."""
        if self.config.build_repairs <= 0 or repair.BUILD_REPAIR_TAG in failed.tags:
            return []
        model = next((t[len(MODEL_TAG):] for t in failed.tags if t.startswith(MODEL_TAG)), None)
        if model not in self.clients:
            model = next(iter(self.clients))
        kind = {"llm_diff": "diff", "llm_full": "full", "llm_crossover": "crossover"}.get(failed.source, "diff")
        if kind == "crossover" and ctx.second_parent is None:
            kind = "diff"
        base = self.build_messages(ctx, kind)
        said = f"(the change, as a unified diff against the program)\n{unified_diff(ctx.parent.code, failed.code)}"
        messages = repair.follow_up(base, said, repair.build_repair(failed.result or {}))
        try:  # one repair, not a chain of them: no patch retry on top
            prop = self._exchange(ctx, kind, model, messages, f"search.mutate.{kind}.{repair.PURPOSE_BUILD}",
                                  patch_retries=0)
        except LLMBudgetExceeded:
            raise
        except (LLMError, AnswerRejected) as exc:
            self._note(ctx, kind, model, f"build repair of program {failed.id} rejected", str(exc))
            return []
        prop.tags.append(repair.BUILD_REPAIR_TAG)
        prop.meta["repairs"] = failed.id
        self._note(ctx, kind, model, f"build repair of program {failed.id}", prop.name)
        return [prop]
