"""Runs inside rank processes; imports torch; the parent never imports this package at module level.

A rank process is started by launcher.py (through pool.WorkerGroup) as ``python -m cuco_kit.evaluate.rank.worker``.
worker.py serves the parent's commands over the store, harness.py measures and verifies one candidate,
backends.py holds the communicator and the symmetric windows, abi.py mirrors the candidate ABI in ctypes.
The parent (notebook kernel, CLI, search) never creates a CUDA context: it stays in cuco_kit.evaluate.
"""
