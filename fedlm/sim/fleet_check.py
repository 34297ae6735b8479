"""What a config's fleet must be, beyond each setting's own range: the FedScale traces
it names (readable, their numbers the fleet's quantities), what a trace sets that other
settings would too, where the workers sit in a measured network, and a fleet that
changes over time (refused where no job could finish, or with what it cannot run with).
``fedlm.config_check.validate`` calls ``check``."""

from __future__ import annotations

from typing import Any

from fedlm.config import Config
from fedlm.errors import ConfigError, shown
from fedlm.sim import dynamics_settings, fleet, quantities as Q


def _require(ok: bool, path: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {why}, got {shown(value)}")


def check(cfg: Config) -> None:
    """Where the workers are and what they go through: FedScale traces, a measured
    network that holds a worker, a fleet that changes over time
    (``fedlm.sim.dynamics_settings``).
    The workers' profiles are built once, after the traces they may read are checked."""
    f = cfg.fleet
    _check_trace_overrides(f)
    windows = None  # an availability trace's longest presence per worker, run seconds
    for key in ("device_trace", "availability_trace"):
        path = getattr(f, key)
        if path:
            from fedlm.sim import traces  # only configs that name a trace read one

            load = (traces.load_device_trace if key == "device_trace"
                    else traces.load_availability_trace)
            try:
                entries = load(path)
            except ConfigError as exc:  # not a FedScale trace: say which setting named it
                raise ConfigError(f"fleet.{key}: {exc}") from None
            if key == "availability_trace":  # its period, in run seconds
                for e in entries:
                    Q.check_derived(f"fleet.availability_trace: client {e.key}",
                                    f"'finish_time' {e.finish_time:g} x fleet.trace_time_scale "
                                    f"{f.trace_time_scale:g}", e.finish_time * f.trace_time_scale,
                                    Q.DURATION)
                windows = dynamics_settings.longest_windows(entries, cfg.workers,
                                                            f.trace_time_scale)
    profiles = fleet.profiles(f, cfg.workers, cfg.inner.batch_size)
    regions = [p.region.name for p in profiles]
    if f.matrix and not f.device_trace and not set(regions) & set(f.matrix["regions"]):
        raise ConfigError(f"fleet.matrix: no worker is in any of its regions "  # it does nothing
                          f"({', '.join(f.matrix['regions'])}); place them with "
                          f"fleet.topology or fleet.regions")
    dynamics_settings.check(f, cfg.workers, regions)
    if not dynamics_settings.enabled(f):
        return
    # a job's compute alone (H steps; one step where the policy may shorten it)
    steps = cfg.inner.steps if cfg.local_steps == "fixed" else 1
    why = dynamics_settings.no_job_fits(f, [steps * p.step_time for p in profiles], windows)
    if why is not None:
        raise ConfigError(why)
    why = None
    if cfg.clock != "virtual" and (f.slowdown or f.stragglers):
        raise ConfigError("fleet.slowdown, fleet.stragglers: the virtual clock only (on the "
                          "wall clock the machines' speeds are their own; absences, "
                          "availability traces, join and leave work there)")
    if cfg.network.hierarchical:
        why = "one worker per node (not network.hierarchical pods)"
    elif cfg.network.server_down or cfg.network.server_up:
        why = "links of their own (not a shared network.server_down/server_up)"
    elif cfg.stream.fragments or cfg.stream.overlap:
        why = "whole-model jobs (not Streaming DiLoCo's fragments)"
    if why is not None:
        raise ConfigError(f"fleet: a fleet that changes over time (slowdown, stragglers, "
                          f"availability, join, leave, availability_trace) runs with {why}")


def _check_trace_overrides(f) -> None:
    """A trace sets what other settings would: both at once is refused, not one ignored."""
    if f.device_trace:  # every worker's speed and link, each its own region
        for key in ("step_times", "regions", "topology", "matrix", "links"):
            _require(not getattr(f, key), f"fleet.{key}", getattr(f, key),
                     "is set by fleet.device_trace (each worker's speed and link), which "
                     "is also set: drop one")
    Q.TIME_SCALE.check("fleet.trace_time_scale", f.trace_time_scale)
    _require(f.availability_trace or f.trace_time_scale == 1.0, "fleet.trace_time_scale",
             f.trace_time_scale, "scales an availability trace's times, and no "
             "fleet.availability_trace is set")
