"""``/mcp``: the MCP server's streamable-HTTP endpoint in the web view, behind the token.

The endpoint reads everything the store holds (and allows read-only SQL on its views), so
it asks for the web view's token in every request, as a change does: ``Authorization:
Bearer TOKEN``; the login cookie is not enough. A web view without a token refuses it
outright (403): a loopback web view with no token is open to every local user, and MCP is
read access to everything. The MCP server itself is not part of the web view: whoever runs
the web view (``gpuwhy up``, :mod:`gpuwhy.app.mcp_http`) puts a WSGI app in
``app.extensions[EXTENSION]``; this view checks the token, bounds the body and hands the
request over. Without that app, 404.
"""

from __future__ import annotations

from io import BytesIO

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwhy.webui.auth import bearer_matches

bp = Blueprint("mcp", __name__)
EXTENSION = "gpuwhy.mcp"
# One JSON-RPC message of the read-only tools: the largest argument is a 20,000-character
# SQL query, which JSON escaping can grow six-fold; past this the body is refused unread.
MAX_BODY = 256 * 1024


def _refused(status: int, message: str, **headers: str) -> ResponseReturnValue:
    return jsonify(error=message), status, headers


@bp.route("/mcp", methods=["GET", "POST", "DELETE"])
def serve() -> ResponseReturnValue:
    if not current_app.config["AUTH_TOKEN"]:
        return _refused(403, "MCP over HTTP reads everything gpuwhy stores, so it needs a "
                             "token: start gpuwhy with GPUWHY_AUTH_TOKEN (web.auth_token) set, "
                             "and send it as 'Authorization: Bearer TOKEN'; or use `gpuwhy mcp` "
                             "(stdio) on the host")
    if not bearer_matches():
        return _refused(401, "send the web view's token as 'Authorization: Bearer TOKEN'",
                        **{"WWW-Authenticate": 'Bearer realm="gpuwhy"'})
    endpoint = current_app.extensions.get(EXTENSION)
    if endpoint is None:
        return _refused(404, "this web view serves no MCP endpoint (`gpuwhy up` does)")
    if request.method != "POST":
        # stateless: no session to resume (GET) or end (DELETE), no stream the server opens
        return _refused(405, "POST a JSON-RPC message: this endpoint is stateless and answers "
                             "in JSON, it keeps no session", Allow="POST")
    if (request.content_length or 0) > MAX_BODY:
        return _refused(413, f"an MCP message of at most {MAX_BODY // 1024} KiB is taken")
    body = request.stream.read(MAX_BODY + 1)     # chunked: no length said beforehand
    if len(body) > MAX_BODY:
        return _refused(413, f"an MCP message of at most {MAX_BODY // 1024} KiB is taken")
    environ = {**request.environ, "wsgi.input": BytesIO(body),
               "CONTENT_LENGTH": str(len(body))}
    environ.pop("HTTP_TRANSFER_ENCODING", None)  # the body is whole now, of that length
    return Response.from_app(endpoint, environ, buffered=True)
