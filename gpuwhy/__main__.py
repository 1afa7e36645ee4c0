"""Entry point for `python -m gpuwhy`."""

from gpuwhy.app.cli import cli

cli()
