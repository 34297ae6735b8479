"""The contract of a kind of server: the fifteen hooks ``ServerCalls``
(``fedlm.servers.calls``) calls, in a fixed order, for the engine and replay alike
(``ServerKind``), and the records they pass (``Sent``, ``Message``, ``Alarm``) and a
kind declares (``Serves``). The engine and replay call only ``ServerCalls``.

    setup        worker_links(fleet), start(params, fleet), versions_wanted(updates)
    a job        wants_job(w, v), next_job(w, v, allow) -> steps or None,
                 dispatch(job, events, index) -> Sent, send(job, start) -> Sent (a job
                 in flight sent again, on resume), reference(job)
    an event     accept(job) -> staleness, take(update), lose(w, job_id, reason),
                 deliver(key) (a message it queued arrived), on_timer(key) (a wake-up
                 it asked for is due): each returns new evaluated params, or None
    checkpoints  state_dict(), load_state_dict(state, checkpoint)

Beside the hooks, every kind has: what it serves (``serves``, data) and its config rules
(the classmethod ``check``); its settings (``Settings``, ``self.settings``:
``fedlm.servers.settings``); the evaluated model (``params``, ``version``, changed by
``new_version``) and the bytes a whole-model job moves (``model_bytes``, ``up_bytes``,
set by ``start``); and a kind's services to itself: ``queue`` a message to another
server, ``wake_in`` some seconds. ``fedlm.servers.protocol.Server`` is the one-server
kind, which answers the hooks with finer steps of its own that other kinds override.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from fedlm.config import Config
from fedlm.job import JobSpec
from fedlm.servers.settings import NoSettings, settings_of
from fedlm.strategies.base import Strategy, Update


@dataclass(frozen=True)
class Sent:
    """A job as the server sends it."""

    job: JobSpec  # with any fields the server sets on it
    payload: Any  # the tensors sent
    down: int  # bytes sent down
    up: int  # bytes of its reply
    timing: Any = None  # its durations on the event clock (None: not timed, or wall clock)
    keep: Any = None  # the start the job keeps (resume sends it again); None: a global version


@dataclass(frozen=True)
class Message:
    """A message between servers, which the engine times and hands back on arrival.

    A server is named by the index of its region in the fleet (``fedlm.sim.fleet.by_region``),
    or None: the fleet's server, where the star topology's sits. A message travels
    up its source's link to that server and down its destination's, so two region
    servers' messages (gossip) cross both links."""

    key: int  # the sender's number for it, handed back on arrival
    source: int | None
    destination: int | None
    nbytes: int  # what travels
    kind: str = ""  # a label for the run log ("push", "model", ...); no one branches on it
    # its transit in seconds where the sender timed it itself (a worker's upload over the
    # worker's own link); None: the engine times it over the regions' links
    seconds: float | None = None


@dataclass(frozen=True)
class Alarm:
    """A wake-up a kind asked of the run's clock (``ServerKind.wake_in``): ``key`` comes back
    to its ``on_timer`` ``seconds`` later, in the run and, as an operation of the run
    log, in its replay and resume (in the spirit of SimPy's timeouts)."""

    key: int
    seconds: float


class JobClock(Protocol):
    """What a server kind's ``timing`` may ask of the engine's event source (virtual:
    ``fedlm.engine.events.VirtualEvents``; wall: ``WallEvents``, which answers None)."""

    @property
    def now(self) -> float:
        """Seconds on the run's clock now (the job's dispatch)."""

    def timing(self, w: int, steps: int, index: int = 0, up_bytes: int | None = None) -> Any:
        """A whole job of ``steps`` steps on worker ``w`` (its ``index``-th), timed;
        ``up_bytes``: its upload's, if not the run's (``network.slow_compression``)."""

    def overlapped_timing(self, w: int, steps: int, down_bytes: int, up_bytes: int,
                          overlap: int) -> Any:
        """A job that waits for the previous round's exchange, overlapped by its first
        ``overlap`` steps."""


@dataclass(frozen=True)
class Serves:
    """What a kind of server can serve, declared as data in one place (``ServerKind.serves``):
    the config check, the engine and checkpoints read it; a kind's other rules are its
    ``check``. (Whether it times its own jobs is not declared: it overrides ``timing``.)"""

    # a synchronous strategy's rounds (region servers and a pipeline step on every
    # arrival: asynchronous strategies only; the config check refuses the others)
    synchronous: bool = True
    # a shared server link in the config's network (else each worker's own link)
    shared_link: bool = True
    # a job in flight keeps the model it started from (resume sends it again); else it
    # started from a global version, which the engine keeps while it is needed
    keeps_job_starts: bool = False
    # the run waits for its messages in flight before it ends (a kind whose messages
    # carry workers' updates); else it ends once no job is in flight
    drains_messages: bool = False
    # it closes a synchronous strategy's rounds itself (a deadline, a period: it calls
    # ``Rounds.cut``): a reply may then come after its round closed, and is late
    cuts_rounds: bool = False


# what ``Serves`` replaced: class attributes a kind of an older fedlm declared
OLD_CAPABILITIES = ("keeps_job_starts", "shared_link", "serves_synchronous", "drains_messages")


class ServerKind(ABC):
    """What every kind of server implements and has (the module's docstring)."""

    serves = Serves()
    # its own settings ([server]'s keys beside kind): a frozen dataclass, read as
    # ``self.settings`` (``fedlm.servers.settings``); NoSettings: none
    Settings: type = NoSettings

    @classmethod
    def check(cls, cfg: Config, strategy: type[Strategy]) -> None:
        """Refuse a config this kind cannot serve, before any run is stored: raise
        ValueError with one line (the config check says it as ``server: ...``)."""

    def __init__(self, cfg: Config, strategy: Strategy) -> None:
        from fedlm.strategies.registry import build_local_steps

        self.cfg, self.strategy = cfg, strategy
        self.settings = settings_of(cfg, type(self))
        # how many inner steps each job gets (``local_steps``): the kind's, which sizes
        # its own jobs; the engine reaches it only through ``ServerCalls``
        self.policy = build_local_steps(cfg.local_steps)
        self.params: Any = None  # the evaluated (and hashed) model
        self.version = 0
        self.model_bytes = self.up_bytes = 0  # a whole-model job's bytes (set by start)
        self.uploads: dict[int, int] = {}  # worker -> its whole job's upload, where not up_bytes
        self.outbox: list[Message] = []  # messages queued since the engine last took them
        self.alarms: list[Alarm] = []  # wake-ups asked since the engine last took them
        self.next_key = 0  # the key the next message or wake-up gets

    # -- the hooks: setup ------------------------------------------------------------------
    def worker_links(self, fleet: list) -> list:
        """The profiles a worker's jobs are timed over: its link to its server."""
        return fleet

    @abstractmethod
    def start(self, params, fleet: list) -> None:
        """Start from ``params`` (set ``params``, ``model_bytes``, ``up_bytes``)."""

    def versions_wanted(self, updates: int) -> int:
        """Versions of the evaluated model the run's ``updates`` stand for."""
        return updates

    # -- the hooks: a job -----------------------------------------------------------------
    @abstractmethod
    def wants_job(self, worker: int, version: int) -> bool:
        """Whether free ``worker`` gets a job now (the evaluated model at ``version``)."""

    @abstractmethod
    def next_job(self, worker: int, version: int,
                 allow: Callable[[int], int]) -> int | None:
        """Inner steps of ``worker``'s next job, within ``allow`` (the engine's step
        budget); None: no job."""

    @abstractmethod
    def dispatch(self, job: JobSpec, events: JobClock | None, index: int) -> Sent:
        """``job`` starts now: what it is sent, timed on ``events`` (None: not timed),
        and the start it keeps (``Sent.keep``)."""

    @abstractmethod
    def send(self, job: JobSpec, start) -> Sent:
        """``job`` from ``start``: what it carries (a resume sends a job again with it)."""

    @abstractmethod
    def reference(self, job: JobSpec):
        """Tensors shaped as ``job``'s outer gradient must be."""

    # -- the hooks: events ----------------------------------------------------------------
    @abstractmethod
    def accept(self, job: JobSpec) -> int:
        """``job``'s reply passed the checks: its update's staleness."""

    @abstractmethod
    def take(self, update: Update):
        """Take ``update``: new evaluated params, or None."""

    @abstractmethod
    def lose(self, worker: int, *, job_id: int, reason: str):
        """A job of ``worker`` is lost (``Strategy.on_job_lost``'s reasons)."""

    def deliver(self, key: int) -> tuple[Any | None, int]:
        """Message ``key`` arrived: (new evaluated params or None, its staleness)."""
        raise KeyError(f"no message {key}: {type(self).__name__} sends none")

    def on_timer(self, key: int):
        """Wake-up ``key`` is due: new evaluated params, or None."""
        raise KeyError(f"no wake-up {key}: {type(self).__name__} asks for none")

    # -- the hooks: checkpoints -----------------------------------------------------------
    @abstractmethod
    def state_dict(self) -> dict:
        """Everything a resume needs, with the queued messages and ``next_key``."""

    @abstractmethod
    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        """``state`` from ``state_dict``; ``checkpoint``: the engine's whole checkpoint,
        for parts that older versions of fedlm kept beside the model."""

    # -- what a kind has, and its services to itself ----------------------------------------
    def new_version(self, params) -> None:
        """``params`` become the next version of the evaluated model."""
        self.params = params
        self.version += 1

    def describe(self) -> str:
        """What a run of this kind is, in a few words ("" for one server)."""
        return ""

    def queue(self, source: int | None, destination: int | None, nbytes: int, kind: str,
              seconds: float | None = None) -> int:
        """Queue a message (``Message``'s fields); its key, which ``deliver`` gets back."""
        key, self.next_key = self.next_key, self.next_key + 1
        self.outbox.append(Message(key, source, destination, nbytes, kind, seconds))
        return key

    def take_messages(self) -> list[Message]:
        """Messages queued since the last call; each comes back through ``deliver``."""
        out, self.outbox = self.outbox, []
        return out

    def wake_in(self, seconds: float) -> int:
        """Ask the run's clock for a wake-up ``seconds`` from now: its key, which
        ``on_timer`` gets back then (a deadline, a round of a fixed period)."""
        if not seconds >= 0:
            raise ValueError(f"a wake-up is due in seconds >= 0, not {seconds!r}")
        key, self.next_key = self.next_key, self.next_key + 1
        self.alarms.append(Alarm(key, float(seconds)))
        return key

    def take_alarms(self) -> list[Alarm]:
        """Wake-ups asked since the last call; each comes back through ``on_timer``."""
        out, self.alarms = self.alarms, []
        return out
