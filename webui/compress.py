"""Static files sent compressed: the pages' scripts and styles (``/static/…``) and the chart
library (``/vendor/…``: echarts.min.js is 1.03 MB as it stands, 0.33 MB gzipped) go out
gzipped to a browser that accepts it, each compressed once per version of the file.

Caching stays as Flask's ``send_file`` sets it (an ETag and Last-Modified on every file;
``no-cache`` on /static, which the browser revalidates; an hour on /vendor); the gzipped
variant has an ETag of its own (the file's, suffixed), answered with 304 when the browser
already holds it, and ``Vary: Accept-Encoding`` tells caches the two apart."""

from __future__ import annotations

import gzip
import threading

from flask import Flask, Request, Response, request

PREFIXES = ("/static/", "/vendor/")
TYPES = ("text/javascript", "application/javascript", "text/css", "image/svg+xml")
SUFFIX = "-gzip"
MIN_BYTES = 512              # smaller ones are not worth a round of compression
_cache: dict[tuple[str, str], bytes] = {}      # (path, the file's ETag) -> gzipped bytes
_lock = threading.Lock()


def _accepts_gzip(req: Request) -> bool:
    return any(coding.strip().split(";")[0].strip() in ("gzip", "*") and
               not coding.strip().replace(" ", "").endswith(";q=0")
               for coding in req.headers.get("Accept-Encoding", "").split(","))


def _compressed(path: str, etag: str, response: Response) -> bytes:
    key = (path, etag)
    with _lock:
        found = _cache.get(key)
    if found is None:
        response.direct_passthrough = False
        found = gzip.compress(response.get_data(), compresslevel=9, mtime=0)
        with _lock:
            for old in [k for k in _cache if k[0] == path]:
                del _cache[old]          # an older version of the same file
            _cache[key] = found
    return found


def compress(response: Response) -> Response:
    if (request.method not in ("GET", "HEAD") or response.status_code not in (200, 304)
            or not request.path.startswith(PREFIXES)
            or response.mimetype not in TYPES or "Content-Encoding" in response.headers):
        return response
    response.vary.add("Accept-Encoding")
    etag, weak = response.get_etag()
    if not etag or not _accepts_gzip(request):
        return response
    gz_etag = etag + SUFFIX
    if gz_etag in request.if_none_match:
        # the browser holds this version, gzipped: nothing to send again
        response.status_code = 304
        response.direct_passthrough = False
        response.set_data(b"")
        response.headers.pop("Content-Length", None)
        response.set_etag(gz_etag, bool(weak))
        return response
    if response.status_code != 200 or (response.content_length or MIN_BYTES) < MIN_BYTES:
        return response
    body = _compressed(request.path, etag, response)
    response.direct_passthrough = False
    response.set_data(body)             # sets Content-Length
    response.headers["Content-Encoding"] = "gzip"
    response.headers.pop("Accept-Ranges", None)   # byte ranges of the file, not of this
    response.set_etag(gz_etag, bool(weak))
    return response


def init_app(app: Flask) -> None:
    app.after_request(compress)
