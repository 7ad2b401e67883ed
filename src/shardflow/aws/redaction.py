"""Keeps credentials out of every message shardflow produces.

Error texts from AWS or from the HTTP stack are passed through :func:`redact` before they reach
an exception or a log line. Known secrets (registered when clients are built) are replaced, and
anything shaped like an access key id is masked even if it was never registered.
"""

from __future__ import annotations

import re
import threading

_ACCESS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|ANPA|AGPA)[A-Z0-9]{12,}\b")
_SIGNATURE = re.compile(r"(Signature=)[0-9a-f]{16,}")
_CREDENTIAL = re.compile(r"(Credential=)[^/,\s]+")

_lock = threading.Lock()
_secrets: set[str] = set()

MASK = "****"


def register_secret(*values: str | None) -> None:
    """Remember values (secret keys, session tokens) that must never be printed."""
    with _lock:
        # Short values would mask innocent text; real secrets are long.
        _secrets.update(v for v in values if v and len(v) >= 8)


def redact(text: str) -> str:
    """``text`` with registered secrets and credential-shaped substrings masked."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _ACCESS_KEY_ID.sub(MASK, text)
    text = _SIGNATURE.sub(rf"\g<1>{MASK}", text)
    return _CREDENTIAL.sub(rf"\g<1>{MASK}", text)
