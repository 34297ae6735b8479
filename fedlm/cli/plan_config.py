"""``fedlm plan --config FILE`` / ``--set KEY=VALUE``: the plan of a run config.

The config's fleet (its workers' step times and regions' links), H, network and
strategy are what is planned, with the simulator's own numbers: a run's step times
are virtual seconds per inner step, so the plan is the time per global update the
simulator would show (``fedlm.plan.from_config``). The model is the config's, or
``--params`` where given. A config whose strategy has servers in every region
(halos) is planned by ``fedlm.plan.regions``: two-level and async only; every other
strategy as ``fedlm plan`` plans the flags (sync beside async, any topology or
streaming). The flags that describe a fleet by hand are refused beside a config.
"""

from __future__ import annotations

import argparse
import json

from fedlm.errors import ConfigError

# fedlm plan's flags that still mean something beside a config
WITH_CONFIG = {"config", "set", "params", "mode", "json", "func", "command", "verbose",
               "quiet"}
# ... and those that ask for another kind of answer than one configuration's plan
OTHER_ANSWERS = {"scan", "walltime", "plot"}


def refuse_fleet_flags(args: argparse.Namespace, parser_actions) -> None:
    """One line for the first flag that does not go with ``--config`` / ``--set``."""
    for action in parser_actions:
        if not action.option_strings or action.dest in WITH_CONFIG or action.dest == "help":
            continue
        if getattr(args, action.dest, action.default) in (action.default, None):
            continue
        flag = (getattr(args, "spelled", None) or {}).get(action.dest,
                                                          action.option_strings[0])
        if action.dest in OTHER_ANSWERS:
            raise ConfigError(f"{flag}: not with --config or --set, which plan one run "
                              f"config; drop one of them")
        raise ConfigError(f"{flag}: the config describes the fleet and links; set it there "
                          f"or with --set, not beside --config")


def plan_config(args: argparse.Namespace, params: float | None) -> int:
    """Print the plan of ``--config`` with ``--set`` for a model of ``params``
    (None: the config's own model)."""
    from fedlm import config_load, presets, servers
    from fedlm.data import tokenizer
    from fedlm.plan import from_config, predict_topology, report
    from fedlm.servers.regions import RegionServers

    cfg = config_load.load(args.config, args.set or [])
    _refuse_sampling(cfg)
    if params is None:
        params = presets.parameter_count(cfg.model, cfg.data.seq_len,
                                         tokenizer.vocab_size(cfg.data.tokenizer))
    inp = from_config(cfg, params)
    two_level = issubclass(servers.server_class(cfg), RegionServers)
    names = None
    if two_level:
        from fedlm.plan.regions import predict_regions, push_every, region_inputs

        preds, modes, names = ({"sync": None, "async": predict_regions(cfg, params)},
                               ("async",), {"async": cfg.strategy})
        regions = region_inputs(cfg, params)
        heading = [f"strategy {cfg.strategy}: a server in each of {len(regions)} regions, a "
                   f"push to the global server every {push_every(cfg)} region updates; the "
                   f"evaluated model is the global one (an update: a merge)"]
        heading += [f"  region {wan.name}: {local.workers} worker(s) at "
                    f"{report.human(8 * min(local.down_bw), 'bit/s')} to their region's server;"
                    f" to the global server {report.human(8 * wan.up_bw, 'bit/s')} up, "
                    f"{report.human(8 * wan.down_bw, 'bit/s')} down, latency "
                    f"{report.seconds(wan.latency)}" for local, wan in regions]
    else:
        preds = predict_topology(inp)
        modes = ("sync", "async") if args.mode == "both" else (args.mode,)
        heading = [f"strategy {cfg.strategy}, model {cfg.model}"]
    if cfg.local_steps != "fixed":  # the planner gives every job H steps
        heading.append(f"(planned with H = {cfg.inner.steps} steps for every job: local_steps "
                       f"{cfg.local_steps!r} is not modelled)")
    from fedlm.sim import dynamics

    changes = [words for _, words in dynamics.features(cfg.fleet)]
    if changes:  # the cost model's fleet is steady
        heading.append(f"(planned for a steady fleet: {', '.join(changes)} not modelled; "
                       f"`fedlm run` simulates them)")
    if args.json:
        print(json.dumps({"strategy": cfg.strategy, **report.report_dict(inp, preds)}, indent=2))
    else:
        print("\n".join(heading))
        print(report.table(inp, preds, modes, names))
    return 0


def _refuse_sampling(cfg) -> None:
    """A config whose rounds draw K of the workers (``outer.fraction``, ``outer.overcommit``)
    is refused: the cost model puts every worker in every round, so its plan would be of
    another run than the config's."""
    from fedlm import servers
    from fedlm.strategies.rounds import Synchronous

    strategy = servers.build(cfg).strategy
    if isinstance(strategy, Synchronous) and strategy.rounds.draws:
        key = "outer.fraction" if "fraction" in cfg.outer else "outer.overcommit"
        raise ConfigError(f"{key}: fedlm plan puts every worker in every round and does not "
                          f"model rounds drawn from the workers (outer.fraction, "
                          f"outer.overcommit); plan the workers a round takes (--set "
                          f"workers=K), or simulate it with fedlm run, got "
                          f"{cfg.outer.get(key.split('.')[1])!r}")
