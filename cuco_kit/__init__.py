"""cuco-kit: compute-communication co-design of multi-GPU CUDA kernels, from notebooks.

The engine lives here; the notebook layer is ``cuco_kit.widgets`` (installed from ``widgets/``) and the engine
never imports it.
"""

__version__ = "0.1.0"
