"""The web view's HTTP server: Werkzeug's, with a ``Server`` header that names no versions."""

from __future__ import annotations

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from gpuwhy.config import Config
from gpuwhy.webui import create_app

SERVER_NAME = "gpuwhy"


class RequestHandler(WSGIRequestHandler):
    """Werkzeug's handler says ``Werkzeug/3.x Python/3.x`` in every response (its own error
    pages included, which never reach the app): versions only help whoever looks for a
    known hole. The app cannot fix that itself: http.server adds its header regardless."""

    server_version = SERVER_NAME   # also the WSGI SERVER_SOFTWARE

    def version_string(self) -> str:
        return SERVER_NAME


def make_web_server(config: Config) -> BaseWSGIServer:
    """The threaded server of ``create_app(config)`` on web.host and web.port (0: any)."""
    return make_server(config["web.host"], config["web.port"], create_app(config),
                       threaded=True, request_handler=RequestHandler)
