"""Reading the command lines the product renders: the value after a flag."""

from __future__ import annotations

from collections.abc import Sequence


def flag(args: Sequence[str], name: str) -> str:
    """The value after flag ``name`` in ``args`` (the flag must be there)."""
    return args[args.index(name) + 1]


def flags(args: Sequence[str], *names: str) -> dict[str, str]:
    """The value after each flag of ``names``, by flag: compare it to a dict to check several at once."""
    return {name: flag(args, name) for name in names}
