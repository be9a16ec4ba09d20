"""One WebRTC call: the peer connection, its inbound playout, outbound pacer and events."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Optional, Protocol

import numpy as np

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender, RTCSessionDescription

from .config import Config
from .echo_test import EchoTest
from .events import EventChannel
from .logs import CallLogger
from .loop_monitor import LoopLagMonitor
from .pacer import PacedAudioTrack
from .playout import Playout
from .sdp import SdpError, check_offer, enable_opus_fec, opus_payload_type

log = logging.getLogger("parley.call")

EVENTS_CHANNEL_LABEL = "events"
MIGRATE_FLUSH_S = 1.0  # longest wait for session.migrate to leave the data channel before the call closes


PEER_CHECK_S = 1.0  # how often a connected call checks that its peer is still there
# Ends the client must not resume: they hung up, the session moved on, the assistant ended
# the call (a goodbye, or a caller who stayed silent), or it failed in a way a resume would
# only repeat (the recognizer could not be kept going, or the call's mode crashed).
FINAL_REASONS = frozenset({"hangup", "replaced", "taken_over", "assistant_ended", "idle", "stt_failed", "error"})
ENDED_FLUSH_S = 0.5  # longest wait for session.ended to leave before the connection closes


class Mode(Protocol):
    """What a call does with the caller's audio (echo test, transcription, conversation)."""

    def on_audio(self, pcm: np.ndarray) -> None:
        """One 20 ms frame of 16 kHz int16 mono from the jitter buffer, on the playout clock."""

    async def run(self) -> None:
        """The mode's own work for the call's lifetime (cancelled when the call closes)."""

    def describe(self) -> dict:
        """Fields for session.ready."""

    def close(self) -> None: ...


HangUp = Callable[[str], Awaitable[None]]  # ends the call with a reason
ModeFactory = Callable[[PacedAudioTrack, EventChannel, HangUp], Mode]


def echo_test_mode(config: Config) -> ModeFactory:
    return lambda pacer, events, hang_up: EchoTest(pacer, config.echo_delay_ms)


class Call:
    def __init__(self, call_id: str, session_id: str, config: Config,
                 on_closed: Callable[["Call"], Awaitable[None] | None],
                 loop_lag: Optional[LoopLagMonitor] = None, events: Optional[EventChannel] = None,
                 resumed: bool = False, mode: Optional[ModeFactory] = None) -> None:
        self.call_id = call_id
        self.session_id = session_id
        self.config = config
        self.resumed = resumed
        self.created = time.monotonic()
        self.close_reason: Optional[str] = None
        self.log = CallLogger(log, {"call_id": call_id, "session_id": session_id})
        ice_servers = [RTCIceServer(url) for url in config.stun_urls]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers))
        self.events = events or EventChannel()
        self.pacer = PacedAudioTrack(bitrate=config.opus_bitrate)
        self.mode = (mode or echo_test_mode(config))(self.pacer, self.events, self.close)
        self.playout = Playout(self.mode.on_audio)
        self._on_closed = on_closed
        self._loop_lag = loop_lag
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.closed = asyncio.Event()

    # -- set-up ---------------------------------------------------------------------------

    async def answer(self, offer_sdp: str) -> str:
        """Apply the caller's offer and return our answer (all candidates included)."""
        check_offer(offer_sdp)
        if opus_payload_type(offer_sdp) is None:
            raise SdpError("offer has no Opus codec; Parley's WebRTC calls need audio/opus")
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:  # aiortc raises many types on bad SDP
            raise SdpError(f"SDP offer could not be parsed: {exc or type(exc).__name__}") from None
        audio = [t for t in self.pc.getTransceivers() if t.kind == "audio"]
        if not audio:
            raise SdpError("SDP offer has no audio media section (m=audio)")
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        audio[0].setCodecPreferences(opus)
        self.pc.addTrack(self.pacer)
        self.playout.attach(audio[0].receiver)
        try:
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as exc:
            raise SdpError(f"cannot answer this offer: {exc}") from None
        answer = self.pc.localDescription.sdp
        if opus_payload_type(answer) is None:
            raise SdpError("no codec in common: Parley needs audio/opus")
        self.playout.start()
        self._spawn(self._stats_loop())
        self._spawn(self._connect_watchdog())
        self._spawn(self._peer_watchdog())
        self._start_mode()
        self.log.info("call answered", extra={"mode": self.config.mode})
        return enable_opus_fec(answer)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        return task

    def _start_mode(self) -> None:
        self._spawn(self.mode.run()).add_done_callback(self._mode_ended)

    def _mode_ended(self, task: asyncio.Task) -> None:
        """The mode's run() ended. Returned or cancelled: the mode has dealt with its own end
        (a failed stream is reported by transcribe and conversation; echo-test has nothing to
        run). Raised: nothing hears the caller any more, so the call must not stay up deaf:
        tell the caller (error `call_failed`) and the operator (log, metrics), and end it."""
        if task.cancelled() or task.exception() is None or self._closing:
            return
        self.log.error("call mode failed: ending the call", exc_info=task.exception(), extra={"mode": self.config.mode})
        self.events.error("call_failed", "the call failed on the gateway and ends")
        self._spawn(self.close("error"))

    # -- events -----------------------------------------------------------------------------

    def _on_datachannel(self, channel) -> None:
        if channel.label != EVENTS_CHANNEL_LABEL:
            return
        self.events.attach(channel)
        self.events.emit("session.ready", call_id=self.call_id, session_id=self.session_id,
                         resumed=self.resumed, sample_rate=16000, **self.mode.describe())

    def stats(self) -> dict:
        return {
            "connection": self.pc.connectionState,
            "jitter": self.playout.buffer.stats.as_dict(),
            "pacer": self.pacer.stats.as_dict(),
            "loop": self._loop_lag.summary() if self._loop_lag else {},
        }

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.stats_interval_s)
            if self.events.is_open:
                self.events.emit("call.stats", **self.stats())

    async def migrate_away(self, reason: str, resume_token: str, retry_after_s: int) -> None:
        """Tell the client to reconnect elsewhere (session.migrate), then close with reason "drained"."""
        if self._closing:
            return
        self.events.emit("session.migrate", reason=reason, session_id=self.session_id,
                         resume_token=resume_token, retry_after_s=retry_after_s)
        await self.events.flushed(MIGRATE_FLUSH_S)
        await self.close("drained")

    # -- tear-down --------------------------------------------------------------------------

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        self.log.info("connection state", extra={"state": state})
        if state in ("failed", "closed"):
            await self.close(f"connection_{state}")

    async def _connect_watchdog(self) -> None:
        await asyncio.sleep(self.config.connect_timeout_s)
        if self.pc.connectionState != "connected":
            await self.close("connect_timeout")

    async def _peer_watchdog(self) -> None:
        """Close a connected call whose peer went silent: no RTP and no client message for
        peer_timeout_s (aioice alone would take ~30 s to notice), so the caller can resume."""
        while True:
            await asyncio.sleep(PEER_CHECK_S)
            if self.pc.connectionState != "connected":
                continue
            heard = [t for t in (self.playout.last_packet_at, self.events.last_message_at) if t is not None]
            last = max(heard, default=self.created)
            if time.monotonic() - last > self.config.peer_timeout_s:
                await self.close("peer_timeout")
                return

    async def close(self, reason: str) -> None:
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        self.close_reason = reason
        if reason in FINAL_REASONS and self.events.is_open:
            self.events.emit("session.ended", reason=reason)
            await self.events.flushed(ENDED_FLUSH_S)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        await self.playout.detach()
        self.mode.close()
        self.pacer.stop()
        try:
            await self.pc.close()
        except Exception:
            self.log.exception("error while closing the peer connection")
        self.log.info("call closed", extra={"reason": reason, "duration_s": round(time.monotonic() - self.created, 1)})
        self.closed.set()
        result = self._on_closed(self)
        if asyncio.iscoroutine(result):
            await result
