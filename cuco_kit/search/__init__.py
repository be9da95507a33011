"""Evolutionary search: islands, parents, archive, phases, novelty, meta-summary, mutation sources, gate.

Modules: ``engine`` (SearchEngine), ``config`` (SearchConfig), ``proposal`` (Proposal, ProposalSource,
ProposalContext), sources ``llm_source`` / ``design_space`` / ``human``, ``gate`` (ApprovalGate), ``executor``
(Executor, PoolExecutor), ``selection``, ``islands``, ``archive``, ``phases``, ``novelty``, ``meta``,
``budget``, ``population`` (the in-memory view of a run) and ``synthetic`` (a small workload for tests and smoke
runs with the SIMULATED evaluator). `cuco search` is `cuco_kit.commands.search`. Import the module you need;
nothing heavy is imported here.
"""
