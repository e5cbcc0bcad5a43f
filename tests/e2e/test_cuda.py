"""Real CUDA runs: one-GPU training, AMP with GradScaler, and a 2-process DDP run (NCCL on two GPUs,
else gloo sharing one). Skipped, with the reason, where CUDA is absent; run them with `python -m
pytest -q -s tests/e2e/test_cuda.py` to see the figures each test prints (step times, top kernels,
device busy share, trace sizes).

They assert on what torch's Kineto writes for a GPU: device events (`cat` "kernel", "gpu_memcpy"),
the runtime/driver calls that launched them ("cuda_runtime"/"cuda_driver"), and on stepcli's kernel
table, device busy share, CUDA peak memory and step annotations built from them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import load_trace, profiler_steps, run_stepcli, stepcli_env, trace_files, write_script


@functools.lru_cache(maxsize=1)
def _gpus() -> tuple[int, str]:
    """(CUDA devices torch sees, why none): asked in a subprocess, so the test process never
    initializes CUDA."""
    if not (os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi")):
        return 0, "no NVIDIA driver on this machine"
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=120,
            env=stepcli_env(),
        )
        count = int(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
        return 0, f"could not ask torch about CUDA: {exc}"
    return count, "" if count else "torch.cuda.is_available() is False"


pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_gpus()[0] == 0, reason=f"CUDA is not available: {_gpus()[1]}"),
]

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

TRAIN_GPU = """
    import sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    host = torch.randn(256, 1024).pin_memory()
    for i in range(12):
        x = host.to("cuda", non_blocking=True)  # a host-to-device copy in every step
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(torch.cuda.max_memory_allocated())
"""
# float32 weights and biases of TRAIN_GPU's model
PARAM_BYTES = (1024 * 4096 + 4096 + 4096 * 1024 + 1024) * 4


def _events(trace: Path) -> list[dict[str, Any]]:
    return [e for e in load_trace(trace)["traceEvents"] if e.get("ph") == "X"]


def _device_events(trace: Path) -> list[dict[str, Any]]:
    return [e for e in _events(trace) if e.get("cat") in DEVICE_CATEGORIES]


def _report(title: str, summary: dict[str, Any]) -> None:
    """The figures the lead reports: shown with `pytest -s`."""
    times = summary["step_time_ms"]
    print(f"\n== {title}")
    for key in ("untouched", "profiled", "first_step"):
        stats = times.get(key)
        if stats:
            print(
                f"  {key:10} n={stats['count']} median {stats['median']:.3f} ms  p90 "
                f"{stats['p90']:.3f} ms  min {stats['min']:.3f} ms  max {stats['max']:.3f} ms"
            )
    device = summary.get("device")
    if device:
        print(
            f"  device busy {device['busy_ms']:.3f} ms per recorded step, share "
            f"{device['busy_share']:.1%}"
        )
    print(
        f"  CUDA peak {summary['peak_memory']['cuda_bytes']} bytes, RSS peak "
        f"{summary['peak_memory']['rss_bytes']} bytes"
    )
    for kernel in summary["top_kernels"][:5]:
        print(
            f"  kernel {kernel['self_ms']:9.3f} ms  {kernel['calls']:5} calls  "
            f"{kernel['name'][:90]}"
        )
    for window in summary["windows"]:
        print(
            f"  trace {window['worker']} steps {window['first_step']}-{window['last_step']}: "
            f"{window['bytes']} bytes {Path(window['trace']).name}"
        )
    if summary.get("breakdown_ms"):
        print(
            "  breakdown "
            + ", ".join(f"{k} {v:.3f} ms" for k, v in summary["breakdown_ms"].items())
        )
    for rank in summary.get("ranks", []):
        if rank["step_ms"]:
            print(
                f"  rank {rank['rank']}: median {rank['step_ms']['median']:.3f} ms over "
                f"{rank['step_ms']['count']} steps"
            )


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `stepcli run` of a one-GPU training loop, recording steps 2-4 with every activity torch
    offers."""
    tmp = tmp_path_factory.mktemp("cuda")
    script = write_script(tmp, "train_gpu.py", TRAIN_GPU)
    out = tmp / "out"
    result = run_stepcli("run", "-o", out, "--json", tmp / "run.json", script, cwd=tmp, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp / "run.json").read_text())
    _report("one GPU, AdamW, 12 steps, recording 2-4", summary)
    return {"tmp": tmp, "script": script, "out": out, "result": result, "summary": summary}


def test_one_gpu_trace_holds_kernels_copies_and_their_launches(gpu_run: dict[str, Any]) -> None:
    (trace,) = trace_files(gpu_run["out"])
    assert profiler_steps(trace) == [2, 3, 4]
    events = _events(trace)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    launches = [
        e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in e["name"]
    ]
    assert len(kernels) >= 3 * 10  # forward, backward and optimizer kernels of three steps
    assert len(copies) >= 3  # at least the host-to-device copy of each recorded step
    assert len(launches) >= len(kernels) // 2
    assert any("elementwise_kernel" in k["name"] for k in kernels)  # ReLU, square, ...
    assert all(k["dur"] >= 0 for k in kernels) and sum(k["dur"] for k in kernels) > 0
    # every kernel ran on the GPU lane of the trace, not the CPU's
    assert {k.get("pid") for k in kernels}.isdisjoint(
        {e.get("pid") for e in events if e.get("cat") == "cpu_op"}
    )


def test_one_gpu_summary_has_kernel_table_device_busy_and_cuda_peak(
    gpu_run: dict[str, Any],
) -> None:
    summary = gpu_run["summary"]
    (trace,) = trace_files(gpu_run["out"])
    kernels = summary["top_kernels"]
    assert kernels and all(k["self_ms"] > 0 and k["calls"] > 0 for k in kernels)
    device_names = {e["name"] for e in _device_events(trace)}
    # rows are the trace's own kernels and copies
    assert {k["name"] for k in kernels} <= device_names
    # never mixed with CPU ops
    assert all(op["name"] not in device_names for op in summary["top_operators"])
    device = summary["device"]
    assert 0 < device["busy_share"] <= 1 and device["busy_ms"] > 0
    # the program's own torch.cuda.max_memory_allocated() is what stepcli reports as the CUDA peak
    printed_peak = int(gpu_run["result"].stdout.strip().splitlines()[-1])
    (process,) = summary["processes"]
    assert process["cuda_peak_bytes"] == printed_peak == summary["peak_memory"]["cuda_bytes"]
    assert printed_peak >= 3 * PARAM_BYTES  # weights, gradients and AdamW's two moments
    assert summary["breakdown_ms"]["backward"] > 0 and summary["breakdown_ms"]["optimizer"] > 0
    assert summary["steps"] == {"global": 12, "requesters": {"AdamW#0": 12}}


def test_table_reads_the_gpu_trace(gpu_run: dict[str, Any]) -> None:
    (trace,) = trace_files(gpu_run["out"])
    result = run_stepcli("table", "--json", trace)
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    assert table["device_kernels"] and table["device"]["busy_share"] > 0
    assert [s["step"] for s in table["steps"]] == [2, 3, 4]
    shown = run_stepcli("table", trace)
    assert "kernel" in shown.stdout.lower() and shown.returncode == 0


def test_activities_cpu_leaves_the_gpu_out(gpu_run: dict[str, Any]) -> None:
    tmp = gpu_run["tmp"]
    out = tmp / "cpu_only"
    result = run_stepcli(
        "run",
        "--activities",
        "cpu",
        "--active",
        "1",
        "-o",
        out,
        "--json",
        tmp / "cpu.json",
        gpu_run["script"],
        cwd=tmp,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    (trace,) = trace_files(out)
    assert _device_events(trace) == []
    summary = json.loads((tmp / "cpu.json").read_text())
    assert summary["top_kernels"] == [] and summary["device"] is None
    assert summary["peak_memory"]["cuda_bytes"] >= 3 * PARAM_BYTES  # memory is measured either way


def test_amp_with_grad_scaler(tmp_path: Path) -> None:
    # GIVEN mixed precision: autocast to float16 and a GradScaler stepping the optimizer
    script = write_script(
        tmp_path,
        "amp.py",
        """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1024)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda")
        x = torch.randn(128, 1024, device="cuda")
        for i in range(10):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    """,  # noqa: E501
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--record-shapes",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    _report("AMP float16 + GradScaler, 10 steps, recording 2-4", summary)
    # THEN each GradScaler.step counts once, whether or not it skipped opt.step() on inf/NaN
    # gradients
    assert summary["steps"] == {"global": 10, "requesters": {"SGD#0": 10}}
    (trace,) = trace_files(out)
    assert profiler_steps(trace) == [2, 3, 4]
    events = _events(trace)
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"} <= ops
    half_matmuls = [
        e
        for e in events
        if e.get("cat") == "cpu_op"
        and e["name"] == "aten::addmm"
        and "c10::Half" in json.dumps(e.get("args", {}).get("Input type", []))
    ]
    assert half_matmuls  # autocast really ran the linear layers in float16
    assert _device_events(trace) and summary["top_kernels"]
    assert 0 < summary["device"]["busy_share"] <= 1
    assert summary["peak_memory"]["cuda_bytes"] > 0


def test_ddp_two_processes(tmp_path: Path) -> None:
    # GIVEN DDP over 2 processes: NCCL when two GPUs exist, else gloo with both processes on GPU 0
    gpus = _gpus()[0]
    script = write_script(
        tmp_path,
        "ddp_gpu.py",
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        gpus = torch.cuda.device_count()
        dist.init_process_group("nccl" if gpus >= 2 else "gloo")
        rank = dist.get_rank()
        device = torch.device("cuda", rank % gpus)
        torch.cuda.set_device(device)
        torch.manual_seed(rank)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                        torch.nn.Linear(2048, 1024)).to(device), device_ids=[device.index])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(10):
            model(torch.randn(64, 1024, device=device)).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dist.barrier()
        dist.destroy_process_group()
    """,  # noqa: E501
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        script,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    _report(
        f"DDP, 2 processes, {'NCCL' if gpus >= 2 else 'gloo on one GPU'}, recording 2-4", summary
    )
    # THEN one trace per rank, each with the steps and that rank's GPU work
    traces = trace_files(out)
    assert sorted(t.name.split(".")[0] for t in traces) == ["rank0", "rank1"]
    for trace in traces:
        assert profiler_steps(trace) == [2, 3, 4]
        assert any(e.get("cat") == "kernel" for e in _events(trace))
    assert sorted(p["worker"] for p in summary["processes"]) == ["rank0", "rank1"]
    assert all(p["cuda_peak_bytes"] and p["cuda_peak_bytes"] > 0 for p in summary["processes"])
    assert sorted(r["rank"] for r in summary["ranks"]) == [0, 1]
    # equal work on both ranks: a straggler is named only when one rank's compute stands out, with
    # its evidence
    assert summary["slowest_rank"] in (None, 0, 1)
    assert all(
        r["compute_ms"] is not None and r["comm_ms"] is not None for r in summary["ranks"]
    ), summary["ranks"]
    assert 0 < summary["device"]["busy_share"] <= 1
    if gpus >= 2:  # NCCL's all-reduce runs as a kernel of its own
        names = {e["name"] for trace in traces for e in _device_events(trace)}
        assert any("nccl" in name.lower() for name in names)
    table = json.loads(run_stepcli("table", "--json", out).stdout)
    assert sorted(r["rank"] for r in table["ranks"]) == [0, 1] and table["device_kernels"]
