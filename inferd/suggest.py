"""Did-you-mean for names a user typed: config fields and enum values, parameter keys,
model names, datatypes (``difflib`` ranks the candidates). Core layer: imports nothing
of inferd, so errors, dtypes and config can all use it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or "" when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
