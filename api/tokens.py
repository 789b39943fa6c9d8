"""Service tokens: how they are made, parsed and checked (pure; no Django, no Redis).

A token is ``dsp_<prefix>_<secret>``: the 12-hex-digit prefix finds the row, the
secret (``secrets.token_urlsafe(32)``) is stored only as its SHA-256, compared in
constant time. The clear token is shown once, when it is made.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

TOKEN_SCHEME = "dsp_"
PREFIX_LEN = 12


@dataclass(frozen=True)
class NewToken:
    token: str
    prefix: str
    secret_hash: str


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_token() -> NewToken:
    prefix = secrets.token_hex(PREFIX_LEN // 2)
    secret = secrets.token_urlsafe(32)
    return NewToken(f"{TOKEN_SCHEME}{prefix}_{secret}", prefix, hash_secret(secret))


def parse(token: str) -> tuple[str, str] | None:
    """``(prefix, secret)`` of a well-formed token, else None."""
    if not token.startswith(TOKEN_SCHEME):
        return None
    rest = token[len(TOKEN_SCHEME):]
    prefix, sep, secret = rest[:PREFIX_LEN], rest[PREFIX_LEN:PREFIX_LEN + 1], rest[PREFIX_LEN + 1:]
    if sep != "_" or not secret or len(secret) > 200 or any(c not in "0123456789abcdef" for c in prefix):
        return None
    return prefix, secret


def secret_matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), secret_hash)
