"""NOTHING-MEASURED.txt: the one visible file a run that measured nothing leaves in its output
folder.

A run that measured nothing leaves a folder holding only the hidden `.stepcli/`: it would look
empty, as if stepcli had failed to write. One visible file says what happened (the summary's notes)
and what is there. A later run into the same folder replaces it (it measured nothing either) or
removes it (it did measure): the note speaks for the latest run, never beside a real trace and
report.
"""

from __future__ import annotations

import os
import shlex

from stepcli import safefile
from stepcli.fmt import plural
from stepcli.runfolder.layout import RUN_FOLDER
from stepcli.runfolder.summaryfile import RunSummary

NOTHING_MEASURED = "NOTHING-MEASURED.txt"
# how the note begins: only a file that begins so is ever replaced or removed
_HEAD = b"stepcli run: "


def update_note(summary: RunSummary, measured: bool) -> None:
    """Write the note for a run that measured nothing; remove an earlier run's note when this one
    measured."""
    out = summary.out_dir
    if not out or not os.path.isdir(out):
        return
    path = os.path.join(out, NOTHING_MEASURED)
    if safefile.why_not_replace(path, lambda head: head.startswith(_HEAD)) is not None:
        return  # the user's own file by that name (or a link): kept
    if measured:
        safefile.remove(path)
        return
    notes = "\n".join(f"- {note}" for note in summary.notes or []) or "- no step was recorded"
    text = (
        f"stepcli run: {shlex.join(summary.command)}\nexit status {summary.exit_status}, "
        f"{plural(summary.steps.global_ if summary.steps else 0, 'step')}: no trace was "
        f"recorded.\n\n{notes}\n\nstepcli's own records (step logs, the run summary) are in the "
        f"hidden folder {RUN_FOLDER}/:\n`stepcli report {shlex.quote(out)}` still writes an HTML "
        f"page of what they hold.\n"
    )
    try:
        safefile.write_bytes(path, text.encode())
    except OSError:
        pass  # a read-only or full folder: the summary on the terminal says the same
