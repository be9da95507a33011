"""Evolutionary search: islands, parents, archive, phases, novelty, meta-summary, mutation sources, gate."""
