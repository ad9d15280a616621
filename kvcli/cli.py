"""The `kvcli` command line: a click group whose subcommands live in kvcli.commands.

Every subcommand module imports only click and the standard library at import
time; torch and transformers are imported inside the command bodies, so
`kvcli --help` and `kvcli audit` start fast and never load torch.
"""

from __future__ import annotations

import click

from kvcli import __version__  # also sets the thread-pool environment (kvcli/__init__.py)
from kvcli.commands.audit import audit
from kvcli.commands.bench import bench
from kvcli.commands.cache import cache
from kvcli.commands.generate import generate
from kvcli.commands.models import models


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvcli")
def main() -> None:
    """Offline LLM batch generation with prefix caching, and prompt-cache auditing."""


main.add_command(generate)
main.add_command(audit)
main.add_command(models)
main.add_command(bench)
main.add_command(cache)
