"""Importing a user's own host-driven CUDA + NCCL program as a workload folder (`cuco init`).

``plan`` reads the program into an `ImportPlan` the user can correct; ``seed_writer`` turns plan + program into a
seed in the candidate ABI; ``workload_writer`` writes ``workload.py``; ``port`` asks an LLM for the port and the
torch reference (each checked, each shown for approval); ``check`` is `cuco check-workload`.
"""
