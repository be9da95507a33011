"""A torch ``Store`` that seals what it sets and opens what it gets (seal.py), over the parent's TCPStore.

Both sides of the rank control channel use it: the parent (pool.WorkerGroup) and every rank (worker.Channel),
and through the rank's channel also torch itself (the gloo rendezvous, the symmetric-memory exchange, the NCCL
unique id), so nothing the world stores is readable or forgeable by a process without the token.

Exceptions, by necessity: counters made with ``add`` are plain integers (the server does the arithmetic), so
``get`` passes a plain decimal value through; ``get_sealed`` never does and is what the kit's own protocol
reads. Key names are not hidden (the store lists them to anyone); they carry no data.

The class derives from torch's ``Store``, and the parent side of evaluation imports no torch at import time:
``sealed_store`` makes the class on first use.
"""
from __future__ import annotations

import re
from datetime import timedelta
from functools import cache
from typing import Any

from cuco_kit.evaluate.seal import Sealer

_COUNTER = re.compile(rb"-?[0-9]{1,20}")


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def sealed_store(inner: Any, token: str) -> Any:
    """``inner`` (a TCPStore) behind a SealedStore sealing with ``token``."""
    return _store_class()(inner, token)


@cache
def _store_class() -> type:
    import torch.distributed as dist  # torch is heavy: only where a store is made

    class SealedStore(dist.Store):
        def __init__(self, inner: Any, token: str) -> None:
            super().__init__()
            self.inner = inner
            self._sealer = Sealer(token)

        def set(self, key: str, value: Any) -> None:
            self.inner.set(key, self._sealer.seal(key, _bytes(value)))

        def get_sealed(self, key: str) -> bytes:
            """The value of ``key``; raises seal.StoreAuthError unless sealed with this token for this key."""
            return self._open(key, self.inner.get(key))

        def _open(self, key: str, raw: Any) -> bytes:
            return self._sealer.open(key, _bytes(raw))

        def get(self, key: str) -> bytes:
            raw = _bytes(self.inner.get(key))
            return raw if _COUNTER.fullmatch(raw) else self._sealer.open(key, raw)

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            """TCPStore's semantics over sealed values: set ``desired`` when the current value is ``expected``
            (or the key is absent and ``expected`` is empty); returns the value now stored. The swap itself is
            the server's, on the sealed bytes, so it stays atomic."""
            expected, sealed = _bytes(expected), self._sealer.seal(key, _bytes(desired))
            if not self.inner.check([key]):
                return expected if expected else self._open(key, self.inner.compare_set(key, b"", sealed))
            raw = _bytes(self.inner.get(key))
            if self._open(key, raw) != expected:
                return self._open(key, raw)
            return self._open(key, self.inner.compare_set(key, raw, sealed))

        def add(self, key: str, amount: int) -> int:
            return int(self.inner.add(key, amount))

        def check(self, keys: list[str]) -> bool:
            return bool(self.inner.check(keys))

        def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
            if timeout is None:
                self.inner.wait(keys)
            else:
                self.inner.wait(keys, timeout)

        def delete_key(self, key: str) -> bool:
            return bool(self.inner.delete_key(key))

        def num_keys(self) -> int:
            return int(self.inner.num_keys())

        def set_timeout(self, timeout: timedelta) -> None:
            self.inner.set_timeout(timeout)

    return SealedStore
