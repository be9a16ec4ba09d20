"""A real aiortc caller for tests and benchmarks: sends a signal, records what comes back."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from typing import Any, Callable, Optional

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48000
FRAME = 960


class _RealTimeTrack(MediaStreamTrack):
    """An audio track whose frame n is released at start + n * 20 ms (aiortc sends at once)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.started_at: Optional[float] = None  # monotonic time of the first frame
        self._pts = 0  # samples released so far

    async def _next_slot(self) -> int:
        """Wait for the next frame's slot; returns its pts (48 kHz samples)."""
        if self.readyState != "live":
            raise MediaStreamError
        if self.started_at is None:
            self.started_at = time.monotonic()
        wait = self.started_at + self._pts / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        pts, self._pts = self._pts, self._pts + FRAME
        return pts


class SignalTrack(_RealTimeTrack):
    """Plays float32 mono samples at 48 kHz in real time, then silence."""

    def __init__(self, samples: Optional[np.ndarray] = None) -> None:
        super().__init__()
        self.samples = samples if samples is not None else np.zeros(0, dtype=np.float32)

    async def recv(self) -> av.AudioFrame:
        pts = await self._next_slot()
        chunk = self.samples[pts:pts + FRAME]
        pcm = np.zeros(FRAME, dtype=np.int16)
        pcm[:len(chunk)] = np.clip(chunk * 32767, -32768, 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


class PreEncodedTrack(_RealTimeTrack):
    """Loops Opus packets encoded once up front, paced in real time (cheap: no per-call encoding)."""

    def __init__(self, packets: list[bytes]) -> None:
        super().__init__()
        self.packets = packets

    async def recv(self) -> av.Packet:
        pts = await self._next_slot()
        packet = av.Packet(self.packets[(pts // FRAME) % len(self.packets)])
        packet.pts = pts
        packet.time_base = fractions.Fraction(1, RATE)
        return packet


def encode_opus(samples: np.ndarray) -> list[bytes]:
    """float32 48 kHz mono -> 20 ms Opus packets (Parley's mono encoder)."""
    from gateway.opus import OpusEncoder

    encoder = OpusEncoder(RATE)
    pcm = np.clip(samples * 32767, -32768, 32767).astype(np.int16)
    pcm = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, dtype=np.int16)])
    return [encoder.encode(frame) for frame in pcm.reshape(-1, FRAME)]


QUIET = encode_opus(np.zeros(FRAME * 5, dtype=np.float32))  # 100 ms of silence, ready to send


class PacketCounter:
    """Stands in for aiortc's jitter buffer on a light caller's receiver: counts, never decodes."""

    LOUD_PAYLOAD_BYTES = 40  # Opus packets carrying sound are larger than silence packets

    def __init__(self) -> None:
        self.packets = 0
        self.loud_packets = 0
        self.first_packet_at: Optional[float] = None  # time.monotonic()
        self.first_packet = asyncio.Event()
        self.arrivals: list[tuple[int, float]] = []  # (RTP seq, monotonic arrival) when record_arrivals

    record_arrivals = False  # set on an instance to keep every packet's seq and arrival time

    def add(self, packet: Any) -> tuple[bool, None]:
        if self.first_packet_at is None:
            self.first_packet_at = time.monotonic()
            self.first_packet.set()
        if self.record_arrivals:
            self.arrivals.append((packet.sequence_number, time.monotonic()))
        self.packets += 1
        self.loud_packets += len(packet.payload) > self.LOUD_PAYLOAD_BYTES
        return False, None


class Caller:
    """One aiortc peer that calls the gateway over POST /v1/calls.

    light=True (benchmarks): send pre-encoded Opus and only count what comes back, so many
    callers fit on one machine next to the gateway they measure. offer_filter and
    answer_filter rewrite the SDP offer before it is sent and the gateway's answer before it is
    applied (tests/kit/impair.py puts its relay in the path).
    """

    def __init__(self, base_url: str, samples: Optional[np.ndarray] = None, light: bool = False,
                 packets: Optional[list[bytes]] = None, offer_filter: Optional[Callable[[str], str]] = None,
                 answer_filter: Optional[Callable[[str], str]] = None) -> None:
        self.base_url = base_url
        self.light = light
        self.offer_filter, self.answer_filter = offer_filter, answer_filter
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.counter: Optional[PacketCounter] = None
        if light:
            self.track = PreEncodedTrack(packets if packets is not None else encode_opus(samples))
        else:
            self.track = SignalTrack(samples)
        self.received: list[np.ndarray] = []
        self.first_audio_at: Optional[float] = None
        self.events: list[dict[str, Any]] = []
        self.event_arrived = asyncio.Event()
        self.channel = self.pc.createDataChannel("events")
        self.channel.on("message", self._on_message)
        self.response: dict[str, Any] = {}
        self._recorder: Optional[asyncio.Task] = None

    def _on_message(self, message: str) -> None:
        self.events.append(json.loads(message))
        self.event_arrived.set()

    async def call(self, http: aiohttp.ClientSession, resume_token: Optional[str] = None,
                   last_seq: Optional[int] = None) -> dict:
        self.pc.addTrack(self.track)
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        body = {"sdp": self.offer_filter(offer) if self.offer_filter is not None else offer, "type": "offer"}
        if resume_token:
            body["resume_token"] = resume_token
        if last_seq is not None:
            body["last_seq"] = last_seq
        async with http.post(self.base_url + "/v1/calls", json=body) as response:
            self.response = await response.json()
            if response.status != 201:
                raise RuntimeError(f"call refused: {response.status} {self.response}")
            self.response["location"] = response.headers["Location"]
        answer = self.response["sdp"]
        if self.answer_filter is not None:
            answer = self.answer_filter(answer)
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        if self.light:
            self.counter = PacketCounter()
            for transceiver in self.pc.getTransceivers():
                if transceiver.kind == "audio":
                    setattr(transceiver.receiver, "_RTCRtpReceiver__jitter_buffer", self.counter)
        return self.response

    def _on_track(self, track: MediaStreamTrack) -> None:
        if self.light:
            return  # nothing is decoded, so nothing queues up on the track
        self._recorder = asyncio.ensure_future(self._record(track))

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic() - frame.samples / frame.sample_rate
            pcm = frame.to_ndarray().reshape(-1)
            if frame.layout.name == "stereo":
                pcm = pcm[::2]
            self.received.append(pcm.astype(np.float32) / 32768)

    def recording(self) -> np.ndarray:
        return np.concatenate(self.received) if self.received else np.zeros(0, dtype=np.float32)

    async def wait_for_event(self, type_: str, timeout: float = 30.0,
                             where: Callable[[dict], bool] = lambda event: True) -> dict:
        """The first event of this type (for which `where` holds), waiting for it if need be."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event["type"] == type_ and where(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {type_} event within {timeout} s; got {[e['type'] for e in self.events]}")
            self.event_arrived.clear()
            try:
                await asyncio.wait_for(self.event_arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def seqs(self) -> list[int]:
        return [event["seq"] for event in self.events]

    async def wait_connected(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pc.connectionState != "connected":
            if self.pc.connectionState in ("failed", "closed") or time.monotonic() > deadline:
                raise RuntimeError(f"connection {self.pc.connectionState}")
            await asyncio.sleep(0.05)

    async def hang_up(self, http: aiohttp.ClientSession) -> int:
        status = 0
        if self.response.get("location"):
            async with http.delete(self.base_url + self.response["location"]) as response:
                status = response.status
        await self.close()
        return status

    async def close(self) -> None:
        if self._recorder:
            self._recorder.cancel()
        await self.pc.close()
