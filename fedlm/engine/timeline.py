"""The workers' timeline rows (the store's ``intervals``) the engine writes when a job
ends and when the run does: a job's download / compute / upload, free workers' idle
time, offline and slowed spans, the jobs still in flight."""

from __future__ import annotations

from fedlm.engine.types import InFlight


def job_rows(events, f: InFlight, end: float, compute_seconds: float) -> list:
    """Interval rows of a job's download / compute / upload, cut at ``end``."""
    return [(f.job.worker, kind, min(a, end), min(max(a, b), end), f.job.base_version,
             f.job.job_id) for kind, a, b in events.spans(f, end, compute_seconds)]


def closing_rows(end: float, version: int, pool, presence, in_flight, events,
                 workers: int) -> list:
    """At the run's end: free workers were idle until now, offline ones offline, slowed
    spans (a fleet that changes) and the jobs in flight up to now."""
    rows = pool.closing_rows(end, version)
    if presence is not None:  # when each worker ran slowed, for the timeline
        rows += presence.slowed_rows(workers, end, version)
    for f in in_flight.flights():
        rows += job_rows(events, f, end, compute_seconds=0.0)
    return rows
