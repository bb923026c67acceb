"""The ``inferd perf`` program: parsed arguments -> options -> :func:`~.runner.measure` -> report.

The parser (``options``) knows nothing of running; the runner knows nothing of the terminal
table or the files; this module is the only one that calls all three.
"""

from __future__ import annotations

import argparse
import os
import sys

from .options import HTTP_REQUIREMENT, PLOT_REQUIREMENT, PerfError, PerfOptions


def check_requirements(options: PerfOptions) -> None:
    """The optional packages the options need, checked before any load is sent."""
    if options.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            # The requirement itself: 'inferd[perf]' would fetch some other "inferd" from the index
            # (or nothing) where inferd was installed from a checkout.
            raise PerfError(f"--plot needs matplotlib, which is not installed: pip install '{PLOT_REQUIREMENT}' "
                            "(in an inferd checkout: pip install -e '.[perf]')") from None
    if options.protocol == "http":
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            raise PerfError(f"-i http needs aiohttp, which is not installed: pip install '{HTTP_REQUIREMENT}'") \
                from None


def perf_main(options: PerfOptions) -> int:
    from . import report
    from .runner import measure

    result = measure(options)
    report.print_table(result)
    if options.csv:
        report.write_csv(result, options.csv)
    if options.json:
        report.write_json(result, options.json)
    if options.plot:
        report.write_plot(result, options.plot)
    for path in (options.csv, options.json, options.plot):
        if path:
            print(f"wrote {os.fspath(path)}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry point of ``inferd perf``: 0 on success, 1 on an error (one line on stderr), 130 on Ctrl-C."""
    try:
        options = PerfOptions.from_args(args)
        check_requirements(options)
        return perf_main(options)
    except PerfError as exc:
        print(f"inferd perf: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("inferd perf: interrupted", file=sys.stderr)
        return 130
