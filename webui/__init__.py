"""The web view: ``create_app(config)`` builds the Flask app, with no import side effects."""

from __future__ import annotations

from typing import Any

from flask import Flask

from gpuwhy.config import Config, load_config


def create_app(config: Config | None = None, test_config: dict[str, Any] | None = None) -> Flask:
    """The Flask application over the store named by ``config["store.path"]``."""
    from gpuwhy.webui import db, health, processes

    config = config or load_config()
    app = Flask(__name__)
    app.config.from_mapping(GPUWHY=config, DATABASE=config["store.path"],
                            REFRESH_SECONDS=config["web.refresh_seconds"])
    if test_config:
        app.config.update(test_config)
    db.init_app(app)
    app.register_blueprint(processes.bp)
    app.register_blueprint(health.bp)
    return app
