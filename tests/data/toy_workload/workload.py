"""A toy workload for CPU tests of the widgets and the search: y = x on every rank."""
from cuco_kit.workload import TensorSpec, Workload

WORKLOAD = Workload(
    name="toy",
    directory=None,  # set by load_workload
    description="copy x to y (tests only)",
    params={"N": 16},
    tensors=[TensorSpec("x", "input", "f32", lambda p, w: (p["N"],)),
             TensorSpec("y", "output", "f32", lambda p, w: (p["N"],))],
    reference=lambda inputs, p, w: [{"y": inp["x"]} for inp in inputs],
    size_presets={"tiny": {"N": 8}},
)
