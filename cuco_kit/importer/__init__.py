"""Importing a user's own host-driven CUDA + NCCL program as a workload folder (`cuco init`).

``program`` reads the program (its functions, the chain of calls from main() to the step, what each statement
does); ``sizes`` finds the integers that become the workload's sizes; ``derive`` makes the `ImportPlan` the user can
correct (``plan``: the plan as data, its file and its checks); ``seed_writer`` turns plan + program into a seed in
the candidate ABI; ``workload_writer`` writes ``workload.py``; ``session`` asks an LLM for the port and the torch
reference (each checked, each shown for approval); ``check`` is `cuco check-workload`.
"""
