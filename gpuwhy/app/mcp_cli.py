"""`gpuwhy mcp`: serve gpuwhy's answers to a local AI assistant over MCP (stdio), read-only.

The same server is served over HTTP by the web view at ``/mcp`` (gpuwhy/app/mcp_http.py)."""

from __future__ import annotations

import logging
import sys

import click


@click.command()
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """Serve the store to an AI assistant (MCP over stdin/stdout), read-only.

    An MCP client (Claude Desktop, Cursor, an Ollama MCP client) starts this command and
    talks to it on stdin/stdout; see docs/mcp.md for the client's JSON config. Tools: why,
    gpus, gpu_series, processes, incidents, incident, resets, rules, stacks, query, fleet.
    Nothing a client sends changes the store, the rules or the service. The web view
    serves the same over HTTP at /mcp, behind its token.

    \b
    Examples:
      gpuwhy mcp
      gpuwhy --config /etc/gpuwhy/gpuwhy.toml mcp
    """
    from gpuwhy.app.mcp_server import build_server, settle
    from gpuwhy.app.verdicts import service_rules

    config = ctx.obj.config()
    # stdout is the protocol's: every log line goes to stderr, which MCP clients keep
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="gpuwhy mcp %(levelname)s: %(message)s")
    server = build_server(config["store.path"], lambda: service_rules(config),
                          prometheus_url=config["fleet.prometheus_url"],
                          prometheus_timeout=config["fleet.prometheus_timeout"])
    settle()      # what lives now lives as long as the process: no full collection walks it
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
