"""The webhook responder: your own service decides what to say.

Parley POSTs the conversation as JSON:

    {"session_id": "...",
     "messages": [{"role": "user", "content": "where is my order"},
                  {"role": "assistant", "content": "Sure, what's the", "interrupted": true}]}

(an interrupted assistant turn carries only what the caller heard), and speaks the reply
as it streams back, by its Content-Type:

- `text/plain` (or any text/*): every chunk is spoken as it arrives.
- `application/x-ndjson`: one JSON object a line, `{"text": "..."}` to speak,
  `{"action": "handoff", "reason": "..."}` or `{"action": "end_call"}` to act.
- `application/json`: one such object, the whole reply.
- `204 No Content`: nothing to say.
"""

from __future__ import annotations

import codecs
import contextlib
import json
from typing import Any, AsyncIterator, Optional, Sequence

import aiohttp

from ..dialog import Turn
from .base import Delta, EndCall, Handoff, ResponderError, spoken_text
from .httpstream import Deadline, HttpResponder, chunks, lines, public_url, within

NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/jsonlines", "application/ndjson")
ACTIONS = {"handoff": Handoff, "end_call": EndCall}


def webhook_messages(history: Sequence[Turn]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in history:
        message: dict[str, Any] = {"role": turn.role, "content": spoken_text(turn)}
        if turn.role == "assistant" and turn.heard_text is not None and turn.heard_text != turn.text:
            message["interrupted"] = True
        messages.append(message)
    return messages


def record_deltas(record: Any, who: str) -> list[Delta]:
    """The deltas of one JSON record: {"text": ...} and/or {"action": ..., "reason": ...}."""
    if not isinstance(record, dict):
        raise ResponderError(f"{who}: each JSON record must be an object", "responder_bad_reply")
    deltas: list[Delta] = []
    text, action, reason = record.get("text"), record.get("action"), record.get("reason", "")
    if text is not None:
        if not isinstance(text, str):
            raise ResponderError(f"{who}: \"text\" must be a string", "responder_bad_reply")
        if text:
            deltas.append(text)
    if action is not None:
        if action not in ACTIONS:
            raise ResponderError(f"{who}: unknown action {str(action)[:40]!r} (known: {', '.join(ACTIONS)})",
                                 "responder_bad_reply")
        deltas.append(ACTIONS[action](str(reason)))
    return deltas


def _parse_record(line: str, who: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        raise ResponderError(f"{who}: malformed JSON in the reply", "responder_bad_reply") from None


class WebhookResponder(HttpResponder):
    name = "webhook"

    def __init__(self, url: str, session_id: str = "", token: str = "", first_s: float = 5.0,
                 total_s: float = 60.0, http: Optional[aiohttp.ClientSession] = None) -> None:
        super().__init__(http, first_s, total_s)
        self.url, self.session_id = url, session_id
        self._token = token  # sent, never logged or put in an error
        self.who = f"webhook responder ({public_url(url)})"

    def headers(self) -> dict[str, str]:
        return self.bearer_headers("text/plain, application/x-ndjson, application/json", self._token)

    def payload(self, history: Sequence[Turn]) -> dict[str, Any]:
        return {"session_id": self.session_id, "messages": webhook_messages(history)}

    def reply_deltas(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        if response.status == 204:
            return _nothing()
        if response.content_type in NDJSON_TYPES:
            return self._ndjson(response, deadline)
        if response.content_type == "application/json":
            return self._json(response, deadline)
        if response.content_type.startswith("text/") or response.content_type == "application/octet-stream":
            return self._text(response, deadline)
        raise ResponderError(f"{self.who}: unsupported Content-Type {response.content_type[:60]!r}",
                             "responder_bad_reply")

    async def _text(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        decoder = _decoder(response.charset)
        async with contextlib.aclosing(chunks(response, deadline, self.who)) as stream:
            async for data in stream:
                text = decoder.decode(data)  # a character split across chunks waits for its rest
                if text:
                    yield text
        if tail := decoder.decode(b"", final=True):
            yield tail

    async def _ndjson(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(lines(response, deadline, self.who)) as stream:
            async for line in stream:
                if line.strip():
                    for delta in record_deltas(_parse_record(line, self.who), self.who):
                        yield delta

    async def _json(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        body = await within(deadline, response.text(), self.who)
        for delta in record_deltas(_parse_record(body, self.who), self.who):
            yield delta


def _decoder(charset: Optional[str]) -> codecs.IncrementalDecoder:
    try:
        return codecs.getincrementaldecoder(charset or "utf-8")("replace")
    except LookupError:  # a charset Python does not know: read it as UTF-8
        return codecs.getincrementaldecoder("utf-8")("replace")


async def _nothing() -> AsyncIterator[Delta]:
    return
    yield  # pragma: no cover - makes this an async generator
