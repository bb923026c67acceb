"""The verification run: the candidate the halving left against the current configuration, in
fresh pairs of alternating rounds at the target level, before anything is written.

Why fresh pairs: the candidate was chosen because its pairs looked best, and among several
candidates one looks best by luck too; pairs measured after the choice carry no such bias. The
run goes on until the time budget ends (at most ``max_verify_pairs``) and is judged once, at the
end, by :func:`inferd.tune.search.decide`: the candidate wins when its 98% interval lies above 1,
i.e. it wins by more than the spread of the pairs (and its p99 keeps the budget, or where the
current config misses the budget at the target level, is no worse than it). Nothing else is
written. (Looking at it along the way and stopping at the first decision was tried: the looks had
to share the confidence, which widened every interval by a quarter, and the time saved bought
nothing, so fewer runs ended with a decision.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferd.tune.search import Driver, Verification
    from inferd.tune.space import Candidate


def verify(driver: "Driver", candidate: "Candidate", level: float, deadline: float, screened: int) -> "Verification":
    """Fresh pairs until ``deadline`` (or ``max_verify_pairs``), then the verdict."""
    from inferd.tune.search import Verification, decide, p99_limit

    s = driver.settings
    pairs = []
    while len(pairs) < s.max_verify_pairs:
        p = driver.pair(candidate, level, "verify", deadline)
        if p is None:
            break
        pairs.append(p)
    keep, win = (driver.estimate(pairs, level, c) for c in (s.confidence, s.win_confidence))
    return Verification(candidate, level, pairs, keep, win,
                        *decide(keep, win, candidate, screened, s, p99_limit(s, driver.base_p99(level))))
