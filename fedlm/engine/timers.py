"""Wake-ups a server kind asked for (``fedlm.servers.ServerKind.wake_in``): set on the event
clock (virtual, or the wall clock) when the kind asks, and logged as an operation when
one rings and the kind has taken it (``ServerCalls.rang``), so that replay rings it at
the same place of the log. A kind that asks for none costs nothing here.
"""

from __future__ import annotations

from fedlm.servers import Alarm

from fedlm.engine.runlog import RunLog


class ServerTimers:
    def __init__(self, events, log: RunLog) -> None:
        self.events = events
        self.log = log
        self.pending: dict[int, dict] = {}  # key -> when it was set and is due

    def set(self, alarms: list[Alarm], now: float) -> None:
        """Set ``alarms`` now, each due its ``seconds`` later."""
        for a in alarms:
            self.pending[a.key] = {"key": a.key, "t_set": now, "t_due": now + a.seconds}
            self.events.wake_at(now + a.seconds, a.key)

    def rang(self, key: int) -> None:
        """Wake-up ``key`` rang and its kind took it."""
        self.log.rang(self.pending.pop(key))

    def state_dict(self) -> dict:
        return {"pending": {k: dict(v) for k, v in self.pending.items()}}

    def load_state_dict(self, st: dict) -> None:
        self.pending = {int(k): dict(v) for k, v in st["pending"].items()}
