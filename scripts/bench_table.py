"""Benchmark `stepcli table` on a large realistic trace, and on a folder of rank traces, against
references.

Usage: python scripts/bench_table.py [--size-mb 300] [--trace PATH] [--repeat N] [--ranks 8]
[--rank-mb 40]
       [--folder DIR] [--skip-one-file] [--skip-folder] [--against REV]

One file: `stepcli table --json` against the reference (msgspec's typed decode of the 7 needed
fields plus a straight Python aggregation of per-name sums, in one process), plus typed decoding
alone and reading the bytes; the goal (issue 32) is at most 0.5x the reference's time and 1.5x the
file's size of peak RSS. Folder: --ranks traces of --rank-mb each (rank N in distributedInfo);
`stepcli table --json` on the folder against the ideal (one file's time x ranks / available cores);
the goal is at most 0.7x. Both show the floor: what no msgspec-based reader can go below on this
machine, the file's events decoded (the reference's 7 fields, in 1 MB slices, the fastest way found)
by one process per core, and nothing else done.

The trace is built from a real torch.profiler recording (record_shapes=True) of a small transformer
training loop, replicated and shifted in time until it reaches the requested size, with synthetic
CUDA runtime calls, kernels and flow events added so the event mix looks like a GPU training trace,
and written in Kineto's own layout (one field per line), so 300 MB holds about as many events
(~800k) as a real trace of that size. With --trace PATH the trace is kept there (and reused when it
exists). Each command runs in its own process; the table shows its wall time and peak RSS (summed
over its process tree), best of --repeat runs.

--against REV: a regression check before landing a change to the reader or the analyses. REV is
checked out in a temporary `git worktree`; on the same generated traces (the one large file and the
folder of --ranks), `stepcli table --json` of REV and of the working tree run side by side, taking
turns (the order flips every round), each with PYTHONPATH at its own tree, and so does the run end's
single read of its traces (REV's and the working tree's own `scripts/bench_run_end.py` `after`, on
the folder), and reading plus analysing the large file in one process (its own CPU time, steadier
than wall time on a busy machine); --with REV2 puts revision REV2 in the working tree's place (to
find which commit made a difference). Printed: each side's median wall and CPU time over --repeat
rounds, the median and range of the rounds' ratios (working tree / REV: above 1.0x is slower), and
whether the two `--json` answers are byte-identical.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import copy
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent

_TEMPLATE_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=2), torch.nn.Linear(256, 1000))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(48, 64, 256), torch.randint(0, 1000, (48, 64)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)

    def ready(prof):
        prof.export_chrome_trace(sys.argv[1])

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=4, repeat=1), on_trace_ready=ready) as prof:
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, 1000), y.reshape(-1))
            loss.backward()
            opt.step()
            prof.step()
    """  # noqa: E501
)

# CPU ops that only make views or allocate: on a GPU they launch no kernel.
_NO_KERNEL = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::as_strided",
    "aten::view",
    "aten::t",
    "aten::transpose",
    "aten::expand",
    "aten::detach",
    "detach",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::select",
    "aten::slice",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::permute",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::_unsafe_view",
    "aten::alias",
    "aten::split",
    "aten::chunk",
    "aten::unbind",
    "aten::narrow",
    "aten::lift_fresh",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::result_type",
    "aten::stride",
    "aten::size",
    "aten::is_nonzero",
    "aten::resize_",
    "aten::set_",
    "aten::unflatten",
    "aten::flatten",
    "aten::_has_compatible_shallow_copy_type",
    "aten::numel",
    "aten::dim",
}

# A real CUDA kernel name is a long templated C++ signature; trace size and decode cost depend on
# it.
_KERNEL_NAME = (
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
    "{op}_functor<float> >(at::TensorIteratorBase&, at::native::{op}_functor<float> const&)::"
    "{{lambda(int)#1}}>(int, at::native::gpu_kernel_impl_nocast<at::native::{op}_functor<float> >"
    "(at::TensorIteratorBase&, at::native::{op}_functor<float> const&)::{{lambda(int)#1}})"
)


def leaf_ops(events: list[dict[str, Any]]) -> set[int]:
    """Indexes of X events with no nested X event on their thread (the ops that would launch
    kernels)."""
    by_thread: dict[tuple[Any, Any], list[int]] = {}
    for i, e in enumerate(events):
        if e.get("ph") == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(i)
    leaves: set[int] = set()
    for idxs in by_thread.values():
        idxs.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        for a, b in zip(idxs, idxs[1:] + [None]):
            if b is None or events[b]["ts"] >= events[a]["ts"] + events[a]["dur"]:
                leaves.add(a)
    return leaves


def record_template(workdir: Path) -> dict[str, Any]:
    """Profile the real training loop once and return the parsed trace."""
    script = workdir / "template_train.py"
    script.write_text(_TEMPLATE_SCRIPT)
    out = workdir / "template.pt.trace.json"
    subprocess.run(
        [sys.executable, str(script), str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trace: dict[str, Any] = orjson.loads(out.read_bytes())
    return trace


def add_device_activity(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add cudaLaunchKernel runtime events, kernels and ac2g flows under launching CPU ops, as a GPU
    trace has."""
    out: list[dict[str, Any]] = []
    correlation = 1
    device_cursor = 0.0
    leaves = leaf_ops(events)
    for i, event in enumerate(events):
        out.append(event)
        if i not in leaves or event.get("cat") != "cpu_op" or event.get("name") in _NO_KERNEL:
            continue
        ts, dur = float(event["ts"]), float(event["dur"])
        launch_ts = round(ts + dur * 0.4, 3)
        launch_dur = round(max(dur * 0.2, 0.001), 3)
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": event["pid"],
                "tid": event["tid"],
                "ts": launch_ts,
                "dur": launch_dur,
                "args": {
                    "External id": event["args"].get("External id", 0),
                    "cbid": 211,
                    "correlation": correlation,
                },
            }
        )
        device_cursor = max(device_cursor, launch_ts + 2.0)
        kernel_dur = round(max(dur * 0.7, 1.0), 3)
        name = event["name"].replace("aten::", "")
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": _KERNEL_NAME.format(op=name),
                "pid": 0,
                "tid": 7,
                "ts": round(device_cursor, 3),
                "dur": kernel_dur,
                "args": {
                    "External id": event["args"].get("External id", 0),
                    "queued": 0,
                    "device": 0,
                    "context": 1,
                    "stream": 7,
                    "correlation": correlation,
                    "registers per thread": 32,
                    "shared memory": 0,
                    "blocks per SM": 0.25,
                    "warps per SM": 1.0,
                    "grid": [132, 1, 1],
                    "block": [128, 1, 1],
                    "est. achieved occupancy %": 3,
                },
            }
        )
        out.append(
            {
                "ph": "s",
                "id": correlation,
                "pid": event["pid"],
                "tid": event["tid"],
                "ts": launch_ts,
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        out.append(
            {
                "ph": "f",
                "id": correlation,
                "pid": 0,
                "tid": 7,
                "ts": round(device_cursor, 3),
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
        device_cursor += kernel_dur + 1.0
        correlation += 1
    return out


def kineto_format(event: dict[str, Any]) -> str:
    """One event laid out the way Kineto writes it (one field per line, args on one line), so sizes
    are realistic."""
    lines = [f'    "{key}": {json.dumps(value)}' for key, value in event.items() if key != "args"]
    text = "  {\n" + ",\n".join(lines)
    args = event.get("args")
    if args:
        text += '\n    ,\n    "args": {\n      ' + json.dumps(args)[1:-1] + "\n    }"
    return text + "\n  }"


def write_big_trace(path: Path, size_mb: float, workdir: Path) -> int:
    """Write a trace of about size_mb megabytes in Kineto's layout; return its number of events."""
    template = record_template(workdir)
    events = [e for e in template["traceEvents"] if e.get("ph") in ("X", "s", "f")]
    meta = [e for e in template["traceEvents"] if e.get("ph") == "M"]
    events = add_device_activity(events)
    steps = sorted(
        int(e["name"].split("#")[1])
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    t0 = min(float(e["ts"]) for e in events)
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events) - t0 + 50.0
    max_ext = max(int(e.get("args", {}).get("External id", 0)) for e in events) + 1
    one_copy = sum(len(kineto_format(e)) + 2 for e in events)
    copies = max(1, round(size_mb * 1_000_000 / one_copy))
    header = {k: v for k, v in template.items() if k != "traceEvents"}
    header["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 1}
    count = 0
    with open(path, "w") as out:
        out.write(
            "{\n"
            + ",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in header.items() if k != "traceName")
        )
        out.write(',\n  "traceEvents": [\n')
        out.write(",\n".join(kineto_format(e) for e in meta))
        count += len(meta)
        for k in range(copies):
            batch = copy.deepcopy(events)
            for event in batch:
                event["ts"] = round(float(event["ts"]) + k * span, 3)
                args = event.get("args")
                if args and "External id" in args:
                    args["External id"] += k * max_ext
                if "id" in event:
                    event["id"] += k * 1_000_000
                name = event.get("name", "")
                if name.startswith("ProfilerStep#"):
                    event["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * len(steps)}"
            out.write(",\n" + ",\n".join(kineto_format(e) for e in batch))
            count += len(batch)
        out.write(f'\n  ],"traceName": {json.dumps(str(path))} }}\n')
    return count


# The reference of the issue: typed decode of the needed fields, then a straight aggregation loop
# (calls and total time per kept name, steps counted), i.e. the least a Python summarizer built on
# msgspec must do.
_REFERENCE = """
import sys, gc, msgspec
class E(msgspec.Struct, gc=False):
    name: str = ""; cat: str = ""; ph: str = ""; pid: int | str = 0; tid: int | str = 0; ts: float = 0.0; dur: float = 0.0
class T(msgspec.Struct):
    traceEvents: list[E]
KEPT = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset"}
gc.disable()
events = msgspec.json.decode(open(sys.argv[1], 'rb').read(), type=T).traceEvents
rows = {}
for e in events:
    if e.ph != "X" or e.cat not in KEPT:
        continue
    row = rows.get(e.name)
    if row is None:
        rows[e.name] = [1, e.dur]
    else:
        row[0] += 1
        row[1] += e.dur
print(len(rows))
"""  # noqa: E501

# The baselines, each run in its own process so each peak RSS is its own.
_READ = "import sys; open(sys.argv[1], 'rb').read()"
# The candidate stepcli did not pick as is: msgspec decoding only the needed fields into typed
# structs, whole file.
_MSGSPEC = """
import sys, gc, msgspec
class E(msgspec.Struct, gc=False):
    name: str = ""; cat: str = ""; ph: str = ""; pid: int | str = 0; tid: int | str = 0; ts: float = 0.0; dur: float = 0.0
class T(msgspec.Struct):
    traceEvents: list[E]
gc.disable()
msgspec.json.decode(open(sys.argv[1], 'rb').read(), type=T)
"""  # noqa: E501

# The floor: the events of the files named decoded (the reference's 7 fields) in 1 MB slices, split
# over one forked process per core (pread, a cut between two events), nothing kept, summed or
# written.
_FLOOR = """
import sys, gc, os, re, msgspec
class E(msgspec.Struct, gc=False):
    name: str = ""; cat: str = ""; ph: str = ""; pid: int | str = 0; tid: int | str = 0; ts: float = 0.0; dur: float = 0.0
gc.disable()
cores = len(os.sched_getaffinity(0))
separator = re.compile(rb"\\}\\s*,\\s*\\{")
decoder = msgspec.json.Decoder(list[E])
def ranges(path):
    fd, size = os.open(path, os.O_RDONLY), os.path.getsize(path)
    head = os.pread(fd, 1 << 20, 0)
    cuts = [head.index(b"[", head.index(b'"traceEvents"')) + 1]
    for k in range(1, cores):
        at = cuts[0] + (size - cuts[0]) * k // cores
        cuts.append(at + separator.search(os.pread(fd, 1 << 20, at)).start() + 1)
    tail_at = max(0, size - (1 << 20))
    cuts.append(tail_at + os.pread(fd, 1 << 20, tail_at).rindex(b"]"))
    return [(fd, lo, hi) for lo, hi in zip(cuts, cuts[1:])]
def decode(fd, lo, hi):
    data, at = os.pread(fd, hi - lo, lo), 0
    while at < len(data):
        cut = separator.search(data, at + (1 << 20))
        end = cut.start() + 1 if cut else len(data)
        decoder.decode(b"[" + data[at:end].strip(b", \\n") + b"]")
        at = end + 1 if cut else end
work = [piece for path in sys.argv[1:] for piece in ranges(path)]  # (each file cut in one range per core)
children = []
for worker in range(1, cores):
    pid = os.fork()
    if pid == 0:
        for piece in work[worker::cores]:
            decode(*piece)
        os._exit(0)
    children.append(pid)
for piece in work[0::cores]:
    decode(*piece)
for pid in children:
    os.waitpid(pid, 0)
"""  # noqa: E501


def measure(
    argv: list[str], out: Path | None = None, sample: bool = True
) -> tuple[float, int, int]:
    """Wall seconds, peak RSS bytes and exit status of one command (its standard output into `out`,
    else dropped). The RSS is the peak of the sum over the command's process tree (its worker
    processes included), sampled every 5 ms, or the command's own peak (os.wait4) if that is larger.
    That own peak counts the pages of the process it was started from (Linux keeps the high-water
    mark across the fork and exec): start it from a small one (scripts/bench_job.py's
    `measure_apart`). `sample=False`: no sampling, the command's own peak only; for the timed runs,
    since the sampler reads /proc for the whole tree every 5 ms and takes CPU from a command that
    uses every core (not from one that uses one: that bias made stepcli's parallel runs look
    slower)."""
    import psutil

    start = time.perf_counter()
    with open(out, "wb") if out is not None else contextlib.nullcontext(subprocess.DEVNULL) as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE)
        if sample:
            peak = _peak_rss(proc, psutil)
        else:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.read().decode() if proc.stderr else "")
    return elapsed, peak, proc.returncode


def _peak_rss(proc: subprocess.Popen[bytes], psutil: Any) -> int:
    """Wait for `proc` (its exit status set on it) and return its tree's peak RSS (see measure)."""
    peak = 0
    root = psutil.Process(proc.pid)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            peak = max(
                peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            )
        except psutil.Error:
            pass
        time.sleep(0.005)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return max(peak, usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024))


def best_wall(cmd: list[str], repeat: int) -> float:
    """Best wall time of `repeat` unsampled runs (see measure); exits on a failure."""
    walls = []
    for _ in range(max(1, repeat)):
        wall, _, code = measure(cmd, sample=False)
        if code != 0:
            raise SystemExit(f"{' '.join(cmd[:3])} ...: exit {code}")
        walls.append(wall)
    return min(walls)


def peak_rss(cmd: list[str]) -> int:
    """The peak RSS of the command's process tree, in a run of its own (sampled, not timed)."""
    _, rss, code = measure(cmd)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ...: exit {code}")
    return rss


def best_of(cmd: list[str], repeat: int) -> tuple[float, int]:
    """Best wall time of `repeat` unsampled runs, and the peak RSS of one more, sampled."""
    return best_wall(cmd, repeat), peak_rss(cmd)


def stepcli_cmd(*args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from stepcli.cli import entry; entry()",
        *args,
    ]


def generate(trace: Path, size_mb: float) -> None:
    """Generate in a child: a child's peak RSS counts the parent's pages it was forked from, so the
    process that launches the measured commands must stay small."""
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--generate-only",
            "--size-mb",
            str(size_mb),
            "--trace",
            str(trace),
        ],
        check=True,
    )


def make_folder(folder: Path, ranks: int, rank_mb: float, workdir: Path) -> list[Path]:
    """`ranks` traces of about rank_mb each, rank N in distributedInfo (one generated trace, the
    rank patched in)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"node0_{1000 + r}.{r}.pt.trace.json" for r in range(ranks)]
    if all(f.exists() for f in files):
        return files
    one = workdir / "one_rank.pt.trace.json"
    generate(one, rank_mb)
    data = one.read_bytes()
    marker = b'"rank": 0, "world_size": 1'
    assert marker in data[:4096]
    for r, path in enumerate(files):
        path.write_bytes(data.replace(marker, f'"rank": {r}, "world_size": {ranks}'.encode(), 1))
    one.unlink()
    return files


def one_file(trace: Path, repeat: int) -> None:
    """The one-file table: stepcli against the reference, typed decoding alone and reading the
    bytes."""
    size = trace.stat().st_size
    commands = {
        "read bytes": [sys.executable, "-c", _READ, str(trace)],
        "msgspec typed decode": [sys.executable, "-c", _MSGSPEC, str(trace)],
        "reference (typed+aggr.)": [sys.executable, "-c", _REFERENCE, str(trace)],
        "floor (decode, all cores)": [sys.executable, "-c", _FLOOR, str(trace)],
        "stepcli table --json": stepcli_cmd("table", "--json", str(trace)),
    }
    # Round-robin: every round runs each command once, so a change of load on a shared machine hits
    # all alike.
    rounds: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(max(1, repeat)):
        for label, cmd in commands.items():
            rounds[label].append(best_wall(cmd, 1))
    results = {label: (min(runs), peak_rss(commands[label])) for label, runs in rounds.items()}
    paired = sorted(
        a / b for a, b in zip(rounds["stepcli table --json"], rounds["reference (typed+aggr.)"])
    )
    mb = 1024 * 1024
    print(f"one file: {size / mb:,.0f} MiB, {trace.name}")
    print(f"{'':26}{'wall s':>8}{'peak RSS MiB':>14}{'RSS / file':>12}")
    for label, (wall, rss) in results.items():
        print(f"{label:26}{wall:8.2f}{rss / mb:14.0f}{rss / size:12.2f}")
    wall, rss = results["stepcli table --json"]
    ref_wall, _ = results["reference (typed+aggr.)"]
    print(
        f"ONE-FILE RATIO  stepcli / reference: {wall / ref_wall:.2f}x time (goal <= 0.5x); "
        f"peak RSS {rss / size:.2f}x the file (goal <= 1.5x)"
    )
    floor_wall, _ = results["floor (decode, all cores)"]
    print(
        f"  floor / reference: {floor_wall / ref_wall:.2f}x (decoding alone, on every core: no "
        f"reader does less)"
    )
    print(
        f"  per round (same round's runs): median {paired[len(paired) // 2]:.2f}x, "
        f"range {paired[0]:.2f}x-{paired[-1]:.2f}x over {len(paired)} rounds"
    )


def folder_run(files: list[Path], repeat: int) -> None:
    """The folder table: one rank file alone (1 job), the folder (default jobs), and the ideal."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    folder = files[0].parent
    commands = {
        "one": stepcli_cmd("table", "--json", "--jobs", "1", str(files[0])),
        "all": stepcli_cmd("table", "--json", str(folder)),
        "floor": [sys.executable, "-c", _FLOOR, *map(str, files)],
    }
    rounds: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(max(1, repeat)):  # round-robin, as one_file does
        for label, cmd in commands.items():
            rounds[label].append(best_wall(cmd, 1))
    one_wall, all_wall, floor_wall = (min(rounds[label]) for label in commands)
    one_rss, all_rss = peak_rss(commands["one"]), peak_rss(commands["all"])
    serial_wall, serial_rss = best_of(stepcli_cmd("table", "--json", "--jobs", "1", str(folder)), 1)
    paired = sorted(a * cores / (b * len(files)) for a, b in zip(rounds["all"], rounds["one"]))
    mb = 1024 * 1024
    size = sum(f.stat().st_size for f in files)
    ideal = one_wall * len(files) / cores
    print(
        f"folder: {len(files)} ranks x {files[0].stat().st_size / mb:,.0f} MiB = {size / mb:,.0f} "
        f"MiB, {cores} cores"
    )
    print(f"{'':26}{'wall s':>8}{'peak RSS MiB':>14}")
    print(f"{'one rank file, 1 job':26}{one_wall:8.2f}{one_rss / mb:14.0f}")
    print(f"{'folder, 1 job':26}{serial_wall:8.2f}{serial_rss / mb:14.0f}")
    print(f"{'folder, default jobs':26}{all_wall:8.2f}{all_rss / mb:14.0f}")
    print(f"{'ideal (one x N / cores)':26}{ideal:8.2f}")
    print(f"{'floor (decode, all cores)':26}{floor_wall:8.2f}")
    print(
        f"FOLDER RATIO  stepcli / ideal: {all_wall / ideal:.2f}x (goal <= 0.7x); serial / "
        f"parallel: {serial_wall / all_wall:.2f}x; floor / ideal: {floor_wall / ideal:.2f}x"
    )
    print(
        f"  per round (same round's runs): median {paired[len(paired) // 2]:.2f}x, "
        f"range {paired[0]:.2f}x-{paired[-1]:.2f}x over {len(paired)} rounds"
    )


# The run end of a tree, as that tree's own scripts/bench_run_end.py defines it (one read shared by
# summary and page).
_RUN_END = """
import sys, threading, os, tempfile
tree = sys.argv[1]
sys.path[:0] = [tree, os.path.join(tree, "scripts")]
from bench_run_end import after
idle = threading.Event()
threading.Thread(target=idle.wait, daemon=True).start()  # as the launcher's watchdog: workers start by forkserver
with tempfile.TemporaryDirectory(prefix="stepcli-bench-run-end-") as out:
    os.chdir(out)  # (report.html goes here)
    after(sys.argv[2:])
idle.set()
"""  # noqa: E501

# The CPU time of reading one file into columns and analysing it, in one process (no worker, no
# forked helper): steadier than wall time on a busy machine. Trees without
# stepcli.traces.read.columns (before 2026-11-24) skip it.
_ONE_PROCESS = """
import sys, time, gc
try:
    from stepcli.traces.read.columns import load_columns
    from stepcli.traces.analyses.traceanalysis import summarize_read
except ImportError:
    print("nan"); sys.exit(0)
gc.disable()
start = time.process_time()
trace = load_columns(sys.argv[1])
read = time.process_time()
summarize_read(trace.columns, trace)
print(time.process_time() - start, read - start)
"""


def timed(argv: list[str], tree: Path) -> tuple[float, float, bytes]:
    """Wall seconds, CPU seconds (the command's process tree, as far as it was reaped:
    RUSAGE_CHILDREN) and stdout of one command run with PYTHONPATH at `tree` and in `tree` (so
    `python -m stepcli` imports that tree's code)."""
    import resource

    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, cwd=tree, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        raise SystemExit(f"{' '.join(argv[:4])} ... in {tree}: exit {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def checkout(rev: str, tree: Path) -> Path:
    """REV in a detached temporary worktree of this repository, its modules compiled as an install
    has them."""
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(tree), rev],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    compileall.compile_dir(str(tree / "stepcli"), quiet=1)
    return tree


def remove_checkout(tree: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False
    )
    shutil.rmtree(tree, ignore_errors=True)


def short(rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def against(
    rev: str, cases: dict[str, list[str]], repeat: int, workdir: Path, other: str | None = None
) -> None:
    """Each case's command of REV and of the working tree (or of revision `other`), taking turns;
    medians, paired ratios, same answers."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the temporary worktrees are removed)
    label = short(rev)
    tree = checkout(rev, workdir / "against")
    work = "work" if other is None else short(other)
    mine = REPO if other is None else checkout(other, workdir / "with")
    try:
        sides = {label: tree, work: mine}
        has_run_end = (tree / "scripts" / "bench_run_end.py").exists()
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        answers: dict[tuple[str, str], set[bytes]] = {}
        for k in range(max(1, repeat)):
            order = list(sides.items()) if k % 2 == 0 else list(sides.items())[::-1]
            for case, argv in cases.items():
                if case.startswith("run end") and not has_run_end:
                    continue
                for side, root in order:
                    if case.startswith("run end"):
                        cmd = [sys.executable, "-c", _RUN_END, str(root), *argv]
                    elif case.startswith("one process"):
                        cmd = [sys.executable, "-c", _ONE_PROCESS, *argv]
                    else:
                        cmd = argv
                    wall, cpu, out = timed(cmd, root)
                    if case.startswith("one process"):
                        cpu = float(out.split()[0])  # its own CPU time (read + analysis)
                        if cpu != cpu:  # nan: not in this tree
                            continue
                    results.setdefault((case, side), []).append((wall, cpu))
                    if case.startswith("table"):
                        answers.setdefault((case, side), set()).add(out)
        print(
            f"{work} against {rev} ({label}): {max(1, repeat)} rounds, taking turns; medians; "
            f"ratio = {work} / {label}"
        )
        print(
            f"{'':34}{label + ' wall':>13}{work + ' wall':>13}{label + ' CPU':>13}"
            f"{work + ' CPU':>13}  ratio (range)"
        )
        for case in cases:
            old, new = results.get((case, label)), results.get((case, work))
            if not old or not new:
                print(f"{case:34}  (not in {label})")
                continue
            ratios = sorted(n[0] / o[0] for o, n in zip(old, new))
            same = ""
            if (case, label) in answers:
                a, b = answers[(case, label)], answers[(case, work)]
                same = "  same answers" if len(a) == 1 and a == b else "  ANSWERS DIFFER"
            print(
                f"{case:34}{statistics.median(o[0] for o in old):13.2f}"
                f"{statistics.median(n[0] for n in new):13.2f}"
                f"{statistics.median(o[1] for o in old):13.2f}"
                f"{statistics.median(n[1] for n in new):13.2f}  {statistics.median(ratios):.2f}x "
                f"({ratios[0]:.2f}-{ratios[-1]:.2f}){same}"
            )
    finally:
        remove_checkout(tree)
        if other is not None:
            remove_checkout(mine)


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the traces and print both tables and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mb", type=float, default=300.0, help="approximate one-file trace size to generate"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="use (or create, if missing) this trace file instead of a temp one",
    )
    parser.add_argument("--ranks", type=int, default=8, help="rank traces in the folder benchmark")
    parser.add_argument(
        "--rank-mb", type=float, default=40.0, help="approximate size of each rank trace"
    )
    parser.add_argument(
        "--folder", type=Path, help="use (or create) the rank traces in this folder"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per measurement; the best is reported"
    )
    parser.add_argument("--skip-one-file", action="store_true")
    parser.add_argument("--skip-folder", action="store_true")
    parser.add_argument(
        "--generate-only", action="store_true", help="write the trace (needs --trace) and exit"
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="time REV (a temporary git worktree) and this tree in turns",
    )
    parser.add_argument(
        "--with", dest="other", metavar="REV2", help="with --against: REV2 instead of this tree"
    )
    args = parser.parse_args(argv)
    if args.generate_only:
        if args.trace is None:
            parser.error("--generate-only needs --trace")
        t = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="stepcli-bench-") as tmp:
            count = write_big_trace(args.trace, args.size_mb, Path(tmp))
        print(
            f"generated {args.trace} ({count:,} events) in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
        )
        return 0

    # An installed stepcli has its modules compiled (pip writes the .pyc files); a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would compile them at every start, which no user pays.
    compileall.compile_dir(str(REPO / "stepcli"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="stepcli-bench-") as tmp:
        workdir = Path(tmp)
        if args.against:
            cases: dict[str, list[str]] = {}
            if not args.skip_one_file:
                trace = args.trace or workdir / "big.pt.trace.json"
                if not trace.exists():
                    generate(trace, args.size_mb)
                mib = trace.stat().st_size / 1024 / 1024
                cases[f"table --json, one {mib:,.0f} MiB file"] = [
                    sys.executable,
                    "-m",
                    "stepcli",
                    "table",
                    "--json",
                    str(trace),
                ]
                cases["one process: read + analysis"] = [str(trace)]
            if not args.skip_folder:
                files = make_folder(
                    args.folder or workdir / "ranks", args.ranks, args.rank_mb, workdir
                )
                cases[f"table --json, {len(files)} ranks"] = [
                    sys.executable,
                    "-m",
                    "stepcli",
                    "table",
                    "--json",
                    str(files[0].parent),
                ]
                cases[f"run end, {len(files)} ranks (one read)"] = [str(f) for f in files]
            against(args.against, cases, args.repeat, workdir, args.other)
            return 0
        if not args.skip_one_file:
            trace = args.trace or workdir / "big.pt.trace.json"
            if not trace.exists():
                generate(trace, args.size_mb)
            one_file(trace, args.repeat)
        if not args.skip_folder:
            files = make_folder(args.folder or workdir / "ranks", args.ranks, args.rank_mb, workdir)
            folder_run(files, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
