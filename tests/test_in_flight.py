"""The jobs in flight (fedlm.engine.in_flight): each query the engine's parts ask
answers what a scan of every job in flight would, as jobs come and go."""

import random

from fedlm.engine.in_flight import InFlightJobs
from fedlm.engine.types import InFlight
from fedlm.job import JobSpec


def _flight(job_id, *, version, steps, t, deadline, departs=None):
    return InFlight(JobSpec(job_id, job_id % 7, version, steps, 0), t, None, 0, deadline,
                    departs=departs)


def _scan(jobs: dict, now: float):
    """What the engine computed before, from a plain dict of the jobs in flight."""
    overdue = [j for j, f in jobs.items() if f.deadline <= now]
    gone = [j for j, f in jobs.items() if f.departs is not None and f.departs <= now]
    return (sum(f.job.local_steps for f in jobs.values()),
            {f.job.base_version for f in jobs.values()},
            min(overdue) if overdue else None,
            min([f.deadline for f in jobs.values()], default=None),
            min(gone) if gone else None,
            min([f.departs for f in jobs.values() if f.departs is not None], default=None))


def test_queries_match_a_scan_of_every_job_in_flight():
    rng = random.Random(0)
    jobs, plain, now, next_id = InFlightJobs(), {}, 0.0, 0
    for _ in range(3000):
        if plain and rng.random() < 0.5:
            j = rng.choice(list(plain))
            assert jobs.pop(j) is plain.pop(j)
        else:
            f = _flight(next_id, version=rng.randrange(5), steps=rng.randrange(1, 9),
                        t=float(rng.randrange(4)), deadline=now + rng.uniform(0, 50),
                        departs=now + rng.uniform(0, 80) if rng.random() < 0.3 else None)
            jobs.add(f)
            plain[next_id] = f
            next_id += 1
        now += rng.uniform(0, 1)  # time only goes forward
        steps, bases, overdue, soonest, gone, leaves = _scan(plain, now)
        assert jobs.steps() == steps and jobs.base_versions() == bases
        assert jobs.first_overdue(now) == overdue
        assert jobs.next_deadline() == soonest
        assert jobs.first_departed(now) == gone  # a worker gone away: the same index
        assert jobs.next_departure() == leaves
        assert len(jobs) == len(plain) and jobs.ids() == sorted(plain)
        t, v = rng.randrange(4), rng.randrange(5)
        assert jobs.cohort(float(t), v) == {
            j for j, f in plain.items() if f.t_dispatch == t and f.job.base_version == v}
    assert list(jobs) == list(plain)  # dispatch order


def test_state_dict_is_the_checkpoint_format_and_loads_back():
    jobs = InFlightJobs()
    for j in (5, 2, 9):
        jobs.add(_flight(j, version=1, steps=3, t=0.0, deadline=10.0 + j))
    state = jobs.state_dict()
    assert list(state) == [5, 2, 9] and state[2].job.job_id == 2  # job id -> InFlight
    again = InFlightJobs()
    again.load_state_dict(state)
    assert again.state_dict() == state and again.steps() == 9
    assert again.cohort(0.0, 1) == {2, 5, 9} and again.first_overdue(12.0) == 2
    assert again.next_deadline() == 12.0
