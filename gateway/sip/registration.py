"""Registering with a PBX (RFC 3261 section 10) so that it routes calls for Parley's
extension here, with HTTP digest authentication (RFC 8760's MD5, qop=auth, RFC 2617).

The registration is refreshed at half of what the registrar granted; a failure is logged
and retried after RETRY_S, so a PBX that restarts gets Parley back by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from typing import TYPE_CHECKING, Optional

from .dialog import USER_AGENT, new_tag
from .message import Request, Response, address_uri
from .transaction import Address, TransactionTimeout, new_branch

if TYPE_CHECKING:
    from ..config import Config
    from .agent import SipAgent

log = logging.getLogger("parley.sip.register")

RETRY_S = 30.0  # after a failed registration
DEFAULT_SIP_PORT = 5060


class DigestError(ValueError):
    """A challenge Parley cannot answer (an unknown algorithm or qop)."""


def parse_challenge(header: str) -> dict[str, str]:
    """`Digest realm="x", nonce="y", qop="auth"` -> {"realm": "x", "nonce": "y", "qop": "auth"}."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "digest":
        raise DigestError(f"authentication scheme {scheme!r} is not Digest")
    fields, current, quoted = [], [], False
    for ch in rest:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    fields.append("".join(current))
    out = {}
    for item in fields:
        name, sep, value = item.strip().partition("=")
        if sep:
            out[name.strip().lower()] = value.strip().strip('"')
    return out


def digest_authorization(challenge: dict[str, str], method: str, uri: str, username: str, password: str,
                         cnonce: Optional[str] = None, nc: int = 1) -> str:
    """The Authorization header value answering `challenge` (RFC 2617 section 3.2.2)."""
    algorithm = challenge.get("algorithm", "MD5")
    if algorithm.upper() != "MD5":
        raise DigestError(f"digest algorithm {algorithm!r} is not supported (MD5 only)")
    realm, nonce = challenge.get("realm", ""), challenge.get("nonce", "")
    md5 = lambda text: hashlib.md5(text.encode()).hexdigest()  # noqa: E731 - the RFC's H()
    ha1 = md5(f"{username}:{realm}:{password}")
    ha2 = md5(f"{method}:{uri}")
    fields = [f'username="{username}"', f'realm="{realm}"', f'nonce="{nonce}"', f'uri="{uri}"', "algorithm=MD5"]
    qops = [q.strip() for q in challenge.get("qop", "").split(",") if q.strip()]
    if qops:
        if "auth" not in qops:
            raise DigestError(f"digest qop {challenge['qop']!r} is not supported (auth only)")
        cnonce = cnonce or secrets.token_hex(8)
        count = f"{nc:08x}"
        response = md5(f"{ha1}:{nonce}:{count}:{cnonce}:auth:{ha2}")
        fields += [f"response=\"{response}\"", "qop=auth", f"nc={count}", f'cnonce="{cnonce}"']
    else:
        fields.append(f'response="{md5(f"{ha1}:{nonce}:{ha2}")}"')
    if "opaque" in challenge:
        fields.append(f'opaque="{challenge["opaque"]}"')
    return "Digest " + ", ".join(fields)


def registrar_address(uri: str) -> Address:
    """sip:pbx.example.com:5070 -> ("pbx.example.com", 5070)."""
    hostport = address_uri(uri).split(":", 1)[1].split(";")[0].split("@")[-1]
    host, _, port = hostport.partition(":")
    return host, int(port) if port.isdigit() else DEFAULT_SIP_PORT


class Registration:
    def __init__(self, agent: "SipAgent", config: "Config") -> None:
        self.agent = agent
        self.registrar = config.sip_registrar
        self.username, self.password = config.sip_username, config.sip_password
        self.expires_s = config.sip_register_expires_s
        self.destination = registrar_address(self.registrar)
        self._call_id = secrets.token_hex(12) + "@parley"
        self._tag = new_tag()
        self._cseq = 0
        self.registered = asyncio.Event()
        self.granted_s: Optional[int] = None
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                self.granted_s = await self.register(self.expires_s)
                self.registered.set()
                log.info("registered", extra={"registrar": self.registrar, "expires_s": self.granted_s})
                await asyncio.sleep(max(self.granted_s / 2, 1.0))
            except (TransactionTimeout, DigestError, RegistrationRefused) as exc:
                self.registered.clear()
                log.warning("registration failed", extra={"registrar": self.registrar, "error": str(exc)})
                await asyncio.sleep(RETRY_S)

    async def register(self, expires_s: int) -> int:
        """One REGISTER (answering one digest challenge); the lifetime granted, in seconds."""
        response = await self._send(expires_s, None)
        if response.status in (401, 407):
            header = response.headers.get("www-authenticate" if response.status == 401 else "proxy-authenticate")
            authorization = digest_authorization(parse_challenge(header or ""), "REGISTER", self.registrar,
                                                 self.username, self.password)
            name = "Authorization" if response.status == 401 else "Proxy-Authorization"
            response = await self._send(expires_s, (name, authorization))
        if not 200 <= response.status < 300:
            raise RegistrationRefused(f"{response.status} {response.reason}")
        contact_expires = response.headers.get("expires") or str(expires_s)
        return int(contact_expires) if contact_expires.isdigit() else expires_s

    async def _send(self, expires_s: int, authorization: Optional[tuple[str, str]]) -> Response:
        self._cseq += 1
        aor = f"<sip:{self.username}@{self.destination[0]}>"
        request = Request(method="REGISTER", uri=self.registrar)
        request.headers.add("via", f"SIP/2.0/UDP {self.agent.sent_by(self.destination)};branch={new_branch()};rport")
        for name, value in (("max-forwards", "70"), ("from", f"{aor};tag={self._tag}"), ("to", aor),
                            ("call-id", self._call_id), ("cseq", f"{self._cseq} REGISTER"),
                            ("contact", f"<sip:{self.username}@{self.agent.sent_by(self.destination)}>"),
                            ("expires", str(expires_s)), ("user-agent", USER_AGENT)):
            request.headers.add(name, value)
        if authorization is not None:
            request.headers.add(*authorization)
        return await self.agent.transactions.request(request, self.destination)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.registered.is_set():  # unregister, so the PBX stops sending calls here
            self.registered.clear()  # (once: a second stop() does not unregister again)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.register(0), 2.0)


class RegistrationRefused(Exception):
    pass
