"""The exercise's hidden answers (05_teaching, sample_kernels/gemm_allgather/exercise_wait.cu), for recording and
testing only: never shown in a notebook. Each maps gap name -> text, as a learner would type it.

- reference: each chunk's GEMM waits, on the GEMMs' stream, for the flag of exactly the chunk it reads;
- waits_for_everything_first: correct, but waits for every peer chunk before the own-rows GEMM, so the transfer
  hides behind nothing (the low end of the pass mark);
- no_wait: the GEMMs read xg whenever they run (a race: L2 must catch it);
- waits_on_the_side_stream: the right flag on the wrong stream: the GEMM is not ordered after the wait (a race).
"""
from __future__ import annotations

PER_CHUNK = "CUCO_TRY(launch_wait(s.my_flags + (size_t)src * kChunks + c, 1, 0, 0, epoch, {stream}));"

ANSWERS: dict[str, dict[str, str]] = {
    "reference": {"per_chunk": PER_CHUNK.format(stream="ctx->stream")},
    "waits_for_everything_first": {
        "before_local": "CUCO_TRY(launch_wait(s.my_flags, s.world * kChunks, s.rank * kChunks, "
                        "(s.rank + 1) * kChunks, epoch, ctx->stream));"},
    "no_wait": {},
    "waits_on_the_side_stream": {"per_chunk": PER_CHUNK.format(stream="s.side.stream")},
}
# What each answer must grade as: (correct, passes the overlap mark); None: recorded, not asserted (a race that
# the perturbations catch most of the time, not every time).
EXPECTED: dict[str, tuple[bool, bool] | None] = {
    "reference": (True, True),
    "waits_for_everything_first": (True, False),
    "no_wait": (False, False),
    "waits_on_the_side_stream": None,
}
