"""The `kvcli` command line: a click group whose subcommands live in kvcli.commands.

Every subcommand module imports only click and the standard library at import
time; torch and transformers are imported inside the command bodies, so
`kvcli --help` and `kvcli audit` start fast and never load torch.
"""

from __future__ import annotations

import click

from kvcli import __version__, startup  # __init__ sets the thread-pool environment
from kvcli.commands.audit import audit
from kvcli.commands.bench import bench
from kvcli.commands.cache import cache
from kvcli.commands.generate import generate
from kvcli.commands.models import models
from kvcli.commands.perplexity import perplexity
from kvcli.commands.serve import serve

# Commands whose start-up (model load, conversion) keeps kvcli/startup.py's exit-at-once
# Ctrl-C handler; the others get Python's default handling back, as before. perplexity keeps
# it throughout: it writes nothing until its one result line.
_CLEAN_EXIT_COMMANDS = frozenset({"generate", "models", "perplexity", "serve"})


class _UsageError(click.UsageError):
    """A usage error worded like every other kvcli message: ``kvcli generate: ...`` on one
    line (click's own form is a usage block and ``Error: ...``)."""

    def show(self, file: object = None) -> None:
        path = self.ctx.command_path if self.ctx is not None else "kvcli"
        click.echo(f"{path}: {self.format_message()} (see {path} --help)", err=True)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            if isinstance(err, _UsageError):
                raise
            raise _UsageError(err.format_message(), err.ctx) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvcli")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Offline LLM batch generation with prefix caching, and prompt-cache auditing."""
    if ctx.invoked_subcommand not in _CLEAN_EXIT_COMMANDS:
        startup.release()


main.add_command(generate)
main.add_command(audit)
main.add_command(models)
main.add_command(bench)
main.add_command(cache)
main.add_command(perplexity)
main.add_command(serve)
