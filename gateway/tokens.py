"""Resume tokens: HMAC-SHA256-signed, bound to one session id, with an expiry.

Format: base64url("<session_id>.<expiry unix s>") + "." + base64url(hmac[:16]).
Stateless, so any node holding the same secret can verify a token. Never log one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Optional

MAX_TOKEN_CHARS = 512


class TokenError(ValueError):
    """The token is malformed, forged or expired; the message is safe to show the client."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: str, body: bytes) -> str:
    return _b64(hmac.new(secret.encode(), body, hashlib.sha256).digest()[:16])


def issue(session_id: str, secret: str, ttl_s: int, now: Optional[float] = None) -> str:
    expiry = int((time.time() if now is None else now) + ttl_s)
    body = f"{session_id}.{expiry}".encode()
    return f"{_b64(body)}.{_sign(secret, body)}"


def verify(token: object, secret: str, now: Optional[float] = None) -> str:
    """The session id the token was issued for, or TokenError."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise TokenError("resume_token must be a non-empty string")
    encoded, _, signature = token.partition(".")
    try:
        body = _unb64(encoded)
    except (ValueError, TypeError):
        raise TokenError("resume_token is malformed") from None
    # Bytes, not str: compare_digest refuses non-ASCII str (a TypeError, i.e. a 500, for any
    # client that sends one); encoded, a non-ASCII signature simply does not match.
    if not hmac.compare_digest(signature.encode("utf-8", "surrogatepass"), _sign(secret, body).encode()):
        raise TokenError("resume_token signature is invalid")
    session_id, _, expiry = body.decode(errors="replace").rpartition(".")
    if not session_id or not expiry.isdigit():
        raise TokenError("resume_token is malformed")
    if int(expiry) < (time.time() if now is None else now):
        raise TokenError("resume_token has expired")
    return session_id
