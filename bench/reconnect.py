"""Reconnect benchmark: a caller in a conversation-mode call drops and resumes its session,
many times, on one node or across two nodes sharing Redis, and every turn is counted.

How it runs
-----------
Starts a throwaway redis-server and two gateways (`python -m gateway serve --mode
conversation --responder echo --redis-url …`) on free loopback ports. One aiortc caller
(tests.kit.peer.Caller) calls node A. Then, `--cycles` times:

1. The caller says an utterance (recorded speech, tests/data/speech) and waits for the turn
   to end and the agent's reply ("You said: …") to start playing.
2. The connection drops, half the time mid-reply (as soon as the reply's audio starts) and
   half the time after the reply has played. Same-node cycles close the peer connection
   (the gateway notices); cross-node cycles (every other one) simply go silent and resume on
   the other node, which takes the live session over.
3. A new peer connection sends POST /v1/calls {resume_token, last_seq}; the clock runs from
   creating the new offer to the first decoded frame of audio from the gateway. A reply cut
   off by the drop must finish on the resumed connection (response.audio.end for its turn).

Then the session's history is read from Redis. A turn is *lost* if the caller's words or the
agent's reply to them are missing from the history, or the cycle failed; *duplicated* if the
history holds a turn or a reply twice, or the caller received an event seq twice.

Output: one JSON object on stdout (success_rate, resume_ms_p50/p95, lost_turns,
duplicated_turns, the same-node/cross-node and mid-reply splits); progress on stderr.
Usage: python bench/reconnect.py --cycles 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gateway.ice import use_host_addresses  # noqa: E402
from gateway.sessions import session_key  # noqa: E402
from tests.kit.peer import Caller  # noqa: E402
from tests.kit.ports import free_port  # noqa: E402
from tests.kit.processes import kill, start_server, wait_ready  # noqa: E402
from tests.kit.redis_server import RedisServer  # noqa: E402
from tests.kit.talk import UTTERANCES, last_seq, next_event, say, silence, utterance  # noqa: E402

SECRET = "bench-reconnect-secret"
STEP_TIMEOUT_S = 60.0  # a turn on a busy 2-core machine: recognizer, responder, voice
SETTLE_S = 15.0  # for the keeper's writes behind to reach Redis at the end
BUSY_RETRY_S = 1.0  # a resume refused with 503 (the engine's admission, on a loaded machine) is tried again
POLL_S = 0.05


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))], 1)


async def start_node(redis_url: str, node_id: str, stt_model: str) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {"PARLEY_REDIS_URL": redis_url, "PARLEY_SECRET": SECRET, "PARLEY_NODE_ID": node_id,
           "PARLEY_PUBLIC_URL": f"http://127.0.0.1:{port}", "PARLEY_LOG_LEVEL": "error"}
    return await start_server("--port", str(port), "--mode", "conversation", "--responder", "echo",
                              "--stt-model", stt_model, "--engine-threads", "1", env=env)


class Session:
    """What the caller knows: its token, and every event it has received (each connection's
    events are absorbed once, so a seq seen twice arrived twice)."""

    def __init__(self) -> None:
        self.token: Optional[str] = None
        self.id: Optional[str] = None
        self.seen: list[dict] = []

    def absorb(self, caller: Caller, after: int = 0) -> None:
        self.seen += [e for e in caller.events if e["seq"] > after]


async def first_audio(caller: Caller) -> float:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while caller.first_audio_at is None:
        if time.monotonic() > deadline:
            raise TimeoutError("no audio from the gateway after the resume")
        await asyncio.sleep(POLL_S)
    return caller.first_audio_at


async def cycle(http: aiohttp.ClientSession, caller: Caller, session: Session, url: str, same_node: bool,
                mid_reply: bool, speech: Any) -> tuple[Caller, dict[str, Any]]:
    """One turn, then a drop and a resume; returns the new caller and this cycle's figures."""
    before = last_seq(caller)
    say(caller, speech)
    end = await next_event(caller, "turn.end", before, STEP_TIMEOUT_S)
    start = await next_event(caller, "response.audio.start", end["seq"], STEP_TIMEOUT_S)
    if not mid_reply:
        await next_event(caller, "response.audio.end", start["seq"], STEP_TIMEOUT_S, turn=start["turn"])
    claimed = last_seq(caller)  # what the client tells the gateway it has seen
    if same_node:
        await caller.close()
    else:
        caller.track.stop()  # gone quiet; the old node is still alive and must hand over
    session.absorb(caller, after=max((e["seq"] for e in session.seen), default=0))
    started = time.monotonic()
    resumed, refusals = await resume(http, url, session.token, claimed)
    resume_ms = (await first_audio(resumed) - started) * 1000
    await resumed.wait_for_event("session.ready", STEP_TIMEOUT_S)
    session.token = resumed.response["resume_token"]
    if mid_reply:  # the cut-off reply finishes here (its end may also be a replayed event)
        await next_event(resumed, "response.audio.end", 0, STEP_TIMEOUT_S, turn=start["turn"])
    if not same_node:
        await caller.close()
    return resumed, {"resume_ms": resume_ms, "refusals": refusals, "kind": "same_node" if same_node else "cross_node",
                     "mid_reply": mid_reply, "turn": start["turn"],
                     "resumed_reply": any(e["type"] == "response.resumed" for e in resumed.events)}


async def resume(http: aiohttp.ClientSession, url: str, token: str, claimed: int) -> tuple[Caller, int]:
    """POST /v1/calls with the resume token, as a client does: a 503 (engine busy: admission
    refuses calls while the engine's ticks run late) is tried again shortly, up to the step
    deadline. Returns the connected caller and how many times it was refused."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    refusals = 0
    while True:
        caller = Caller(url, silence(0.0))
        try:
            await caller.call(http, resume_token=token, last_seq=claimed)
            return caller, refusals
        except RuntimeError as exc:
            await caller.close()
            if "refused: 503" not in str(exc) or time.monotonic() > deadline:
                raise
            refusals += 1
            await asyncio.sleep(BUSY_RETRY_S)


def read_history(redis: RedisServer, session_id: str) -> tuple[list[dict], dict]:
    raw = redis.client.get(session_key(session_id))
    record = json.loads(raw) if raw else {}
    return record.get("history", []), record.get("in_progress") or {}


async def settled_history(redis: RedisServer, session_id: str, user_turns: int) -> list[dict]:
    """The history once the last reply and the keeper's writes behind have landed."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        history, in_progress = read_history(redis, session_id)
        users = [t for t in history if t["role"] == "user"]
        if (len(users) >= user_turns and not in_progress) or time.monotonic() > deadline:
            return history
        await asyncio.sleep(POLL_S)


def count_turns(history: list[dict], attempted: int) -> dict[str, int]:
    """Lost and duplicated turns in the session history (the echo responder's reply to
    "words" is "You said: words", so each reply names its turn)."""
    users = [t for t in history if t["role"] == "user"]
    replies = [t for t in history if t["role"] == "assistant" and t["text"].startswith("You said")]
    answered = sum(any(r["text"] == f"You said: {u['text']}" or u["text"] in r["text"] for r in replies)
                   for u in users)
    twice = sum(1 for a, b in zip(history, history[1:]) if a == b)
    return {"user_turns": len(users), "replies": len(replies), "lost": max(0, attempted - answered),
            "duplicated": max(0, len(users) - attempted) + max(0, len(replies) - attempted) + twice,
            "replies_heard_in_full": sum(r.get("heard_text") == r["text"] for r in replies)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    use_host_addresses(["127.0.0.1"])
    speech = [utterance(name) for name in UTTERANCES]
    redis = RedisServer()
    (proc_a, url_a), (proc_b, url_b) = await asyncio.gather(start_node(redis.url, "node-a", args.stt_model),
                                                            start_node(redis.url, "node-b", args.stt_model))
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    session = Session()
    try:
        async with aiohttp.ClientSession() as http:
            await asyncio.gather(wait_ready(http, url_a), wait_ready(http, url_b))
            caller = Caller(url_a, silence(0.0))
            await caller.call(http)
            await caller.wait_for_event("session.ready", STEP_TIMEOUT_S)
            session.token, session.id = caller.response["resume_token"], caller.response["session_id"]
            here = url_a
            for i in range(args.cycles):
                same_node = i % 2 == 0
                mid_reply = (i // 2) % 2 == 0
                target = here if same_node else (url_b if here == url_a else url_a)
                try:
                    caller, row = await cycle(http, caller, session, target, same_node, mid_reply,
                                              speech[i % len(speech)])
                    here = target
                    rows.append(row)
                except Exception as exc:  # a failed cycle is a figure, not a crash
                    failures.append(f"cycle {i}: {type(exc).__name__}: {exc}")
                    print(failures[-1], file=sys.stderr)
                    break
                print(f"cycle {i + 1}: {row['kind']}, {'mid-reply' if mid_reply else 'after reply'}, "
                      f"resumed in {row['resume_ms']:.0f} ms", file=sys.stderr)
            session.absorb(caller, after=max((e["seq"] for e in session.seen), default=0))
            history = await settled_history(redis, session.id, len(rows))
            await caller.hang_up(http)
    finally:
        await kill(proc_a)
        await kill(proc_b)
        redis.stop()
    seqs = [e["seq"] for e in session.seen]
    turns = count_turns(history, len(rows))
    resume = [row["resume_ms"] for row in rows]

    def split(key: str, value: Any) -> list[float]:
        return [row["resume_ms"] for row in rows if row[key] == value]

    return {
        "cycles": args.cycles,
        "success_rate": round(len(rows) / args.cycles, 4),
        "resume_ms_p50": percentile(resume, 50),
        "resume_ms_p95": percentile(resume, 95),
        "same_node_resume_ms_p50": percentile(split("kind", "same_node"), 50),
        "cross_node_resume_ms_p50": percentile(split("kind", "cross_node"), 50),
        "mid_reply_resume_ms_p50": percentile(split("mid_reply", True), 50),
        "lost_turns": turns["lost"] + (args.cycles - len(rows)),
        "duplicated_turns": turns["duplicated"] + len(seqs) - len(set(seqs)),
        "history": turns,
        "cut_off_replies_resumed": sum(row["resumed_reply"] for row in rows if row["mid_reply"]),
        "mid_reply_drops": sum(row["mid_reply"] for row in rows),
        "resumes_refused_busy": sum(row["refusals"] for row in rows),
        "failures": failures,
        "settings": {"stt_model": args.stt_model, "responder": "echo"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "definitions": {
            "resume_ms": "new RTCPeerConnection's offer created -> first decoded audio frame from the gateway",
            "lost_turns": "cycles whose caller words or reply are missing from the Redis session history, "
                          "plus cycles not completed",
            "duplicated_turns": "turns or replies recorded more than once in the history, plus event seqs "
                                "the caller received more than once",
            "cross_node": "resume on the other node while the old node still drives the session (takeover)",
            "mid_reply": "dropped as soon as the reply's audio started; the reply must finish after the resume",
            "resumes_refused_busy": "resume POSTs answered 503 engine_busy and tried again after 1 s (counted in "
                                    "that cycle's resume_ms)",
        },
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--stt-model", default="ssm", help="the nodes' recognizer (ssm: lightest on a CPU)")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    ok = result["success_rate"] == 1.0 and result["lost_turns"] == 0 and result["duplicated_turns"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
