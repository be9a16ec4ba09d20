"""The LLM responder: any OpenAI-compatible Chat Completions endpoint, streamed.

POST {base_url}/chat/completions with `stream: true`; the reply is Server-Sent Events,
`data: {json chunk}` lines whose `choices[0].delta.content` are the text deltas, ended by
`data: [DONE]`. Works with OpenAI, vLLM, llama.cpp's server, Ollama and the like. A server
that ignores `stream` and answers one JSON completion is accepted too.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Optional, Sequence

import aiohttp

from ..dialog import Turn
from .base import Delta, ResponderError, chat_messages
from .httpstream import Deadline, HttpResponder, lines, public_url, within

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant on a phone call. Your words are spoken aloud: answer "
    "in one to three short, plain sentences, without lists, markdown, emoji or URLs.")
DONE = "[DONE]"


class SseEvents:
    """Server-Sent Events: feed lines, get each event's data (multi-line data joined by newlines)."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> Optional[str]:
        if not line:  # a blank line dispatches the event
            return self.flush()
        if line.startswith(":"):  # a comment (keep-alive)
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None  # event:, id:, retry: do not matter here

    def flush(self) -> Optional[str]:
        data, self._data = self._data, []
        return "\n".join(data) if data else None


def chunk_delta(data: str, who: str) -> tuple[str, bool]:
    """(text, finished) of one streamed chunk; ResponderError for a malformed or error chunk."""
    try:
        chunk = json.loads(data)
    except ValueError:
        raise ResponderError(f"{who}: malformed stream chunk (not JSON)", "responder_bad_reply") from None
    if not isinstance(chunk, dict):
        raise ResponderError(f"{who}: malformed stream chunk (not an object)", "responder_bad_reply")
    if chunk.get("error"):
        raise ResponderError(f"{who}: the server failed mid-reply ({_error_message(chunk['error'])})",
                             "responder_http_error")
    choices = chunk.get("choices") or []  # a usage-only chunk has none
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        raise ResponderError(f"{who}: malformed stream chunk (bad choices)", "responder_bad_reply")
    if not choices:
        return "", False
    delta = choices[0].get("delta") or choices[0].get("message") or {}
    text = delta.get("content") if isinstance(delta, dict) else None
    if text is not None and not isinstance(text, str):
        raise ResponderError(f"{who}: malformed stream chunk (content is not text)", "responder_bad_reply")
    return text or "", choices[0].get("finish_reason") is not None


def _error_message(error: Any) -> str:
    message = error.get("message", "") if isinstance(error, dict) else str(error)
    return " ".join(str(message).split())[:200] or "no message"


class OpenAIResponder(HttpResponder):
    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str = "", system_prompt: str = "",
                 first_s: float = 5.0, total_s: float = 60.0,
                 http: Optional[aiohttp.ClientSession] = None) -> None:
        super().__init__(http, first_s, total_s)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.system_prompt = model, system_prompt or DEFAULT_SYSTEM_PROMPT
        self._api_key = api_key  # sent, never logged or put in an error
        self.who = f"openai responder ({public_url(self.url)})"

    def payload(self, history: Sequence[Turn]) -> dict[str, Any]:
        messages = [{"role": "system", "content": self.system_prompt}, *chat_messages(history)]
        return {"model": self.model, "messages": messages, "stream": True}

    def headers(self) -> dict[str, str]:
        return self.bearer_headers("text/event-stream", self._api_key)

    async def reply_deltas(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        if response.content_type == "application/json":  # the server ignored stream: true
            text, _ = chunk_delta(await within(deadline, response.text(), self.who), self.who)
            if text:
                yield text
            return
        async with contextlib.aclosing(self._stream(response, deadline)) as stream:
            async for text in stream:
                yield text

    async def _stream(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[str]:
        events, finished = SseEvents(), False
        async with contextlib.aclosing(lines(response, deadline, self.who)) as stream:
            async for line in stream:
                data = events.feed(line)
                if data is None:
                    continue
                if data.strip() == DONE:
                    return
                text, done = chunk_delta(data, self.who)
                finished = finished or done
                if text:
                    yield text
        data = events.flush()  # the server closed without the blank line after its last event
        if data is not None and data.strip() == DONE:
            return
        if data is not None:
            text, done = chunk_delta(data, self.who)
            finished = finished or done
            if text:
                yield text
        if not finished:
            raise ResponderError(f"{self.who}: the stream ended before the reply was complete",
                                 "responder_bad_reply")
