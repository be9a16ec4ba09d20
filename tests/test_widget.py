"""The embeddable widget in a real Chromium: the small shop's page (web/shop/) on one origin,
the gateway, and the widget it serves, on another.

Each test keeps the gateway's access control on (API keys, call tokens bound to origins,
CORS). A state that passes quickly is held still for its screenshot by holding the request
that ends it (the shop's token endpoint, the gateway's resume, the responder's webhook), so
no screenshot races the call. Screenshots land in the test's output folder (tmp_path/shots).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import socket
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import numpy as np
from aiohttp import web

from gateway import call_tokens
from tests.kit.signals import resample, write_wav
from tests.test_browser import RATE, WAIT_MS, chromium, demo_page, wait_for_no_calls  # noqa: F401 (chromium: a fixture)

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "small-shop-key-0123456789"
WIDGET = "parley-voice"
REPLY = ("Your order of Ethiopia Guji left our roastery this morning and should reach you by Thursday. "
         "Is there anything else I can help you with today?")


def load_shop() -> Any:
    """web/shop/shop.py, the example a site copies (not a package: loaded from its path)."""
    spec = importlib.util.spec_from_file_location("shop_example", ROOT / "web" / "shop" / "shop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shop = load_shop()


class Site:
    """A web server on its own loopback port: its URL is its origin."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.origin = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.runner: web.AppRunner | None = None

    async def serve(self, app: web.Application) -> "Site":
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()
        return self


@contextlib.asynccontextmanager
async def sites(count: int) -> AsyncIterator[list[Site]]:
    """`count` sites whose origins are known before their apps are (the gateway needs them first)."""
    made = [Site() for _ in range(count)]
    try:
        yield made
    finally:
        for site in made:
            if site.runner is not None:
                await site.runner.cleanup()
            site.sock.close()


def the_shop(gateway, token_origin: str) -> web.Application:
    """The example shop as a site deploys it: its page, and its token endpoint asking the
    gateway for tokens bound to `token_origin` (the shop's own origin)."""
    return shop.make_app(gateway.url, shop.parley_token_endpoint(gateway.url, API_KEY, token_origin))


def fixed_token(token: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A token endpoint that hands out this token (an expired or forged one)."""
    async def endpoint(request: web.Request) -> web.Response:
        return web.json_response({"token": token, "expires_at": 0}, status=201)
    return endpoint


def caller_wav(tmp_path: Path, lead_in_s: float, speech: bool = True, tail_s: float = 20.0) -> Path:
    """The fake microphone: silence, a held-out voice's sentence, silence."""
    parts = [np.zeros(round(lead_in_s * RATE), np.float32)]
    if speech:
        from engine.wavfile import read_wav
        from tests.test_stt_shipped import SPEECH

        samples = read_wav(SPEECH / "flite_slt-020.wav", 16000).astype(np.float32)
        parts.append(resample(samples / 32768 if np.abs(samples).max() > 1 else samples, 16000, RATE))
    parts.append(np.zeros(round(tail_s * RATE), np.float32))
    wav = tmp_path / "caller.wav"
    write_wav(wav, np.concatenate(parts), RATE)
    return wav


# -- the page side -------------------------------------------------------------------------

RECORD_WIDGET_EVENTS = """
() => {
  const widget = document.querySelector("parley-voice");
  window.__widget = {states: [], transcripts: [], responses: []};
  widget.addEventListener("state", (e) => window.__widget.states.push(e.detail.state));
  widget.addEventListener("transcript", (e) => window.__widget.transcripts.push(e.detail));
  widget.addEventListener("response", (e) => window.__widget.responses.push(e.detail));
}
"""
DEEP_FOCUS = """
() => {
  let el = document.activeElement;
  while (el && el.shadowRoot && el.shadowRoot.activeElement) el = el.shadowRoot.activeElement;
  return el ? {tag: el.tagName.toLowerCase(), cls: el.className, label: el.getAttribute("aria-label")} : null;
}
"""


async def open_shop(page, url: str) -> None:
    await page.goto(url)
    await page.wait_for_function(f"customElements.get('{WIDGET}') && document.querySelector('{WIDGET}')")
    await page.evaluate(RECORD_WIDGET_EVENTS)
    await wait_state(page, "idle")


async def wait_state(page, state: str) -> None:
    await page.wait_for_function(f"document.querySelector('{WIDGET}').state === {json.dumps(state)}")


async def shot(page, folder: Path, state: str) -> Path:
    """A screenshot of the page while the widget is in `state` (checked on both sides of it)."""
    await wait_state(page, state)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{state}.png"
    await page.screenshot(path=str(path))
    assert await page.evaluate(f"document.querySelector('{WIDGET}').state") == state, f"{state} passed mid-shot"
    assert path.stat().st_size > 0
    return path


async def hold(page, url: str, release: asyncio.Event, held: asyncio.Event,
               when: Callable[[Any], bool] = lambda request: True) -> None:
    """Requests to `url` matching `when` wait for `release` (the browser sees a slow server)."""
    async def handler(route) -> None:
        if route.request.method == "POST" and when(route.request):
            held.set()
            await release.wait()
        await route.continue_()
    await page.route(url, handler)


def widget_button(page, name: str):
    return page.locator(f"{WIDGET} button.{name}")  # Playwright's CSS pierces the open shadow root


async def hang_up(page, gateway) -> None:
    async with page.expect_response(lambda r: r.request.method == "DELETE") as deleted:
        await widget_button(page, "hangup").click()
    assert (await deleted.value).status == 204
    await wait_state(page, "idle")
    await wait_for_no_calls(gateway)
    assert not gateway.registry.calls, "hang-up left the call open on the gateway"


# -- tests -----------------------------------------------------------------------------------

async def test_a_shop_page_talks_to_the_gateway_across_origins(start_gateway, tmp_path):
    """Shop on origin A, gateway and widget on origin B: a token from the shop's own endpoint,
    a conversation turn with captions of both sides, every state on screen, and a hang-up."""
    from tests.test_conversation_call import conversation_engine

    webhook_calls: list[dict] = []
    reply_release = asyncio.Event()

    async def webhook(request: web.Request) -> web.Response:
        webhook_calls.append(await request.json())
        await reply_release.wait()  # the widget shows "thinking" until the responder answers
        return web.json_response({"text": REPLY})

    shots = tmp_path / "shots"
    async with sites(2) as (shop_site, hook_site):
        hook_app = web.Application()
        hook_app.router.add_post("/reply", webhook)
        await hook_site.serve(hook_app)
        gateway = await start_gateway(
            mode="conversation", responder="webhook", webhook_url=f"{hook_site.origin}/reply",
            responder_timeout_s=60, responder_total_timeout_s=120, idle_prompt_s=120, idle_hangup_s=120,
            speech_engine=conversation_engine(), api_keys=[API_KEY], allowed_origins=[shop_site.origin])
        await shop_site.serve(the_shop(gateway, shop_site.origin))
        async with demo_page(caller_wav(tmp_path, lead_in_s=3.0)) as (page, console):
            await open_shop(page, shop_site.origin)
            assert await page.evaluate(f"new URL(document.querySelector('{WIDGET}').gateway).origin") == gateway.url
            await shot(page, shots, "idle")

            token_release, token_held = asyncio.Event(), asyncio.Event()
            await hold(page, f"{shop_site.origin}/parley-token", token_release, token_held)
            await widget_button(page, "start").click()
            await asyncio.wait_for(token_held.wait(), WAIT_MS / 1000)
            await shot(page, shots, "connecting")
            token_release.set()

            await page.wait_for_selector(f"{WIDGET} .captions li.user")  # the caller's words
            await shot(page, shots, "thinking")  # the webhook holds the reply
            assert webhook_calls and webhook_calls[-1]["messages"][-1]["role"] == "user"
            reply_release.set()
            await shot(page, shots, "speaking")
            await page.wait_for_function(
                f"document.querySelector('{WIDGET}').shadowRoot.querySelector('.captions li.assistant')"
                f"?.textContent.includes('Thursday')")
            await shot(page, shots, "listening")  # the reply has played; the caller is silent

            recorded = await page.evaluate("window.__widget")
            await hang_up(page, gateway)

    assert [t for t in recorded["transcripts"] if t["final"] and t["text"]], "no final caption of the caller"
    assert recorded["responses"][-1]["text"] == REPLY
    states = recorded["states"]
    for earlier, later in (("connecting", "listening"), ("thinking", "speaking"), ("speaking", "listening")):
        assert earlier in states and later in states[states.index(earlier):], states
    assert "error" not in states
    assert sorted(p.name for p in shots.iterdir()) == [f"{s}.png" for s in
                                                       sorted(["idle", "connecting", "thinking", "speaking", "listening"])]


async def test_refused_tokens_show_a_clear_message(start_gateway, tmp_path):
    """A token copied onto another site, an expired token and a forged one are refused by the
    gateway, and a page whose origin the gateway does not allow cannot even ask; the widget
    says so in words, and no call is left open."""
    shots = tmp_path / "shots"
    async with sites(5) as (shop_site, copy_site, expired_site, forged_site, unknown_site):
        gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[
            shop_site.origin, copy_site.origin, expired_site.origin, forged_site.origin])
        secret = gateway.registry.config.secret
        expired, _ = call_tokens.issue([expired_site.origin], 60, secret, now=time.time() - 120)
        forged, _ = call_tokens.issue([forged_site.origin], 300, "a guessed secret")
        # The shop's own endpoint, deployed on another origin: its tokens name the shop's origin.
        await copy_site.serve(the_shop(gateway, shop_site.origin))
        await expired_site.serve(shop.make_app(gateway.url, fixed_token(expired)))
        await forged_site.serve(shop.make_app(gateway.url, fixed_token(forged)))
        await unknown_site.serve(the_shop(gateway, shop_site.origin))
        cases = [(copy_site, "origin_not_allowed", "not allowed to use this voice service"),
                 (expired_site, "token_expired", "expired"),
                 (forged_site, "invalid_token", "could not verify"),
                 (unknown_site, "unreachable", "Cannot reach the voice service")]
        async with demo_page(caller_wav(tmp_path, 0.5, speech=False)) as (page, console):
            for site, code, words in cases:
                await open_shop(page, site.origin)
                await widget_button(page, "start").click()
                await shot(page, shots / code, "error")
                message = await page.locator(f"{WIDGET} .error").inner_text()
                assert words in message, (code, message)
                assert await page.get_attribute(f"{WIDGET} .error", "role") == "alert"
                assert await page.evaluate(f"document.querySelector('{WIDGET}').call.errorCode") == code
                assert await page.locator(f"{WIDGET} button.start").inner_text() == "Try again"
            assert "origin_not_allowed" in "\n".join(console)  # the technical detail is in the console
        assert not gateway.registry.calls and gateway.registry.active == 0


async def test_the_widget_reconnects_after_a_server_side_drop(start_gateway, tmp_path):
    """The gateway drops the call without a word (as a dying node would): the widget shows
    "reconnecting", resumes the same session with its resume token, and goes on listening."""
    shots = tmp_path / "shots"
    async with sites(1) as (shop_site,):
        gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[shop_site.origin], stats_interval_s=0.5)
        await shop_site.serve(the_shop(gateway, shop_site.origin))
        async with demo_page(caller_wav(tmp_path, 0.5, speech=False)) as (page, console):
            await open_shop(page, shop_site.origin)
            await widget_button(page, "start").click()
            await wait_state(page, "listening")
            await page.wait_for_function(f"document.querySelector('{WIDGET}').call.ready !== null")  # events flow
            first = next(iter(gateway.registry.by_session.values()))
            session_id = first.session_id

            resume_release, resume_held = asyncio.Event(), asyncio.Event()
            await hold(page, f"{gateway.url}/v1/calls", resume_release, resume_held,
                       when=lambda request: "resume_token" in (request.post_data or ""))
            await first.close("peer_timeout")  # dropped without session.ended
            await asyncio.wait_for(resume_held.wait(), WAIT_MS / 1000)
            await shot(page, shots, "reconnecting")
            # Motion only for those who have not asked for less.
            dot = f"document.querySelector('{WIDGET}').shadowRoot.querySelector('.dot')"
            assert await page.evaluate(f"getComputedStyle({dot}).animationName") == "pulse"
            await page.emulate_media(reduced_motion="reduce")
            assert await page.evaluate(f"getComputedStyle({dot}).animationName") == "none"
            resume_release.set()

            await page.wait_for_function(f"document.querySelector('{WIDGET}').call.reconnects === 1")
            await wait_state(page, "listening")
            second = gateway.registry.by_session[session_id]
            assert second is not first and second.resumed
            await hang_up(page, gateway)


async def test_keyboard_only_use(start_gateway, tmp_path):
    """Tab reaches the widget's labelled button, Enter calls, focus moves to the call's
    controls, Space mutes, Enter hangs up and focus comes back; Escape hangs up too."""
    async with sites(1) as (shop_site,):
        gateway = await start_gateway(api_keys=[API_KEY], allowed_origins=[shop_site.origin])
        await shop_site.serve(the_shop(gateway, shop_site.origin))
        async with demo_page(caller_wav(tmp_path, 0.5, speech=False)) as (page, console):
            await open_shop(page, shop_site.origin)
            for _ in range(10):  # past the shop's own links
                await page.keyboard.press("Tab")
                focus = await page.evaluate(DEEP_FOCUS)
                if focus and focus["cls"] == "start":
                    break
            assert focus == {"tag": "button", "cls": "start", "label": "Talk to us: start a voice call"}

            await page.keyboard.press("Enter")
            await wait_state(page, "listening")
            assert (await page.evaluate(DEEP_FOCUS))["label"] == "Hang up"
            await page.keyboard.press("Shift+Tab")
            assert (await page.evaluate(DEEP_FOCUS))["label"] == "Mute microphone"
            await page.keyboard.press("Space")
            assert await page.get_attribute(f"{WIDGET} button.mute", "aria-pressed") == "true"
            assert await page.evaluate(
                f"document.querySelector('{WIDGET}').call.microphone.getAudioTracks()[0].enabled") is False
            await page.keyboard.press("Tab")
            async with page.expect_response(lambda r: r.request.method == "DELETE") as deleted:
                await page.keyboard.press("Enter")
            assert (await deleted.value).status == 204
            await wait_state(page, "idle")
            assert (await page.evaluate(DEEP_FOCUS))["cls"] == "start"

            await page.keyboard.press("Enter")
            await wait_state(page, "listening")
            await page.keyboard.press("Escape")
            await wait_state(page, "idle")
            await wait_for_no_calls(gateway)
            assert not gateway.registry.calls
