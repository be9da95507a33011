"""A candidate's source: read (CUDA parsing, EVOLVE-BLOCK markers and knobs, communication analysis),
checked (the static check) and edited (patches)."""
