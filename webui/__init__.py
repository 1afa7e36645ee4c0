"""The web view: ``create_app(config)`` builds the Flask app, with no import side effects."""

from __future__ import annotations

import secrets
from typing import Any

from flask import Flask

from gpuwhy.config import Config, load_config


def create_app(config: Config | None = None, test_config: dict[str, Any] | None = None) -> Flask:
    """The Flask application over the store named by ``config["store.path"]``.

    Raises :class:`gpuwhy.errors.ConfigError` when auth is on without a token.
    """
    from gpuwhy.webui import (
        answers,
        auth,
        compress,
        db,
        error_pages,
        filters,
        gpus,
        health,
        incidents,
        mcp,
        processes,
        resets,
        rules,
        security,
        stacks,
        throttle,
        vendor,
    )

    config = config or load_config()
    app = Flask(__name__)
    app.config.from_mapping(GPUWHY=config, DATABASE=config["store.path"],
                            REFRESH_SECONDS=config["web.refresh_seconds"],
                            AUTH_TOKEN=auth.auth_token(config),
                            VENDOR_PATH=str(vendor.vendor_path(config)),
                            MAX_POINTS=config["web.max_points"],
                            SECRET_KEY=secrets.token_bytes(32))
    if test_config:
        app.config.update(test_config)
    app.extensions["gpuwhy.throttle"] = throttle.Throttle()   # token attempts (auth)
    db.init_app(app)
    security.init_app(app)
    compress.init_app(app)
    filters.init_app(app)
    error_pages.init_app(app)
    for module in (auth, answers, gpus, processes, incidents, resets, rules, vendor, health,
                   stacks, mcp):   # /mcp: its server is put in by gpuwhy.app.mcp_http
        app.register_blueprint(module.bp)
    from gpuwhy.webui import metrics  # /metrics

    metrics.register_metrics(app)
    return app
