"""The run database: one SQLite file (WAL) per search holding runs, program lineage, proposals and decisions,
evaluations, the LLM ledger and per-run key/value metadata.

A run resumes from this file, so every write is its own committed transaction: once a method returns, the row
survives a killed process ("complete" means committed). Evaluations still ``in_flight`` after a kill are found
by :meth:`Store.mark_interrupted`, marked ``interrupted`` and re-run by the caller.

Schema versions
    ``SCHEMA_VERSION`` is the version this code writes. The ``schema_version`` table holds one row per applied
    migration (``version``, ``applied_at``); the file's version is the largest. ``MIGRATIONS[i]`` turns version
    ``i`` into ``i + 1``, each in one transaction, so a file is never left half-migrated. Version 0 is either an
    empty file or the prototype's unversioned layout (``V0_LAYOUT``: runs, programs, evaluations with the result
    as one JSON blob, no ``schema_version`` table). A file newer than this code is refused, never touched.

Enumerations (run state, program source, badge, proposal status, evaluation status) are checked here in Python,
not with SQL CHECK constraints, so a later version can add a value without rebuilding a table.

Provenance (table ``evaluations``)
    ``provenance`` keeps the evaluator's dict as JSON, unchanged. Its well-known keys are copied into their own
    columns so they can be filtered and grouped in SQL: ``gpu`` (TEXT, e.g. "NVIDIA H200"), ``driver`` (TEXT),
    ``cuda`` (TEXT), ``nccl`` (TEXT), ``mps`` (INTEGER 0/1, NULL = unknown), ``git_rev`` (TEXT, from the
    provenance key ``git``; ``git_rev`` / ``git_revision`` are accepted too) and ``badge`` (TEXT: real, replayed,
    simulated or unmeasured; the result's badge wins over the one given at start). Per-rank timings are
    ``per_rank_median_ms`` and ``iteration_ms`` (JSON lists); ``logs`` is a JSON dict of log tails; ``result``
    keeps the whole ``EvalResult.to_dict()`` so fields added later are not lost.

Refused files: an existing file is inspected before any connection can change it (a writable connection switches
it to WAL at once): one that is not SQLite, holds foreign tables, has a newer schema or -- opened for writing --
fails SQLite's quick_check is refused with one line and left as it was, byte for byte, with no -wal or -shm file
next to it. A statement that meets a damaged page later raises :class:`StoreError` (one line), not SQLite's error.

One owner: a search drives its runs as the database's owner (:meth:`Store.acquire_owner`): an OS file lock
(flock) on ``<real path>.lock``, next to the file the path leads to (symlinks resolved), so every path to one
file -- a symlink, a relative path, another mount of the folder -- meets the same lock. The lock file names the
owner's pid and host for the refusal a second search gets, and is removed when the owner lets go. The kernel drops
the lock when the owner dies, even by kill -9, so a resume is never blocked by a dead owner (its file, left
behind, is taken over). Read-only Stores (dashboards, reports) need no lock and may look while the owner writes.

One name: SQLite keeps its journal (``-wal``, ``-shm``) beside the name a file was opened by, so two writers
through two hard links of one file write two journals and corrupt it. A file with more than one hard link is
refused for writing, with one line, before any connection opens it.

Threads: one connection guarded by a re-entrant lock, so one writer thread and any number of reader threads may
share a ``Store``; :meth:`Store.transaction` groups writes into one commit. Other processes (a CLI looking at a
running search) open their own ``Store``; WAL lets them read while the search writes.
"""
from __future__ import annotations

from cuco_kit.store.database import Store
from cuco_kit.store.errors import NotFound, StoreError
from cuco_kit.store.files import owner_lock_path
from cuco_kit.store.rows import (
                                 BADGES,
                                 DECISIONS,
                                 EVALUATION_STATUSES,
                                 PROGRAM_SOURCES,
                                 PROPOSAL_STATUSES,
                                 RUN_STATES,
                                 BestRow,
                                 DecisionRow,
                                 EvaluationRow,
                                 LLMCallRow,
                                 ProgramRow,
                                 ProposalRow,
                                 RunRow,
)
from cuco_kit.store.schema import MIGRATIONS, SCHEMA_VERSION, V0_LAYOUT, code_hash

__all__ = ["BADGES", "DECISIONS", "EVALUATION_STATUSES", "MIGRATIONS", "PROGRAM_SOURCES", "PROPOSAL_STATUSES",
           "RUN_STATES", "SCHEMA_VERSION", "V0_LAYOUT", "BestRow", "DecisionRow", "EvaluationRow", "LLMCallRow",
           "NotFound", "ProgramRow", "ProposalRow", "RunRow", "Store", "StoreError", "code_hash", "owner_lock_path"]
