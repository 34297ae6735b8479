"""A deployed node's worker, without Flower's engine: the warm executor
(fedlm.deploy.warm_executor) runs each job in its own process, with the node's state
RecordDict (the worker's optimizer states with inner.state_store = context) held
there per run, in place of Flower's context.state; the context it pushes back to
the SuperNode keeps the state it came with, so optimizer states never travel.
(tests/test_deploy_warm.py runs it in a real deployment.)"""

import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from fedlm.deploy.warm_executor import MAX_RUNS, NodeStates
from fedlm.flower import client_app, messages
from fedlm.job import JobSpec
from fedlm.worker.states import MissingState
from tests.conftest import tiny_config

NODE = {"partition-id": 1, "num-partitions": 2}


def _pulled(run_id: int) -> Context:
    """A context as the executor pulls it from its SuperNode."""
    return Context(run_id=run_id, node_id=7, node_config=dict(NODE), state=RecordDict(),
                   run_config={})


def test_the_node_state_is_kept_per_run_across_messages():
    states = NodeStates()
    first, second, other = (states.context_for(_pulled(r)) for r in (1, 1, 2))
    assert first.state is second.state
    assert other.state is not first.state


def test_the_pulled_context_keeps_its_own_state():
    pulled = _pulled(1)
    seen = NodeStates().context_for(pulled)
    seen.state["fedlm.opt.0.meta"] = ConfigRecord({"schedule_step": 3})
    assert "fedlm.opt.0.meta" not in pulled.state  # what goes back to the SuperNode
    assert (seen.run_id, seen.node_id, seen.node_config) == \
        (pulled.run_id, pulled.node_id, pulled.node_config)


def test_only_the_most_recent_runs_are_kept():
    states = NodeStates()
    kept = states.context_for(_pulled(0)).state
    for run in range(1, MAX_RUNS):
        states.context_for(_pulled(run))
    assert states.context_for(_pulled(0)).state is kept  # used again: now the most recent
    states.context_for(_pulled(MAX_RUNS))  # one run too many: the oldest (run 1) goes
    assert list(states.runs) == [*range(2, MAX_RUNS), 0, MAX_RUNS]
    assert states.context_for(_pulled(0)).state is kept


def _train(states: NodeStates, cfg, params, job: JobSpec, run_id: int = 1):
    content = messages.train_request(job, params, cfg.to_json(), "run-key")
    context = states.context_for(_pulled(run_id))
    return messages.read_train_reply(
        client_app.train_answer(content, context.node_config, context.state), job.job_id)


def test_jobs_build_on_the_states_the_executor_keeps():
    from fedlm import model

    cfg = tiny_config("workers=2", "inner.steps=2", "inner.state_store=context")
    params = model.snapshot(model.build(cfg.model, cfg.data.seq_len, 0))
    states = NodeStates()
    spec = dict(worker=1, base_version=0, local_steps=2, data_seed=5)
    assert _train(states, cfg, params, JobSpec(job_id=0, **spec)).steps == 2
    # the next message finds the state job 0 saved, in this process
    assert _train(states, cfg, params, JobSpec(job_id=1, prev_job=0, **spec)).steps == 2
    held = states.runs[1]
    assert {"fedlm.opt.0", "fedlm.opt.1"} <= set(held.keys())
    # a job that names a state this node never had fails (Flower's error reply); the
    # states held stay for the next message
    with pytest.raises(MissingState):
        _train(states, cfg, params, JobSpec(job_id=2, prev_job=9, **spec))
    assert _train(states, cfg, params, JobSpec(job_id=3, prev_job=1, keep_from=1,
                                               **spec)).steps == 2
    assert "fedlm.opt.0" not in held and "fedlm.opt.3" in held  # keep_from pruned job 0
    # another run on the same node starts with no state
    with pytest.raises(MissingState):
        _train(states, cfg, params, JobSpec(job_id=4, prev_job=3, **spec), run_id=2)
