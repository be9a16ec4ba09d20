"""Call tokens: short-lived, HMAC-signed permission to place calls from named web origins.

A site's backend holds an API key and asks the gateway for a token (POST /v1/tokens); the
site's page hands the token to the widget, which places the call with it. The token names
the origins (scheme, host and port, exactly) whose pages may use it, an expiry and
optionally a flow, so a token copied onto another site is refused there.

Format: "pct1." + base64url(JSON {"o": [origins], "exp": unix s, "f": flow|null, "n": nonce})
+ "." + base64url(HMAC-SHA256). The signing key is derived from the gateway secret with a
label of its own, so a resume token can never pass for a call token or the other way round.
Stateless: any node with the same secret verifies it. Never log one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Iterable, Optional
from urllib.parse import urlsplit

PREFIX = "pct1"
KEY_LABEL = b"parley call token v1"  # domain separation from resume tokens (same secret)
MAX_TOKEN_CHARS = 4096
MAX_ORIGINS = 16
MAX_ORIGIN_CHARS = 300
FLOW_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DEFAULT_PORTS = {"http": 80, "https": 443}


class OriginError(ValueError):
    """Not a web origin (scheme://host[:port]); the message says what is wrong."""


class CallTokenError(ValueError):
    """A token that must be refused; `code` is the API error code, the message is safe to show."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class CallGrant:
    """What a verified token allows."""

    origins: tuple[str, ...]  # normalized
    expires_at: int  # unix seconds
    flow: Optional[str]
    token_id: str  # the nonce: per-token rate limits count by it

    def allows_origin(self, origin: Optional[str]) -> bool:
        return origin_in(origin, self.origins)


def normalize_origin(text: str) -> str:
    """The canonical form of a web origin: lower-case scheme and host, the port only when it is
    not the scheme's default. Anything with a path, query, fragment, user or wildcard is
    refused: an origin is compared exactly, never as a prefix or a suffix."""
    if not isinstance(text, str) or not text or len(text) > MAX_ORIGIN_CHARS:
        raise OriginError("an origin must be a non-empty string of at most 300 characters")
    if any(c.isspace() for c in text) or "*" in text:
        raise OriginError(f"{text!r} is not an origin (no spaces or wildcards; name each origin exactly)")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise OriginError(f"{text!r} is not an origin ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise OriginError(f"{text!r} is not an origin: the scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise OriginError(f"{text!r} is not an origin: it carries a user name")
    if parts.path or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise OriginError(f"{text!r} is not an origin: write scheme://host[:port], without a path or a trailing /")
    host = (parts.hostname or "").lower()
    if not host or host.endswith("."):
        raise OriginError(f"{text!r} is not an origin: it has no host (or ends with a dot)")
    if ":" in host:  # IPv6, which urlsplit returns without its brackets
        host = f"[{host}]"
    if port is None or port == DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def origin_in(origin: Optional[str], allowed: Iterable[str]) -> bool:
    """Whether a request's Origin header names one of `allowed` (normalized origins) exactly.
    A missing, "null" or malformed Origin matches nothing."""
    if not origin:
        return False
    try:
        candidate = normalize_origin(origin)
    except OriginError:
        return False
    return any(hmac.compare_digest(candidate, known) for known in allowed)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signing_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), KEY_LABEL, hashlib.sha256).digest()


def _sign(secret: str, payload: str) -> str:
    return _b64(hmac.new(_signing_key(secret), f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest())


def issue(origins: Iterable[str], ttl_s: int, secret: str, flow: Optional[str] = None,
          now: Optional[float] = None) -> tuple[str, int]:
    """A signed token for `origins` (normalized here) and its expiry in unix seconds."""
    normalized = sorted({normalize_origin(origin) for origin in origins})
    if not 1 <= len(normalized) <= MAX_ORIGINS:
        raise OriginError(f"a token names 1 to {MAX_ORIGINS} origins")
    if flow is not None and not FLOW_PATTERN.fullmatch(flow):
        raise ValueError("a flow is 1-64 letters, digits, '_', '.' or '-'")
    expires_at = int((time.time() if now is None else now) + ttl_s)
    body = {"o": normalized, "exp": expires_at, "f": flow, "n": secrets.token_hex(8)}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{PREFIX}.{payload}.{_sign(secret, payload)}", expires_at


def verify(token: object, secret: str, now: Optional[float] = None) -> CallGrant:
    """What the token allows, or CallTokenError (invalid_token: malformed or forged;
    token_expired: genuine but past its expiry)."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise CallTokenError("invalid_token", f"a call token is a non-empty string of at most {MAX_TOKEN_CHARS} characters")
    prefix, _, rest = token.partition(".")
    payload, _, signature = rest.partition(".")
    if prefix != PREFIX or not payload or not signature:
        raise CallTokenError("invalid_token", "the call token is malformed")
    # The signature first: nothing in an unsigned payload is read.
    if not hmac.compare_digest(signature.encode(), _sign(secret, payload).encode()):
        raise CallTokenError("invalid_token", "the call token's signature is invalid")
    try:
        body = json.loads(_unb64(payload))
        grant = CallGrant(tuple(body["o"]), int(body["exp"]), body["f"], str(body["n"]))
    except (ValueError, TypeError, KeyError):
        raise CallTokenError("invalid_token", "the call token is malformed") from None
    if grant.expires_at <= (time.time() if now is None else now):
        raise CallTokenError("token_expired", "the call token has expired; ask the site for a new one")
    return grant
