"""A small shop's web server: its page embeds Parley's widget, and it hands out call tokens.

    PARLEY_GATEWAY=https://voice.shop.example PARLEY_API_KEY=... SHOP_ORIGIN=https://shop.example \
        python web/shop/shop.py --port 8000

The API key stays on this server; the page only ever sees a five-minute call token bound to
this site's origin. `parley_token_endpoint` is the part a site's backend copies.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import jinja2
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.Response]]
PAGE = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True).get_template(
    "index.html")


def parley_token_endpoint(gateway: str, api_key: str, site_origin: str) -> Handler:
    """POST /parley-token: a call token for this site's pages. (Add your own checks here: a
    logged-in customer, a rate limit.)"""
    async def parley_token(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gateway}/v1/tokens", json={"origins": [site_origin], "ttl_s": 300},
                                 headers={"Authorization": f"Bearer {api_key}"}) as reply:
                return web.json_response(await reply.json(), status=reply.status)
    return parley_token


def make_app(gateway: str, token_endpoint: Handler) -> web.Application:
    """The shop: its page (with the widget from `gateway`) and its token endpoint."""
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE.render(gateway=gateway.rstrip("/")), content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_post("/parley-token", token_endpoint)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="the small-shop example page for Parley's widget")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    gateway = os.environ.get("PARLEY_GATEWAY", "http://127.0.0.1:8080")
    origin = os.environ.get("SHOP_ORIGIN", f"http://{args.host}:{args.port}")
    endpoint = parley_token_endpoint(gateway, os.environ["PARLEY_API_KEY"], origin)
    web.run_app(make_app(gateway, endpoint), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
