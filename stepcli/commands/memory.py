"""`stepcli memory`: its options; reading and analyzing the snapshots is
stepcli.snapshots.memorymain's, loaded only when the command runs."""

from __future__ import annotations

import math

import click

from stepcli.commands.pathparam import PathParam
from stepcli.limits import DEFAULT_DECODE_BYTES

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
}
_SIZE_UNITS.update(
    {"t": 1 << 40, "tib": 1 << 40, "kb": 1000, "mb": 10**6, "gb": 10**9, "tb": 10**12}
)


def parse_size(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    """A size in bytes: `4GiB`, `512MiB`, `1.5G` (binary), `2GB` (decimal), `1073741824`."""
    text = value.strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    unit = _SIZE_UNITS.get(text[len(number) :])
    try:
        count = float(number) * unit if unit is not None and number else math.nan
    except ValueError:
        count = math.nan
    if not math.isfinite(count) or count < 1 << 20:
        raise click.BadParameter(
            f"expected a size of at least 1MiB, such as 4GiB or 512MiB; got {value!r}"
        )
    return int(count)


@click.command(
    short_help="What filled CUDA memory: a snapshot's peak or out-of-memory error, split and "
    "advice."
)
@click.argument("path", type=PathParam())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Allocation sites listed.",
)
@click.option(
    "--max-memory",
    default=f"{DEFAULT_DECODE_BYTES >> 30}GiB",
    show_default=True,
    callback=parse_size,
    help="Memory the decoding of one snapshot may take (4GiB, 512MiB...); past it, refused.",
)
def memory(path: str, as_json: bool, top: int, max_memory: int) -> int:
    """Read CUDA memory snapshots and say what filled the memory, when, and what to do about it.

    PATH is a snapshot (a torch.cuda.memory._snapshot() pickle, .gz too) or a `stepcli run --memory`
    output folder (its oom-*.pickle files). Exit 0 analyzed, 2 bad input (missing, not a snapshot,
    not of a snapshot's shape, a pickle that asks for a class, over --max-memory: refused), 3 no
    snapshot in the folder.
    """
    from stepcli.snapshots.memorymain import memory_main

    click.echo(memory_main(path, as_json=as_json, top=top, max_memory=max_memory))
    return 0
