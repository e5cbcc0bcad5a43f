"""The recorder's window state alone: its moves, and what other threads may ask of it."""

from __future__ import annotations

from stepcli.agent.windowstate import WindowState


def test_a_window_warms_up_records_and_goes_on_to_its_next_cycle() -> None:
    window = WindowState()
    assert not window.is_open and window.first_step is None
    window.open(None)  # its first steps warm up
    assert window.is_open and window.first_step is None
    window.recording_from(5)
    assert window.first_step == 5
    window.next_cycle()  # saved; the same profiler object warms up again (wait=0)
    assert window.is_open and window.first_step is None
    window.open(9)
    window.close()
    assert not window.is_open and window.first_step is None


def test_requests_from_other_threads_keep_the_first_reason_until_done() -> None:
    window = WindowState()
    window.ask_cut("cut short: a step was made on another thread")
    window.ask_cut("cut short: SIGTERM")
    assert window.pending_cut == "cut short: a step was made on another thread"
    window.ask_drop("withdrawn")
    window.ask_drop("withdrawn again")
    assert window.take_drop() == "withdrawn"
    assert window.pending_drop == "" and window.take_drop() == ""


def test_an_early_close_says_how_the_trace_is_treated_until_it_is_over() -> None:
    window = WindowState()
    window.open(3)
    window.closing("cut short: the program exited", discard=False)
    assert (window.cut_reason, window.discard, window.dropping) == (
        "cut short: the program exited",
        False,
        False,
    )
    window.closed_early()
    window.closing("withdrawn", discard=True, dropping=True)
    assert (window.discard, window.dropping) == (True, True)
    window.closed_early()
    assert (window.cut_reason, window.discard, window.dropping) == ("", False, False)
