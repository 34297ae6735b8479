"""The server side as the engine and replay call it: eighteen calls, each event's hooks of
the server kind (its contract: ``fedlm.servers.kind.ServerKind``) in their one order,
written once.

    setup        links(fleet), start(params, fleet) -> (down, up), versions_wanted(updates),
                 versions_per_update(), drains_messages()
    the model    evaluated() -> (version, params)
    a job        offered(workers, v) -> drew, wants_job(w, v), job_steps(w, v, allow) ->
                 steps or None,
                 dispatch(job, events, index) -> Sent, reference(job)
    an event     finished(job, grad, tokens, steps, record) -> Update, lost(w, job_id,
                 reason), arrived(key) -> staleness, rang(key): a wake-up the kind asked for
    checkpoints  state_dict(), load_state_dict(state, checkpoint), resend(flight, base_params)

Every event may make a new version of the evaluated model, queue messages between
servers and ask for wake-ups: each ends the same way, the version first (``on_version``:
the engine logs, evaluates and checkpoints, replay keeps it), then the messages
(``on_messages``: the engine times them, replay ignores them, their arrivals are in its
log), then the wake-ups (``on_alarms``: the engine sets them on its clock, replay ignores
them, when each rang is in its log). ``ServerCalls``
also numbers the updates it hands on (``seq``), and knows which are not yet in a
version (``held``): the run log's view, not a kind's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fedlm.job import JobSpec
from fedlm.servers.kind import Alarm, Message, Sent, ServerKind
from fedlm.servers.watch import HookWatch, Watched
from fedlm.strategies.base import DROPPED, Update
from fedlm.strategies.rounds import Rounds, Synchronous
from fedlm.strategies.traits import traits


@dataclass(frozen=True)
class Version:
    """A new version of the evaluated model, and what made it."""

    number: int
    params: Any
    seqs: list[int]  # the updates in it (numbered by ``ServerCalls``)
    # "update" | "lost" (e.g. a sync round closed with what it had) | "message" | "timer"
    cause: str


class ServerCalls:
    """A server kind, driven the one way the engine and replay both drive it."""

    def __init__(self, server: ServerKind, *, on_version: Callable[[Version], None],
                 on_messages: Callable[[list[Message]], None] = lambda messages: None,
                 on_alarms: Callable[[list[Alarm]], None] = lambda alarms: None,
                 watch: HookWatch | None = None) -> None:
        # every call into the kind (and so its strategy) bounded in wall-clock time
        self._server = Watched(server, watch) if watch is not None and watch.limit > 0 else server
        self._on_version = on_version
        self._on_messages = on_messages
        self._on_alarms = on_alarms
        self._seq = 0  # updates handed to the strategy so far
        self._held: list[int] = []  # their seqs not yet in a version

    # -- setup -------------------------------------------------------------------------
    def links(self, fleet: list) -> list:
        """The profiles a worker's jobs are timed over (its link to its server)."""
        return self._server.worker_links(fleet)

    def start(self, params, fleet: list) -> tuple[int, int, list[int]]:
        """Start from ``params``; returns the bytes a whole-model job moves (down, up),
        and each worker's upload (up, or its link's own encoding's)."""
        s = self._server
        s.start(params, fleet)
        self._messages()  # what the kind asks for at its start (a first wake-up, say)
        return s.model_bytes, s.up_bytes, [s.uploads.get(w, s.up_bytes) for w in range(len(fleet))]

    def versions_wanted(self, updates: int) -> int:
        return self._server.versions_wanted(updates)

    def drains_messages(self) -> bool:
        """Whether the run waits for messages in flight before it ends."""
        return self._server.serves.drains_messages

    def versions_per_update(self) -> int:
        """Versions one of the run's ``updates`` (and ``eval.every``) counts: what one
        more update adds (streamed: P rounds an update, and P - 1 more end the run)."""
        return self._server.versions_wanted(2) - self._server.versions_wanted(1)

    def evaluated(self) -> tuple[int, Any]:
        """The evaluated (and hashed) model's version and params."""
        return self._server.version, self._server.params

    # -- what the engine may know of the kind's strategy and job sizes -----------------
    @property
    def policy(self):
        """The kind's local-steps policy (``fedlm.strategies.local_steps``): the engine
        starts it, tells it what each job took, offers it a round's workers."""
        return self._server.policy

    @property
    def synchronous(self) -> bool:
        """Whether the strategy runs rounds with a barrier."""
        return traits(self._server.strategy).synchronous

    @property
    def wants_grace(self) -> bool:
        """Whether jobs that finish together should be applied together (async)."""
        return traits(self._server.strategy).wants_grace

    @property
    def draws_rounds(self) -> bool:
        """Whether the strategy draws each round's workers from those offered."""
        rounds = self._rounds()
        return rounds is not None and rounds.draws

    @property
    def awaits_draw(self) -> bool:
        """Whether its next round is still to be drawn (every free worker is offered)."""
        rounds = self._rounds()
        return rounds is not None and rounds.awaits_draw

    def _rounds(self) -> Rounds | None:
        """The strategy's synchronous rounds (``Synchronous``), whose draws these are."""
        strategy = self._server.strategy
        return strategy.rounds if isinstance(strategy, Synchronous) else None

    @property
    def strategy_name(self) -> str:
        return self._server.strategy.name

    @property
    def outer_lr(self):
        """The strategy's outer learning rate, where it has one (for a divergence hint)."""
        return getattr(self._server.strategy, "lr", None)

    # -- a job -------------------------------------------------------------------------
    def wants_job(self, worker: int, version: int) -> bool:
        return self._server.wants_job(worker, version)

    def offered(self, workers: list[int], version: int) -> list[int] | None:
        """Free, present ``workers`` before they are asked for jobs: the workers a round
        was drawn from, or None (the engine logs them; replay offers exactly them)."""
        rounds = self._rounds()
        return rounds.draw(workers) if rounds is not None else None

    def job_steps(self, worker: int, version: int,
                  allow: Callable[[int], int] = lambda steps: steps) -> int | None:
        """Inner steps of ``worker``'s next job, within ``allow`` (the engine's step
        budget); None: no job (0 steps, unless the kind sends a job of none)."""
        return self._server.next_job(worker, version, allow)

    def dispatch(self, job: JobSpec, events=None, index: int = 0) -> Sent:
        """``job`` starts now: what it is sent, timed on ``events`` (None: not timed)."""
        sent = self._server.dispatch(job, events, index)
        self._messages()
        return sent

    def reference(self, job: JobSpec):
        """Tensors shaped as ``job``'s outer gradient must be."""
        return self._server.reference(job)

    # -- events ------------------------------------------------------------------------
    def finished(self, job: JobSpec, grad, tokens: int, steps: int,
                 record: Callable[[Update, int], None] = lambda update, seq: None) -> Update:
        """``job``'s reply was accepted: its update, numbered (``record`` sees it before
        the strategy takes it), goes to the strategy."""
        s = self._server
        update = Update(worker=job.worker, job_id=job.job_id, base_version=job.base_version,
                        outer_grad=grad, tokens=tokens, local_steps=steps,
                        staleness=s.accept(job))
        seq = self._seq
        record(update, seq)
        self._held.append(seq)
        self._seq += 1
        taken = s.take(update)
        if taken is DROPPED:  # never to be applied: no version will count it
            self._held.remove(seq)
            taken = None
        self._version(taken, "update")
        self._messages()
        return update

    def lost(self, worker: int, job_id: int, reason: str) -> None:
        """A job of ``worker`` is lost (``Strategy.on_job_lost``'s reasons)."""
        self._version(self._server.lose(worker, job_id=job_id, reason=reason), "lost")
        self._messages()

    def arrived(self, key: int) -> int:
        """Message ``key`` arrived; returns its staleness (the kind's measure)."""
        params, staleness = self._server.deliver(key)
        self._version(params, "message")
        self._messages()
        return staleness

    def rang(self, key: int) -> None:
        """Wake-up ``key`` the kind asked for is due (``ServerKind.wake_in``)."""
        self._version(self._server.on_timer(key), "timer")
        self._messages()

    def _version(self, params, cause: str) -> None:
        if params is None:
            return
        self._server.new_version(params)
        seqs, self._held = self._held, []
        self._on_version(Version(self._server.version, params, seqs, cause))

    def _messages(self) -> None:
        """What the event asked for beyond a version: its messages, then its wake-ups."""
        messages = self._server.take_messages()
        if messages:
            self._on_messages(messages)
        alarms = self._server.take_alarms()
        if alarms:
            self._on_alarms(alarms)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**self._server.state_dict(), "seq": self._seq, "held": list(self._held)}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        """``state`` from ``state_dict`` (``checkpoint``: the engine's whole one, where
        older versions of fedlm kept parts of it)."""
        self._server.load_state_dict(state, checkpoint)
        self._seq = state["seq"]
        self._held = list(state["held"])

    def resend(self, flight, base_params: dict):
        """What a job in flight at a checkpoint carried (resume sends it again)."""
        if flight.start is not None:
            return flight.start
        start = base_params[flight.job.base_version]
        return self._server.send(flight.job, start).payload
