"""Entry point for `python -m gpuwhy`."""

from gpuwhy.cli import cli

cli()
