"""The largest job a run's local-steps policy will hand out, known before the run starts.

Job sizes are derived quantities: ``fill`` sizes a fast worker's job to the length of the
round's slowest whole job, so a speed ratio of 10^5 between two workers gives the fast
one 10^5 times H steps, and a job's batches are built at once (its token rows, int64, on
its device). Such a job is checked as a typed quantity is: its step count against
``quantities.JOB_STEPS``, its batches against the memory this machine has. The first
round (every worker offered a job at once, nominal speeds and links, fp32 or the
configured built-in encoding on the wire) is where a policy's sizes are largest for a
steady fleet; a fleet that changes only shortens later rounds' jobs or repeats these.
"""

from __future__ import annotations

from fedlm.config import Config
from fedlm.errors import ConfigError
from fedlm.presets import parameter_count
from fedlm.sim import fleet as fleet_lib, quantities as Q, wire_sizes
from fedlm.data import tokenizer

TOKEN_BYTES = 8  # a job's token rows go to its device as int64


def first_jobs(cfg: Config) -> list[int]:
    """Each worker's inner steps in the run's first round, by its policy."""
    from fedlm.strategies import registry  # torch-free at import

    profiles = fleet_lib.node_profiles(cfg)
    params = parameter_count(cfg.model, cfg.data.seq_len, tokenizer.vocab_size(cfg.data.tokenizer))
    net = cfg.network
    builtin = net.compression in wire_sizes.BYTES_PER_VALUE
    wire = wire_sizes.payload_bytes(params, net.compression, net.block_size) if builtin \
        else 4 * params  # a codec of one's own: fp32, an upper bound on its transfers
    timer = fleet_lib.JobTimer(profiles, cfg.seed, net.intra_bw, net.topology)
    policy = registry.build_local_steps(cfg.local_steps)
    policy.start(steps=cfg.inner.steps, step_times=[p.step_time for p in profiles],
                 transfer_times=[timer.transfers(w, 4 * params, wire)
                                 for w in range(len(profiles))])
    if policy.sizes_rounds:
        policy.offered(now=0.0, version=0, workers=list(range(len(profiles))), busy=0)
    return [policy.local_steps(w) for w in range(len(profiles))]


def batch_bytes(cfg: Config, steps: int) -> int:
    """Bytes of a job's batches of ``steps`` steps on its device."""
    return steps * cfg.inner.batch_size * (cfg.data.seq_len + 1) * TOKEN_BYTES


def check(cfg: Config, available: int) -> int:
    """The largest first job's batch bytes, or a one-line ``ConfigError`` when its steps
    are out of ``JOB_STEPS``'s range or its batches would take more than half of
    ``available`` bytes (a job's model and optimizer need the rest)."""
    sizes = first_jobs(cfg)
    w = max(range(len(sizes)), key=sizes.__getitem__)
    steps = sizes[w]
    need = batch_bytes(cfg, sizes[w])
    why = (f"local_steps {cfg.local_steps}: worker {w}'s first job would run {steps:,} inner "
           f"steps (inner.steps {cfg.inner.steps}; step times "
           f"{min(p.step_time for p in fleet_lib.node_profiles(cfg)):g}-"
           f"{max(p.step_time for p in fleet_lib.node_profiles(cfg)):g} s)")
    if not Q.JOB_STEPS.ok(steps):
        raise ConfigError(f"{why}, more than the {Q.JOB_STEPS.hi:,.0f} a job may run: lower "
                          f"inner.steps, bring the fleet's speeds closer, or use local_steps "
                          f"dylu")
    if need > available // 2:
        raise ConfigError(f"{why}, whose batches take {need / 1e9:.1f} GB, more than half "
                          f"the {available / 1e9:.1f} GB a process of this run may use here (free "
                          f"memory, less any ulimit or container limit): lower "
                          f"inner.steps or inner.batch_size, or bring the speeds closer")
    return need
