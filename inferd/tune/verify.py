"""The verification run: the candidate the halving left against the current configuration, in
fresh pairs of alternating rounds at the target level, before anything is written.

Why fresh pairs: the candidate was chosen because its pairs looked best, and among several
candidates one looks best by luck too; pairs measured after the choice carry no such bias. The
run goes on until the time budget ends (at most ``max_verify_pairs``) and is looked at up to
``verify_looks`` times, evenly, stopping at the first decision; each look's intervals are at the
confidences divided among the planned looks (Bonferroni), so a decision keeps its stated
confidence however early it comes. The rule is :func:`inferd.tune.search.decide`: the candidate
wins when its 98% interval lies above 1, i.e. it wins by more than the spread of the pairs (and
its p99 keeps the budget, or where the current config misses the budget at the target level, is
no worse than it). Nothing else is written.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.tune.search import Driver, Verification
    from inferd.tune.space import Candidate


def verify(driver: "Driver", candidate: "Candidate", level: float, deadline: float, screened: int) -> "Verification":
    """Fresh pairs until ``deadline`` (or ``max_verify_pairs``), with looks; the verdict."""
    from inferd.tune.search import Verification, decide, p99_limit

    s = driver.settings
    planned = min(s.max_verify_pairs, max(1, int((deadline - driver.clock()) / (2 * driver.cost))))
    looks = max(1, min(s.verify_looks, planned // 10))  # a look sees at least 10 new pairs
    at = {math.ceil(planned * (i + 1) / looks) for i in range(looks - 1)}
    keep_conf, win_conf = (1 - (1 - c) / looks for c in (s.confidence, s.win_confidence))

    def verdict() -> tuple[str, str]:
        return decide(driver.estimate(pairs, level, keep_conf), driver.estimate(pairs, level, win_conf), candidate,
                      screened, s, p99_limit(s, driver.base_p99(level)))

    pairs = []
    while len(pairs) < s.max_verify_pairs:
        p = driver.pair(candidate, level, "verify", deadline)
        if p is None:
            break
        pairs.append(p)
        if len(pairs) in at and verdict()[0] != "none":
            break
    return Verification(candidate, level, pairs, driver.estimate(pairs, level, keep_conf), looks, *verdict())
