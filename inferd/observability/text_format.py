"""Metric families written in the Prometheus text format 0.0.4 the way Triton writes them.

prometheus_client names every counter ``<name>_total`` (OpenMetrics requires it);
Triton's counters carry no suffix, so the families that must read exactly as
Triton's (``nv_inference_*``, ``nv_energy_consumption``) are written here instead.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client.utils import floatToGoString


def family(lines: list[str], name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> None:
    """Append one family: its HELP and TYPE lines, then ``name{labels} value`` per sample
    (``labels``: the already escaped ``key="value",...`` text)."""
    lines.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
    lines.extend(f"{name}{{{labels}}} {number(value)}\n" for labels, value in samples)


def number(value: float) -> str:
    return str(value) if isinstance(value, int) else floatToGoString(value)  # Triton writes 12, not 12.0


def escape(value: str) -> str:
    """A label value, escaped as the text format requires."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
