"""The culprit analysis (stepcli.traces.analyses.arrivals, stepcli.traces.analyses.culprit) on
hand-made traces: who arrives last, how late, why, clock alignment, and no finding from noise."""

from __future__ import annotations

from typing import Any

import pytest

from stepcli.traces.analyses.alignment import align
from stepcli.traces.analyses.arrivals import RankArrivals, rank_arrivals
from stepcli.traces.analyses.culprit import analyze
from stepcli.traces.analyses.culpritwords import summary_line
from stepcli.traces.analyses.significance import chance_of_last
from stepcli.traces.read.events import Event
from stepcli.traces.read.typedcolumns import columns_from_events

MAIN, WORKER = 10, 20


STEPS = 6


def _rank_trace(
    late_us: float,
    *,
    offset: float = 0.0,
    extra: list[Event] | None = None,
    late_steps: int = STEPS,
) -> list[Event]:
    """Six 100 ms steps; in each the rank works 5 ms (aten::mm), idles `late_us`, then all-reduces;
    the collective ends 1 ms after rank 1 arrives (rank 1 idles 30 ms: the lateness the others wait
    for)."""
    events: list[Event] = []
    for step in range(STEPS):
        t0 = step * 100_000.0 + offset
        events.append(Event(f"ProfilerStep#{step}", "user_annotation", "X", 1, MAIN, t0, 90_000.0))
        events.append(Event("aten::mm", "cpu_op", "X", 1, MAIN, t0 + 100, 5_000.0))
        # early after `late_steps`
        arrive = t0 + 5_200 + (late_us if step < late_steps else -1_000.0)
        events.append(Event("c10d::allreduce_", "cpu_op", "X", 1, MAIN, arrive, 50.0))
        done = t0 + 5_200 + 30_000 + 1_000
        events.append(
            Event(
                "gloo:all_reduce",
                "user_annotation",
                "X",
                1,
                WORKER,
                arrive + 60,
                done - arrive - 60,
            )
        )
    events.extend(extra or [])
    events.sort(key=lambda e: e.ts)
    return events


def _arrivals(events: list[Event], rank: int) -> RankArrivals:
    found = rank_arrivals(columns_from_events(events), rank)
    assert found is not None
    return found


def test_arrivals_keys_gaps_and_departures() -> None:
    arrivals = _arrivals(_rank_trace(30_000), 1)
    assert arrivals.keys == [(step, "c10d::allreduce_", -1, 0) for step in range(STEPS)]
    assert arrivals.groups == [-1] * STEPS and arrivals.group_table == []  # gloo: no process group
    assert arrivals.arrive_us[0] == pytest.approx(35_200)
    # the gloo worker's end, not the host call's
    assert arrivals.depart_us[0] == pytest.approx(36_200)
    gap = arrivals.gaps[0]
    assert gap["cpu_operators"] == pytest.approx(5_000)
    assert gap["no_operator"] == pytest.approx(30_200)
    assert arrivals.details[0] == {"aten::mm": pytest.approx(5_000)}


def test_sleeping_rank_is_the_culprit_and_its_cause_is_no_operator() -> None:
    section = analyze([_arrivals(_rank_trace(0), 0), _arrivals(_rank_trace(30_000), 1)], 90.0)
    assert section is not None
    found = section["culprit"]
    assert found["rank"] == 1 and found["last_share"] == 1.0
    assert found["lateness_ms_per_step"] == pytest.approx(30.0, abs=0.01)
    assert found["wait_caused_ms_per_step"] == pytest.approx(30.0, abs=0.01)
    assert found["cause"] == "no_operator" and found["cause_ms_per_step"] == pytest.approx(
        30.0, abs=0.01
    )
    rank0 = section["ranks"][0]
    assert rank0["waited_ms_per_step"] == pytest.approx(30.0, abs=0.01) and rank0["times_last"] == 0
    assert [s["lateness_ms"]["1"] for s in section["per_step"]] == pytest.approx([30.0] * STEPS)
    assert [s["last_rank"] for s in section["per_step"]] == [1] * STEPS


def test_gc_and_operator_causes_are_named() -> None:
    gcs = [
        Event("python gc (gen 2)", "user_annotation", "X", 1, MAIN, s * 100_000.0 + 5_200, 30_000.0)
        for s in range(STEPS)
    ]
    mms = [
        Event("aten::addmm", "cpu_op", "X", 1, MAIN, s * 100_000.0 + 5_200, 30_000.0)
        for s in range(STEPS)
    ]
    cases = (
        (gcs, "gc", "python gc (gen 2)", "garbage collection (gen 2)"),
        (mms, "cpu_operators", "aten::addmm", "aten::addmm"),
    )
    for extra, cause, name, words in cases:
        section = analyze(
            [_arrivals(_rank_trace(0), 0), _arrivals(_rank_trace(30_000, extra=extra), 1)], 90.0
        )
        assert section is not None
        found = section["culprit"]
        assert found["cause"] == cause
        assert found["top"][0]["name"] == name and found["top"][0]["ms_per_step"] == pytest.approx(
            30.0, abs=0.01
        )
        assert words in found["evidence"]


def test_equal_ranks_name_no_culprit() -> None:
    # 0.3 ms apart, alternately: noise, not a finding
    ranks = [_arrivals(_rank_trace(300 if r == 0 else 0), r) for r in (0, 1)]
    section = analyze(ranks, 90.0)
    assert section is not None and section["culprit"] is None
    # last every time, but by less than MIN_LATENESS_MS
    assert section["ranks"][0]["times_last"] == STEPS
    assert section["no_culprit"]["reason"] in ("lead_in_noise", "little_lateness")
    assert section["no_culprit"]["words"].startswith(
        f"rank 0 arrives last at {STEPS} of {STEPS} collectives, but"
    )


def test_clock_offset_leaves_the_skew_unchanged() -> None:
    plain = analyze([_arrivals(_rank_trace(0), 0), _arrivals(_rank_trace(30_000), 1)], 90.0)
    shifted = analyze(
        [_arrivals(_rank_trace(0), 0), _arrivals(_rank_trace(30_000, offset=-250_000.0), 1)], 90.0
    )
    assert plain is not None and shifted is not None
    assert shifted["alignment"]["offsets_ms"]["1"] == pytest.approx(-250.0, abs=1e-6)

    def skew(section: dict[str, Any]) -> list[float]:
        return [c["lateness_ms"] for c in section["per_collective"]]

    assert skew(shifted) == pytest.approx(skew(plain), abs=1e-6)
    assert shifted["culprit"]["rank"] == 1


def test_alignment_error_from_the_spread_of_departures() -> None:
    # rank 1's clock is 1000 µs ahead; its departures jitter by ±100 µs
    depart = [[0.0, 1000.0 + d] for d in (-100, 0, 100, 0, 0)]
    arrive = [[-50_000.0, -50_000.0 + 1000.0] for _ in depart]
    offsets, errors = align(arrive, depart)
    assert offsets[1] == pytest.approx(1000.0)
    assert 50.0 <= errors[1] <= 100.0


def test_lateness_within_alignment_error_is_no_finding() -> None:
    # rank 1 is 2 ms late but the departures disagree by ±5 ms
    r0 = _arrivals(_rank_trace(0), 0)
    r1 = _arrivals(_rank_trace(2_000), 1)
    r1.depart_us = [d + jitter for d, jitter in zip(r1.depart_us, (-5_000.0, 0.0, 5_000.0) * 2)]
    section = analyze([r0, r1])  # no step time: only the 1 ms floor and the alignment error apply
    assert section is not None and section["alignment"]["error_ms"] >= 2.0
    assert section["culprit"] is None and section["no_culprit"]["reason"] == "lead_in_noise"
    assert "no more than the noise" in section["no_culprit"]["words"]


def test_ranks_on_one_clock_are_not_aligned_and_carry_no_alignment_error() -> None:
    # the same noisy departures as above, but both traces say they come from one boot of one machine
    r0 = _arrivals(_rank_trace(0), 0)
    r1 = _arrivals(_rank_trace(2_000), 1)
    r1.depart_us = [d + jitter for d, jitter in zip(r1.depart_us, (-5_000.0, 0.0, 5_000.0) * 2)]
    r0.clock = r1.clock = "node7 4b1f-boot"
    section = analyze([r0, r1])
    assert section is not None
    assert (
        section["alignment"]["offsets_ms"]["1"] == 0.0 and section["alignment"]["error_ms"] == 0.0
    )
    assert section["alignment"]["one_clock"] is True
    # 2 ms late every time: a finding once no alignment error hides it
    assert section["culprit"]["rank"] == 1
    assert [c["lateness_ms"] for c in section["per_collective"]] == pytest.approx(
        [2.0] * STEPS, abs=0.01
    )
    # another machine's rank is still aligned by the collectives, through the one it meets
    r1.clock = "node8 9c2e-boot"
    section = analyze([r0, r1])
    assert section is not None and section["alignment"]["one_clock"] is False
    assert section["alignment"]["error_ms"] >= 2.0


def _steady(rank: int, arrive_late_us: float, own_us: float) -> RankArrivals:
    """Six collectives 100 ms apart on one clock; the rank arrives `arrive_late_us` late after
    `own_us` of operators since the previous one."""
    from stepcli.traces.analyses.arrivals import CAUSES

    return RankArrivals(
        rank,
        keys=[(step, "c10d::allreduce_", -1, 0) for step in range(STEPS)],
        arrive_us=[step * 100_000.0 + 5_000.0 + arrive_late_us for step in range(STEPS)],
        depart_us=[step * 100_000.0 + 9_000.0 for step in range(STEPS)],
        gaps=[dict.fromkeys(CAUSES, 0.0) | {"cpu_operators": own_us} for _ in range(STEPS)],
        details=[{"aten::mm": own_us} for _ in range(STEPS)],
        clock="node7 4b1f-boot",
    )


def test_a_rank_late_without_doing_more_is_no_culprit() -> None:
    # GIVEN rank 1 arrives 2 ms after rank 0 at every collective, after the same 4 ms of its own
    # work (it left the previous collective later: gloo's ring completes on the ranks in turn)
    section = analyze([_steady(0, 0.0, 4_000.0), _steady(1, 2_000.0, 4_000.0)], 20.0)
    # THEN it is last every time and 2 ms/step late, but not the culprit: nothing of its own made it
    # late
    assert section is not None and section["ranks"][1]["last_share"] == 1.0
    assert section["ranks"][1]["lateness_ms_per_step"] == pytest.approx(2.0)
    assert section["culprit"] is None and section["thresholds"]["min_cause_ms_per_step"] == 1.0
    # AND the sentence gives that reason, never "no rank arrives last consistently enough" beside
    # its 100%
    assert section["no_culprit"]["reason"] == "no_extra_work"
    line = summary_line(section)
    assert line is not None and "consistently" not in line
    assert line.startswith(
        "culprit: none: rank 1 arrives last at 6 of 6 collectives, 2.00 ms/step late, but does no "
        "extra work before arriving (0.00 ms/step more than the others): it only leaves each "
        "collective later"
    ), line
    # AND with 2 ms more work of its own before arriving, it is
    section = analyze([_steady(0, 0.0, 4_000.0), _steady(1, 2_000.0, 6_000.0)], 20.0)
    assert section is not None and section["culprit"]["rank"] == 1
    assert section["culprit"]["cause"] == "cpu_operators"
    assert section["culprit"]["cause_ms_per_step"] == pytest.approx(2.0)


def test_a_rank_always_last_by_a_varying_margin_is_the_culprit() -> None:
    # GIVEN rank 1 arrives 40-130 ms late at every collective after as much more work of its own (a
    # loaded machine stretches its matrix work unevenly)
    late_ms = [40.0, 120.0, 50.0, 130.0, 60.0, 110.0]
    r0, r1 = _steady(0, 0.0, 4_000.0), _steady(1, 0.0, 4_000.0)
    r1.arrive_us = [a + ms * 1000 for a, ms in zip(r1.arrive_us, late_ms)]
    r1.gaps = [g | {"cpu_operators": 4_000.0 + ms * 1000} for g, ms in zip(r1.gaps, late_ms)]
    section = analyze([r0, r1], 300.0)
    # THEN its lead (median 85 ms, jitter 52 ms) is judged against the median's standard error, not
    # one collective's spread: it is the culprit
    assert section is not None and section["ranks"][1]["lead_jitter_ms"] > 40.0
    assert section["thresholds"]["min_lead_ms"] < 85.0
    assert section["culprit"]["rank"] == 1 and section["culprit"]["cause"] == "cpu_operators"


def test_clock_groups_align_as_one() -> None:
    # ranks 0, 1 on machine A, ranks 2, 3 on machine B, whose clock runs 500 µs ahead; rank 1 and
    # rank 3 never share a collective with rank 2 / rank 0 directly in this layout: only through
    # their machine
    depart = [[0.0, 0.0, 500.0 + d, 500.0 + d] for d in (-40, 0, 40, 0, 0)]
    arrive = [[-1000.0, -1000.0, -500.0, -500.0] for _ in depart]
    offsets, errors = align(arrive, depart, clocks=["A", "A", "B", "B"])
    assert offsets == pytest.approx([0.0, 0.0, 500.0, 500.0])
    assert errors[0] == errors[1] == 0.0 and errors[2] == errors[3] > 0.0


def test_one_rank_or_no_collectives_gives_no_section() -> None:
    assert analyze([_arrivals(_rank_trace(0), 0)]) is None
    plain = [Event("ProfilerStep#1", "user_annotation", "X", 1, MAIN, 0.0, 10.0)]
    assert rank_arrivals(columns_from_events(plain), 0) is None


def test_last_no_more_often_than_chance_is_no_finding() -> None:
    # rank 1 is 30 ms late at 4 of 6 collectives: as likely as 11 in 32 by chance with 2 ranks
    late4 = analyze(
        [_arrivals(_rank_trace(0), 0), _arrivals(_rank_trace(30_000, late_steps=4), 1)], 90.0
    )
    assert late4 is not None and late4["ranks"][1]["times_last"] >= 4
    assert late4["culprit"] is None
    assert late4["no_culprit"]["reason"] == "chance" and late4["no_culprit"]["rank"] == 1
    assert late4["no_culprit"]["words"].startswith(
        "rank 1 arrives last at 4 of 6 collectives, which ranks doing"
    )
    late3 = analyze(
        [_arrivals(_rank_trace(0), 0), _arrivals(_rank_trace(30_000, late_steps=3), 1)], 90.0
    )
    assert late3 is not None and late3["no_culprit"]["reason"] == "not_last_often"
    assert late3["no_culprit"]["words"].startswith(
        "no rank arrives last at 60% of its collectives or more: the latest"
    )
    assert chance_of_last(4, 6, 2) == pytest.approx(22 / 64)
    assert chance_of_last(6, 6, 2) == pytest.approx(1 / 64) and chance_of_last(0, 6, 2) == 1.0


def test_a_gc_pause_in_a_step_is_other_time_not_forward() -> None:
    from stepcli.traces.analyses.mergeparts import summarize
    from stepcli.traces.read.tracereader import Trace

    events = [
        Event("ProfilerStep#1", "user_annotation", "X", 1, MAIN, 1000.0, 100.0),
        Event("aten::mm", "cpu_op", "X", 1, MAIN, 1001.0, 10.0),
        Event("python gc (gen 2)", "user_annotation", "X", 1, MAIN, 1020.0, 50.0),
    ]
    breakdown = summarize([Trace.from_events(events)]).to_dict()["breakdown_ms"]
    assert breakdown["forward"] == pytest.approx(0.01) and breakdown["other"] == pytest.approx(0.09)


def test_collectives_called_from_another_thread_are_found() -> None:
    # DDP on CUDA: the backward pass and its all-reduces run on the autograd engine's thread, not
    # the steps' thread
    autograd = 30

    def moved(events: list[Event]) -> list[Event]:
        return [
            Event(e.name, e.cat, e.ph, e.pid, autograd, e.ts, e.dur)
            if e.name.startswith(("c10d", "aten"))
            else e
            for e in events
        ]

    section = analyze(
        [_arrivals(moved(_rank_trace(0)), 0), _arrivals(moved(_rank_trace(30_000)), 1)], 90.0
    )
    assert section is not None and section["collectives"] == STEPS
    assert section["culprit"]["rank"] == 1 and section["culprit"]["cause"] == "no_operator"


def test_nccl_kernels_are_the_departures_and_nested_host_events_one_collective() -> None:
    # NCCL: c10d::allreduce_ wraps record_param_comms on the host; the collective ends with its
    # kernel on the device
    events: list[Event] = []
    for step in range(STEPS):
        t0 = step * 100_000.0
        events.append(Event(f"ProfilerStep#{step}", "user_annotation", "X", 1, MAIN, t0, 90_000.0))
        events.append(Event("c10d::allreduce_", "cpu_op", "X", 1, MAIN, t0 + 1_000, 40.0))
        events.append(Event("record_param_comms", "cpu_op", "X", 1, MAIN, t0 + 1_005, 30.0))
        events.append(
            Event(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", "X", 0, 7, t0 + 1_100, 2_000.0
            )
        )
    events.sort(key=lambda e: e.ts)
    arrivals = _arrivals(events, 0)
    assert [k[1] for k in arrivals.keys] == ["c10d::allreduce_"] * STEPS
    assert arrivals.depart_us[0] == pytest.approx(3_100.0)


def _with_cpu_time(arrivals: RankArrivals, ran_ms: float, waited_ms: float) -> RankArrivals:
    """The rank's steps' thread ran `ran_ms` on a CPU and waited `waited_ms` for one in each
    step."""
    arrivals.cpu_time = {step: (ran_ms, waited_ms) for step in range(STEPS)}
    return arrivals


def test_waiting_for_a_cpu_is_the_cause_only_beyond_what_its_work_explains() -> None:
    # GIVEN rank 1 arrives 10 ms late at every collective after 10 ms more of operators (as the
    # trace shows them)
    def ranks(waited_0: float, ran_1: float, waited_1: float) -> list[RankArrivals]:
        return [
            _with_cpu_time(_steady(0, 0.0, 4_000.0), 4.0, waited_0),
            _with_cpu_time(_steady(1, 10_000.0, 14_000.0), ran_1, waited_1),
        ]

    # WHEN its thread ran as long as rank 0's but waited 9 ms more for a CPU (starved: the operators
    # were stretched)
    section = analyze(ranks(1.0, 4.0, 10.0), 30.0)
    # THEN the cause is waiting for a CPU: 10 - 4 x (1 / 4) = 9 ms/step that its own work does not
    # explain
    assert section is not None
    found = section["culprit"]
    assert found["rank"] == 1 and found["cause"] == "cpu_wait"
    assert (
        found["cause_ms_per_step"] == pytest.approx(9.0)
        and found["causes_ms_per_step"]["cpu_wait"] == 9.0
    )
    assert "time waiting for a CPU (more busy threads than cores), 9.0 ms/step" in found["evidence"]
    # BUT WHEN every rank waits in proportion to its work (a machine evenly short of cores) and rank
    # 1 ran 10 ms more
    section = analyze(ranks(4.0, 14.0, 14.0), 30.0)
    # THEN its own work is the cause: its wait is what any rank's would be for that much work
    assert section is not None and section["culprit"]["cause"] == "cpu_operators"
    assert section["culprit"]["causes_ms_per_step"]["cpu_wait"] == pytest.approx(0.0)
    # AND WHEN it ran 10 ms more and waited far more than that work explains (a busy thread waits
    # more per ms than one that sleeps in collectives) THEN its work is still the cause: the wait
    # only stretched it
    section = analyze(ranks(1.0, 14.0, 30.0), 30.0)
    assert section is not None and section["culprit"]["cause"] == "cpu_operators"
    assert section["culprit"]["causes_ms_per_step"]["cpu_wait"] == pytest.approx(30.0 - 14.0 / 4.0)
    # AND a wait under half the lateness is not the cause either
    section = analyze(ranks(0.0, 4.0, 4.0), 30.0)
    assert section is not None and section["culprit"]["cause"] == "cpu_operators"
    assert section["culprit"]["causes_ms_per_step"]["cpu_wait"] == pytest.approx(4.0)
    # AND without CPU times in every trace (not recorded by stepcli), there is no such cause
    section = analyze(
        [_steady(0, 0.0, 4_000.0), _with_cpu_time(_steady(1, 10_000.0, 14_000.0), 4.0, 10.0)], 30.0
    )
    assert section is not None and section["culprit"]["cause"] == "cpu_operators"
    assert section["culprit"]["causes_ms_per_step"]["cpu_wait"] is None


def test_last_at_3_of_3_by_a_lead_far_beyond_its_spread_is_a_finding() -> None:
    # GIVEN 2 ranks, 3 collectives (the default window), rank 1 last at each by ~59 ms with ~11 ms
    # of jitter: the sign alone (1 in 8 at random) cannot name it each step: work (5 ms + extra),
    # all-reduce until 80 ms after the step's first arrival
    period = 85_200.0

    def trace(extra_ms: list[float]) -> list[Event]:
        events: list[Event] = []
        for step, extra in enumerate(extra_ms):
            t0 = step * period
            events.append(
                Event(f"ProfilerStep#{step}", "user_annotation", "X", 1, MAIN, t0, period - 100)
            )
            events.append(
                Event("aten::mm", "cpu_op", "X", 1, MAIN, t0 + 100, 5_000.0 + extra * 1000)
            )
            arrive = t0 + 5_200 + extra * 1000
            done = t0 + 5_200 + 80_000
            events.append(Event("c10d::allreduce_", "cpu_op", "X", 1, MAIN, arrive, 50.0))
            events.append(
                Event(
                    "gloo:all_reduce",
                    "user_annotation",
                    "X",
                    1,
                    WORKER,
                    arrive + 60,
                    done - arrive - 60,
                )
            )
        return events

    section = analyze(
        [_arrivals(trace([0.0, 0.4, 0.1]), 0), _arrivals(trace([59.0, 48.0, 70.0]), 1)], 85.0
    )
    assert section is not None and section["ranks"][1]["times_last"] == 3
    assert chance_of_last(3, 3, 2) == pytest.approx(1 / 8)
    # THEN named, for its extra CPU operators, by the size of its lead against rank 0's own noise
    found = section["culprit"]
    assert found and found["rank"] == 1 and found["cause"] == "cpu_operators", section
    assert section["thresholds"]["lead_t_chance"] < 0.025
    # AND a balanced pair (leads of both signs, a few ms) names nobody
    balanced = analyze(
        [_arrivals(trace([0.0, 3.0, 0.0]), 0), _arrivals(trace([2.0, 0.0, 4.0]), 1)], 30.0
    )
    assert balanced is not None and balanced["culprit"] is None
    # AND a rank last 3 times by leads (3, 2.5, 0.5 ms) within their own spread and rank 0's own
    # noise (its work varies by ~2 ms) names nobody, though every other floor is passed (lateness 2
    # ms/step >= 5% of a 30 ms step)
    noisy = analyze(
        [_arrivals(trace([0.0, 4.0, 1.0]), 0), _arrivals(trace([3.0, 6.5, 1.5]), 1)], 30.0
    )
    assert noisy is not None and noisy["ranks"][1]["times_last"] == 3
    assert noisy["thresholds"]["lead_t_chance"] > 0.05 and noisy["culprit"] is None, noisy[
        "thresholds"
    ]


def test_student_t_tail_matches_the_tables() -> None:
    from stepcli.traces.analyses.significance import lead_t_chance, student_t_sf

    # one-sided 5% critical values of Student's t for 1..5 and 10 degrees of freedom
    for df, t in ((1, 6.314), (2, 2.920), (3, 2.353), (4, 2.132), (5, 2.015), (10, 1.812)):
        assert student_t_sf(t, df) == pytest.approx(0.05, abs=2e-4)
    assert student_t_sf(0.0, 3) == pytest.approx(0.5) and student_t_sf(-2.92, 2) == pytest.approx(
        0.95, abs=2e-4
    )
    # the mean lead against the others' gaps' noise: 20 ms late where the others' gaps vary by ~1 ms
    # is a finding
    assert lead_t_chance([36.0, 17.0, 18.0], [5.0, 6.0, 5.5]) < 0.01
    # ... and against its own spread: 14 +- 2 ms, though the others' gaps vary by 10 ms
    assert lead_t_chance([13.6, 14.4, 16.9], [5.0, 25.0, 8.0]) < 0.01
    # a lead within both noises is not
    assert lead_t_chance([3.0, 2.5, 0.5], [5.0, 9.0, 6.0]) > 0.05
    assert lead_t_chance([1.0], [1.0]) == 1.0 and lead_t_chance([-5.0, -6.0], [1.0, 2.0]) == 1.0
    assert lead_t_chance([2.0, 2.0], [3.0, 3.0]) == 0.0


def test_the_others_median_gap_equals_the_median_over_the_others() -> None:
    # GIVEN collectives of 1-12 members with tied, zero and random gaps (and one with a NaN gap)
    import math
    import random

    from stepcli.stats import median
    from stepcli.traces.analyses.culprit import _OthersGap

    rng = random.Random(7)
    cases = [
        [
            {"cpu": rng.choice([0.0, 1.5, 2.0, rng.random() * 100]), "gc": rng.random()}
            for _ in range(n)
        ]
        for n in [rng.randint(1, 12) for _ in range(500)]
    ]
    cases.append([{"cpu": 1.0}, {"cpu": math.nan}, {"cpu": 3.0}])
    for gaps in cases:
        others = _OthersGap(gaps)
        for k in range(len(gaps)):
            # WHEN each member's others' median is asked THEN it is the median of the others' summed
            # gaps, exactly
            expected = median([sum(g.values()) for i, g in enumerate(gaps) if i != k])
            got = others(k)
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (gaps, k)
