"""Summarizing many trace files at once: each file is read and summarized on its own, in worker
processes when there are several files and cores, and only the small per-file parts
(stepcli.traces.analyses.results.FilePart) come back to be merged. Peak memory is a few files (one
per worker), not the folder; the answers equal the serial path's. A process that may fork shares the
files with forked children (stepcli.traces.forkmap); one that may not (a launcher's threads) uses a
process pool from a forkserver.

`table`, `report` and the run summary after `stepcli run` all go through `summarize_paths` /
`file_parts`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from stepcli.errors import TraceError
from stepcli.traces.read.columns import ColumnTrace, load_columns
from stepcli.traces.read.files import list_trace_files
from stepcli.traces.read.forked import available_cores
from stepcli.traces.read.splitread import read_blocked
from stepcli.traces.read.tracereader import Decode

# multiprocessing and concurrent.futures cost ~20 ms to import: only where a pool is made
if TYPE_CHECKING:
    import multiprocessing.context
    from concurrent.futures import ProcessPoolExecutor

    from stepcli.traces.analyses.results import FilePart, TraceSummary

_T = TypeVar("_T")


def worker_count(jobs: int | None, files: int) -> int:
    """Worker processes for `files` files: `--jobs` (default: the available cores), never more than
    the files nor the cores (more processes than cores only add memory: `--jobs 10000` must not fork
    10,000)."""
    wanted = jobs if jobs is not None else available_cores()
    return max(1, min(wanted, available_cores(), files))


# While a worker reads a .gz trace it holds the compressed bytes, the inflated bytes and the decoded
# columns.
_GZIP_FOOTPRINT = 3
# in a worker: the semaphore bounding the .gz files read at once (None: no bound needed)
_gzip_gate: Any = None


def gzip_slots(files: Sequence[str], workers: int, memory: int | None = None) -> int:
    """How many .gz traces may be inflated at once so that, together, they fit in half the available
    memory; at least one (a file too large for the memory is read alone), at most `workers`. The
    inflated size comes from each file's gzip trailer, bounded by the input limit (stepcli.inputs):
    a trailer that lies only ever reaches the limit, which every read enforces."""
    from stepcli.limits import input_limit

    sizes = [_inflated_size_hint(f) for f in files if f.endswith(".gz")]
    memory = _memory_available() if memory is None else memory
    if not sizes or workers <= 1 or memory is None:
        return workers
    per_read = _GZIP_FOOTPRINT * max(1, min(max(sizes), input_limit()))
    return max(1, min(workers, (memory // 2) // per_read))


def _inflated_size_hint(path: str) -> int:
    """A gzip file's inflated size from its trailer (ISIZE, modulo 4 GiB), never less than its own
    size; 0 for what is no regular gzip file (a FIFO named `*.json.gz` is never waited on:
    stepcli.inputs.gzip_trailer)."""
    from stepcli.inputs import gzip_trailer

    found = gzip_trailer(path)
    return max(found) if found is not None else 0


def _memory_available() -> int | None:
    """MemAvailable (Linux), else the physical memory; None when neither is known."""
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _set_gzip_gate(gate: Any, expected: Mapping[str, Any] | None = None) -> None:
    """Pool initializer: the shared semaphore this worker takes around each .gz read, and the traces
    it reads only while they are the files the run wrote (stepcli.inputs.expect_written: a
    forkserver worker does not inherit them)."""
    global _gzip_gate
    _gzip_gate = gate
    if expected:
        from stepcli.inputs import restore_expected

        restore_expected(expected)


# Ranges per core when one big file is cut (measured on 2 cores: more ranges cost more than they
# balance).
_PIECES_PER_CORE = 1


class _Failed:
    """A worker's one-line trace error, sent back as data (a TraceError does not survive pickling as
    itself)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem


def _part_of(
    path: str,
    groupings: tuple[bool, ...],
    shapes: bool,
    decode: Decode | None = None,
    arrivals: bool = True,
    lanes: bool = False,
    stacks: bool = False,
) -> list[FilePart] | _Failed:
    """Read one file and summarize it once per grouping (plain, by shape); runs in a worker or
    in-process."""
    try:
        # (a plain file of a few MB or more: a block at a time through this process's buffer)
        trace = read_blocked(path, shapes) if decode is None else None
        if trace is None:
            trace = load_columns(path, shapes=shapes, decode=decode)
    except TraceError as exc:
        return _Failed(exc.path, exc.problem)
    return _summarized(trace, groupings, arrivals, lanes, stacks)


def _or_failed(function: Callable[[str], _T], path: str) -> _T | _Failed:
    """`function(path)`, or its TraceError as data (one line that survives pickling: the cluster
    sends it back)."""
    try:
        return function(path)
    except TraceError as exc:
        return _Failed(exc.path, exc.problem)


def _gated(function: Callable[[str], _T], path: str) -> _T:
    """`function(path)` in a worker, holding the pool's .gz semaphore while a .gz file is read (and
    its decoded data alive)."""
    gate = _gzip_gate if path.endswith(".gz") else None
    with gate if gate is not None else contextlib.nullcontext():
        return function(path)


def _summarized(
    trace: ColumnTrace,
    groupings: tuple[bool, ...],
    arrivals: bool = True,
    lanes: bool = False,
    stacks: bool = False,
) -> list[FilePart]:
    """One part per grouping (plain, by shape) of a trace read into columns, whole or in ranges
    (`arrivals`: see stepcli.traces.analyses.traceanalysis.summarize_columns). Only the first part
    carries the collectives' arrivals: the culprit is found from it, and a second copy (the page's
    by-shape part) cost every rank's file their computing, pickling and memory again for nothing."""
    from stepcli.traces.analyses.traceanalysis import summarize_read

    parts = [
        summarize_read(trace.columns, trace, group_by_shape=g, arrivals=arrivals and i == 0)
        for i, g in enumerate(groupings)
    ]
    if lanes and parts:  # `lanes`: the first part also carries the file's what-if lane
        from stepcli.traces.analyses.lanes import lane_of

        parts[0].lane = lane_of(trace)
    # `stacks`: the first part also carries the file's Python stacks (only when asked: slow)
    if stacks and parts:
        from stepcli.traces.analyses.pystacks import stacks_of

        cut = trace.incomplete_step if trace.incomplete_step is not None else parts[0].stub_step
        parts[0].stacks = stacks_of(trace.columns, cut)
    return parts


def load_analysis() -> None:
    """Import the analysis now (~35 ms, numpy's own import aside). The reading code does not need
    it, so on one file this is done while a forked child decodes (stepcli.traces.read.twoprocess);
    before worker processes are forked, so that they share it instead of each importing it."""
    import stepcli.traces.analyses.traceanalysis  # noqa: F401


def _split_parts(
    path: str,
    groupings: tuple[bool, ...],
    shapes: bool,
    cores: int,
    lanes: bool = False,
    stacks: bool = False,
) -> list[FilePart] | None:
    """One large trace decoded by `cores` processes (stepcli.traces.read.splitread); None when it is
    not split."""
    from stepcli.traces.read.splitread import FIRST_EXTRA, plan, read_split

    # Forked children begin at once: no head start for this process. (A pool, where this process may
    # not fork, is made only for a file that is cut, so reading a .gz or small file imports no
    # multiprocessing.)
    forking = _may_fork()
    ranges = plan(path, cores * _PIECES_PER_CORE, head_start=0.0 if forking else FIRST_EXTRA)
    if ranges is None:
        return None
    # children forked for the ranges, no pool; the analysis is imported while they finish
    if forking:
        from stepcli.traces.read.splitread import read_split_forked

        trace = read_split_forked(path, ranges, shapes, meanwhile=load_analysis)
        return (
            None
            if trace is None
            else _summarized(trace, groupings, arrivals=False, lanes=lanes, stacks=stacks)
        )
    from concurrent.futures.process import BrokenProcessPool

    context = _context()
    forked = context.get_start_method() == "fork"
    try:
        with _worker_pool(min(cores - 1, len(ranges) - 1), context) as pool:
            trace = read_split(path, ranges, shapes, pool, submit_aside=not forked)
            # read whole instead; a worker a failed start left waiting must not hold us up
            if trace is None:
                _kill(pool)
    # a worker died (out of memory?) or none could start: read it whole
    except (BrokenProcessPool, OSError):
        return None
    if trace is None:
        return None
    # (one file alone: one rank)
    return _summarized(trace, groupings, arrivals=False, lanes=lanes, stacks=stacks)


@contextlib.contextmanager
def _worker_pool(
    workers: int, context: multiprocessing.context.BaseContext, gzip_at_once: int | None = None
) -> Iterator[ProcessPoolExecutor]:
    """A process pool that leaves no worker behind: when using it fails, the workers it started are
    killed. A forking pool starts all its workers at the first task; if one fork is refused (a
    container's process limit), those already forked wait for work forever, and the pool's shutdown
    and this process's exit wait for them. `gzip_at_once`: at most that many workers inflate a .gz
    trace at the same time."""
    from concurrent.futures import ProcessPoolExecutor

    from stepcli.inputs import expected_files

    load_analysis()  # (forked workers share it)
    gate = (
        context.BoundedSemaphore(gzip_at_once)
        if gzip_at_once is not None and gzip_at_once < workers
        else None
    )
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_set_gzip_gate,
        initargs=(gate, expected_files()),
    )
    try:
        yield pool
    except BaseException:
        _kill(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _kill(pool: ProcessPoolExecutor) -> None:
    # (no public way before 3.14)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            process.kill()
        except (OSError, ValueError, AttributeError):
            pass


def _may_fork() -> bool:
    """Whether worker processes may be forked from this one (see _context)."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _context() -> multiprocessing.context.BaseContext:
    """How worker processes start. A fork is the cheapest (a worker is decoding within milliseconds
    and shares the parent's imports), but it is only safe while this process runs one thread
    (`stepcli table` does; a launcher with a spinner on the terminal does not). Otherwise forkserver
    on Linux (workers from a small clean process), spawn elsewhere."""
    import multiprocessing

    if sys.platform.startswith("linux"):
        if _may_fork():
            # A forked worker flushes the standard streams it inherited when it exits: empty them
            # first, or text this process had buffered would be printed twice.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (AttributeError, OSError, ValueError):
                    pass
            return multiprocessing.get_context("fork")
        context = multiprocessing.get_context("forkserver")
        # The server imports the reader once; each worker forked from it starts with it loaded.
        context.set_forkserver_preload(
            [
                "stepcli.traces.engine",
                "stepcli.traces.analyses.traceanalysis",
                "stepcli.traces.read.columns",
                "stepcli.traces.read.splitread",
            ]
        )
        return context
    return multiprocessing.get_context("spawn")


def file_parts(
    paths: Sequence[str],
    *,
    groupings: tuple[bool, ...] = (False,),
    shapes: bool = False,
    jobs: int | None = None,
    scheduler: str | None = None,
    scheduler_wait: float | None = None,
    lanes: bool = False,
    stacks: bool = False,
) -> list[list[FilePart]]:
    """Per file named by `paths` (files or folders, as stepcli.traces.read.tracereader.load_paths
    reads them), in that order: its parts, one per grouping. `jobs` worker processes at most
    (default: the available cores); 1 reads in-process. With `scheduler`, a Dask distributed
    cluster's workers read the files instead (stepcli.traces.cluster). `lanes`: each file's first
    part also carries its what-if lane (FilePart.lane; not on a cluster). `stacks`: its Python
    stacks (FilePart.stacks; not on a cluster).

    Raises TraceError for the first file (in order) that is not a readable trace.
    """
    files = list_trace_files(paths)
    if scheduler is not None:
        from stepcli.traces.cluster import WORKER_WAIT_S, cluster_results

        wait_s = WORKER_WAIT_S if scheduler_wait is None else scheduler_wait
        per_file = functools.partial(_part_of, groupings=groupings, shapes=shapes)
        return _checked(cluster_results(scheduler, per_file, files, wait_s))
    cores = (
        worker_count(jobs, len(files))
        if len(files) > 1
        else min(jobs or available_cores(), available_cores())
    )
    if len(files) == 1 and cores > 1:
        split = _split_parts(files[0], groupings, shapes, cores, lanes, stacks)
        if split is not None:
            return [split]
        # a .gz or smaller file: read into memory, decoded by this process and a forked one
        if _may_fork():
            from stepcli.traces.read.twoprocess import DecodeInTwo

            decode = DecodeInTwo(shapes, meanwhile=load_analysis)
            return _checked(
                [
                    _part_of(
                        files[0],
                        groupings,
                        shapes,
                        decode,
                        arrivals=False,
                        lanes=lanes,
                        stacks=stacks,
                    )
                ]
            )
    # One file alone is one rank: no other to compare its collectives' arrivals with (the culprit).
    part_of = functools.partial(
        _part_of,
        groupings=groupings,
        shapes=shapes,
        arrivals=len(files) > 1,
        lanes=lanes,
        stacks=stacks,
    )
    return _checked(map_files(part_of, files, cores))


def map_files(
    function: Callable[[str], _T],
    files: Sequence[str],
    jobs: int | None = None,
    scheduler: str | None = None,
    scheduler_wait: float | None = None,
) -> list[_T]:
    """`function(file)` for each file, in order: in worker processes when there are several files
    and cores (`function` must be picklable, e.g. a module-level function or a partial of one, and
    return picklable data), else in this process. If no worker can start, the files are done here,
    one after another. With `scheduler`, on a Dask distributed cluster's workers
    (stepcli.traces.cluster), as `file_parts` reads there; the first bad file (in order) raises
    TraceError here, as locally."""
    if scheduler is not None:
        from stepcli.traces.cluster import WORKER_WAIT_S, cluster_results

        wait_s = WORKER_WAIT_S if scheduler_wait is None else scheduler_wait
        results = cluster_results(
            scheduler, functools.partial(_or_failed, function), list(files), wait_s
        )
        for result in results:
            if isinstance(result, _Failed):
                raise TraceError(result.path, result.problem)
        return results
    workers = worker_count(jobs, len(files))
    if workers > 1:
        gzip_at_once = gzip_slots(files, workers)
        # no pool: this process and forked children share the files
        if _may_fork() and gzip_at_once >= workers:
            from stepcli.traces.forkmap import forked_map

            load_analysis()  # (the children share it)
            shared = forked_map(function, files, workers)
            return shared if shared is not None else [function(file) for file in files]
        from concurrent.futures.process import BrokenProcessPool

        from stepcli.traces.forkmap import worker_died

        try:
            with _worker_pool(workers, _context(), gzip_at_once) as pool:
                return list(pool.map(functools.partial(_gated, function), files))
        except BrokenProcessPool:
            raise worker_died(workers) from None
        except OSError:  # no worker could start (a process limit?)
            pass
    return [function(file) for file in files]


def _checked(results: Sequence[list[FilePart] | _Failed]) -> list[list[FilePart]]:
    """The parts, or the first file's error (in file order) as TraceError."""
    out: list[list[FilePart]] = []
    for result in results:
        if isinstance(result, _Failed):
            raise TraceError(result.path, result.problem)
        out.append(result)
    return out


def summarize_paths(
    paths: Sequence[str],
    *,
    group_by_shape: bool = False,
    jobs: int | None = None,
    scheduler: str | None = None,
    scheduler_wait: float | None = None,
    stacks: bool = False,
) -> TraceSummary:
    """`summarize(load_paths(paths))`, with files read in parallel and never all in memory at once;
    with `stacks`, the Python stacks too (`table --stacks`)."""
    parts = file_parts(
        paths,
        groupings=(group_by_shape,),
        shapes=group_by_shape,
        jobs=jobs,
        scheduler=scheduler,
        scheduler_wait=scheduler_wait,
        stacks=stacks,
    )
    from stepcli.traces.analyses.mergeparts import merge_parts

    return merge_parts([p[0] for p in parts], group_by_shape=group_by_shape)
