"""Checks of the sip_* settings (gateway/config.py), each error naming its setting."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config


class SettingsError(ValueError):
    pass


def allowed_networks(cidrs: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(cidr, strict=False) for cidr in cidrs]
    except ValueError as exc:
        raise SettingsError(f"sip_allowed_networks: {exc}") from None


def validate_sip(config: "Config") -> None:
    if not 0 <= config.sip_port <= 65535:
        raise SettingsError(f"sip_port: {config.sip_port} is outside 0-65535")
    allowed_networks(config.sip_allowed_networks)
    if config.sip_max_calls < 1:
        raise SettingsError(f"sip_max_calls: {config.sip_max_calls} must be at least 1")
    for name in ("sip_transfer_target", "sip_registrar"):
        value = getattr(config, name)
        if value and not value.startswith(("sip:", "sips:")):
            raise SettingsError(f"{name}: {value!r} must be a sip: URI")
    if config.sip_registrar and not config.sip_username:
        raise SettingsError("sip_registrar needs sip_username (and usually sip_password)")
    if not 60 <= config.sip_register_expires_s <= 86400:
        raise SettingsError(f"sip_register_expires_s: {config.sip_register_expires_s} is outside 60-86400")
    if not 10 <= config.sip_t1_ms <= 5000:
        raise SettingsError(f"sip_t1_ms: {config.sip_t1_ms} is outside 10-5000")
