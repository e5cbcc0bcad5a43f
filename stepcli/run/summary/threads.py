"""The run summary's `threads` section: per host, how many intra-op threads the processes run
against the cores they may use. torch runs each operator on its intra-op pool (OMP_NUM_THREADS,
torch.set_num_threads), and OpenMP threads spin while they wait: ranks x threads beyond the cores
make every operator wait for a core (measured on 2 cores: two ranks of 2 threads each ran their
operators 8-10x slower than with OMP_NUM_THREADS=1). The advice rule that reads it is
stepcli.advice.rules.threads.
"""

from __future__ import annotations

from typing import Any

from stepcli.runfolder.summaryfile import Threads, ThreadsHost


def _int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def threads_section(logs: list[dict[str, Any]]) -> Threads | None:
    """Per host: its processes, their intra-op threads (summed, and each process's), the cores they
    may run on (the union of their affinity masks) and whether the threads outnumber the cores; None
    when no process said."""
    hosts: dict[str, tuple[list[int], set[int]]] = {}
    for log in logs:
        threads: Any = log.get("intra_op_threads")
        cpus: Any = log.get("cpus")
        if (
            not _int(threads, 1)
            or not isinstance(cpus, list)
            or not cpus
            or not all(_int(c, 0) for c in cpus)
        ):
            continue
        counts, cores = hosts.setdefault(str(log.get("host")), ([], set()))
        counts.append(threads)
        cores.update(cpus)
    if not hosts:
        return None
    entries = [
        ThreadsHost(
            host=host,
            processes=len(counts),
            intra_op_threads=sum(counts),
            per_process=sorted(set(counts)),
            cores=len(cores),
            oversubscribed=sum(counts) > len(cores),
        )
        for host, (counts, cores) in sorted(hosts.items())
    ]
    return Threads(hosts=entries, oversubscribed=any(entry.oversubscribed for entry in entries))
