"""`gpuwhy mcp` over HTTP: the SDK's streamable-HTTP transport, bridged to the web view's WSGI.

The web view (Flask on cheroot, WSGI) serves ``/mcp`` (gpuwhy/webui/mcp.py: the token, the
body bound); this module gives it the MCP server to hand requests to: the same read-only
server as `gpuwhy mcp` over stdio (:func:`gpuwhy.app.mcp_server.build_server`), on the SDK's
streamable-HTTP transport in stateless mode with JSON answers (each POST is one exchange,
no session to keep or resume, no stream left open to hold a worker), run on an asyncio
loop of its own thread and bridged to WSGI by a2wsgi, not by a protocol of our own.

Nothing of the SDK is imported, and no thread started, until the first request with the
token: the sidecar does not pay for MCP's imports (pydantic, starlette: megabytes) unless
someone uses it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from flask import Flask

from gpuwhy.config import Config
from gpuwhy.threads import Thread
from gpuwhy.webui.mcp import EXTENSION, MAX_BODY

START_TIMEOUT = 10.0       # seconds the transport may take to start (the SDK's imports)
STOP_TIMEOUT = 2.0         # seconds close() waits for the exchanges still running

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class McpOverHttp:
    """A WSGI app answering MCP's streamable HTTP: built at its first request."""

    def __init__(self, config: Config):
        self.config = config
        self._lock = threading.Lock()
        self._wsgi: WsgiApp | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running: Future[None] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        return self._app()(environ, start_response)

    def _app(self) -> WsgiApp:
        with self._lock:
            if self._wsgi is None:
                self._wsgi = self._start()
            return self._wsgi

    def _start(self) -> WsgiApp:
        from a2wsgi import ASGIMiddleware
        from mcp.server.transport_security import TransportSecuritySettings

        from gpuwhy.app.mcp_server import build_server
        from gpuwhy.app.verdicts import service_rules

        config = self.config
        server = build_server(config["store.path"], lambda: service_rules(config),
                              prometheus_url=config["fleet.prometheus_url"],
                              prometheus_timeout=config["fleet.prometheus_timeout"])
        # The web view's own Host allow-list (webui/security.py) has run before any request
        # gets here; the SDK's would refuse every name but localhost.
        server.streamable_http_app(
            stateless_http=True, json_response=True, max_request_body_size=MAX_BODY,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        manager = server.session_manager
        loop = asyncio.new_event_loop()
        Thread(target=loop.run_forever, name="gpuwhy-mcp-http", daemon=True).start()
        started = threading.Event()

        async def run() -> None:
            # the manager's task group lives as long as this coroutine: every request's
            # exchange runs in it (a2wsgi gives ASGI apps no lifespan of their own)
            self._stop = asyncio.Event()
            async with manager.run():
                started.set()
                await self._stop.wait()

        self._running = asyncio.run_coroutine_threadsafe(run(), loop)
        if not started.wait(START_TIMEOUT):
            raise RuntimeError("the MCP transport did not start")
        self._loop = loop
        return ASGIMiddleware(manager.handle_request, loop=loop)  # type: ignore[arg-type,return-value]

    def close(self, wait: float = STOP_TIMEOUT) -> None:
        """Stop the transport (``wait`` s at most for the exchanges running) and its loop;
        a later request starts it again."""
        with self._lock:
            loop, stop, running = self._loop, self._stop, self._running
            self._wsgi = self._loop = self._stop = self._running = None
        if loop is None or stop is None or running is None:
            return
        loop.call_soon_threadsafe(stop.set)
        try:
            running.result(wait)
        except Exception:  # noqa: BLE001 - stopping: what it ended with changes nothing
            pass
        loop.call_soon_threadsafe(loop.stop)


def mount(app: Flask, config: Config) -> McpOverHttp:
    """Serve MCP at ``/mcp`` of the web view ``app`` (the token is asked there)."""
    endpoint = McpOverHttp(config)
    app.extensions[EXTENSION] = endpoint
    return endpoint
