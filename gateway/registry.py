"""The node's live calls: admission, one session per call, draining and migration.

The HTTP handlers (gateway/app.py) and the SIP agent (gateway/sip/agent.py) both open calls
through a CallRegistry; it owns the session keeper, the node registry and the metrics, and
builds each call's mode (echo test, transcribe or conversation) on the speech engine.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Optional

from . import tokens
from .call import Call, ModeFactory, echo_test_mode
from .config import ENGINE_MODES, Config
from .conversation import Conversation
from .engine_host import EngineHost
from .errors import ApiError
from .events import EventChannel
from .keeper import LiveSession, SessionBusy, SessionKeeper
from .logs import CallLogger
from .loop_monitor import LoopLagMonitor
from .metrics import Metrics
from .nodes import NodeRegistry, NodeStatus
from .recording import CallRecording
from .responders import Responder, make_responder
from .sessions import SessionNotFound, SessionRecord, StoreUnavailable, open_store
from .transcribe import Transcribe

log = logging.getLogger("parley.app")  # (the name operators' log filters already use for drain lines)

DRAIN_POLL_S = 0.1  # how often a drain checks whether the last call has ended


class CallRegistry:
    """Live calls, with a slot reserved before any await so max_sessions holds under bursts.

    Each call drives one session; the keeper holds the session's state and lease, and a
    resumed session replaces the call that drove it before (on this node or another).
    """

    def __init__(self, config: Config, engine: Optional[EngineHost] = None) -> None:
        self.config = config
        self.engine = engine
        self.calls: dict[str, Call] = {}
        self.by_session: dict[str, Call] = {}
        # A session is kept as long as a resume token could bring its caller back
        store = open_store(config.redis_url or None, config.resume_token_ttl_s)
        self.keeper = SessionKeeper(store, config.node_id, config.lease_ttl_s,
                                    allow_new_without_store=config.new_calls_without_redis == "accept",
                                    session_ttl_s=config.resume_token_ttl_s)
        self.keeper.on_lease_lost = self._taken_over
        self.nodes = NodeRegistry(config.redis_url or None, heartbeat_s=config.lease_ttl_s / 3)
        self._reserved = 0
        self.draining = False
        self.drain_task: Optional[asyncio.Task] = None
        self.loop_lag = LoopLagMonitor()
        self.metrics = Metrics()
        self.metrics.active_sessions.set_function(lambda: self.active)
        self.metrics.draining.set_function(lambda: int(self.draining))
        if engine is not None:
            self.metrics.registry.register(engine)

    @property
    def active(self) -> int:
        return len(self.calls) + self._reserved

    @property
    def full(self) -> bool:
        return self.active >= self.config.max_sessions

    def reserve(self) -> None:
        if self.full:
            raise ApiError(429, "too_many_sessions",
                           f"this node is at its limit of {self.config.max_sessions} sessions",
                           {"Retry-After": str(self.config.retry_after_s)})
        if self.engine is not None:
            admit, retry_after_s = self.engine.admission()
            if not admit:
                raise ApiError(503, "engine_busy", "the speech engine is at capacity; try again shortly",
                               {"Retry-After": str(max(1, math.ceil(retry_after_s)))})
        self._reserved += 1

    async def open(self, offer_sdp: str, session_id: Optional[str], last_seq: int,
                   make_call: Callable[..., Any] = Call, flow: Optional[str] = None) -> tuple[Call, str]:
        """Answer an offer for a new session (session_id None) or a resumed one; the caller
        must have reserved a slot, which this releases. `make_call` builds the call (a SIP
        call's class, gateway/sip/call.py, takes Call's arguments and answers G.711 SDP).
        `flow`: a new session's named flow (config `flows`, from its call token), kept in the
        session's settings so that every resume runs it too; None: the default flow."""
        try:
            session = await self._session(session_id, flow)
            call = self._new_call(session, resumed=session_id is not None, last_seq=last_seq, make_call=make_call)
            try:
                answer = await call.answer(offer_sdp)
            except BaseException:
                await call.close("rejected")
                raise
        finally:
            self._reserved -= 1
        self.calls[call.call_id] = call
        self.by_session[call.session_id] = call
        return call, answer

    async def _session(self, session_id: Optional[str], flow: Optional[str] = None) -> LiveSession:
        retry = {"Retry-After": str(self.config.retry_after_s)}
        try:
            if session_id is None:
                return await self.keeper.open_new(secrets.token_hex(12), {"flow": flow} if flow else None)
            previous = self.by_session.get(session_id)
            if previous is not None:  # the caller reconnected before this node noticed the drop
                await previous.close("replaced")
            return await self.keeper.resume(session_id)
        except SessionNotFound:
            raise ApiError(404, "session_not_found", "the session has ended or expired; start a new call") from None
        except SessionBusy as exc:
            raise ApiError(409, "session_busy", str(exc), retry) from None
        except StoreUnavailable:
            raise ApiError(503, "store_unavailable", "session storage is unavailable; try again shortly",
                           retry) from None

    def _new_call(self, session: LiveSession, resumed: bool, last_seq: int,
                  make_call: Callable[..., Any] = Call) -> Call:
        session_id = session.record.session_id
        # The client may have seen events the store had not yet written when a node died.
        events = EventChannel(last_seq=max(session.record.last_event_seq, last_seq),
                              on_emit=lambda event, text: self._on_event(session_id, event, text))
        if resumed:
            events.replay(self.keeper.replay_after(session_id, last_seq))
        return make_call(secrets.token_hex(8), session_id, self.config, self._forget, self.loop_lag,
                         events=events, resumed=resumed, mode=self._mode(session))

    def _on_event(self, session_id: str, event: dict, text: str) -> None:
        self.keeper.record_event(session_id, event, text)
        self.metrics.observe_event(event)

    def _mode(self, session: LiveSession) -> ModeFactory:
        if self.config.mode not in ENGINE_MODES:
            return echo_test_mode(self.config)
        session_id = session.record.session_id
        try:
            stream = self.engine.open_stt(session_id)
        except Exception as exc:  # CapacityError, or the engine closing under us
            raise ApiError(503, "engine_busy", f"the speech engine cannot take this call: {exc}",
                           {"Retry-After": str(self.config.retry_after_s)}) from None
        if self.config.mode == "transcribe":
            return lambda pacer, events, hang_up: Transcribe(stream, events)
        return lambda pacer, events, hang_up: self._conversation(session, stream, pacer, events, hang_up)

    def _conversation(self, session: LiveSession, stt: Any, pacer: Any, events: EventChannel,
                      hang_up: Any) -> Conversation:
        """The conversation keeps its history in the session record, so a resume finds it."""
        record = session.record

        def saved() -> None:  # called only after construction, so `conversation` is bound
            record.in_progress = conversation.in_progress
            record.last_turn = conversation.speaker.turns
            self.keeper.save(record.session_id)

        conversation = Conversation(stt, lambda: self.engine.open_tts(record.session_id),
                                    self._responder(record), pacer, events,
                                    history=record.history, pending=record.in_progress, hang_up=hang_up,
                                    resume_unfinished=self.config.resume_unfinished, on_change=saved,
                                    idle_prompt_s=self.config.idle_prompt_s, idle_hangup_s=self.config.idle_hangup_s,
                                    max_turn_s=self.config.max_turn_s, recording=self._recording(record.session_id),
                                    reopen_stt=lambda: self.engine.open_stt(record.session_id),
                                    last_turn=record.last_turn,
                                    log_content=self.config.privacy_log_content,
                                    logger=CallLogger(logging.getLogger("parley.conversation"),
                                                      {"session_id": record.session_id}))
        return conversation

    def _responder(self, record: SessionRecord) -> Responder:
        """The session's responder: its named flow when it has one (scripted), else the default."""
        flow = record.settings.get("flow")
        if flow is not None and flow not in self.config.named_flows():
            log.warning("session's flow is not in this node's flows setting: running the default flow",
                        extra={"session_id": record.session_id, "flow": flow})
            flow = None
        return make_responder(self.config, session_id=record.session_id, flow=flow)

    def _recording(self, session_id: str) -> Optional[CallRecording]:
        if not self.config.record_dir:
            return None
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return CallRecording(Path(self.config.record_dir) / f"{stamp}-{session_id}-{secrets.token_hex(2)}.wav")

    async def _forget(self, call: Call) -> None:
        self.calls.pop(call.call_id, None)
        if self.by_session.get(call.session_id) is call:
            del self.by_session[call.session_id]
            if call.close_reason != "taken_over":
                await self.keeper.end(call.session_id)
        self.metrics.call_ended(call)

    async def _taken_over(self, session_id: str) -> None:
        call = self.by_session.get(session_id)
        if call is not None:
            await call.close("taken_over")

    def status(self, ready: bool) -> NodeStatus:
        return NodeStatus(self.config.node_id, self.config.public_url, ready and not self.draining and not self.full,
                          self.draining, self.active, self.config.max_sessions, time.time())

    def start_drain(self, timeout_s: float) -> asyncio.Task:
        """Begin draining in the background (once); the task ends when the drain is done."""
        self.draining = True
        if self.drain_task is None:
            self.drain_task = asyncio.get_running_loop().create_task(self.drain(timeout_s))
        return self.drain_task

    async def drain(self, timeout_s: float) -> None:
        """Refuse new calls, let live ones run up to `timeout_s`, then migrate the rest away."""
        self.draining = True
        await self.nodes.publish(self.status(ready=False))  # peers stop sending callers here at once
        log.info("draining", extra={"active_sessions": self.active, "drain_timeout_s": timeout_s})
        deadline = time.monotonic() + timeout_s
        while self.active and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        remaining = list(self.calls.values())
        if remaining:
            log.info("drain timeout: migrating remaining calls", extra={"calls": len(remaining)})
        await asyncio.gather(*(self.migrate(call) for call in remaining))

    async def migrate(self, call: Call) -> None:
        """Send the client to another node (session.migrate with a fresh resume token)."""
        token = tokens.issue(call.session_id, self.config.secret, self.config.resume_token_ttl_s)
        await call.migrate_away("draining", token, self.config.retry_after_s)

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(call.close(reason) for call in list(self.calls.values())))
