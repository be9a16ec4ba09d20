"""Responders: who decides what Parley says. History in, text deltas (and actions) out.

    responder = make_responder(config, session_id=session_id, http=shared_client_session)
    async with contextlib.aclosing(responder.start()) as greeting: ...   # speaks first, maybe
    async with contextlib.aclosing(responder.respond(history)) as reply:
        async for delta in reply:       # str -> TTS; Handoff / EndCall -> act once the text before it has played
            ...
    await responder.aclose()            # at hang-up

A failure or timeout raises ResponderError (message and `code` fit an `error` event).
"""

from __future__ import annotations

import datetime as dt
from typing import Callable, Optional

import aiohttp

from ..config import Config
from .base import (Action, Delta, EndCall, Handoff, Responder, ResponderError, chat_messages,
                   collect, spoken_text)
from .echo import EchoResponder
from .flow import DEFAULT_FLOW, Flow, FlowError, cached_flow, load_flow
from .openai import OpenAIResponder
from .scripted import ScriptedResponder
from .webhook import WebhookResponder

__all__ = [
    "Action", "Delta", "EndCall", "Handoff", "Responder", "ResponderError", "chat_messages",
    "collect", "spoken_text", "EchoResponder", "ScriptedResponder", "OpenAIResponder", "WebhookResponder",
    "DEFAULT_FLOW", "Flow", "FlowError", "load_flow", "make_responder",
]


def make_responder(config: Config, *, session_id: str = "", http: Optional[aiohttp.ClientSession] = None,
                   today: Callable[[], dt.date] = dt.date.today, flow: Optional[str] = None) -> Responder:
    """A new responder for one call, of the kind config.responder names.

    `http`: a ClientSession to share between calls (connection reuse); without one, a network
    responder opens its own and closes it in `aclose`. `today` dates "tomorrow" (tests).
    `flow`: scripted: one of config.flows' names (a call token's flow) instead of flow_file;
    ValueError for a name config.flows does not have.
    """
    if config.responder == "echo":
        return EchoResponder()
    if config.responder == "openai":
        return OpenAIResponder(config.openai_base_url, config.openai_model, config.openai_api_key,
                               config.system_prompt, config.responder_timeout_s,
                               config.responder_total_timeout_s, http, config.openai_tools)
    if config.responder == "webhook":
        return WebhookResponder(config.webhook_url, session_id, config.webhook_token,
                                config.responder_timeout_s, config.responder_total_timeout_s, http)
    if config.responder == "scripted":
        if flow is not None:
            named = config.named_flows()
            if flow not in named:
                raise ValueError(f"flow {flow!r} is not in the flows setting ({', '.join(sorted(named)) or 'empty'})")
            return ScriptedResponder(cached_flow(named[flow]), today)
        return ScriptedResponder(cached_flow(config.flow_file or DEFAULT_FLOW), today)
    raise ValueError(f"unknown responder {config.responder!r}")  # Config.validate() prevents this
