"""`python -m kvcli`: the clean Ctrl-C handler goes in before the CLI's imports."""

from kvcli import startup

startup.install()

from kvcli.cli import main  # noqa: E402 - after the handler, on purpose

main(prog_name="kvcli")  # messages say "kvcli generate: ...", however it was started
