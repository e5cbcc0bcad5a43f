"""Child processes: every Python process inherits the hook; only processes that step write
anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import profiler_steps, run_stepcli, stepcli_env, trace_files, write_script

from stepcli.run.launcher import BOOTSTRAP_DIR


def test_dataloader_workers_leave_no_files(tmp_path: Path) -> None:
    # GIVEN one training loop fed by two DataLoaders at once, one with forked workers and one with
    # spawned workers (started together before the first step, as one loader's would be), 2 workers
    # each
    script = write_script(
        tmp_path,
        "loader.py",
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def main():
            data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
            forked, spawned = (
                iter(DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context=method))
                for method in ("fork", "spawn")
            )
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for (x, y), (x2, y2) in zip(forked, spawned):
                ((model(x) - y).square().mean() + (model(x2) - y2).square().mean()).backward()
                opt.step()

        if __name__ == "__main__":
            main()
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli("run", "--wait", "1", "--warmup", "1", "--active", "2", "-o", out, script)
    assert result.returncode == 0, result.stderr
    # THEN only the training process wrote anything: its one window, its one step log, the run's
    # page
    traces = trace_files(out)
    assert [profiler_steps(t) for t in traces] == [[2, 3]]
    assert len(list(out.rglob("*.steps.json"))) == 1  # one process traced
    names = {p.name for p in out.iterdir()}
    assert names == {traces[0].name, ".stepcli", "report.html"}  # report.html: the run's page


def test_multiprocessing_spawn_ranks_each_write_their_trace(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "mpspawn.py",
        """
        import os
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp

        def worker(rank, world, init_file):
            dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(5):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
            dist.barrier()
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(worker, args=(2, os.path.abspath("rendezvous")), nprocs=2)
    """,  # noqa: E501
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "0",
        "--active",
        "2",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    traces = trace_files(out)
    assert sorted(t.name.split(".")[0] for t in traces) == ["rank0", "rank1"]
    assert all(profiler_steps(t) == [1, 2] for t in traces)
    # one step log per rank even though the rank is gone after destroy_process_group()
    summary = json.loads((tmp_path / "run.json").read_text())
    assert sorted(p["worker"] for p in summary["processes"]) == ["rank0", "rank1"]
    assert summary["steps"]["global"] == 5
    assert summary["step_time_ms"]["profiled"]["count"] == 4  # steps 1-2 of each rank
    assert len(summary["windows"]) == 2


def test_ranks_forked_before_their_parent_trains_each_write_their_trace(tmp_path: Path) -> None:
    # GIVEN torch.multiprocessing with the fork start method: two trainers forked from a parent that
    # never steps
    script = write_script(
        tmp_path,
        "mpfork.py",
        """
        import torch
        import torch.multiprocessing as mp

        def train(index):
            model = torch.nn.Linear(8, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(5):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()

        if __name__ == "__main__":
            mp.start_processes(train, nprocs=2, start_method="fork")
            print("done")
    """,
    )
    out = tmp_path / "out"
    result = run_stepcli(
        "run",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        "-o",
        out,
        "--json",
        tmp_path / "run.json",
        script,
        cwd=tmp_path,
    )
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    # THEN each is a process of its own, as a spawned one is: a trace of steps 2-3 and a step log
    # each (they were dropped as DataLoader-like children, and the run said nothing was measured)
    traces = trace_files(out)
    assert [profiler_steps(t) for t in traces] == [[2, 3], [2, 3]]
    summary = json.loads((tmp_path / "run.json").read_text())
    assert [p["global_steps"] for p in summary["processes"]] == [5, 5]
    assert len({p["worker"] for p in summary["processes"]}) == 2
    assert not (out / "NOTHING-MEASURED.txt").exists()


def test_existing_sitecustomize_still_runs(tmp_path: Path, train_script: Path) -> None:
    write_script(
        tmp_path,
        "site_dir/sitecustomize.py",
        "import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n",
    )
    check = write_script(
        tmp_path,
        "check.py",
        "import os, sys\nprint(os.environ.get('USER_SITECUSTOMIZE'), "
        "sys.modules['sitecustomize'].__file__)\n",
    )
    result = run_stepcli(
        "run", "-q", "-o", tmp_path / "out", check, env={"PYTHONPATH": str(tmp_path / "site_dir")}
    )
    assert result.returncode == 0, result.stderr
    flag, module_file = result.stdout.split()
    assert flag == "ran" and module_file == str(tmp_path / "site_dir" / "sitecustomize.py")


def test_broken_user_sitecustomize_is_reported_like_python_does(tmp_path: Path) -> None:
    write_script(tmp_path, "site_dir/sitecustomize.py", "import not_a_module_xyz\n")
    script = write_script(tmp_path, "hello.py", "print('ran anyway')\n")
    result = run_stepcli(
        "run", "-q", "-o", tmp_path / "out", script, env={"PYTHONPATH": str(tmp_path / "site_dir")}
    )
    assert result.returncode == 0 and result.stdout == "ran anyway\n"
    assert "Error in sitecustomize" in result.stderr and "not_a_module_xyz" in result.stderr


def test_agent_failure_leaves_the_program_untouched(tmp_path: Path) -> None:
    script = write_script(tmp_path, "hello.py", "print('fine')\n")
    env = stepcli_env({"PYTHONPATH": BOOTSTRAP_DIR, "STEPCLI_CONFIG": "{not json"})
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0 and result.stdout == "fine\n"
    assert result.stderr.startswith("stepcli: profiling disabled in this process:")
    assert len(result.stderr.splitlines()) == 1


def test_injected_code_imports_nothing_heavy(tmp_path: Path) -> None:
    # GIVEN the bootstrap active with a valid config, in a process that never imports torch
    from stepcli.agent.config import AgentConfig

    config = AgentConfig(run_id="t", out_dir=str(tmp_path), launcher_pid=1).to_env()
    probe = write_script(
        tmp_path,
        "probe.py",
        """
        import json, sys
        heavy = {"click", "rich", "orjson", "psutil", "torch", "numpy", "msgspec"}
        # of stepcli itself only the run folder's layout (names and keys, standard library only) and its packages
        light = {"stepcli", "stepcli.runfolder", "stepcli.runfolder.layout"}
        ours = [m for m in sys.modules if (m == "stepcli" or m.startswith("stepcli.")) and m not in light]
        found = sorted(heavy & set(sys.modules)) + sorted(ours)
        print(json.dumps({"heavy": found, "agent": "_stepcli_agent.runtime" in sys.modules}))
    """,  # noqa: E501
    )
    env = stepcli_env({"PYTHONPATH": BOOTSTRAP_DIR, "STEPCLI_CONFIG": config})
    result = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, env=env, timeout=60
    )
    report = json.loads(result.stdout)
    assert report == {"heavy": [], "agent": True}, result.stderr


def test_bootstrap_folder_holds_only_sitecustomize() -> None:
    assert sorted(p.name for p in Path(BOOTSTRAP_DIR).iterdir() if p.name != "__pycache__") == [
        "sitecustomize.py"
    ]
