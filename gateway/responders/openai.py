"""The LLM responder: any OpenAI-compatible Chat Completions endpoint, streamed.

POST {base_url}/chat/completions with `stream: true`; the reply is Server-Sent Events,
`data: {json chunk}` lines whose `choices[0].delta.content` are the text deltas, ended by
`data: [DONE]`. Works with OpenAI, vLLM, llama.cpp's server, Ollama and the like. A server
that ignores `stream` and answers one JSON completion is accepted too.

The model is offered two tools (TOOLS, unless openai_tools is off): `transfer_to_human`,
which becomes a Handoff (a SIP call is REFERred to sip_transfer_target), and `end_call`, an
EndCall. Their streamed fragments (`delta.tool_calls`) are joined by index and the action
follows the reply's text, as the webhook's actions do. A server without tool support (vLLM
without --enable-auto-tool-choice) answers 400 to a request with tools: set openai_tools off.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Optional, Sequence

import aiohttp

from ..dialog import Turn
from .base import Action, Delta, EndCall, Handoff, ResponderError, chat_messages
from .httpstream import Deadline, HttpResponder, lines, public_url, within

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant on a phone call. Your words are spoken aloud: answer "
    "in one to three short, plain sentences, without lists, markdown, emoji or URLs.")
DONE = "[DONE]"
TOOLS = [
    {"type": "function", "function": {
        "name": "transfer_to_human",
        "description": "Hand the caller over to a human agent: when they ask for a person, or when you "
                       "cannot help. Say one short sentence before calling it.",
        "parameters": {"type": "object", "properties": {
            "reason": {"type": "string", "description": "why, in a few words"}}, "required": []}}},
    {"type": "function", "function": {
        "name": "end_call",
        "description": "Hang up once the caller is done. Say goodbye before calling it.",
        "parameters": {"type": "object", "properties": {
            "reason": {"type": "string", "description": "why, in a few words"}}, "required": []}}},
]
TOOL_ACTIONS = {"transfer_to_human": Handoff, "end_call": EndCall}
MAX_REASON_CHARS = 200


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
    text, finished, _ = chunk_parts(data, who)
    return text, finished


def chunk_parts(data: str, who: str) -> tuple[str, bool, list]:
    """(text, finished, tool-call fragments) of one streamed chunk (or of a whole completion)."""
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
        return "", False, []
    delta = choices[0].get("delta") or choices[0].get("message") or {}
    text = delta.get("content") if isinstance(delta, dict) else None
    if text is not None and not isinstance(text, str):
        raise ResponderError(f"{who}: malformed stream chunk (content is not text)", "responder_bad_reply")
    calls = (delta.get("tool_calls") if isinstance(delta, dict) else None) or []
    if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
        raise ResponderError(f"{who}: malformed stream chunk (bad tool_calls)", "responder_bad_reply")
    return text or "", choices[0].get("finish_reason") is not None, calls


class ToolCalls:
    """A reply's tool calls, streamed in fragments (name first, arguments in pieces) joined by index."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._calls: dict[int, dict[str, str]] = {}

    def feed(self, fragments: list) -> None:
        for position, fragment in enumerate(fragments):
            index = fragment.get("index", position)
            function = fragment.get("function") or {}
            if not isinstance(index, int) or not isinstance(function, dict):
                raise ResponderError(f"{self.who}: malformed tool call", "responder_bad_reply")
            call = self._calls.setdefault(index, {"name": "", "arguments": ""})
            call["name"] += str(function.get("name") or "")
            call["arguments"] += str(function.get("arguments") or "")

    def action(self) -> Optional[Action]:
        """The first call as an action (one per reply, as from the webhook); None without calls."""
        if not self._calls:
            return None
        call = self._calls[min(self._calls)]
        kind = TOOL_ACTIONS.get(call["name"])
        if kind is None:
            raise ResponderError(f"{self.who}: the model called an unknown tool {call['name'][:40]!r}",
                                 "responder_bad_reply")
        try:
            arguments = json.loads(call["arguments"] or "{}")
        except ValueError:
            raise ResponderError(f"{self.who}: the arguments of {call['name']} are not JSON", "responder_bad_reply") from None
        reason = arguments.get("reason", "") if isinstance(arguments, dict) else ""
        return kind(reason=" ".join(str(reason).split())[:MAX_REASON_CHARS])


def _error_message(error: Any) -> str:
    message = error.get("message", "") if isinstance(error, dict) else str(error)
    return " ".join(str(message).split())[:200] or "no message"


class OpenAIResponder(HttpResponder):
    name = "openai"

    def __init__(self, base_url: str, model: str, api_key: str = "", system_prompt: str = "",
                 first_s: float = 5.0, total_s: float = 60.0,
                 http: Optional[aiohttp.ClientSession] = None, tools: bool = True) -> None:
        super().__init__(http, first_s, total_s)
        self.tools = tools
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.system_prompt = model, system_prompt or DEFAULT_SYSTEM_PROMPT
        self._api_key = api_key  # sent, never logged or put in an error
        self.who = f"openai responder ({public_url(self.url)})"

    def payload(self, history: Sequence[Turn]) -> dict[str, Any]:
        messages = [{"role": "system", "content": self.system_prompt}, *chat_messages(history)]
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True}
        if self.tools:
            payload["tools"] = TOOLS
        return payload

    def headers(self) -> dict[str, str]:
        return self.bearer_headers("text/event-stream", self._api_key)

    async def reply_deltas(self, response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[Delta]:
        calls = ToolCalls(self.who)
        if response.content_type == "application/json":  # the server ignored stream: true
            text, _, fragments = chunk_parts(await within(deadline, response.text(), self.who), self.who)
            calls.feed(fragments)
            if text:
                yield text
        else:
            async with contextlib.aclosing(self._stream(response, deadline, calls)) as stream:
                async for text in stream:
                    yield text
        action = calls.action()
        if action is not None:
            yield action

    async def _stream(self, response: aiohttp.ClientResponse, deadline: Deadline, calls: ToolCalls) -> AsyncIterator[str]:
        events, finished = SseEvents(), False
        async with contextlib.aclosing(lines(response, deadline, self.who)) as stream:
            async for line in stream:
                data = events.feed(line)
                if data is None:
                    continue
                if data.strip() == DONE:
                    return
                text, done, fragments = chunk_parts(data, self.who)
                calls.feed(fragments)
                finished = finished or done
                if text:
                    yield text
        data = events.flush()  # the server closed without the blank line after its last event
        if data is not None and data.strip() == DONE:
            return
        if data is not None:
            text, done, fragments = chunk_parts(data, self.who)
            calls.feed(fragments)
            finished = finished or done
            if text:
                yield text
        if not finished:
            raise ResponderError(f"{self.who}: the stream ended before the reply was complete",
                                 "responder_bad_reply")
