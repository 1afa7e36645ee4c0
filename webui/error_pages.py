"""Error answers that never strand a page: every 5xx says why and when to try again.

A page that reloads itself (the overview does when a GPU's health changes) must not land on
an error page that stays there: every answer of 500 or more carries ``Retry-After``, and an
HTML one to a GET also ``Refresh`` (the browser loads the page again after that many
seconds, with no script, which the Content-Security-Policy would refuse inline anyway).
A store that cannot be read now (not there yet, being upgraded by its migrations, busy)
answers 503 with the reason; anything else unexpected, 500.
"""

from __future__ import annotations

import json
import logging
import sqlite3

from flask import Flask, Response, current_app, jsonify, render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from gpuwhy.errors import StoreError
from gpuwhy.store.migrations import migrations
from gpuwhy.webui.db import get_db

RETRY_SECONDS = 5          # how soon an error page, or a client told 503, tries again
# (app.config["RETRY_SECONDS"] where set: a test that waits for the retry)
log = logging.getLogger("gpuwhy.web")


def retry_seconds() -> int:
    """How soon to try again, in seconds."""
    return int(current_app.config.get("RETRY_SECONDS", RETRY_SECONDS))


def _wants_json() -> bool:
    return request.path.startswith("/api/") or \
        request.accept_mimetypes.best == "application/json"


def error_answer(status: int, message: str) -> ResponseReturnValue:
    """``message`` as JSON (``{"error": …}``) to API clients, else as a page that needs
    nothing from the store (it may be what failed; base.html's one read, the SIMULATED
    banner, gives up quietly), plain text if even that fails."""
    if _wants_json():
        return jsonify(error=message, retry_after=retry_seconds()), status
    try:
        return render_template("error.html", status=status, message=message,
                               retry_seconds=retry_seconds()), status
    except Exception:  # noqa: BLE001 - the error page itself must not fail
        log.exception("the error page could not be rendered")
        return Response(f"{status}: {message}\n", status, mimetype="text/plain")


def pending_migrations() -> list[str]:
    """The store's migrations not yet applied (another process is upgrading it, or has not
    started to), by name; [] when that cannot be read."""
    try:
        return [m.name for m in migrations.pending(get_db())]
    except (StoreError, sqlite3.Error):
        return []


def store_unavailable(exc: Exception) -> ResponseReturnValue:
    """503 for a store that cannot be read now, saying why; 500 for an SQL failure that is
    none of those (a fault to report, logged with its traceback)."""
    path = current_app.config["DATABASE"]
    if isinstance(exc, StoreError):
        return error_answer(503, f"{exc}: is gpuwhy up running, and has it written the "
                                 "store yet?")
    pending = pending_migrations()
    if pending:
        return error_answer(503, f"the store {path} is being upgraded: {len(pending)} "
                                 f"schema migration(s) pending (next: {pending[0]}); "
                                 "gpuwhy up applies them as it starts")
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
        return error_answer(503, f"the store {path} is busy: {text}")
    log.error("reading the store failed on %s", request.path, exc_info=exc)
    return error_answer(500, f"reading the store failed: {text}")


def http_error(exc: HTTPException) -> ResponseReturnValue:
    """Below 500: Werkzeug's own page (it says enough), or to an API client the same
    message as JSON ``{"error": …}`` with the same headers (405's Allow); ours above."""
    if exc.code is not None and exc.code >= 500:
        return error_answer(exc.code, exc.description or exc.name)
    if not request.path.startswith("/api/"):
        return exc
    response = exc.get_response()
    response.set_data(json.dumps({"error": exc.description or exc.name}))
    response.mimetype = "application/json"
    return response


def retry_later(response: Response) -> Response:
    """Every answer of 500 or more, from any view or handler: when to try again."""
    if response.status_code >= 500:
        response.headers.setdefault("Retry-After", str(retry_seconds()))
        if request.method == "GET" and response.mimetype == "text/html":
            response.headers.setdefault("Refresh", str(retry_seconds()))
    return response


def init_app(app: Flask) -> None:
    app.register_error_handler(StoreError, store_unavailable)
    app.register_error_handler(sqlite3.Error, store_unavailable)
    app.register_error_handler(HTTPException, http_error)
    app.after_request(retry_later)
