"""One GPU check of stepcli against answers known without stepcli, in one go (under 8 minutes on one
GPU).

Usage: python scripts/gpu_check.py [--out DIR] [--rounds N] [--only SECTION,...] [--dry-run]

Whoever has an NVIDIA GPU at hand runs this first. Each program below knows its own answer: the
analytic matmul FLOPs of a GPT step, its own synchronized step times, a planted host stall, a
planted out-of-memory and a planted leak, CUDA graphs replayed across windows. stepcli's figures are
compared against them, and the table at the end says figure / expected / got / PASS-FAIL, followed
by the overhead ratios of interleaved plain-vs-stepcli rounds (the untouched steps' median step time
after the window over the plain program's median, the program's own synchronized timing on both
sides). Everything it records (traces, summaries, snapshots, the table as JSON) is kept under --out:
the real traces make good test fixtures.

Sections (--only picks some): env, overhead, graphs, flops, stall, memory, compile, pytest.
--dry-run runs every section on the CPU with tiny sizes, to check the script itself (figures then
mean nothing, and the GPU-only checks say SKIP).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ROWS: list[dict[str, Any]] = []
RATIOS: list[dict[str, Any]] = []

LOOP = """
import json, sys, time, torch
steps, report = int(sys.argv[1]), sys.argv[2]
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
width = 256 if dev == "cuda" else 32
layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True, dropout=0.0)
model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(8, 64, width, device=dev)
times = []
for step in range(steps):
    t0 = time.perf_counter()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dev == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
json.dump({"times_s": times}, open(report, "w"))
"""

GRAPHS = """
import sys, torch
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
static_x = torch.randn(64, 512, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):  # warm up before capture, as torch's docs ask
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(static_x).square().mean().backward()
        opt.step()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
capture_at = int(sys.argv[2])
steps = int(sys.argv[1])
for step in range(steps):
    if step == capture_at:  # captured inside stepcli's window (the default window is steps 2-4)
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = model(static_x).square().mean()
            static_loss.backward()
            opt.step()
    if step >= capture_at:
        static_x.copy_(torch.randn(64, 512, device=dev))
        g.replay()
    else:
        opt.zero_grad(set_to_none=True)
        model(static_x).square().mean().backward()
        opt.step()
torch.cuda.synchronize()
print("graphs ok", float(static_loss) if steps > capture_at else 0.0)
"""  # noqa: E501

COMPILED = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
step_fn = torch.compile(model, mode="reduce-overhead")
x = torch.randn(32, 256, device="cuda")
for step in range(40):
    loss = step_fn(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("compiled ok", float(loss))
"""  # noqa: E501

OOM = """
import torch
torch.cuda.set_per_process_memory_fraction(0.03)  # out of memory in a few steps, whatever the card
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
batch = 256
for step in range(40):
    x = torch.randn(batch, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    batch *= 2  # nothing of a step outlives the next one: the batch grows, no tensor is kept
"""  # noqa: E501

LEAK = """
import torch
torch.cuda.set_per_process_memory_fraction(0.03)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
kept = []
def keep_forward(out):
    kept.append(out)  # the leak: each step's output, and the graph behind it, stays alive
for step in range(10000):
    x = torch.randn(512, 1024, device="cuda")
    out = model(x)
    keep_forward(out)
    out.square().mean().backward(retain_graph=True)
    opt.step()
    opt.zero_grad(set_to_none=True)
"""  # noqa: E501


def row(section: str, figure: str, expected: str, got: str, ok: bool | None) -> None:
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    ROWS.append(
        {"section": section, "figure": figure, "expected": expected, "got": got, "status": status}
    )
    print(f"  [{status}] {section}: {figure}: expected {expected}, got {got}", flush=True)


def env_for_run() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPCLI_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update({"NO_COLOR": "1", "COLUMNS": "120", "PYTHONUNBUFFERED": "1"})
    return env


def sh(
    argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or env_for_run(),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(
            argv, 124, str(exc.stdout or ""), f"timed out after {timeout} s"
        )


def stepcli(*args: str) -> list[str]:
    return [sys.executable, "-m", "stepcli", *args]


def warned(proc: subprocess.CompletedProcess[str]) -> bool:
    return "Profiler clears events" in proc.stderr


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


# -- sections
# --------------------------------------------------------------------------------------------------
def section_env(work: Path, gpu: bool) -> None:
    probe = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': "
        "torch.__version__, 'cuda': torch.version.cuda, 'device': torch.cuda.get_device_name() if "
        "c else None, 'cublas': torch._C._cuda_getCompiledVersion() if c else None}))"
    )
    done = sh([sys.executable, "-c", probe], 120)
    info = (
        json.loads(done.stdout.strip().splitlines()[-1])
        if done.returncode == 0
        else {"error": done.stderr[-300:]}
    )
    smi = shutil.which("nvidia-smi")
    if smi:
        q = sh([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 30)
        info["nvidia_smi"] = q.stdout.strip()
    rev = sh(["git", "rev-parse", "--short", "HEAD"], 10, cwd=REPO)
    info["stepcli_commit"] = rev.stdout.strip() or None
    info["python"] = sys.version.split()[0]
    print("env:", json.dumps(info), flush=True)
    (work / "env.json").write_text(json.dumps(info, indent=1))
    row(
        "env",
        "CUDA device",
        "present",
        str(info.get("device")),
        bool(info.get("device")) if gpu else None,
    )


def _loop_median(report: Path, phases: str | None, first: int) -> float | None:
    """Median of the program's own step times from step `first` on, of the steps stepcli left
    untouched."""
    try:
        times = json.loads(report.read_text())["times_s"]
    except (OSError, ValueError, KeyError):
        return None
    picked = [
        t
        for i, t in enumerate(times)
        if i >= first and (phases is None or (i < len(phases) and phases[i] == "0"))
    ]
    return statistics.median(picked) if picked else None


def section_overhead(work: Path, gpu: bool, rounds: int) -> None:
    steps = 300 if gpu else 40
    prog = work / "loop.py"
    prog.write_text(LOOP)
    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        "stepcli (default window)": (["run", "-q"], {}),
        "stepcli, CUPTI kept (TEARDOWN_CUPTI=0)": (["run", "-q"], {"TEARDOWN_CUPTI": "0"}),
        "stepcli --capture-on-slow 3x": (["run", "-q", "--capture-on-slow", "3x"], {}),
        "stepcli, 4 windows (--wait 50 --repeat 4)": (
            ["run", "-q", "--wait", "50", "--repeat", "4"],
            {},
        ),
        "stepcli --memory": (["run", "-q", "--memory"], {}),
    }
    heavy = {
        "stepcli --capture-on-slow 3x",
        "stepcli, 4 windows (--wait 50 --repeat 4)",
        "stepcli --memory",
    }
    plain: list[float] = []
    got: dict[str, list[float]] = {name: [] for name in variants}
    warnings_seen = 0
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in ["plain", *order]:
            if name in heavy and r > 0 and rounds > 2 and r != rounds - 1:
                # the costlier variants once or twice; the two that decide item 1 every round
                continue
            report = work / f"loop-{r}-{len(plain)}-{abs(hash(name)) % 10**6}.json"
            if name == "plain":
                done = sh([sys.executable, str(prog), str(steps), str(report)], 300)
                m = _loop_median(report, None, 10)
                if m is not None:
                    plain.append(m)
                continue
            args, extra = variants[name]
            out = work / f"ovh-{r}-{abs(hash(name)) % 10**6}"
            summary = out.with_suffix(".summary.json")
            env = env_for_run()
            env.update(extra)
            done = sh(
                stepcli(
                    *args,
                    "-o",
                    str(out),
                    "--json",
                    str(summary),
                    str(prog),
                    str(steps),
                    str(report),
                ),
                300,
                env,
            )
            warnings_seen += warned(done)
            if done.returncode != 0:
                row(
                    "overhead",
                    f"{name}: exit status",
                    "0",
                    f"{done.returncode}: {last_line(done.stderr)}",
                    False,
                )
                continue
            try:
                phases = json.loads(summary.read_text()).get("timeline_phases")
            except (OSError, ValueError):
                phases = None
            m = _loop_median(report, phases, 10)
            if m is not None:
                got[name].append(m)
    base = statistics.median(plain) if plain else None
    for name, values in got.items():
        if not values or not base:
            row(
                "overhead",
                f"{name}: untouched median / plain",
                "<= 1.03",
                "no figure",
                False if gpu else None,
            )
            continue
        ratio = statistics.median(values) / base
        RATIOS.append(
            {
                "variant": name,
                "plain_ms": base * 1e3,
                "ms": statistics.median(values) * 1e3,
                "ratio": ratio,
                "runs": len(values),
            }
        )
        decides = name in (
            "stepcli (default window)",
            "stepcli --capture-on-slow 3x",
            "stepcli, 4 windows (--wait 50 --repeat 4)",
        )
        row(
            "overhead",
            f"{name}: untouched median / plain ({base * 1e3:.2f} ms)",
            "<= 1.03" if decides else "(measured)",
            f"{ratio:.3f}x",
            (ratio <= 1.03 if decides else None) if gpu else None,
        )
    row(
        "quiet",
        "torch's 'Profiler clears events' warning in the program's stderr",
        "never",
        f"{warnings_seen} runs",
        warnings_seen == 0,
    )


def section_graphs(work: Path, gpu: bool) -> None:
    if not gpu:
        row("graphs", "CUDA graphs across windows", "exit 0", "no GPU", None)
        return
    prog = work / "graphs.py"
    prog.write_text(GRAPHS)
    for label, args in (
        ("captured in the window, replayed after it", ["run", "-q"]),
        (
            "captured in a window, replayed through 3 more windows",
            ["run", "-q", "--wait", "5", "--repeat", "4"],
        ),
    ):
        out = work / f"graphs-{len(ROWS)}"
        done = sh(stepcli(*args, "-o", str(out), str(prog), "60", "3"), 180)
        row(
            "graphs",
            f"torch.cuda.graph {label}",
            "exit 0, 'graphs ok'",
            f"exit "
            f"{done.returncode}"
            f"{'' if 'graphs ok' in done.stdout else ': ' + last_line(done.stderr)}",
            done.returncode == 0 and "graphs ok" in done.stdout,
        )


def _gpt(work: Path) -> Path:
    source = REPO.parent / "shared" / "traces" / "h200_gpt_bf16" / "gpt.py"
    local = REPO / "scripts" / "gpu_programs" / "gpt.py"
    path = work / "gpt.py"
    shutil.copy(local if local.exists() else source, path)
    return path


def section_flops(work: Path, gpu: bool) -> None:
    gpt = _gpt(work)
    for dtype in ("bf16", "fp32"):
        out, summary, report = (
            work / f"gpt-{dtype}",
            work / f"gpt-{dtype}.summary.json",
            work / f"gpt-{dtype}.json",
        )
        done = sh(
            stepcli(
                "run",
                "-q",
                "--with-flops",
                "--gzip",
                "-o",
                str(out),
                "--json",
                str(summary),
                str(gpt),
                "--steps",
                "30",
                "--dtype",
                dtype,
                "--report",
                str(report),
            ),
            300,
        )
        if done.returncode != 0:
            row(
                "flops",
                f"{dtype} GPT: exit status",
                "0",
                f"{done.returncode}: {last_line(done.stderr)}",
                False,
            )
            continue
        own = json.loads(report.read_text())
        doc = json.loads(summary.read_text())
        flops = doc.get("flops") if isinstance(doc.get("flops"), dict) else {}
        analytic = own["analytic_flops_per_step"]
        per_step = flops.get("flops_per_step")
        row(
            "flops",
            f"{dtype} GPT: FLOPs per step",
            f"{analytic:.4g} (analytic)",
            f"{per_step:.4g}" if per_step else "none",
            bool(per_step) and abs(per_step / analytic - 1) < 0.02,
        )
        phases = doc.get("timeline_phases") or ""
        times = own["times_s"]
        untouched = [
            t for i, t in enumerate(times) if i >= 5 and i < len(phases) and phases[i] == "0"
        ]
        peak = flops.get("peak_flops_per_s")
        if untouched and peak:
            own_mfu = analytic / statistics.median(untouched) / peak
            mfu = flops.get("mfu")
            row(
                "flops",
                f"{dtype} GPT: MFU at the program's pace",
                f"{own_mfu:.1%} (own timing)",
                f"{mfu:.1%}" if mfu is not None else "none",
                mfu is not None and abs(mfu / own_mfu - 1) < 0.05,
            )
        else:
            row(
                "flops",
                f"{dtype} GPT: MFU",
                "a figure",
                f"peak {peak}, {len(untouched)} untouched steps",
                False if gpu else None,
            )
        row(
            "flops",
            f"{dtype} GPT: MFU dtype",
            dtype,
            f"{flops.get('mfu_dtype')} (assumed: {flops.get('mfu_dtype_assumed')})",
            (flops.get("mfu_dtype") == dtype and not flops.get("mfu_dtype_assumed"))
            if gpu
            else None,
        )
        for trace in sorted(out.glob("*.pt.trace.json.gz"))[:1]:
            shutil.copy(trace, work / f"fixture-gpt-{dtype}.pt.trace.json.gz")


def section_stall(work: Path, gpu: bool) -> None:
    gpt = _gpt(work)
    out, summary = work / "stall", work / "stall.summary.json"
    done = sh(
        stepcli(
            "run",
            "-q",
            "--capture-on-slow",
            "3x",
            "-o",
            str(out),
            "--json",
            str(summary),
            str(gpt),
            "--steps",
            "65",
            "--layers",
            "2",
            "--slow-every",
            "10",
            "--slow-s",
            "0.5",
        ),
        300,
    )
    if done.returncode != 0:
        row("stall", "exit status", "0", f"{done.returncode}: {last_line(done.stderr)}", False)
        return
    doc = json.loads(summary.read_text())
    triggered = doc.get("triggered") or []
    steps = [t.get("step") for t in triggered if isinstance(t, dict)]
    row(
        "stall",
        "slow steps that triggered a capture",
        "steps 20, 30 or 40 (stall every 10)",
        str(steps),
        bool(steps) and all(isinstance(s, int) and s % 10 == 0 for s in steps),
    )


def section_memory(work: Path, gpu: bool) -> None:
    if not gpu:
        row("memory", "OOM and leak", "snapshots", "no GPU", None)
        return
    for name, program, must_not, must in (
        ("batch doubling to OOM", OOM, "leak", "out of memory at step"),
        # where the kept outputs were made: `out = model(x)`
        ("leak to OOM", LEAK, None, "leak.py:11"),
    ):
        prog = work / f"{name.split()[0]}.py"
        prog.write_text(program)
        out = work / f"mem-{name.split()[0]}"
        done = sh(stepcli("run", "-q", "--memory", "-o", str(out), str(prog)), 240)
        pickles = sorted(out.rglob("*.pickle"))
        row(
            "memory",
            f"{name}: program fails, snapshot written",
            "exit != 0, a .pickle",
            f"exit {done.returncode}, {len(pickles)} pickles",
            done.returncode != 0 and bool(pickles),
        )
        shown = sh(stepcli("memory", str(out)), 120)
        (work / f"memory-{name.split()[0]}.txt").write_text(shown.stdout + shown.stderr)
        advice = [line.lower() for line in shown.stdout.splitlines() if line.startswith("advice:")]
        text = shown.stdout.lower()
        ok = (
            shown.returncode == 0
            and must.lower() in text
            and (must_not is None or not any(must_not in a for a in advice))
        )
        row(
            "memory",
            f"{name}: `stepcli memory` says",
            f"'{must}'" + (f", no advice of a {must_not}" if must_not else ""),
            f"exit {shown.returncode}, advice: {' | '.join(a[8:40] for a in advice)}",
            ok,
        )
        if name.startswith("leak"):
            row(
                "memory",
                "leak: the leak's advice comes first",
                "first advice names the leak",
                advice[0][:60] if advice else "no advice",
                bool(advice) and "leak" in advice[0],
            )
        for pickle in pickles[:1]:
            if pickle.stat().st_size < 12 << 20:
                shutil.copy(pickle, work / f"fixture-{name.split()[0]}.pickle")


def section_compile(work: Path, gpu: bool) -> None:
    if not gpu:
        row(
            "compile",
            "torch.compile(mode='reduce-overhead') across the window",
            "exit 0",
            "no GPU",
            None,
        )
        return
    prog = work / "compiled.py"
    prog.write_text(COMPILED)
    done = sh(stepcli("run", "-q", "-o", str(work / "compiled"), str(prog)), 240)
    row(
        "compile",
        "torch.compile(mode='reduce-overhead') recorded in a window, replayed after",
        "exit 0",
        f"exit {done.returncode}{'' if done.returncode == 0 else ': ' + last_line(done.stderr)}",
        done.returncode == 0 and "compiled ok" in done.stdout,
    )


def section_pytest(work: Path, gpu: bool) -> None:
    if not gpu:
        row("pytest", "tests marked cuda", "pass", "no GPU", None)
        return
    done = sh(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-m",
            "cuda",
            "tests/e2e/test_cuda.py",
            "tests/e2e/test_memory_cuda.py",
        ],
        300,
        cwd=REPO,
    )
    (work / "pytest-cuda.txt").write_text(done.stdout[-20000:] + done.stderr[-5000:])
    row("pytest", "tests marked cuda", "all pass", last_line(done.stdout), done.returncode == 0)


SECTIONS = {
    "env": section_env,
    "overhead": section_overhead,
    "graphs": section_graphs,
    "flops": section_flops,
    "stall": section_stall,
    "memory": section_memory,
    "compile": section_compile,
    "pytest": section_pytest,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="keep everything here (default: a temporary folder)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved plain/stepcli rounds for the overhead"
    )
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny sizes: checks the script, not stepcli"
    )
    args = parser.parse_args()
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    gpu = probe.stdout.strip().endswith("True")
    if not gpu and not args.dry_run:
        print(
            "no CUDA GPU here: run with --dry-run to check the script on the CPU", file=sys.stderr
        )
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for name in args.only.split(","):
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            if name == "overhead":
                section_overhead(work, gpu, args.rounds if gpu else 1)
            else:
                SECTIONS[name](work, gpu)
        except Exception as exc:  # one broken section must not lose the others' figures
            row(name, "section ran", "no error", f"{type(exc).__name__}: {exc}", False)
        print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
        (work / "gpu_check.json").write_text(
            json.dumps({"rows": ROWS, "overhead": RATIOS}, indent=1)
        )
    print("\n| figure | expected | got | |\n|---|---|---|---|")
    for r in ROWS:
        print(f"| {r['section']}: {r['figure']} | {r['expected']} | {r['got']} | {r['status']} |")
    if RATIOS:
        print(
            "\n| variant | plain median ms | stepcli untouched median ms | ratio | runs "
            "|\n|---|---:|---:|---:|---:|"
        )
        for r in RATIOS:
            print(
                f"| {r['variant']} | {r['plain_ms']:.2f} | {r['ms']:.2f} | {r['ratio']:.3f}x | "
                f"{r['runs']} |"
            )
    failed = sum(r["status"] == "FAIL" for r in ROWS)
    print(
        f"\n{len(ROWS) - failed} passed, {failed} failed ({time.perf_counter() - started:.0f} s, "
        f"results in {work})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
