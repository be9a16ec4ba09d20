"""One SIP call on the gateway: the same session, mode (conversation), events, jitter
buffer and pacer as a WebRTC call (gateway/call.py), with G.711 RTP instead of aiortc.

The CallRegistry builds it (`registry.open(..., make_call=...)`), so a SIP call counts
against max_sessions, lives in the session store, is sampled for /metrics, and is drained
and closed like any other. What differs lives here: the SDP is G.711's, the media is
gateway/sip/media.py's, events go to SIP event listeners rather than a data channel, DTMF
keys reach the conversation, a handoff becomes a REFER, and Parley's end of the call is a
BYE (through the `SipSignaling` the agent gives it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional, Protocol

from ..call import FINAL_REASONS, ModeFactory
from ..config import Config
from ..events import EventChannel
from ..jitter import JitterBuffer
from ..logs import CallLogger
from ..pacer import PacedAudioTrack
from ..playout import Playout
from .g711 import G711_RATE, G711Decoder, G711Encoder
from .media import RtpSession, bind_pair
from .sdp import AudioOffer, SdpError, build_answer, new_session_id, parse_offer

log = logging.getLogger("parley.sip.call")

RTP_TIMEOUT_S = 30.0  # no RTP this long (and not on hold): the phone is gone (a PBX's usual rtptimeout)
RTP_CHECK_S = 1.0
BYE_TIMEOUT_S = 5.0  # an unanswered BYE does not hold up the close


class SipSignaling(Protocol):
    """What a call asks of its dialog (the agent implements it)."""

    async def bye(self) -> None: ...

    async def refer(self, target: str) -> bool: ...


class EventTap:
    """Stands in for the data channel: a SIP caller has none, but the call's events still go
    to the session store and metrics (EventChannel's on_emit) and to SIP event listeners."""

    readyState = "open"

    def __init__(self, deliver: Callable[[str], None]) -> None:
        self._deliver = deliver

    def on(self, name: str, handler: Callable[..., Any]) -> None:
        pass  # no client messages come this way

    def send(self, text: str) -> None:
        self._deliver(text)


class SipCall:
    def __init__(self, call_id: str, session_id: str, config: Config,
                 on_closed: Callable[["SipCall"], Awaitable[None] | None], loop_lag: Any = None,
                 events: Optional[EventChannel] = None, resumed: bool = False, mode: Optional[ModeFactory] = None,
                 *, signaling: SipSignaling, caller: tuple[str, int], host: str, advertised: str,
                 port_range: Optional[tuple[int, int]], on_event: Callable[["SipCall", str], None]) -> None:
        self.call_id, self.session_id, self.config, self.resumed = call_id, session_id, config, resumed
        self.created = time.monotonic()
        self.close_reason: Optional[str] = None
        self.log = CallLogger(log, {"call_id": call_id, "session_id": session_id})
        self.events = events or EventChannel()
        self.events.attach(EventTap(lambda text: on_event(self, text)))
        self._make_mode = mode
        self.signaling = signaling
        self.caller, self._host, self._advertised, self._port_range = caller, host, advertised, port_range
        self.pacer: Optional[PacedAudioTrack] = None
        self.playout: Optional[Playout] = None
        self.media: Optional[RtpSession] = None
        self.mode: Any = None
        self.codec = ""
        self._on_closed = on_closed
        self._sdp_session, self._sdp_version = new_session_id(), 0
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.hung_up_by_caller = False
        self.closed = asyncio.Event()

    async def answer(self, offer_sdp: str) -> str:
        """The SDP answer to the INVITE's offer; media and the mode start at once."""
        offer = parse_offer(offer_sdp)
        self.codec = offer.codec
        self.pacer = PacedAudioTrack(encoder=G711Encoder(offer.codec))
        self.mode = self._make_mode(self.pacer, self.events, self.close)
        if hasattr(self.mode, "transfer"):
            self.mode.transfer = self._transfer
        buffer = JitterBuffer(G711Decoder(offer.codec), rtp_clock_rate=G711_RATE)
        self.playout = Playout(self.mode.on_audio, buffer=buffer)
        rtp, rtcp = await bind_pair(self._host, self._port_range, None, None)
        self.media = RtpSession(rtp, rtcp, self.playout, self.pacer, self.on_digit, self.caller[0])
        self.media.apply(offer)
        self.playout.start()
        self.media.start()
        self._spawn(self.mode.run()).add_done_callback(self._mode_ended)
        self._spawn(self._rtp_watchdog())
        self.events.emit("session.ready", call_id=self.call_id, session_id=self.session_id, resumed=False,
                         sample_rate=16000, transport="sip", codec=offer.codec, **self.mode.describe())
        self.log.info("SIP call answered", extra={"codec": offer.codec, "rtp_port": self.media.port})
        return self._answer_sdp(offer)

    def reoffer(self, offer_sdp: str) -> str:
        """A re-INVITE's offer (hold, unhold, a session-timer refresh): the new answer."""
        offer = parse_offer(offer_sdp, prefer=self.codec)
        if offer.codec != self.codec:
            raise SdpError(f"changing codec mid-call ({self.codec} -> {offer.codec}) is not supported")
        was_held = self.media.on_hold
        self.media.apply(offer)
        if self.media.on_hold != was_held:
            self.events.emit("call.hold", on_hold=self.media.on_hold)
            self.log.info("SIP call hold", extra={"on_hold": self.media.on_hold})
        return self._answer_sdp(offer)

    def _answer_sdp(self, offer: AudioOffer) -> str:
        self._sdp_version += 1
        return build_answer(offer, self._advertised, self.media.port, self._sdp_session, self._sdp_version)

    def on_digit(self, digit: str, source: str) -> None:
        """A DTMF key (RFC 4733 from the media, or SIP INFO) for the call's mode."""
        handler = getattr(self.mode, "on_dtmf", None)
        if handler is not None:
            handler(digit, source)
        else:
            self.events.emit("dtmf", digit=digit, source=source)

    async def _transfer(self, handoff: Any) -> bool:
        """A handoff: REFER the caller to its target (or sip_transfer_target). True when the
        caller was handed over (then Parley hangs up); False keeps the caller with Parley."""
        target = getattr(handoff, "target", "") or self.config.sip_transfer_target
        if not target:
            return True  # nowhere to transfer to: the handoff event alone, as on WebRTC
        self.events.emit("transfer.started", target=target)
        try:
            transferred = await self.signaling.refer(target)
        except Exception:
            self.log.exception("SIP transfer failed")
            transferred = False
        self.events.emit("transfer.ended", target=target, ok=transferred)
        if not transferred:
            self.events.error("transfer_failed", f"the transfer to {target} did not go through")
            return False
        asyncio.get_running_loop().create_task(self.close("transferred"))
        return True

    def stats(self) -> dict:
        return {"transport": "sip", "codec": self.codec, "on_hold": bool(self.media and self.media.on_hold),
                "jitter": self.playout.buffer.stats.as_dict() if self.playout else {},
                "pacer": self.pacer.stats.as_dict() if self.pacer else {}}

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        return task

    def _mode_ended(self, task: asyncio.Task) -> None:
        """As gateway/call.py: a mode that raised leaves the caller unheard, so tell them and end."""
        if task.cancelled() or task.exception() is None or self._closing:
            return
        self.log.error("call mode failed: ending the SIP call", exc_info=task.exception())
        self.events.error("call_failed", "the call failed on the gateway and ends")
        self._spawn(self.close("error"))

    async def _rtp_watchdog(self) -> None:
        while True:
            await asyncio.sleep(RTP_CHECK_S)
            last = self.playout.last_packet_at or self.created
            if not self.media.on_hold and time.monotonic() - last > RTP_TIMEOUT_S:
                await self.close("rtp_timeout")
                return

    async def migrate_away(self, reason: str, resume_token: str, retry_after_s: int) -> None:
        """A drain that outlasted drain_timeout_s: a phone cannot reconnect elsewhere, so hang up."""
        await self.close("drained")

    def remote_hangup(self) -> None:
        """The caller sent BYE (already answered); close without a BYE of our own."""
        self.hung_up_by_caller = True
        asyncio.get_running_loop().create_task(self.close("hangup"))

    async def close(self, reason: str) -> None:
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.close_reason = reason
        if reason in FINAL_REASONS:
            self.events.emit("session.ended", reason=reason)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        if self.playout is not None:
            await self.playout.stop()
        if self.mode is not None:
            self.mode.close()
        if self.pacer is not None:
            self.pacer.stop()
        if self.media is not None:
            await self.media.close()
        if not self.hung_up_by_caller and reason not in ("rejected", "cancelled"):
            try:
                await asyncio.wait_for(self.signaling.bye(), BYE_TIMEOUT_S)
            except Exception as exc:  # the caller may be gone already; the call is over either way
                self.log.info("BYE not answered", extra={"error": type(exc).__name__})
        self.log.info("SIP call closed", extra={"reason": reason, "duration_s": round(time.monotonic() - self.created, 1)})
        self.closed.set()
        result = self._on_closed(self)
        if asyncio.iscoroutine(result):
            await result
