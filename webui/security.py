"""What every request and response passes: the Host allow-list (against DNS rebinding), a
strict Content-Security-Policy and its companion headers."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Flask, Response, current_app, request

from gpuwhy.config import Config

# Scripts and styles only from this server, as files: no inline code, no eval, nothing remote.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")   # as written in a Host header
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")   # web.host values that name no one address


def host_name(host: str) -> str | None:
    """The name in a Host value (``name``, ``name:port``, ``[v6]``, ``[v6]:port``), lower-case
    and without brackets, as urllib splits it; None when there is none."""
    try:
        return urlsplit(f"//{host.strip()}").hostname
    except ValueError:   # an unclosed '[', a bad port
        return None


def allowed_hosts(config: Config) -> frozenset[str]:
    """The names the web view answers to: loopback, the address it binds (unless that is a
    wildcard), the host of correlator.url (the links in alerts) and web.allowed_hosts."""
    bound = config["web.host"].strip("[]")
    names = [*LOOPBACK_HOSTS, *config["web.allowed_hosts"].split(","),
             urlsplit(config["correlator.url"]).hostname or ""]
    if bound not in WILDCARD_ADDRESSES:
        names.append(f"[{bound}]" if ":" in bound else bound)   # a bare IPv6 address
    return frozenset(name for name in map(host_name, names) if name)


def host_allowed(host: str, allowed: frozenset[str]) -> bool:
    """Whether ``host`` (the validated ``request.host``) is allowed; an entry with a leading
    dot allows that name and every name under it."""
    name = host_name(host)
    if not name:
        return False
    return any(
        name == entry.lstrip(".") or (entry.startswith(".") and name.endswith(entry))
        for entry in allowed)


def refuse_foreign_host() -> Response | None:
    """400 for a Host this server does not go by: a page of another site whose name was
    rebound to this address sends its own name, so it can read nothing here.

    ``request.host`` is Werkzeug's, which already refuses invalid characters (it is then
    empty); the names are compared here rather than through Flask's TRUSTED_HOSTS because
    Werkzeug's matching cannot match an IPv6 literal (``[::1]``) at all.
    """
    if host_allowed(request.host, current_app.config["ALLOWED_HOSTS"]):
        return None
    return Response(f"400 Bad Request: this gpuwhy does not answer to the host "
                    f"{request.host or '(none or invalid)'}; add the name to web.allowed_hosts "
                    "(GPUWHY_ALLOWED_HOSTS) to reach it by that name\n", 400,
                    mimetype="text/plain")


def add_headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    return response


def init_app(app: Flask) -> None:
    """Before the blueprints, so the Host check runs ahead of every other request hook."""
    app.config.setdefault("ALLOWED_HOSTS", allowed_hosts(app.config["GPUWHY"]))
    app.before_request(refuse_foreign_host)
    app.after_request(add_headers)
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict")
