"""The command line's path parameter (a leaf: click only, so every command's wiring may use it)."""

from __future__ import annotations

from typing import Any

import click


class PathParam(click.Path):
    """click.Path that refuses an empty name: `-o ''` would otherwise mean the current folder
    (traces and `.stepcli/` written where the user stands), the default file, or an error naming no
    file at all."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path; give a file or folder name", param, ctx)
        return super().convert(value, param, ctx)
