"""stepcli.runfolder.summaryread: the one loader of run summaries names the first wrong field in one
line (exit 2)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from stepcli.errors import EXIT_USAGE, StepcliError
from stepcli.runfolder.summaryread import load_run_summary, read_run_summary


def _doc(**fields: Any) -> dict[str, Any]:
    return {"schema": "stepcli.run", "schema_version": 2, "command": ["python", "t.py"], **fields}


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"command": [1, 2]}, "command[0] is not a string"),
        ({"processes": "abc"}, "processes is not a list"),
        ({"schedule": [1]}, "schedule is not an object"),
        ({"processes": [{"rank": "0"}]}, "processes[0].rank is not an integer"),
        (
            {"step_times": [{"durations_ms": [1.0], "phases": ""}]},
            "step_times[0] needs durations_ms",
        ),
        ({"windows": [{"trace": 3}]}, "windows[0].trace is not a string"),
        ({"advice": [{"rule": "x"}]}, "advice[0].title is missing"),
        ({"schedule": {"a\nb" * 30: "x"}}, "schedule.'a\\nb"),
        ({"traces": ["/etc/passwd"], "out_dir": "/tmp/run"}, "outside its out_dir"),
        # the parts report.html reads item by item: a wrong one was an internal error (exit 70)
        # there
        ({"triggered": "x"}, "triggered is not a list"),
        ({"triggered": [None]}, "triggered[0] is not an object"),
        ({"triggered": [{"first_step": "2"}]}, "triggered[0].first_step is not an integer"),
        ({"step_record": [{"steps": "x"}]}, "step_record[0].steps is not a non-negative integer"),
        (
            {"step_record": [{"slowest": [[3, None]]}]},
            "step_record[0].slowest[0] is not a non-negative number",
        ),
        ({"step_record": [{"blocks": -1}]}, "step_record[0].blocks is not a list"),
        ({"hang": {"reports": -1}}, "hang.reports is not a list"),
        (
            {"hang": {"reports": [{"processes": [3]}]}},
            "hang.reports[0].processes[0] is not an object",
        ),
        # a field every reader of an entry needs is declared required: missing, it is said at
        # loading
        (
            {"windows": [{"trace": "/tmp/run/a.json"}], "out_dir": "/tmp/run"},
            "windows[0].first_step is missing",
        ),
        ({"outside_steps": {"events": 1}}, "outside_steps.self_ms is missing"),
        (
            {"step_time_ms": {"untouched": {"count": 3, "median": "fast"}}},
            "step_time_ms.untouched.mean is not a",
        ),
        ({"top_operators": [{"calls": 1}]}, "top_operators has an entry without a name"),
        ({"memory_snapshots": ["../x.pickle"]}, "memory_snapshots[0] is not a snapshot file name"),
        ({"timeline_ms": [5e-324]}, "timeline_ms[0] is not a step time in ms"),
    ],
)
@pytest.mark.parametrize("decoded", [True, False], ids=["decoded", "bytes"])
def test_wrong_types_are_one_line(fields: dict[str, Any], problem: str, decoded: bool) -> None:
    # the same message whether the document comes decoded (load_run_summary) or as a file's bytes
    # (read_run_summary)
    with pytest.raises(StepcliError) as info:
        if decoded:
            load_run_summary(_doc(**fields), "run.json")
        else:
            read_run_summary(orjson.dumps(_doc(**fields)), "run.json")
    assert info.value.exit_code == EXIT_USAGE and "\n" not in info.value.message
    assert (
        info.value.message.startswith("run.json: not a valid stepcli run summary: ")
        and problem in info.value.message
    )


_SEGMENT = {"rank": 0, "kind": "cpu", "name": "forward"}  # no `ms`, no `share`


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        # a segment without its ms passed as a plain object; report.html's chart raised KeyError
        (
            {
                "what_would_help": {
                    "verdict": "ok",
                    "critical_path": {"ms": 1.0, "segments": [_SEGMENT]},
                }
            },
            "what_would_help.critical_path.segments[0].ms is missing",
        ),
        (
            {"hang": {"reports": [{"processes": [{"frame": "main"}]}]}},
            "processes[0].frame is not an object",
        ),
        (
            {"hang": {"reports": [{"processes": [{"where": 3}]}]}},
            "processes[0].where is not a string",
        ),
        (
            {"hang": {"reports": [{"processes": [{"in_backward": 1}]}]}},
            "in_backward is not true or false",
        ),
        ({"compile": {"steps": "2"}}, "compile.steps is not a non-negative integer"),
        (
            {"compile": {"by_step": [{"step": 3, "reasons": "x"}]}},
            "compile.by_step[0].reasons is not a list",
        ),
    ],
)
def test_the_typed_sections_check_every_field_they_declare(
    fields: dict[str, Any],
    problem: str,
) -> None:
    # `hang`, `what_would_help` and `compile` are built as Structs and read back as them:
    # every field is checked at loading, not only the few a plain object's check declared
    for read in (
        lambda: load_run_summary(_doc(**fields), "run.json"),
        lambda: read_run_summary(orjson.dumps(_doc(**fields)), "run.json"),
    ):
        with pytest.raises(StepcliError) as info:
            read()
        assert "\n" not in info.value.message and problem in info.value.message, info.value.message


def test_a_number_past_the_float_range_is_named_not_a_json_error() -> None:
    data = b'{"schema": "stepcli.run", "schema_version": 2, "duration_s": 1e400}'
    with pytest.raises(StepcliError, match=r"summary: duration_s is not a non-negative number$"):
        read_run_summary(data, "run.json")


def test_missing_fields_are_fine_unless_required() -> None:
    assert load_run_summary(_doc(), "run.json").command == ["python", "t.py"]
    with pytest.raises(StepcliError, match="step_time_ms is missing"):
        load_run_summary(_doc(), "run.json", required=("step_time_ms",))
    with pytest.raises(StepcliError, match="unknown document schema 'other'"):
        load_run_summary({"schema": "other"}, "run.json")


def test_a_process_that_said_why_its_window_was_lost_is_not_contradicted() -> None:
    # The launcher guesses "a SIGKILL or a hard crash" only when no process said why its window was
    # not saved
    from stepcli.run.summary.runnotes import _window_loss_explained

    blocked = {
        "notes": ["the window open at SIGTERM could not be saved: the main thread was blocked"]
    }
    cut = {
        "notes": [
            "the window from step 2 was not saved (cut short: the program exited before it held a "
            "whole step)"
        ]
    }
    assert _window_loss_explained([{"notes": []}, blocked]) and _window_loss_explained([cut])
    assert not _window_loss_explained([{"notes": ["requesters stepped unequally"]}, {}])
