"""A server kind: what a kind may change, as hooks that ``ServerCalls``
(``fedlm.servers.calls``) calls in a fixed order; the engine and replay call only
``ServerCalls``, never these.

    setup       worker_links(fleet), start(params, fleet) -> start_strategy(params, fleet),
                versions_per_update, versions_wanted(updates), describe()
    a job       wants_job(w, v), job_steps(w, v, policy), sends_empty_job(v),
                start_of(w), send(job, start) -> Sent, timing(sent, events, index),
                dispatched(w, v), reference(job)
    its reply   staleness(w, base_version), accepted(w, job), take(update), lose(w, ...)
    messages    queue(source, destination, nbytes, kind, seconds) -> key, take_messages(),
                deliver(key) -> (params or None, staleness)
    versions    new_version(params)
    state       state_dict(), load_state_dict(state, checkpoint)

``Server`` is also the one-server kind every flat strategy runs on: a job starts
from the global model and reports all of it. Other kinds (``streamed``: a fragment
per round; ``regions``: a server in every region and a global one; plug-ins of
their own by dotted path) override what differs. A kind owns the models it serves
(the evaluated, hashed one and its version; any others, such as each region's)
and composes the strategies that step them; a strategy is only ever called through
the ``Strategy`` base class's methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fedlm.config import Config
from fedlm.job import JobSpec
from fedlm.params import num_bytes
from fedlm.sim import wire_sizes
from fedlm.strategies.base import FleetFacts, Strategy, Update
from fedlm.servers.settings import NoSettings, settings_of


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
    """A wake-up a kind asked of the run's clock (``Server.wake_in``): ``key`` comes back
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

    def timing(self, w: int, steps: int, index: int = 0) -> Any:
        """A whole job of ``steps`` steps on worker ``w`` (its ``index``-th), timed."""

    def overlapped_timing(self, w: int, steps: int, down_bytes: int, up_bytes: int,
                          overlap: int) -> Any:
        """A job that waits for the previous round's exchange, overlapped by its first
        ``overlap`` steps."""


@dataclass(frozen=True)
class Serves:
    """What a kind of server can serve, declared as data in one place (``Server.serves``):
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


# what ``Serves`` replaced: class attributes a kind of an older fedlm declared
OLD_CAPABILITIES = ("keeps_job_starts", "shared_link", "serves_synchronous", "drains_messages")


class Server:
    """One server: every job starts from the global model and reports all of it."""

    serves = Serves()
    # its own settings ([server]'s keys beside kind): a frozen dataclass, read as
    # ``self.settings`` (``fedlm.servers.settings``); one server takes none
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
        self.params: Any = None
        self.version = 0
        self.seen: dict[int, int] = {}  # worker -> base version of its last accepted job
        self.outbox: list[Message] = []  # messages queued since the engine last took them
        self.alarms: list[Alarm] = []  # wake-ups asked since the engine last took them
        self.next_key = 0  # the key the next message or wake-up gets

    # -- setup -----------------------------------------------------------------------
    def worker_links(self, fleet: list) -> list:
        """The profiles a worker's jobs are timed over: its link to this server."""
        return fleet

    def start(self, params, fleet: list) -> None:
        self.params = params
        self.model_bytes = num_bytes(params)  # fp32, as sent down
        self.up_bytes = wire_sizes.encoded_bytes(params, self.cfg.network)
        self.start_strategy(params, fleet)

    def start_strategy(self, params, fleet: list) -> None:
        """The strategy's ``start`` (a kind with more to set up first overrides this)."""
        self.strategy.on_fleet(self.facts(fleet))
        self.strategy.start(params, num_workers=len(fleet))

    def new_strategy(self, outer: dict | None = None) -> Strategy:
        """Another instance of the run's strategy (``outer``: other settings), for a kind
        that composes several (a fragment's, a region's, the global server's)."""
        from fedlm.strategies.registry import build_strategy

        return build_strategy(self.cfg.strategy, self.cfg.outer if outer is None else outer)

    def facts(self, fleet: list) -> FleetFacts:
        """What a strategy of this server may know of the fleet (``Strategy.on_fleet``)."""
        cfg = self.cfg

        def data_sizes() -> list[int] | None:  # the corpus is read only if it is asked for
            from fedlm.shards import shard_sizes

            return shard_sizes(cfg) if cfg.data.shard_choice == "fixed" else None
        return FleetFacts(cfg.seed, tuple(p.step_time for p in fleet), cfg.inner.steps,
                          data_sizes)

    def offered(self, workers: list[int], version: int) -> list[int] | None:
        """Free, present ``workers`` about to be asked for jobs: the strategy may draw its
        round (``Strategy.draws_rounds``); the workers it drew from, or None."""
        return self.strategy.offered(workers, version=version)

    @property
    def versions_per_update(self) -> int:
        """Versions one of the run's ``updates`` (and ``eval.every``) counts."""
        return 1

    def versions_wanted(self, updates: int) -> int:
        return updates * self.versions_per_update

    def describe(self) -> str:
        """What a run of this kind is, in a few words ("" for one server)."""
        return ""

    # -- jobs --------------------------------------------------------------------------
    def wants_job(self, worker: int, version: int) -> bool:
        return self.strategy.wants_job(worker, version=version)

    def job_steps(self, worker: int, version: int) -> int:
        return self.policy.local_steps(worker)

    def sends_empty_job(self, version: int) -> bool:
        return False

    def dispatched(self, worker: int, version: int) -> None:
        self.strategy.on_dispatch(worker, version=version)

    def start_of(self, worker: int):
        """The model a job of ``worker`` starts from now."""
        return self.params

    def send(self, job: JobSpec, start) -> Sent:
        """``job`` from ``start`` (its worker's state came from a job of global version
        ``self.seen.get(job.worker)``; None: a first job)."""
        return Sent(job, start, self.model_bytes, self.up_bytes)

    def timing(self, sent: Sent, events: JobClock, index: int):
        """How long ``sent``'s job takes on the event source (``JobClock``: what a kind
        may ask of it); None on the wall clock, where only the reply says."""
        return events.timing(sent.job.worker, sent.job.local_steps, index)

    def reference(self, job: JobSpec):
        """Tensors shaped as the reply's outer gradient must be."""
        return self.params

    # -- replies -------------------------------------------------------------------------
    def staleness(self, worker: int, base_version: int) -> int:
        return self.version - base_version

    def accepted(self, worker: int, job: JobSpec) -> None:
        self.seen[worker] = job.base_version

    def take(self, update: Update):
        """The strategy takes ``update``: new evaluated params, or None."""
        return self.strategy.on_update(update, self.params)

    def lose(self, worker: int, *, job_id: int, reason: str):
        return self.strategy.on_job_lost(worker, job_id=job_id, reason=reason,
                                         params=self.params)

    # -- messages between servers ----------------------------------------------------------
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

    def deliver(self, key: int) -> tuple[Any | None, int]:
        """Message ``key`` arrived: (new evaluated params or None, its staleness)."""
        raise KeyError(f"no message {key}: {type(self).__name__} sends none")

    # -- timers -----------------------------------------------------------------------
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

    def on_timer(self, key: int):
        """Wake-up ``key`` is due: new evaluated params, or None."""
        raise KeyError(f"no wake-up {key}: {type(self).__name__} asks for none")

    def new_version(self, params) -> None:
        """``params`` become the next version of the evaluated model."""
        self.params = params
        self.version += 1

    # -- state -------------------------------------------------------------------------
    # a kind's own attributes that a checkpoint keeps as they are (dicts, lists, tensors)
    state_fields: tuple[str, ...] = ()

    def state_dict(self) -> dict:
        return {"params": self.params, "version": self.version,
                "strategy": self.strategy.state_dict(), "seen": dict(self.seen),
                "outbox": list(self.outbox), "next_key": self.next_key,
                **{k: getattr(self, k) for k in self.state_fields}}

    def load_state_dict(self, state: dict, checkpoint: dict | None = None) -> None:
        """``state`` from ``state_dict``; ``checkpoint``: the engine's whole checkpoint,
        for parts that older versions of fedlm kept beside the model."""
        self.params, self.version = state["params"], state["version"]
        self.strategy.load_state_dict(state["strategy"])
        seen = state.get("seen", (checkpoint or {}).get("stream", {}).get("seen", {}))
        self.seen = {int(w): int(v) for w, v in seen.items()}
        # a checkpoint of a kind that sends no messages, or of an older fedlm, has none
        self.outbox, self.next_key = list(state.get("outbox", [])), state.get("next_key", 0)
        self.alarms = []  # asked at start again: the engine's checkpoint has those it set
        for k in self.state_fields:
            setattr(self, k, state[k])
