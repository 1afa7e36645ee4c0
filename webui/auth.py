"""Who may use the web view: the shared token, asked of every request when one is set, and of
every change (rules) always, sent in the request itself so a cookie alone never changes a thing.

A token comes as ``Authorization: Bearer TOKEN`` or as the form field ``token``. A browser
logs in once through ``/login``: the signed session cookie then lets it read pages; changes
still carry the token in their form (that also stops cross-site requests).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import (
    Blueprint,
    current_app,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.typing import ResponseReturnValue

from gpuwhy.config import Config
from gpuwhy.errors import ConfigError

bp = Blueprint("auth", __name__)
# Reachable without the token: the login form itself, liveness, the stylesheet.
OPEN_ENDPOINTS = frozenset({"auth.login", "health.healthz", "static"})


def auth_token(config: Config) -> str:
    """The configured token ('' when none); ``web.auth`` (ENABLE_AUTH=1) without one is an
    error, so turning auth on never leaves the view open by mistake."""
    token = config["web.auth_token"]
    if config["web.auth"] and not token:
        raise ConfigError("auth is on (ENABLE_AUTH / web.auth) but no token is set; "
                          "set GPUWHY_AUTH_TOKEN", key="web.auth_token")
    return token


def _matches(presented: str | None) -> bool:
    token = current_app.config["AUTH_TOKEN"]
    return bool(token) and presented is not None and hmac.compare_digest(
        presented.encode(), token.encode())


def presented_token() -> str | None:
    """The token sent with this request itself (header or form), never the cookie."""
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[len("Bearer "):]
    return request.form.get("token") if request.method == "POST" else None


def _refused(status: int, message: str) -> ResponseReturnValue:
    if request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json":
        return jsonify(error=message), status
    return render_template("refused.html", message=message), status


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
    if request.path.startswith("/api/") or request.path in ("/metrics",):
        return _refused(401, "send 'Authorization: Bearer TOKEN'")
    return redirect(url_for("auth.login", next=request.full_path))


def _local_path(target: str | None) -> str:
    """Only a path on this site (never ``//host``), so login cannot redirect elsewhere."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return url_for("gpus.overview")


@bp.route("/login", methods=["GET", "POST"])
def login() -> ResponseReturnValue:
    error = None
    if request.method == "POST":
        if _matches(request.form.get("token")):
            session.clear()
            session["authenticated"] = True
            return redirect(_local_path(request.args.get("next")))
        error = "wrong token"
    return render_template("login.html", error=error), 401 if error else 200
