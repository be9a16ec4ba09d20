"""SIPp (Debian's sip-tester) as a real SIP caller for tests and the capacity bench.

Scenarios live in tests/sip_scenarios/*.xml with @NAME@ placeholders (SIPp reads no
variables in rtp_stream or play_pcap_audio paths); the caller's audio is a raw G.711 file
encoded here from a WAV with the standard library's reference codec (for play_pcap_audio,
a pcap of it as RTP packets), never committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import socket
import struct
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Optional

import numpy as np

from engine.wavfile import read_wav
from gateway.app import SIP_KEY

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # the reference G.711 encoder (stdlib up to 3.12)

SCENARIOS = Path(__file__).resolve().parents[1] / "sip_scenarios"
CALLER_WAV = Path(__file__).resolve().parents[1] / "data" / "speech" / "flite_slt-020.wav"  # "my name is sue"
EVENT_DEADLINE_S = 120.0  # generous: the machine may be busy
SIPP = shutil.which("sipp")
SIP_TESTER = Path("/usr/share/sip-tester")  # sip-tester's RFC 4733 captures: dtmf_2833_<key>.pcap
SIPP_DEADLINE_S = 240.0  # generous: the machine may be busy
AGENT_URI = "sip:agent@127.0.0.1:5999"  # where the agent flow transfers callers (SIPp's referee answers)


def dtmf_capture(key: str) -> Path:
    name = {"*": "star", "#": "pound"}.get(key, key)
    return SIP_TESTER / f"dtmf_2833_{name}.pcap"


def ulaw_file(wav: Path, out: Path, lead_s: float = 0.5, tail_s: float = 3.0) -> Path:
    """A raw 8 kHz PCMU file of `wav` with silence around it (the caller speaks, then pauses)."""
    pcm = read_wav(wav, 8000)
    if pcm.dtype != np.int16:
        pcm = np.clip(pcm * 32767 if np.abs(pcm).max() <= 1.0 else pcm, -32768, 32767).astype(np.int16)
    pcm = np.concatenate([np.zeros(int(lead_s * 8000), np.int16), pcm, np.zeros(int(tail_s * 8000), np.int16)])
    out.write_bytes(audioop.lin2ulaw(pcm.tobytes(), 2))
    return out


def rtp_capture(ulaw: Path, out: Path, payload_type: int = 0) -> Path:
    """A pcap of `ulaw` (raw 8 kHz G.711, as ulaw_file writes) as RTP in 20 ms packets, for a
    scenario's play_pcap_audio (SIPp replays the packets' payloads at their capture times,
    from its media port to the callee's). Ethernet, IPv4 and UDP headers as a capture has them."""
    audio = ulaw.read_bytes()
    audio += b"\xff" * (-len(audio) % 160)  # a whole last packet, padded with G.711 silence
    frames = [audio[i:i + 160] for i in range(0, len(audio), 160)]
    packets = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    for n, frame in enumerate(frames):
        marker = 0x80 if n == 0 else 0
        rtp = struct.pack("!BBHII", 0x80, marker | payload_type, n & 0xFFFF, n * 160, 0x5041524C) + frame
        udp = struct.pack("!HHHH", 6000, 6000, 8 + len(rtp), 0) + rtp
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), n & 0xFFFF, 0, 64, 17, 0,
                         socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1"))
        ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
        frame_bytes = b"\x00" * 12 + b"\x08\x00" + ip + udp
        size = len(frame_bytes)
        packets.append(struct.pack("<IIII", n // 50, (n % 50) * 20000, size, size) + frame_bytes)
    out.write_bytes(b"".join(packets))
    return out


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def scenario(name: str, out_dir: Path, **values: object) -> Path:
    text = (SCENARIOS / f"{name}.xml").read_text()
    for key, value in values.items():
        text = text.replace(f"@{key.upper()}@", str(value))
    path = out_dir / f"{name}.xml"
    path.write_text(text)
    return path


async def run_sipp(scenario_path: Path, sip_port: int, calls: int = 1, rate: int = 10,
                   media_port: Optional[int] = None, extra: tuple[str, ...] = (),
                   local_ip: str = "127.0.0.1") -> tuple[int, str]:
    """Run SIPp against 127.0.0.1:sip_port until its calls end; (exit status, output).
    SIPp exits 0 only when every call followed the scenario. `local_ip` is the address SIPp
    sends from (127.0.0.2 is another source on the loopback); its RTP ports are free ones
    unless `media_port` is given (a fixed port fails when another run holds it)."""
    media_port = media_port or free_media_port(local_ip)
    return await _sipp(scenario_path, f"127.0.0.1:{sip_port}", "-m", str(calls), "-l", str(calls), "-r", str(rate),
                       "-i", local_ip, "-p", "0", "-mp", str(media_port), *extra)


def free_media_port(address: str = "127.0.0.1") -> int:
    """An even UDP port with the three above it free too (SIPp's audio and video RTP/RTCP)."""
    for _ in range(200):
        port = random.randrange(20000, 60000, 2)
        try:
            with contextlib.ExitStack() as held:
                for offset in range(4):
                    sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                    sock.bind((address, port + offset))
            return port
        except OSError:
            continue
    raise RuntimeError("no free UDP port range for SIPp's media")


async def serve_sipp(scenario_path: Path, sip_port: int, calls: int = 1, local_ip: str = "127.0.0.1",
                     extra: tuple[str, ...] = ()) -> tuple[int, str]:
    """Run SIPp as a server (a registrar, a PBX) on local_ip:sip_port until `calls` calls
    (dialogs or registrations, by Call-ID) followed the scenario or failed."""
    return await _sipp(scenario_path, "-m", str(calls), "-i", local_ip, "-p", str(sip_port), *extra)


async def _sipp(scenario_path: Path, *args: str) -> tuple[int, str]:
    errors = scenario_path.with_suffix(".errors.log")
    proc = await asyncio.create_subprocess_exec(
        SIPP, "-sf", str(scenario_path), *args, "-nostdin", "-trace_err", "-error_file", str(errors),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=scenario_path.parent)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), SIPP_DEADLINE_S)
    except asyncio.TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
    except asyncio.CancelledError:  # the test gave up on it: leave no SIPp behind
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    detail = errors.read_text()[-3000:] if errors.exists() else ""
    return proc.returncode, out.decode(errors="replace")[-3000:] + detail


async def sip_gateway(start_gateway, **settings):
    """A gateway (from the start_gateway fixture) with its SIP agent on a free port -> (gateway,
    agent, SipEvents)."""
    gateway = await start_gateway(sip_port=free_udp_port(), sip_t1_ms=100, **settings)
    return gateway, gateway.app[SIP_KEY], SipEvents(gateway.app[SIP_KEY])


def agent_flow(out_dir: Path, dtmf: bool = True) -> str:
    """A scripted flow whose agent intent (key 0 when `dtmf`, or the words) transfers to AGENT_URI."""
    path = out_dir / "flow.yaml"
    keys = '    dtmf: "0"\n' if dtmf else ""
    path.write_text('greeting: "Hello."\nfallback: "Sorry?"\nintents:\n  agent:\n' + keys +
                    '    keywords: [agent, person]\n    reply: "Connecting you."\n'
                    f"    transfer: {AGENT_URI}\n")
    return str(path)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SipEvents:
    """Every SIP call's events (the agent's event listeners), by call id, awaitable."""

    def __init__(self, agent) -> None:
        self.by_call: dict[str, list[dict]] = defaultdict(list)
        self._changed = asyncio.Event()
        agent.event_listeners.append(self._on_event)

    def _on_event(self, call, event: dict) -> None:
        self.by_call[call.call_id].append(event)
        self._changed.set()

    def all(self, type_: str) -> list[dict]:
        return [e for events in self.by_call.values() for e in events if e["type"] == type_]

    async def wait(self, condition, timeout: float = EVENT_DEADLINE_S) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()
