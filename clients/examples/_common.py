"""What the examples share: the server address from the command line, and a check that
exits non-zero when a result is wrong (so a test can run them)."""

from __future__ import annotations

import argparse


def url_from_args(description: str) -> str:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default="127.0.0.1:8001", help="the server's gRPC address (default 127.0.0.1:8001)")
    return parser.parse_args().url


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"unexpected result: {what}")
