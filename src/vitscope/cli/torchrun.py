"""Which commands share their work over the processes ``torchrun`` starts; the others refuse to run there."""

from __future__ import annotations

import typer

__all__ = ["DISTRIBUTED_COMMANDS", "refuse_under_torchrun"]

#: commands that share their work over the processes torchrun starts (the others run as one process)
DISTRIBUTED_COMMANDS = frozenset({"analyze", "compare", "probe", "sae train"})


def refuse_under_torchrun(command: str) -> None:
    """Exit with status 2 when ``command`` (e.g. ``"featviz"``, ``"sae eval"``) runs under ``torchrun`` but runs as
    one process: several processes would each run the whole command and write the same files."""
    from vitscope.engine.distributed import in_torchrun

    if in_torchrun() and command not in DISTRIBUTED_COMMANDS:
        typer.echo(f"error: 'vitscope {command}' runs as one process; under torchrun only "
                   f"{', '.join(sorted(DISTRIBUTED_COMMANDS))} share their work (start it without torchrun)", err=True)
        raise typer.Exit(2)
