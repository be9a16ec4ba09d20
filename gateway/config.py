"""Parley's configuration: one typed place, from defaults, PARLEY_* environment and CLI flags."""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

MODES = ("echo-test",)
LOG_LEVELS = ("debug", "info", "warning", "error")
SECRET_FIELDS = {"secret"}


class ConfigError(ValueError):
    """A setting has a value Parley cannot run with; the message names it."""


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    max_sessions: int = 32
    mode: str = "echo-test"
    log_level: str = "info"
    echo_delay_ms: int = 400  # echo-test: how long after speaking the caller hears themself
    opus_bitrate: int = 32000  # outbound Opus, mono, with in-band FEC
    stats_interval_s: float = 1.0  # period of call.stats events
    connect_timeout_s: float = 20.0  # a call whose peer never connects is closed after this
    ice_addresses: list[str] = field(default_factory=list)  # host candidate IPs; empty = all interfaces
    stun_urls: list[str] = field(default_factory=list)  # e.g. stun:stun.example.org:3478
    secret: str = ""  # HMAC key for resume tokens; random per process when unset
    resume_token_ttl_s: int = 3600
    retry_after_s: int = 2  # Retry-After on 429/503
    privacy_log_content: bool = False  # allow audio/transcript text in logs

    def __post_init__(self) -> None:
        if not self.secret:
            self.secret = secrets.token_urlsafe(32)

    def validate(self) -> "Config":
        if self.mode not in MODES:
            raise ConfigError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level: {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: {self.port} is outside 0-65535")
        if self.max_sessions < 1:
            raise ConfigError(f"max_sessions: {self.max_sessions} must be at least 1")
        if not 0 <= self.echo_delay_ms <= 5000:
            raise ConfigError(f"echo_delay_ms: {self.echo_delay_ms} is outside 0-5000")
        if not 6000 <= self.opus_bitrate <= 510000:
            raise ConfigError(f"opus_bitrate: {self.opus_bitrate} is outside 6000-510000")
        if self.stats_interval_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("stats_interval_s and connect_timeout_s must be positive")
        return self

    def masked(self) -> dict[str, Any]:
        """The settings as printed at start: secrets masked."""
        out = dataclasses.asdict(self)
        for name in SECRET_FIELDS:
            out[name] = "***" if out[name] else ""
        return out


def _parse(f: dataclasses.Field, raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind.startswith("list"):
            return [part.strip() for part in raw.split(",") if part.strip()]
        return raw
    except ValueError:
        raise ConfigError(f"{f.name}: cannot read {raw!r} as {kind}") from None


def from_env(environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Settings given as PARLEY_<NAME> environment variables."""
    environ = os.environ if environ is None else environ
    values = {}
    for f in dataclasses.fields(Config):
        raw = environ.get("PARLEY_" + f.name.upper())
        if raw is not None:
            values[f.name] = _parse(f, raw)
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One --flag per setting (dashes for underscores); a flag beats the environment."""
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(),
                            help=f"(env PARLEY_{f.name.upper()})")


def load(args: Optional[argparse.Namespace] = None, environ: Optional[dict[str, str]] = None) -> Config:
    values = from_env(environ)
    fields = {f.name: f for f in dataclasses.fields(Config)}
    if args is not None:
        for name, f in fields.items():
            raw = getattr(args, name, None)
            if raw is not None:
                values[name] = _parse(f, str(raw))
    return Config(**values).validate()
