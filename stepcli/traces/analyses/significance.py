"""How likely a rank's lateness is by chance, for the culprit analysis
(stepcli.traces.analyses.culprit): by its sign (last at so many collectives: chance_of_last), by its
size (a one-sided Student t-test of the mean lead: lead_t_chance, student_t_sf, exact, no scipy),
and the robust spread of its leads (jitter).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stepcli.stats import median


def chance_of_last(times: int, count: int, ranks: float) -> float:
    """How likely a rank is last at `times` or more of `count` collectives when the last one is
    drawn at random among `ranks` (the mean size of its process groups)."""
    p = 1.0 / ranks
    if times <= 0 or p >= 1.0:
        return 1.0

    def term(i: int) -> float:
        log = math.lgamma(count + 1) - math.lgamma(i + 1) - math.lgamma(count - i + 1)
        return math.exp(log + i * math.log(p) + (count - i) * math.log1p(-p))

    return min(1.0, sum(term(i) for i in range(times, count + 1)))


def jitter(values: list[float]) -> float:
    """A robust standard deviation: 1.4826 times the median absolute deviation."""
    middle = median(values)
    return 1.4826 * median([abs(v - middle) for v in values])


def lead_t_chance(leads: Sequence[float], others_gaps: Sequence[float]) -> float:
    """How likely a mean lead this large is when the rank does what the others do: the one-sided
    p-value of a Student t-test of the mean lead over n collectives (n - 1 degrees of freedom),
    against two estimates of the noise, the better of the two taken and doubled (Bonferroni: either
    may decide):

    - the leads' own spread (a consistent lead: 14 +- 2 ms at 3 collectives);
    - the other members' own gaps before arriving, over the collectives, x sqrt(2): under "the same
      work" a lead is the difference of two such gaps, and the noise of the others is untouched by
      the culprit's own uneven lateness (a warm-up collective twice as late: 36, 17, 18 ms).

    1.0 with fewer than 2 collectives or a mean lead not above zero; 0.0 when a noise estimate is
    exactly 0."""
    n = len(leads)
    if n < 2:
        return 1.0
    mean = sum(leads) / n
    if mean <= 0:
        return 1.0

    def sd(values: Sequence[float], factor: float) -> float:
        middle = sum(values) / len(values)
        return math.sqrt(factor * sum((v - middle) ** 2 for v in values) / (len(values) - 1))

    noises = [sd(leads, 1.0)] + ([sd(others_gaps, 2.0)] if len(others_gaps) == n else [])
    best = min(noises)
    if best <= 0:
        return 0.0
    return min(1.0, 2 * student_t_sf(mean / (best / math.sqrt(n)), n - 1))


def student_t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with integer `df` >= 1, exactly (Abramowitz & Stegun 26.7.3-4), no
    scipy."""
    if t < 0:
        return 1.0 - student_t_sf(-t, df)
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    # odd: A = 2/pi (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...)), up to c^(df-3)
    if df % 2:
        series, term = 0.0, 1.0
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        inside = (
            2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)
            if df > 1
            else 2 * theta / math.pi
        )
    else:  # even: A = sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...), up to c^(df-2)
        series, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            series += term
            term *= c2 * (2 * k - 1) / (2 * k)
        inside = math.sin(theta) * series
    return max(0.0, (1.0 - inside) / 2)
