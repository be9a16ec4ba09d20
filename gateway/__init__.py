"""Parley's network edge: signaling, WebRTC calls, jitter buffer, pacer, events."""
