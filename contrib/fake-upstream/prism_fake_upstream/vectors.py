"""Deterministic pseudo-embeddings derived from a hash of the input."""

from __future__ import annotations

import hashlib
import math
import struct

__all__ = ["embedding_for_text", "embedding_for_tokens", "unpack_floats"]


def _vector(seed: bytes, dims: int) -> bytes:
    """Unit-length float32 little-endian vector, as packed bytes.

    Returned packed so the base64 form and the float form come from exactly
    the same float32 values.
    """
    raw = hashlib.shake_128(seed).digest(4 * dims)
    ints = struct.unpack(f"<{dims}I", raw)
    values = [i / 2147483648.0 - 1.0 for i in ints]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return struct.pack(f"<{dims}f", *(v / norm for v in values))


def embedding_for_text(text: str, dims: int) -> bytes:
    # Prefixes keep "1,2" the string apart from [1, 2] the token list.
    return _vector(b"s:" + text.encode(), dims)


def embedding_for_tokens(tokens: list[int], dims: int) -> bytes:
    return _vector(b"t:" + ",".join(map(str, tokens)).encode(), dims)


def unpack_floats(packed: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))
