"""Who may place calls: API keys, call tokens, origin checks, CORS and rate limits.

Open mode (no API keys, the embedded default): anyone who reaches the gateway may call, as
before; with no allowed_origins, any page may, too.

With API keys:
- a site's backend trades its key for a call token: POST /v1/tokens, Authorization: Bearer
  KEY, JSON {"origins": [...], "ttl_s": 300, "flow": optional} -> 201 {"token", "expires_at"};
- a page places a call with Authorization: Bearer TOKEN, and its Origin must be one the token
  names (403 origin_not_allowed otherwise); a server may use its API key instead of a token,
  unbound to any origin; a resume is admitted by its resume token, which the gateway gave the
  call it resumes (so a reconnect works after the call token has expired);
- calls are rate limited per token and per client IP (429 with Retry-After); behind reverse
  proxies listed in trusted_proxies, the client IP is read from X-Forwarded-For
  (gateway/client_ip.py), never otherwise;
- a token may name a flow (one of the `flows` setting's names, checked when it is issued):
  the call it places runs that scripted flow, and so does every resume of its session.

CORS: browsers may call the signaling API only from allowed_origins (open mode without
any: from anywhere). Preflights from other origins get 403 origin_not_allowed; the static
files (the widget and its modules) are public and readable from any origin.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from . import call_tokens
from .api_keys import ApiKeys
from .client_ip import client_address, parse_networks
from .config import Config
from .errors import ApiError, error_response
from .rate_limit import RateLimiter

log = logging.getLogger("parley.access")

DEFAULT_TOKEN_TTL_S = 300
CALL_PATHS = ("/v1/calls", "/v1/whip")  # and their /{id} children, for DELETE
PREFLIGHT_MAX_AGE_S = 600
TOKEN_REQUEST_FIELDS = {"origins", "ttl_s", "flow"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bearer(request: web.Request) -> Optional[str]:
    """The credential of an `Authorization: Bearer X` header, or None without one."""
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    return credential.strip() or None if scheme.lower() == "bearer" else None


def is_call_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in CALL_PATHS)


class CallAccess:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.keys = ApiKeys(config.api_keys, config.api_keys_file)
        self.allowed_origins = tuple(call_tokens.normalize_origin(o) for o in config.allowed_origins)
        self.per_token = RateLimiter(config.rate_limit_per_token)
        self.per_ip = RateLimiter(config.rate_limit_per_ip)
        self.trusted_proxies = parse_networks(config.trusted_proxies)
        self.flows = config.named_flows()

    @property
    def open(self) -> bool:
        return not self.keys.configured

    def log_mode(self) -> None:
        if self.open:
            log.warning("open mode: no API keys configured (api_keys, api_keys_file), so anyone who can reach "
                        "this gateway may place calls, from %s",
                        "any web page" if not self.allowed_origins else ", ".join(self.allowed_origins))
        elif not self.allowed_origins:
            log.warning("API keys configured but allowed_origins is empty: no web page may place calls, "
                        "and POST /v1/tokens refuses every origin; servers may still call with an API key")
        else:
            log.info("calls need a call token or an API key", extra={"api_keys": len(self.keys),
                                                                      "allowed_origins": list(self.allowed_origins)})

    # -- CORS -------------------------------------------------------------------------------

    def cors_allows(self, origin: str) -> bool:
        if self.open and not self.allowed_origins:
            try:
                call_tokens.normalize_origin(origin)
                return True
            except call_tokens.OriginError:
                return False
        return call_tokens.origin_in(origin, self.allowed_origins)

    @web.middleware
    async def cors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.path.startswith("/static/"):
            response = await handler(request)
            response.headers["Access-Control-Allow-Origin"] = "*"  # public files: the widget and its modules
            return response
        if not is_call_path(request.path) or origin is None:
            return await handler(request)
        allowed = self.cors_allows(origin)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not allowed:
                return error_response(403, "origin_not_allowed",
                                      f"pages on {origin} may not place calls on this gateway (allowed_origins)")
            return web.Response(status=204, headers={
                **self._cors_headers(origin),
                "Access-Control-Allow-Methods": "POST, DELETE",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            })
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a redirect from a draining node must be readable too
            if allowed:
                exc.headers.update(self._cors_headers(origin))
            raise
        if allowed:
            response.headers.update(self._cors_headers(origin))
        return response

    @staticmethod
    def _cors_headers(origin: str) -> dict[str, str]:
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Expose-Headers": "Location, Retry-After"}

    # -- placing calls ----------------------------------------------------------------------

    def client_ip(self, request: web.Request) -> str:
        """The caller's address: the peer's, or X-Forwarded-For's behind a trusted proxy."""
        return client_address(request.remote, request.headers.getall("X-Forwarded-For", []), self.trusted_proxies)

    def admit_call(self, request: web.Request, resuming: bool) -> Optional[str]:
        """The flow the call is to run (None: the default), or ApiError unless this request may
        place a call (a resume's token was checked already; its session keeps its flow)."""
        if self.open:
            return None
        self._limit(self.per_ip, f"ip:{self.client_ip(request)}", "too many calls from this address")
        if resuming:
            return None
        credential = bearer(request)
        if credential is None:
            raise ApiError(401, "unauthorized", "this gateway needs a call token: Authorization: Bearer <token> "
                                                "(a site gets one from POST /v1/tokens)", {"WWW-Authenticate": "Bearer"})
        if self.keys.accepts(credential):
            return None  # a server with the key itself, bound to no origin
        try:
            grant = call_tokens.verify(credential, self.config.secret)
        except call_tokens.CallTokenError as exc:
            raise ApiError(401, exc.code, str(exc), {"WWW-Authenticate": "Bearer"}) from None
        origin = request.headers.get("Origin")
        if not grant.allows_origin(origin):
            where = f"pages on {origin}" if origin else "requests without an Origin header"
            raise ApiError(403, "origin_not_allowed", f"this call token is not valid for {where}")
        if grant.flow is not None and grant.flow not in self.flows:  # issued by a node configured otherwise
            raise ApiError(403, "unknown_flow", f"this call token names the flow {grant.flow!r}, "
                                                f"which this gateway does not offer ({self._flows_offered()})")
        self._limit(self.per_token, f"token:{grant.token_id}", "too many calls with this token")
        return grant.flow

    def _limit(self, limiter: RateLimiter, key: str, message: str) -> None:
        wait_s = limiter.take(key)
        if wait_s > 0:
            raise ApiError(429, "rate_limited", f"{message}; try again in {math.ceil(wait_s)} s",
                           {"Retry-After": str(math.ceil(wait_s))})

    # -- issuing tokens ---------------------------------------------------------------------

    async def issue_token(self, request: web.Request) -> web.Response:
        """POST /v1/tokens: a site's backend trades its API key for a call token."""
        if self.open:
            raise ApiError(404, "no_api_keys", "this gateway has no API keys (open mode): calls need no token")
        credential = bearer(request)
        if credential is None or not self.keys.accepts(credential):
            raise ApiError(401, "invalid_api_key", "POST /v1/tokens needs Authorization: Bearer <API key>"
                           if credential is None else "the API key is not valid", {"WWW-Authenticate": "Bearer"})
        origins, ttl_s, flow = self._token_request(await self._json_body(request))
        token, expires_at = call_tokens.issue(origins, ttl_s, self.config.secret, flow)
        return web.json_response({"token": token, "expires_at": expires_at}, status=201)

    @staticmethod
    async def _json_body(request: web.Request) -> dict[str, Any]:
        from .app import decode_text, read_body  # the body limits every endpoint shares

        try:
            payload = json.loads(decode_text(await read_body(request, "application/json")))
        except ValueError:
            raise ApiError(400, "invalid_json", "body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise ApiError(400, "invalid_json", "body must be a JSON object")
        return payload

    def _token_request(self, payload: dict[str, Any]) -> tuple[list[str], int, Optional[str]]:
        unknown = sorted(set(payload) - TOKEN_REQUEST_FIELDS)
        if unknown:
            raise ApiError(400, "invalid_token_request", f"unknown field {unknown[0]!r} (known: origins, ttl_s, flow)")
        origins = payload.get("origins")
        if not isinstance(origins, list) or not 1 <= len(origins) <= call_tokens.MAX_ORIGINS:
            raise ApiError(400, "invalid_token_request",
                           f"'origins' must be a list of 1 to {call_tokens.MAX_ORIGINS} origins")
        normalized = []
        for origin in origins:
            try:
                normalized.append(call_tokens.normalize_origin(origin))
            except call_tokens.OriginError as exc:
                raise ApiError(400, "invalid_origin", str(exc)) from None
            if normalized[-1] not in self.allowed_origins:
                raise ApiError(403, "origin_not_allowed",
                               f"{normalized[-1]} is not in this gateway's allowed_origins (PARLEY_ALLOWED_ORIGINS)")
        ttl_s = payload.get("ttl_s", DEFAULT_TOKEN_TTL_S)
        if not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or not 1 <= ttl_s <= self.config.call_token_max_ttl_s:
            raise ApiError(400, "invalid_ttl", f"'ttl_s' must be an integer from 1 to {self.config.call_token_max_ttl_s}")
        flow = payload.get("flow")
        if flow is not None and (not isinstance(flow, str) or not call_tokens.FLOW_PATTERN.fullmatch(flow)):
            raise ApiError(400, "invalid_flow", "'flow' must be 1-64 letters, digits, '_', '.' or '-'")
        if flow is not None and flow not in self.flows:
            raise ApiError(400, "unknown_flow", f"'flow': {flow!r} is not a flow this gateway offers "
                                                f"({self._flows_offered()})")
        return normalized, ttl_s, flow

    def _flows_offered(self) -> str:
        if not self.flows:
            return "it offers none: its operator names flows in the flows setting, PARLEY_FLOWS=NAME=FILE"
        return "flows: " + ", ".join(sorted(self.flows))
