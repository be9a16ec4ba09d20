"""Headless Chromium placing a call from the demo page, its microphone a WAV file."""

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")  # Debian's chromium, driven by Playwright


def chromium_args(wav: Path) -> list[str]:
    return [
        "--no-sandbox",
        "--use-fake-ui-for-media-stream",  # grant the microphone without a prompt
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav.resolve()}%noloop",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-gpu",
        "--allow-loopback-in-peer-connection",  # the gateway offers only 127.0.0.1
        "--disable-features=WebRtcHideLocalIpsWithMdns",  # real IPs, not .local names
    ]
