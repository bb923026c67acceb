"""Triton's log settings (the LogSettings RPC), applied to Python logging.

``log_info``, ``log_warning``, ``log_error`` switch those severities on or
off; ``log_verbose_level`` > 0 adds debug messages; ``log_format`` is
``default`` or ``ISO8601`` (timestamps). ``log_file`` is reported but cannot
be changed at run time (a network client must not choose where the server
writes files).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from inferd.errors import InvalidArgument

FORMATS = {
    "default": ("%(asctime)s %(levelname)s %(name)s: %(message)s", None),
    "ISO8601": ("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z"),
}
_BOOLS = ("log_info", "log_warning", "log_error")
KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


class LogSettings:
    def __init__(self, logger: logging.Logger | None = None, *, verbose: int = 0, info: bool = True,
                 warning: bool = True, error: bool = True, format: str = "default", file: str = "") -> None:
        self.logger = logger if logger is not None else logging.getLogger()
        self.values: dict[str, Any] = {
            "log_file": file, "log_info": info, "log_warning": warning, "log_error": error,
            "log_verbose_level": verbose, "log_format": format,
        }

    def get(self) -> dict[str, Any]:
        return dict(self.values)

    def apply(self) -> None:
        """Set the logger's level and its handlers' format from the settings."""
        v = self.values
        if v["log_verbose_level"] > 0:
            level = logging.DEBUG
        elif v["log_info"]:
            level = logging.INFO
        elif v["log_warning"]:
            level = logging.WARNING
        elif v["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 10
        self.logger.setLevel(level)
        fmt, datefmt = FORMATS[v["log_format"]]
        for handler in self.logger.handlers:
            handler.setFormatter(logging.Formatter(fmt, datefmt))

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Validate every change, then apply them all; returns the settings now in force."""
        new = dict(self.values)
        for key, value in changes.items():
            if key in _BOOLS:
                if not isinstance(value, bool):
                    raise InvalidArgument(f"log setting '{key}' must be a bool, got {value!r}")
            elif key == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidArgument(f"log setting '{key}' must be a non-negative integer, got {value!r}")
            elif key == "log_format":
                if value not in FORMATS:
                    raise InvalidArgument(f"log setting 'log_format' must be one of {list(FORMATS)}, got {value!r}")
            elif key == "log_file":
                if value != self.values["log_file"]:
                    raise InvalidArgument("log setting 'log_file' cannot be changed at run time")
            else:
                raise InvalidArgument(f"unknown log setting '{key}'; known: {', '.join(KEYS)}")
            new[key] = value
        self.values = new
        self.apply()
        return self.get()


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "on", "yes"):
        return True
    if value in ("false", "0", "off", "no"):
        return False
    raise ValueError(text)


def add_arguments(parser: Any) -> None:
    """Triton's log options, ``--log-info false`` as Triton spells them (``--log-verbose`` is the CLI's own)."""
    for name, what in (("info", "information messages"), ("warning", "warnings"), ("error", "errors")):
        parser.add_argument(f"--log-{name}", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
                            help=f"log {what} (default true)")
    parser.add_argument("--log-format", choices=list(FORMATS), default="default", help="log line format")
