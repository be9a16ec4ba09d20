"""Parley's SIP bridge: phones and PBXs call the same conversation loop as browsers (docs/sip.md)."""
