"""`kvcli bench` (being built: see the issue tracker)."""

from __future__ import annotations

import click


@click.command(context_settings={"ignore_unknown_options": True})
def bench() -> None:
    """Not built yet: exits with an error instead of pretending."""
    raise click.ClickException("'kvcli bench' is not available in this build yet")
