"""Parley's configuration: one typed place.

Precedence, lowest first: the dataclass defaults < an optional TOML file (`--config FILE`
or PARLEY_CONFIG, same keys as the dataclass) < PARLEY_* environment < CLI flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from engine import DEFAULT_TURN_CUES, STT_MODELS, TURN_CUES

MODES = ("echo-test", "transcribe", "conversation")
ENGINE_MODES = ("transcribe", "conversation")  # modes that need the speech engine
RESUME_UNFINISHED = ("continue", "drop")
ENGINE_DEVICES = ("auto", "cpu", "cuda")
NEW_CALLS_WITHOUT_REDIS = ("accept", "reject")
LOG_LEVELS = ("debug", "info", "warning", "error")
SECRET_FIELDS = {"secret", "openai_api_key", "webhook_token", "api_keys", "sip_password"}  # URLs may carry a password too: masked below
RESPONDERS = ("scripted", "echo", "openai", "webhook")
SIP_PRIVATE_NETWORKS = ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")


class ConfigError(ValueError):
    """A setting has a value Parley cannot run with; the message names it."""


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    max_sessions: int = 32
    mode: str = "echo-test"  # echo-test (diagnostic) | transcribe (live transcript) | conversation (an agent)
    log_level: str = "info"
    echo_delay_ms: int = 400  # echo-test: how long after speaking the caller hears themself
    opus_bitrate: int = 32000  # outbound Opus, mono, with in-band FEC
    stats_interval_s: float = 1.0  # period of call.stats events
    connect_timeout_s: float = 20.0  # a call whose peer never connects is closed after this
    ice_addresses: list[str] = field(default_factory=list)  # host candidate IPs; empty = all interfaces
    stun_urls: list[str] = field(default_factory=list)  # e.g. stun:stun.example.org:3478
    media_ports: str = ""  # UDP port range for media, e.g. 40000-40999 (open it in the firewall); empty = any
    secret: str = ""  # HMAC key for resume tokens; random per process when unset
    resume_token_ttl_s: int = 3600  # also how long a session nobody touches is kept (its history, for resuming)
    retry_after_s: int = 2  # Retry-After on 429/503
    drain_timeout_s: float = 30.0  # after SIGTERM, live calls may continue this long before session.migrate
    privacy_log_content: bool = False  # allow transcript text in logs (conversation turns); off: word counts only. Audio is never logged
    engine_device: str = "auto"  # auto = CUDA when present, else CPU
    engine_max_streams: int = 64  # engine state slots (one per call); calls beyond get 503
    engine_threads: int = 0  # torch CPU threads for the engine; 0 = torch's default
    engine_process: bool = True  # run the engine in a child process of its own: its threads share no GIL with the calls' event loop, and a crash there fails only the streams (it is restarted); false: in the gateway's own process
    stt_model: str = "whisper-tiny.en"  # whisper-tiny.en (Whisper reads the words, the SSM hears speech start) | ssm (Parley's SSM alone)
    stt_readers: int = 1  # whisper-tiny.en: threads that read callers' words (CPU cores beside the engine tick)
    turn_cues: str = DEFAULT_TURN_CUES  # whisper-tiny.en: who confirms a turn's end at a pause besides the words: pause (the pause head on Whisper's encoder) | ssm (the SSM's end-of-turn head: sooner, cuts more callers off) | ssm+pause | words
    stt_weights: str = ""  # STT safetensors file; empty = the shipped engine/weights/stt.safetensors
    tts_weights: str = ""  # TTS safetensors file (conversation mode); empty = engine/weights/tts.safetensors
    turn_end_probability: float = 0.0  # P(end) that closes a caller's turn, 0-1; 0 = the engine's default (0.98). Lower answers sooner but cuts more callers off at a pause (README, engine/weights/MODEL_CARD.md)
    resume_unfinished: str = "continue"  # a resumed session's cut-off reply: continue from the first unheard word, or drop
    idle_prompt_s: float = 15.0  # conversation: a caller silent this long is asked if they are still there
    idle_hangup_s: float = 15.0  # ... and after this much more silence the call ends (reason idle)
    max_turn_s: float = 30.0  # conversation: a caller talking this long without a pause gets an answer anyway
    record_dir: str = ""  # conversation: write each call's inbound audio and echo reference here (a 2-channel WAV for `parley replay`); empty = off
    redis_url: str = ""  # sessions and the node registry in Redis (redis://host:6379/0); empty = in memory
    node_id: str = ""  # this node's name in the registry and in leases; random per process when unset
    public_url: str = ""  # how clients reach this node (http://10.0.0.5:8080); drained calls are sent to peers' URLs
    lease_ttl_s: float = 5.0  # a dead node's sessions can be resumed elsewhere after this
    peer_timeout_s: float = 5.0  # a connected call with no RTP and no data-channel message for this long is dead
    new_calls_without_redis: str = "accept"  # while Redis is down: accept (sessions written when it returns) or reject (503)
    responder: str = "scripted"  # who decides what to say: scripted (flow file) | echo | openai | webhook
    flow_file: str = ""  # scripted: YAML flow; empty = the shipped contact-center demo (gateway/responders/flows/)
    flows: list[str] = field(default_factory=list)  # scripted: NAME=FILE flows a call token may name ("flow": NAME); calls without one run flow_file
    openai_base_url: str = ""  # openai: an OpenAI-compatible API, e.g. https://api.openai.com/v1, http://localhost:8000/v1
    openai_model: str = ""  # openai: the model name the endpoint expects
    openai_api_key: str = ""  # openai: sent as a Bearer token; never printed or logged
    system_prompt: str = ""  # openai: empty = a short spoken-answers voice-assistant prompt
    openai_tools: bool = True  # openai: offer the transfer_to_human and end_call tools (off for servers without tool calls)
    webhook_url: str = ""  # webhook: the conversation is POSTed here as JSON, the reply streamed back
    webhook_token: str = ""  # webhook: sent as a Bearer token when set; never printed or logged
    responder_timeout_s: float = 5.0  # openai/webhook: the first words of a reply must arrive within this
    responder_total_timeout_s: float = 60.0  # openai/webhook: a whole reply must arrive within this
    api_keys: list[str] = field(default_factory=list)  # keys that get call tokens (POST /v1/tokens); none, and no api_keys_file: open mode, calls need no token (docs/widget.md)
    api_keys_file: str = ""  # file of API keys' SHA-256 hex digests, one a line
    allowed_origins: list[str] = field(default_factory=list)  # web pages (scheme://host[:port]) that may place calls from a browser; open mode with none: any page
    call_token_max_ttl_s: int = 3600  # the longest ttl_s POST /v1/tokens grants
    rate_limit_per_token: int = 10  # with API keys: calls per minute one call token may place; 0 = no limit
    rate_limit_per_ip: int = 30  # with API keys: calls per minute from one client IP; 0 = no limit
    trusted_proxies: list[str] = field(default_factory=list)  # CIDRs of reverse proxies whose X-Forwarded-For names the client (per-IP limits); empty = the direct peer is the client
    sip_port: int = 0  # SIP user agent on this UDP port (5060); 0 = off (docs/sip.md)
    sip_host: str = ""  # address the SIP and RTP sockets bind to; empty = host
    sip_address: str = ""  # address put in Contact and SDP (a public or NAT address); empty = the local one that reaches the caller
    sip_allowed_networks: list[str] = field(default_factory=lambda: list(SIP_PRIVATE_NETWORKS))  # CIDRs SIP is accepted from; others are ignored unanswered
    sip_max_calls: int = 16  # live SIP calls; INVITEs beyond get 486 Busy Here
    sip_transfer_target: str = ""  # where a handoff transfers a SIP call (REFER), e.g. sip:queue@pbx.example.com; empty = no transfer
    sip_registrar: str = ""  # register with this PBX (sip:pbx.example.com[:port]); empty = no REGISTER
    sip_username: str = ""  # REGISTER's user and digest username
    sip_password: str = ""  # digest password for REGISTER; never printed or logged
    sip_register_expires_s: int = 300  # registration lifetime asked for (refreshed at half of what the PBX grants)
    sip_t1_ms: int = 500  # SIP timer T1 (RFC 3261): first retransmission interval; timers A, B, F, H, J derive from it

    def __post_init__(self) -> None:
        if not self.secret:
            self.secret = secrets.token_urlsafe(32)
        if not self.node_id:
            self.node_id = f"{socket.gethostname()}-{secrets.token_hex(3)}"

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
        if self.engine_device not in ENGINE_DEVICES and not self.engine_device.startswith("cuda:"):
            raise ConfigError(f"engine_device: {self.engine_device!r} is not one of {', '.join(ENGINE_DEVICES)} "
                              "(or cuda:N)")
        if self.engine_max_streams < 1 or self.engine_threads < 0:
            raise ConfigError("engine_max_streams must be at least 1 and engine_threads not negative")
        if self.stt_model not in STT_MODELS:
            raise ConfigError(f"stt_model: {self.stt_model!r} is not one of {', '.join(STT_MODELS)}")
        if self.turn_cues not in TURN_CUES:
            raise ConfigError(f"turn_cues: {self.turn_cues!r} is not one of {', '.join(TURN_CUES)}")
        if self.stt_readers < 1:
            raise ConfigError(f"stt_readers: {self.stt_readers} must be at least 1")
        for name in ("stt_weights", "tts_weights"):
            if getattr(self, name) and not Path(getattr(self, name)).is_file():
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not a file")
        if not 0.0 <= self.turn_end_probability < 1.0:
            raise ConfigError(f"turn_end_probability: {self.turn_end_probability} is outside 0-1 (0: the engine's default)")
        if self.record_dir and not Path(self.record_dir).is_dir():
            raise ConfigError(f"record_dir: {self.record_dir!r} is not a directory")
        if min(self.idle_prompt_s, self.idle_hangup_s, self.max_turn_s) <= 0:
            raise ConfigError("idle_prompt_s, idle_hangup_s and max_turn_s must be positive")
        if self.resume_unfinished not in RESUME_UNFINISHED:
            raise ConfigError(f"resume_unfinished: {self.resume_unfinished!r} is not one of "
                              f"{', '.join(RESUME_UNFINISHED)}")
        if self.media_ports:
            from .ice import parse_port_range

            try:
                parse_port_range(self.media_ports)
            except ValueError as exc:
                raise ConfigError(f"media_ports: {exc}") from None
        if self.lease_ttl_s <= 0 or self.peer_timeout_s <= 0:
            raise ConfigError("lease_ttl_s and peer_timeout_s must be positive")
        if self.new_calls_without_redis not in NEW_CALLS_WITHOUT_REDIS:
            raise ConfigError(f"new_calls_without_redis: {self.new_calls_without_redis!r} is not one of "
                              f"{', '.join(NEW_CALLS_WITHOUT_REDIS)}")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"redis_url: {self.redis_url!r} must start with redis://, rediss:// or unix://")
        if self.public_url and not self.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"public_url: {self.public_url!r} must start with http:// or https://")
        if self.drain_timeout_s < 0:
            raise ConfigError(f"drain_timeout_s: {self.drain_timeout_s} must not be negative")
        self._validate_responder()
        self._validate_access()
        if self.sip_port:
            from .sip.settings import SettingsError, validate_sip

            try:
                validate_sip(self)
            except SettingsError as exc:
                raise ConfigError(str(exc)) from None
        return self

    def _validate_access(self) -> None:
        from .api_keys import ApiKeyError, ApiKeys
        from .call_tokens import OriginError, normalize_origin

        for name, keys, keys_file in (("api_keys", self.api_keys, ""), ("api_keys_file", [], self.api_keys_file)):
            try:
                ApiKeys(keys, keys_file)
            except ApiKeyError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        for origin in self.allowed_origins:
            try:
                normalize_origin(origin)
            except OriginError as exc:
                raise ConfigError(f"allowed_origins: {exc}") from None
        if self.call_token_max_ttl_s < 1:
            raise ConfigError(f"call_token_max_ttl_s: {self.call_token_max_ttl_s} must be at least 1")
        if self.rate_limit_per_token < 0 or self.rate_limit_per_ip < 0:
            raise ConfigError("rate_limit_per_token and rate_limit_per_ip must not be negative (0: no limit)")
        from .client_ip import parse_networks

        try:
            parse_networks(self.trusted_proxies)
        except ValueError as exc:
            raise ConfigError(f"trusted_proxies: {exc}") from None

    def _validate_responder(self) -> None:
        if self.responder not in RESPONDERS:
            raise ConfigError(f"responder: {self.responder!r} is not one of {', '.join(RESPONDERS)}")
        if self.responder_timeout_s <= 0 or self.responder_total_timeout_s < self.responder_timeout_s:
            raise ConfigError("responder_timeout_s must be positive and responder_total_timeout_s at least as long")
        for name in ("openai_base_url", "webhook_url"):
            url = getattr(self, name)
            if url and not url.startswith(("http://", "https://")):
                raise ConfigError(f"{name}: {mask_url_password(url)!r} must start with http:// or https://")
        if self.responder == "openai" and not (self.openai_base_url and self.openai_model):
            raise ConfigError("responder openai needs openai_base_url and openai_model "
                              "(PARLEY_OPENAI_BASE_URL, PARLEY_OPENAI_MODEL)")
        if self.responder == "webhook" and not self.webhook_url:
            raise ConfigError("responder webhook needs webhook_url (PARLEY_WEBHOOK_URL)")
        if self.responder == "scripted" or self.flow_file:
            from .responders.flow import DEFAULT_FLOW, FlowError, cached_flow

            try:
                cached_flow(self.flow_file or DEFAULT_FLOW)
            except FlowError as exc:
                raise ConfigError(f"flow_file: {exc}") from None
        if self.flows and self.responder != "scripted":
            raise ConfigError(f"flows: named flows are scripted flows; responder is {self.responder!r} "
                              "(set responder scripted, or leave flows empty)")
        for name, path in self.named_flows().items():
            try:
                cached_flow(path)
            except FlowError as exc:
                raise ConfigError(f"flows: {name}: {exc}") from None

    def named_flows(self) -> dict[str, str]:
        """The `flows` setting as {name: flow file}; ConfigError for a malformed entry."""
        from .call_tokens import FLOW_PATTERN

        named: dict[str, str] = {}
        for entry in self.flows:
            name, sep, path = (part.strip() for part in entry.partition("="))
            if not sep or not path:
                raise ConfigError(f"flows: {entry!r} is not NAME=FILE (e.g. orders=/etc/parley/orders.yaml)")
            if not FLOW_PATTERN.fullmatch(name):
                raise ConfigError(f"flows: {name!r} is not a flow name (1-64 letters, digits, '_', '.' or '-')")
            if name in named:
                raise ConfigError(f"flows: {name!r} is named twice")
            named[name] = path
        return named

    def masked(self) -> dict[str, Any]:
        """The settings as printed at start: secrets masked."""
        out = dataclasses.asdict(self)
        for name in SECRET_FIELDS:
            out[name] = "***" if out[name] else ""
        for name in ("redis_url", "openai_base_url", "webhook_url"):
            out[name] = mask_url_password(out[name])
        return out


def mask_url_password(url: str) -> str:
    """redis://user:pw@host -> redis://user:***@host"""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


def _parse(f: dataclasses.Field, raw: str) -> Any:
    kind = _type_name(f)
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
    """--config FILE, then one --flag per setting (dashes for underscores); a flag beats the environment."""
    add_config_file_argument(parser)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(),
                            help=f"(env PARLEY_{f.name.upper()})")


def _type_name(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _check_file_value(f: dataclasses.Field, value: Any, source: str) -> Any:
    """A TOML value for field `f`, or a ConfigError naming the file, the key and the expected type."""
    kind = _type_name(f)
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(kind, isinstance(value, list) and all(isinstance(v, str) for v in value))
    if not ok:
        expected = "a list of strings" if kind.startswith("list") else kind
        raise ConfigError(f"{source}: {f.name}: expected {expected}, got {type(value).__name__} {value!r}")
    return float(value) if kind == "float" else value


def from_file(path: str) -> dict[str, Any]:
    """Settings from a TOML file whose top-level keys are the Config field names."""
    try:
        with Path(path).open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(Config)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"config file {path}: unknown key {unknown[0]!r} (known keys: {', '.join(fields)})")
    return {name: _check_file_value(fields[name], value, f"config file {path}") for name, value in data.items()}


def config_path(args: Optional[argparse.Namespace], environ: Optional[dict[str, str]]) -> Optional[str]:
    """The TOML file named by --config, else by PARLEY_CONFIG, else none."""
    environ = os.environ if environ is None else environ
    path = getattr(args, "config", None) if args is not None else None
    return path or environ.get("PARLEY_CONFIG") or None


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", dest="config", default=None, metavar="FILE",
                        help="TOML file with the same keys as the settings (env PARLEY_CONFIG)")


def load(args: Optional[argparse.Namespace] = None, environ: Optional[dict[str, str]] = None) -> Config:
    """The effective configuration: defaults < TOML file < environment < flags, validated."""
    path = config_path(args, environ)
    values = from_file(path) if path else {}
    values.update(from_env(environ))
    fields = {f.name: f for f in dataclasses.fields(Config)}
    if args is not None:
        for name, f in fields.items():
            raw = getattr(args, name, None)
            if raw is not None:
                values[name] = _parse(f, str(raw))
    return Config(**values).validate()
