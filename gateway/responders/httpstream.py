"""Streaming HTTP for the network responders: deadlines, status checks, lines and chunks.

Every await on the network is bounded by the reply's `Deadline` (first delta, then the
whole reply), never by a timeout held across a `yield`: the time the loop spends speaking
between deltas is the loop's, and a cancelled turn is not mistaken for a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from abc import abstractmethod
from typing import Any, AsyncIterator, Awaitable, Optional, Sequence, TypeVar

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from ..dialog import Turn
from .base import Delta, Responder, ResponderError

ERROR_BODY_CHARS = 200  # of an error response, quoted in the ResponderError
NO_TIMEOUT = aiohttp.ClientTimeout(total=None)  # Deadline bounds every step instead

T = TypeVar("T")


def public_url(url: str) -> str:
    """The URL without credentials or query (a token may hide there): safe to log."""
    try:
        return str(URL(url).with_user(None).with_query(None).with_fragment(None))
    except (ValueError, TypeError):
        return "<invalid url>"


class Deadline:
    """When one reply must have produced its first delta, and when it must be complete."""

    def __init__(self, first_s: float, total_s: float) -> None:
        now = asyncio.get_running_loop().time()
        self.first_s, self.total_s = first_s, total_s
        self._first_at, self._total_at = now + first_s, now + max(first_s, total_s)
        self.started = False  # the first delta has arrived

    def at(self) -> float:
        return self._total_at if self.started else min(self._first_at, self._total_at)

    def describe(self) -> str:
        if self.started:
            return f"the reply took longer than {self.total_s:g} s"
        return f"no reply within {self.first_s:g} s"


async def within(deadline: Deadline, step: Awaitable[T], who: str) -> T:
    """Await one network step before the deadline; failures become ResponderError."""
    try:
        async with asyncio.timeout_at(deadline.at()):
            return await step
    except TimeoutError:
        raise ResponderError(f"{who}: {deadline.describe()}", "responder_timeout") from None
    except aiohttp.ClientPayloadError as exc:
        raise ResponderError(f"{who}: the reply was cut off ({_short(exc)})", "responder_bad_reply") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ResponderError(f"{who}: connection failed ({_short(exc)})", "responder_unreachable") from None


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:ERROR_BODY_CHARS]


async def post(http: aiohttp.ClientSession, url: str, payload: dict[str, Any], headers: dict[str, str],
               deadline: Deadline, who: str) -> aiohttp.ClientResponse:
    """POST JSON and wait for the response head; an error status becomes ResponderError."""
    response = await within(deadline, http.post(url, json=payload, headers=headers, timeout=NO_TIMEOUT), who)
    if response.status < 400:
        return response
    try:
        body = await within(deadline, response.content.read(4 * ERROR_BODY_CHARS), who)
    except ResponderError:
        body = b""
    finally:
        response.close()
    raise ResponderError(f"{who}: HTTP {response.status}{_detail(body)}{_hint(response.status)}",
                         "responder_http_error")


def _detail(body: bytes) -> str:
    """The useful part of an error body: an OpenAI-style error message, else its first characters."""
    text = body.decode("utf-8", "replace")
    try:
        error = json.loads(text).get("error")
        text = error.get("message", text) if isinstance(error, dict) else str(error or text)
    except (ValueError, AttributeError):
        pass
    text = " ".join(text.split())[:ERROR_BODY_CHARS]
    return f" ({text})" if text else ""


def _hint(status: int) -> str:
    return " - check the API key or token" if status in (401, 403) else ""


async def lines(response: aiohttp.ClientResponse, deadline: Deadline, who: str) -> AsyncIterator[str]:
    """The body's lines, decoded, without line endings, until the server ends it."""
    while True:
        try:
            raw = await within(deadline, response.content.readuntil(b"\n"), who)
        except (ValueError, HttpProcessingError):  # longer than aiohttp's read buffer (128 KiB)
            raise ResponderError(f"{who}: a line of the reply is too long", "responder_bad_reply") from None
        if not raw:
            return
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


async def chunks(response: aiohttp.ClientResponse, deadline: Deadline, who: str) -> AsyncIterator[bytes]:
    """The body as the server sends it, chunk by chunk."""
    while True:
        data, _ = await within(deadline, response.content.readchunk(), who)
        if not data:
            return
        yield data


def finish(response: Optional[aiohttp.ClientResponse], complete: bool) -> None:
    """Give the connection back for reuse after a complete body; otherwise close it at once."""
    if response is None:
        return
    if complete:
        response.release()
    else:
        response.close()


class HttpResponder(Responder):
    """A responder that talks to a server: it uses the gateway's shared ClientSession, or
    opens its own on first use and closes it in `aclose`."""

    def __init__(self, http: Optional[aiohttp.ClientSession], first_s: float, total_s: float) -> None:
        self._http, self._owns_http = http, http is None
        self.first_s, self.total_s = first_s, total_s

    def session(self) -> aiohttp.ClientSession:
        if self._http is None or (self._owns_http and self._http.closed):
            self._http = aiohttp.ClientSession()
        return self._http

    def deadline(self) -> Deadline:
        return Deadline(self.first_s, self.total_s)

    def bearer_headers(self, accept: str, token: str) -> dict[str, str]:
        headers = {"Accept": accept}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @abstractmethod
    def payload(self, history: Sequence[Turn]) -> dict[str, Any]:
        """The request body for this kind of server."""

    @abstractmethod
    def headers(self) -> dict[str, str]: ...

    @abstractmethod
    def reply_deltas(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        """The reply's deltas, read in this kind of server's format."""

    async def respond(self, history: Sequence[Turn]) -> AsyncIterator[Delta]:
        """POST the conversation, then relay the reply's deltas; the response is closed at once
        if the reply is cut short (cancelled, timed out), and reused after a complete one."""
        deadline = self.deadline()
        response, complete = None, False
        try:
            response = await post(self.session(), self.url, self.payload(history), self.headers(), deadline, self.who)
            async with contextlib.aclosing(self.reply_deltas(response, deadline)) as stream:
                async for delta in stream:
                    deadline.started = True
                    yield delta
            complete = True
        finally:
            finish(response, complete)

    async def aclose(self) -> None:
        if self._owns_http and self._http is not None:
            await self._http.close()
