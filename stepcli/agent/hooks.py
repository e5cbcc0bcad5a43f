"""The post-import hook: run callbacks right after the program imports a module (torch, `--step-on`
modules).

Runs inside the target: standard library only. torch is never imported here: a meta-path finder
waits for the program to import it (importing it at start-up would run before the script sets
CUDA_VISIBLE_DEVICES or its multiprocessing start method, and would slow every Python process the
command starts).
"""

from __future__ import annotations

import importlib.util
import sys

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], None]


class PostImportHooks:
    """Runs callbacks right after a watched module finishes executing, before anyone else uses
    it."""

    def __init__(self, on_error: Callable[[str, BaseException], None]) -> None:
        self._callbacks: dict[str, list[Callback]] = {}
        self._resolving: set[str] = set()
        self._on_error = on_error

    def when_imported(self, name: str, callback: Callback) -> None:
        module = sys.modules.get(name)
        if module is not None:
            self._run(name, [callback], module)
            return
        self._callbacks.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> Any:
        if fullname not in self._callbacks or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            # the other finders, exactly as the import would
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving.discard(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        callbacks = self._callbacks.pop(fullname)
        original = loader.exec_module

        def stepcli_exec_module(module: ModuleType) -> None:
            try:
                original(module)
            finally:
                try:
                    # back to the class's method: the loader is this module's alone
                    del loader.exec_module
                except AttributeError:
                    pass
            self._run(fullname, callbacks, module)

        try:
            loader.exec_module = stepcli_exec_module
        except (AttributeError, TypeError):
            return None
        return spec

    def _run(self, name: str, callbacks: list[Callback], module: ModuleType) -> None:
        for callback in callbacks:
            try:
                callback(module)
            except Exception as exc:  # a hook must never break the program's import
                self._on_error(name, exc)
