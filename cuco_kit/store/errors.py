"""The store's errors: a file that cannot be used, an id that is not there."""
from __future__ import annotations

from cuco_kit.errors import CucoError


class StoreError(CucoError):
    """The database file cannot be used as it is (not SQLite, newer schema, read-only, foreign layout)."""


class NotFound(CucoError):
    """A run, program, proposal or evaluation id that is not in the store."""
