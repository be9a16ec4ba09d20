"""API keys: what a site's backend presents to get call tokens (or to place calls itself).

Keys come from PARLEY_API_KEYS (the keys themselves) and from api_keys_file (their SHA-256
hex digests, one a line, so the file on disk gives nothing away). The gateway keeps only
digests and compares a presented key's digest with each in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path
from typing import Iterable

MIN_KEY_CHARS = 16  # shorter is guessable; `python -c "import secrets; print(secrets.token_urlsafe(32))"`
DIGEST = re.compile(r"[0-9a-f]{64}")


class ApiKeyError(ValueError):
    """A key or key file Parley cannot use; the message names the problem (never the key)."""


def digest(key: str) -> str:
    """The SHA-256 hex digest api_keys_file holds for `key`."""
    return hashlib.sha256(key.encode()).hexdigest()


def read_digest_file(path: str) -> list[str]:
    """The digests in a key file: 64 hex digits a line; blank lines and # comments skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeyError(f"cannot read {path} ({getattr(exc, 'strerror', None) or exc})") from None
    digests = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip().lower()
        if not text:
            continue
        if not DIGEST.fullmatch(text):
            raise ApiKeyError(f"{path} line {number}: expected a SHA-256 hex digest (64 hex digits) of a key, "
                              "e.g. from `printf %s KEY | sha256sum`")
        digests.append(text)
    return digests


class ApiKeys:
    def __init__(self, keys: Iterable[str] = (), keys_file: str = "") -> None:
        keys = list(keys)
        if any(len(key) < MIN_KEY_CHARS for key in keys):
            raise ApiKeyError(f"every API key must be at least {MIN_KEY_CHARS} characters long")
        self._digests = sorted({digest(key) for key in keys} | set(read_digest_file(keys_file) if keys_file else ()))

    @property
    def configured(self) -> bool:
        """False: open mode, anyone who reaches the gateway may place calls."""
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, presented: str) -> bool:
        candidate = digest(presented).encode()
        # Every digest is compared, so the time taken does not tell which one nearly matched.
        return sum(hmac.compare_digest(candidate, known.encode()) for known in self._digests) > 0
