"""The launcher-to-agent contract: the environment variable, the config it carries, where files go.

Runs inside the target: standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .schedule import Schedule

CONFIG_ENV = "STEPCLI_CONFIG"
CONFIG_VERSION = 1
LOG_FOLDER = ".stepcli"  # hidden, so trace viewers and `stepcli table DIR` skip it
STEP_LOG_SUFFIX = ".steps.json"
HELLO_PREFIX = "hello."


@dataclass(frozen=True)
class AgentConfig:
    """Everything a profiled process needs to know, serialized into one environment variable."""

    run_id: str
    out_dir: str
    launcher_pid: int
    schedule: Schedule = field(default_factory=Schedule)
    activities: tuple[str, ...] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    use_gzip: bool = False
    step_on: tuple[str, ...] = ()
    quiet: bool = False
    version: int = CONFIG_VERSION

    @property
    def log_dir(self) -> str:
        """Step logs of this run, one per process that made steps."""
        return os.path.join(self.out_dir, LOG_FOLDER, self.run_id)

    def to_env(self) -> str:
        data: dict[str, Any] = asdict(self)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_env(cls, text: str) -> "AgentConfig":
        data = json.loads(text)
        if data.get("version") != CONFIG_VERSION:
            raise ValueError(f"config version {data.get('version')!r} is not {CONFIG_VERSION} (mixed stepcli versions?)")
        data["schedule"] = Schedule(**data["schedule"])
        data["activities"] = tuple(data["activities"]) if data.get("activities") is not None else None
        data["step_on"] = tuple(data.get("step_on") or ())
        return cls(**data)


def atomic_write_json(path: str, document: Any) -> None:
    """Write JSON next to `path` under a temporary name and rename it, so readers never see half a file."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(document, handle, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
