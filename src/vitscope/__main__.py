"""``python -m vitscope`` (and ``torchrun --nproc_per_node=K -m vitscope analyze ...``): the command line."""

from vitscope.cli.main import app

app(prog_name="vitscope")
