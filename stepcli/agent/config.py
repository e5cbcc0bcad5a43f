"""The launcher-to-agent contract: the environment variable, the config it carries, where files go.

Runs inside the target: standard library only.
"""

from __future__ import annotations

import os

from stepcli.runfolder.layout import run_dir

from .schedule import Schedule

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG_ENV = "STEPCLI_CONFIG"
CONFIG_VERSION = 1


class AgentConfig:
    """Everything a profiled process needs to know, serialized into one environment variable.

    A plain class rather than a dataclass: `dataclasses` costs ~5 ms to import in every process.
    """

    DEFAULTS: dict[str, Any] = {
        "activities": None,
        "record_shapes": False,
        "profile_memory": False,
        "with_stack": False,
        "with_flops": False,
        "with_modules": False,
        "use_gzip": False,
        "step_on": (),
        "quiet": False,
        "run_key": "",  # signs the step logs (agent/signing.py); only the run's processes get it
        "on_demand": False,
        # --capture-on-slow: {"kind", "value", "text", "steps", "max"} (slowrule.py)
        "slow_trigger": None,
        # seconds without a step before a hang dump (stepcli/agent/stacks.py); 0 = never
        "hang_timeout": 0.0,
        "memory_entries": 0,  # --memory: CUDA allocator history entries kept per process; 0 = off
        "version": CONFIG_VERSION,
    }

    run_id: str
    out_dir: str
    launcher_pid: int
    schedule: Schedule
    activities: tuple[str, ...] | None
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool
    with_modules: bool
    use_gzip: bool
    step_on: tuple[str, ...]
    quiet: bool
    run_key: str
    on_demand: bool  # no scheduled window: only `stepcli capture` opens one
    hang_timeout: float
    memory_entries: int
    slow_trigger: dict[str, Any] | None
    version: int

    def __init__(
        self,
        run_id: str,
        out_dir: str,
        launcher_pid: int,
        schedule: Schedule | None = None,
        **options: Any,
    ) -> None:
        unknown = set(options) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unknown AgentConfig options: {sorted(unknown)}")
        self.run_id, self.out_dir, self.launcher_pid = run_id, out_dir, launcher_pid
        self.schedule = schedule if schedule is not None else Schedule()
        for name, default in self.DEFAULTS.items():
            setattr(self, name, options.get(name, default))
        self.activities = tuple(self.activities) if self.activities is not None else None
        self.step_on = tuple(self.step_on)

    @property
    def log_dir(self) -> str:
        """Step logs of this run, one per process that made steps."""
        return run_dir(self.out_dir, self.run_id)

    def to_dict(self) -> dict[str, Any]:
        data = {"run_id": self.run_id, "out_dir": self.out_dir, "launcher_pid": self.launcher_pid}
        data["schedule"] = self.schedule.to_dict()
        data.update({name: getattr(self, name) for name in self.DEFAULTS})
        return data

    def to_env(self) -> str:
        # (here, not at the top: `stepcli table` imports this module for its constants only)
        import json

        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_env(cls, text: str) -> AgentConfig:
        import json

        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != CONFIG_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise ValueError(
                f"config version {version!r} is not {CONFIG_VERSION} (mixed stepcli versions?)"
            )
        data["schedule"] = Schedule(**data["schedule"])
        return cls(**data)


def atomic_write_json(
    path: str, document: Any, mode: int = 0o666, *, private_folder: bool = False
) -> None:
    """Write JSON next to `path` under a temporary name and rename it, so readers never see half a
    file. Created new under a random name and never through a link (stepcli.safefile). `mode` 0o600
    for files that hold stacks or argv. `private_folder`: the folder must be this user's own private
    one (the run's control folder), checked on its descriptor, so nothing is written into a folder
    someone else put in its place (OSError otherwise)."""
    import json

    from stepcli import safefile

    from .interrupts import Held

    data = json.dumps(document, separators=(",", ":")).encode("utf-8")
    # A Ctrl-C meanwhile waits until the file is whole, then reaches the program at its own line,
    # not in these frames (a step log is written at a step's end, where a redelivered Ctrl-C may
    # land on a busy machine).
    with Held():
        if not private_folder:
            safefile.write_bytes(path, data, mode)
            return
        from .controlfiles import open_folder

        folder, name = os.path.split(path)
        fd = open_folder(folder)
        try:
            safefile.write_bytes(name, data, mode, dir_fd=fd)
        finally:
            os.close(fd)
