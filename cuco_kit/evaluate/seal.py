"""Sealed values for the rank control store: encrypted and authenticated with a per-world token.

The parent's TCP store listens on loopback only, but any local process can connect to it, and torch's store
protocol has no authentication: a client can list every key (``list_keys``), read and write them. A secret key
prefix would hide nothing. So every value the kit stores is sealed with a random 32-byte token that only the
parent and its rank processes hold (ranks get it in CUCO_STORE_TOKEN):

    MAGIC | nonce (16 bytes) | tag (32 bytes) | ciphertext

ciphertext = value XOR keystream, the keystream being keyed BLAKE2b over nonce|counter (a PRF in counter mode);
tag = HMAC-SHA256 over the store key's name, the nonce and the ciphertext. A value written without the token,
altered, or moved from another key fails to open (``StoreAuthError``). The encryption and MAC keys are derived
from the token. Standard library only: the parent and the ranks both use it.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

MAGIC = b"CUS1"
_NONCE = 16
_TAG = 32
_BLOCK = 64  # bytes of keystream per BLAKE2b call


class StoreAuthError(ValueError):
    """A store value that was not sealed with this world's token (written by someone else, or tampered with)."""


def new_token() -> str:
    """A fresh token, hex-encoded (it travels in an environment variable)."""
    return secrets.token_hex(32)


def _xor(data: bytes, stream: bytes) -> bytes:
    n = len(data)
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream[:n], "little")).to_bytes(n, "little")


class Sealer:
    """Seals and opens store values under one token."""

    def __init__(self, token: str) -> None:
        try:
            raw = bytes.fromhex(token)
        except ValueError:
            raw = b""
        if len(raw) < 16:
            raise ValueError("store token must be at least 16 bytes, hex-encoded (seal.new_token() makes one)")
        self._enc = hmac.new(raw, b"cuco store: encryption", hashlib.sha256).digest()
        self._mac = hmac.new(raw, b"cuco store: authentication", hashlib.sha256).digest()

    def _stream(self, nonce: bytes, n: int) -> bytes:
        blocks = (n + _BLOCK - 1) // _BLOCK
        return b"".join(hashlib.blake2b(nonce + i.to_bytes(8, "little"), key=self._enc, digest_size=_BLOCK).digest()
                        for i in range(blocks))

    def _tag(self, key: str, nonce: bytes, ct: bytes) -> bytes:
        name = key.encode("utf-8")
        return hmac.new(self._mac, len(name).to_bytes(4, "little") + name + nonce + ct, hashlib.sha256).digest()

    def seal(self, key: str, value: bytes) -> bytes:
        nonce = secrets.token_bytes(_NONCE)
        ct = _xor(value, self._stream(nonce, len(value)))
        return MAGIC + nonce + self._tag(key, nonce, ct) + ct

    def open(self, key: str, blob: bytes) -> bytes:
        head = len(MAGIC) + _NONCE + _TAG
        if len(blob) < head or not blob.startswith(MAGIC):
            raise StoreAuthError(f"store key {key!r}: the value is not sealed (written without this world's token)")
        nonce, tag, ct = blob[len(MAGIC):len(MAGIC) + _NONCE], blob[len(MAGIC) + _NONCE:head], blob[head:]
        if not hmac.compare_digest(tag, self._tag(key, nonce, ct)):
            raise StoreAuthError(f"store key {key!r}: the value failed authentication (not sealed with this "
                                 "world's token, altered, or moved from another key)")
        return _xor(ct, self._stream(nonce, len(ct)))
