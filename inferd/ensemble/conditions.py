"""Conditional and routed ensemble steps: their predicates and routes, parsed once at load.

A predicate is one comparison of a value read from an earlier tensor against a
constant::

    max(SCORE) < 0.8        a reduction (max, min, sum, mean, any, all) of the tensor
    LANG == "de"            the tensor's one element (a string constant: a BYTES tensor)
    COUNT >= 3

Over a whole request (``when``) the value is the reduction over every element,
or the tensor's single element; per row (``when_row``, a batching ensemble) the
reduction runs over each row's elements, or each row holds one element. A route
picks a step's model from a key: a tensor's single element or a request
parameter.

Written here rather than with an expression library: the grammar is one
comparison, and the load-time checks (the tensor exists, its type fits the
constant, its shape gives one value) need its parts; a general evaluator
would accept far more than can be checked before a request arrives.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from inferd.errors import ConfigError

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
}
REDUCTIONS = ("max", "min", "sum", "mean", "any", "all")
_PREDICATE = re.compile(
    r"^\s*(?:(?P<fn>[a-z]+)\s*\(\s*(?P<inner>[^()\s]+)\s*\)|(?P<bare>[^()\s<>=!]+))\s*"
    r"(?P<op>==|!=|<=|>=|<|>)\s*(?P<const>.+?)\s*$"
)
PARAMETER = "parameter:"  # route_by: a request parameter, not a tensor


@dataclass(frozen=True, slots=True)
class Predicate:
    """``reduction(tensor) op constant``; ``per_row``: one answer per row of a batch."""

    text: str
    tensor: str
    reduction: str  # "" for the tensor's single element (per row: each row's)
    op: str
    constant: float | str
    per_row: bool

    @property
    def is_string(self) -> bool:
        return isinstance(self.constant, str)

    def holds(self, array: np.ndarray) -> bool:
        """The request-level answer; ``array``: the tensor, one element unless reduced."""
        value = _reduce(self.reduction, array, None) if self.reduction else _single(array)
        return bool(_OPS[self.op](_comparable(value, self.constant), self.constant))

    def rows(self, array: np.ndarray) -> np.ndarray:
        """The per-row answers (a bool per row of ``array``'s first dimension)."""
        flat = array.reshape(array.shape[0], -1)
        values = _reduce(self.reduction, flat, 1) if self.reduction else flat[:, 0]
        if self.is_string:
            values = np.array([_text(v) for v in values], dtype=object)
        return np.asarray(_OPS[self.op](values, self.constant), dtype=bool)


def parse_predicate(text: str, per_row: bool, where: str) -> Predicate:
    """``text`` as a predicate; ConfigError (naming ``where``) with the syntax when it is not one."""
    m = _PREDICATE.match(text)
    syntax = (f"write '<tensor> <op> <constant>' or '<reduction>(<tensor>) <op> <constant>' with op one of "
              f"{' '.join(_OPS)} and reduction one of {', '.join(REDUCTIONS)}, e.g. 'max(SCORE) < 0.8' or "
              "'LANG == \"de\"'")
    if m is None:
        raise ConfigError(f"{where}: predicate '{text}' is not a comparison: {syntax}")
    fn = m.group("fn") or ""
    if fn and fn not in REDUCTIONS:
        raise ConfigError(f"{where}: predicate '{text}': unknown reduction '{fn}'; known: {', '.join(REDUCTIONS)}")
    tensor = m.group("inner") if fn else m.group("bare")
    raw = m.group("const")
    constant: float | str
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        constant = raw[1:-1]
        if fn:
            raise ConfigError(f"{where}: predicate '{text}': {fn}() gives a number; compare it with a number, "
                              f"not the string {raw}")
        if m.group("op") not in ("==", "!="):
            raise ConfigError(f"{where}: predicate '{text}': a string compares only with == or !=, "
                              f"got {m.group('op')}")
    else:
        try:
            constant = float(raw)
        except ValueError:
            raise ConfigError(f"{where}: predicate '{text}': constant {raw} is neither a number nor a quoted "
                              f"string; {syntax}") from None
    return Predicate(text, tensor, fn, m.group("op"), constant, per_row)


@dataclass(frozen=True, slots=True)
class Route:
    """A step's model chosen per request: ``by`` a tensor (or ``parameter:NAME``), ``models``
    by key (``*``: any other key)."""

    by: str
    models: tuple[tuple[str, str], ...]

    @property
    def parameter(self) -> str | None:
        return self.by[len(PARAMETER):] if self.by.startswith(PARAMETER) else None

    def choose(self, key: str) -> str | None:
        table = dict(self.models)
        return table.get(key, table.get("*"))

    def keys(self) -> list[str]:
        return [k for k, _ in self.models]


def parse_route(by: str, text: str, where: str) -> Route:
    """``route``: ``key=model,key=model[,*=model]``."""
    if not by:
        raise ConfigError(f"{where}: 'route' needs 'route_by' (a tensor name, or {PARAMETER}NAME for a request "
                          "parameter)")
    if by.startswith(PARAMETER) and not by[len(PARAMETER):]:
        raise ConfigError(f"{where}: route_by '{by}' names no request parameter")
    models: list[tuple[str, str]] = []
    for part in (p.strip() for p in text.split(",")):
        key, eq, model = (s.strip() for s in part.partition("="))
        if not eq or not key or not model:
            raise ConfigError(f"{where}: route entry '{part}' must be key=model (route: 'de=model_de,*=model_en')")
        if any(key == k for k, _ in models):
            raise ConfigError(f"{where}: route key '{key}' is listed twice")
        models.append((key, model))
    return Route(by, tuple(models))


def route_key(value: Any) -> str:
    """A route key as the table spells it: a string's text, an integer's digits."""
    if isinstance(value, np.ndarray):
        value = _single(value)
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value.item() if isinstance(value, np.generic) else value)


def _single(array: np.ndarray) -> Any:
    if array.size != 1:
        raise ValueError(f"holds {array.size} elements where one was expected")
    return array.reshape(-1)[0]


def _reduce(fn: str, array: np.ndarray, axis: int | None) -> Any:
    if array.dtype == object or array.dtype.kind in "SU":
        raise ValueError(f"{fn}() needs a numeric tensor")
    return getattr(np, fn)(array, axis=axis)


def _text(value: Any) -> Any:
    return bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, np.bytes_)) else value


def _comparable(value: Any, constant: float | str) -> Any:
    return _text(value) if isinstance(constant, str) else value
