"""Cost model: how long an outer step takes, and how much of it is network.

``fedlm plan`` answers, without running anything: given a model of P
parameters, D data centres (each a worker, or several), their step times, H
local steps per job, their links to the server (latency, bandwidth), the
server's own shared link and how uploads are compressed — how long is one
outer step, what fraction of the workers' time goes to moving bytes, to
computing, and to waiting, for a synchronous strategy (DiLoCo, FedAvg: a
barrier every round) and an asynchronous one (async SGD, delayed Nesterov:
every update applied on arrival)?

It is the simulator's timing model (``fedlm.sim.fleet``, ``fedlm.sim.network``,
``fedlm.engine``) solved on paper, with the simulator's wire sizes and daily
bandwidth cycle (``fedlm.sim.wire_sizes``). The parts, in the order they build on each other:

    inputs      PlanInput (what is planned), its nodes grouped into Classes
    fluid       sharing a link: max-min fair levels, transfers through a shared link
    model       one sync round, one async job cycle -> Prediction (the one result type)
    crossovers  the model size / bandwidth at which communication takes a given share
    topology    the outer step over star / ring / tree / hierarchical, streamed in fragments
    regions     two-level async with a server in every region (halos): predict_regions
    report      the text table and the JSON of ``fedlm plan``, any topology
    scan        model size x data centres x topology x streaming (``--scan``; scan_plots)
    walltime    the wall-clock model of the DiLoCo scaling-laws paper (``--walltime``)
    plots       the scaling figures (``--plot``; ``python -m fedlm.plan.plots``)
    check       the plan against fedlm's real engine (``fedlm.engine.dry_run``: torch;
                not imported here)

Everything imported here is plain numpy and arithmetic: no torch, no
simulation. Bandwidths are bytes per second, like ``fedlm.sim.fleet`` (the CLI,
``fedlm.cli.plan``, takes bits).
"""

from fedlm.plan.crossovers import bandwidth_needed, crossover_params, crossovers
from fedlm.plan.fluid import fluid_finish_times, mean_crowd, water_level
from fedlm.plan.inputs import Classes, PlanInput, from_config
from fedlm.plan.model import (Phases, Prediction, async_cycle, expected_max, predict,
                              predict_async, predict_sync, sync_round)
from fedlm.plan.topology import (plan_topology, predict_topology, topology_bandwidth,
                                 topology_crossovers)
from fedlm.plan.report import (describe, human, input_dict, jsonable, prediction_dict,
                               report_dict, seconds, table, what)
from fedlm.sim.wire_sizes import daily_factors, payload_bytes

__all__ = [
    "PlanInput", "Classes", "from_config",
    "water_level", "fluid_finish_times", "mean_crowd",
    "Phases", "Prediction", "sync_round", "async_cycle", "expected_max",
    "predict", "predict_sync", "predict_async",
    "crossover_params", "bandwidth_needed", "crossovers",
    "human", "seconds", "describe", "what", "table", "input_dict", "prediction_dict",
    "jsonable", "report_dict",
    "payload_bytes", "daily_factors",
    "plan_topology", "predict_topology", "topology_bandwidth",
    "topology_crossovers",
]
