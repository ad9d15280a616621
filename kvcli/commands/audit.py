"""`kvcli audit` (being built: see the issue tracker)."""

from __future__ import annotations

import click


@click.command(context_settings={"ignore_unknown_options": True})
def audit() -> None:
    """Not built yet: exits with an error instead of pretending."""
    raise click.ClickException("'kvcli audit' is not available in this build yet")
