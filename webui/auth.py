"""Who may use the web view: the shared token, asked of every request when one is set, and of
every change (rules) always, sent in the request itself so a cookie alone never changes a thing.

A token comes as ``Authorization: Bearer TOKEN`` or as the form field ``token``. A browser
logs in once through ``/login``: the signed session cookie then lets it read pages; changes
still carry the token in their form (that also stops cross-site requests).

A wrong token (login form, change form, Bearer header) is charged to the client's address
(gpuwhy.webui.throttle): after a few quick failures the address gets 429 with Retry-After for
every wrong token until its bucket has drained. The right token always passes, whatever
failures came before from its address: a scraper or browser sharing an address (a NAT, a
node, a proxy) with a guesser, or with a colleague who mistyped, is never locked out. A
success does not empty the bucket either: it would hand the guesser beside it fresh attempts.
The price, accepted (issue #54): a limited address still tells a right guess (200) from a
wrong one (429) at whatever rate it sends, so the limit slows honest mistakes and noisy
scanners, and the token's own length (16 random characters or more) is what stops guessing.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Response,
    current_app,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import TooManyRequests
from werkzeug.urls import iri_to_uri

from gpuwhy.config import Config
from gpuwhy.errors import ConfigError
from gpuwhy.webui.throttle import Throttle, client_key

bp = Blueprint("auth", __name__)
# Reachable without the token: the login form itself, liveness, the stylesheet.
OPEN_ENDPOINTS = frozenset({"auth.login", "health.healthz", "static"})
# Paths read by programs, not browsers: refused with 401 and JSON, never sent to the login form.
API_PATHS = ("/metrics", "/mcp")


def auth_token(config: Config) -> str:
    """The configured token ('' when none); ``web.auth`` (ENABLE_AUTH=1) without one is an
    error, so turning auth on never leaves the view open by mistake."""
    token = config["web.auth_token"]
    if config["web.auth"] and not token:
        raise ConfigError("auth is on (ENABLE_AUTH / web.auth) but no token is set; "
                          "set GPUWHY_AUTH_TOKEN", key="web.auth_token")
    return token


def _matches(presented: str | None) -> bool:
    """Whether ``presented`` is the token; a wrong one is charged to the client's address,
    and raises TooManyRequests (429) once the address has failed too often."""
    token = current_app.config["AUTH_TOKEN"]
    if not token or presented is None:
        return False
    if hmac.compare_digest(presented.encode(), token.encode()):
        return True
    throttle: Throttle = current_app.extensions["gpuwhy.throttle"]
    if wait := throttle.attempt(client_key(request.remote_addr)):
        raise TooManyRequests("too many wrong tokens from this address; wait and retry",
                              retry_after=wait)
    return False


def presented_token() -> str | None:
    """The token sent with this request itself (header or form), never the cookie."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[len("Bearer "):]
    return request.form.get("token") if request.method == "POST" else None


def bearer_matches() -> bool:
    """Whether this request's own ``Authorization: Bearer`` header carries the token (never
    the cookie, never a form field): what a program such as an MCP client sends."""
    header = request.headers.get("Authorization", "")
    return header.startswith("Bearer ") and _matches(header[len("Bearer "):])


def _is_api() -> bool:
    return request.path.startswith("/api/") or request.path in API_PATHS


def _refused(status: int, message: str) -> tuple[Response | str, int]:
    if _is_api() or request.accept_mimetypes.best == "application/json":
        return jsonify(error=message), status
    return render_template("refused.html", message=message), status


@bp.app_errorhandler(TooManyRequests)
def too_many_attempts(error: TooManyRequests) -> ResponseReturnValue:
    body, status = _refused(429, error.description or "too many attempts")
    return body, status, {"Retry-After": str(error.retry_after)}


def require_token(view: Callable[..., Any]) -> Callable[..., Any]:
    """For views that change something: the request must carry the configured token."""
    @wraps(view)
    def guarded(*args: Any, **kwargs: Any) -> ResponseReturnValue:
        if not current_app.config["AUTH_TOKEN"]:
            return _refused(403, "changes need a token: start gpuwhy with GPUWHY_AUTH_TOKEN set")
        if not _matches(presented_token()):
            return _refused(401, "this change needs the token (web.auth_token)")
        return view(*args, **kwargs)
    return guarded


@bp.before_app_request
def require_login() -> ResponseReturnValue | None:
    if not current_app.config["AUTH_TOKEN"] or request.endpoint in OPEN_ENDPOINTS:
        return None
    if session.get("authenticated") or _matches(presented_token()):
        return None
    if _is_api():
        refused = make_response(_refused(401, "send 'Authorization: Bearer TOKEN'"))
        refused.headers["WWW-Authenticate"] = 'Bearer realm="gpuwhy"'   # what 401 must say
        return refused
    return redirect(url_for("auth.login", next=request.full_path))


def local_path(target: str | None) -> str:
    """``target`` when it is a path on this site, else the overview: login never sends the
    browser elsewhere. Browsers drop tabs and newlines inside a URL and read ``\\`` as ``/``,
    so ``/\\t/evil`` or ``/\\evil`` would mean ``//evil``, another host: a target with a
    backslash, a control character or white space is refused outright, not cleaned."""
    if (not target or not target.startswith("/") or target.startswith("//") or "\\" in target
            or any(c.isspace() or not c.isprintable() for c in target)):
        return url_for("gpus.overview")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return url_for("gpus.overview")
    return iri_to_uri(target)   # ASCII for the Location header (Werkzeug would not quote it)


@bp.route("/login", methods=["GET", "POST"])
def login() -> ResponseReturnValue:
    error = None
    if request.method == "POST":
        if _matches(request.form.get("token")):
            session.clear()
            session["authenticated"] = True
            return redirect(local_path(request.args.get("next")))
        error = "wrong token"
    return render_template("login.html", error=error), 401 if error else 200
