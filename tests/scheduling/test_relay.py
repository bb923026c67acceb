"""Relay lets go of the request once closed, so no reference cycle outlives a request."""

from __future__ import annotations

import asyncio

from inferd.scheduling.base import Relay


class _Completion:
    def __init__(self) -> None:
        self.outcome: object = None

    def done(self) -> bool:
        return self.outcome is not None

    def set_result(self, result: object) -> None:
        self.outcome = result

    def set_exception(self, exception: BaseException) -> None:
        self.outcome = exception


def test_a_relay_forgets_its_completion_and_inner_cancel_on_every_end() -> None:
    for end in ("result", "exception", "cancel"):
        completion = _Completion()
        relay = Relay(completion)
        dropped: list[bool] = []
        relay.cancel_inner = lambda: dropped.append(True)
        if end == "result":
            relay.set_result({})
            assert completion.outcome == {}
        elif end == "exception":
            relay.set_exception(asyncio.CancelledError())
            assert isinstance(completion.outcome, asyncio.CancelledError)
        else:
            relay.cancel()
            assert dropped == [True] and completion.outcome is None
        # The caller keeps relay.cancel and the inner scheduler keeps the relay: holding either
        # would be a cycle per request (see Relay's docstring).
        assert relay.completion is None and relay.cancel_inner is None, end
        relay.set_result({"late": 1})  # closed: nothing more happens
        relay.cancel()
        assert dropped in ([], [True])
