"""`python -m dractl`: the same CLI as the `dractl` console script."""

from dractl import cli

cli.main(prog_name="dractl")
