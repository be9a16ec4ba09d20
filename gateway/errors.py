"""The gateway's error body: {"error": {"code", "message"}}, raised as ApiError anywhere on the edge."""

from __future__ import annotations

from typing import Optional

from aiohttp import web


class ApiError(Exception):
    """A refusal the client should read: HTTP status, a stable code, a human message."""

    def __init__(self, status: int, code: str, message: str, headers: Optional[dict] = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_response(status: int, code: str, message: str, headers: Optional[dict] = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)
