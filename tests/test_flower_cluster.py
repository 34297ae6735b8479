"""sim.ray_address: Flower's Ray backend attached to an existing Ray cluster (two
nodes on this machine), ending where the in-process engine ends."""

import pytest

from fedlm import store
from fedlm.flower import leftovers
from fedlm.runner import run_inprocess
from tests.conftest import tiny_config
from tests.test_flower_e2e import TINY, fedlm_run

pytestmark = pytest.mark.flower


@pytest.fixture
def cluster(monkeypatch):
    """Two Ray nodes of 2 CPUs each (the head one of them); every process they started
    is gone after the test (their shutdown, then a bounded wait and SIGKILL)."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    # Cluster writes its address to /tmp/ray/ray_current_cluster, where any plain
    # ray.init() on this machine (another fedlm run, say) would find and join it.
    monkeypatch.setattr("ray._private.utils.write_ray_address", lambda *a, **k: None)
    nodes = {"num_cpus": 2, "object_store_memory": 80 * 1024**2, "include_dashboard": False}
    with leftovers.none_left_behind(timeout=30):
        made = cluster_utils.Cluster(initialize_head=True, head_node_args=nodes,
                                     shutdown_at_exit=False)
        try:
            made.add_node(**{k: v for k, v in nodes.items() if k != "include_dashboard"})
            made.wait_for_nodes(timeout=120)
            yield made
        finally:
            made.shutdown()


def test_a_run_on_a_ray_cluster_ends_as_in_process(cluster, tmp_path):
    # 2 CPUs an actor (sim.cpus / sim.ray_actors): the pool holds one actor on each
    # node, and 3 workers' jobs a round keep both busy. The ClientApps ran on the
    # cluster's two nodes (its actor table says where), and the weights end where
    # the in-process engine's do: the cluster changes nothing.
    db = tmp_path / "cluster.db"
    fedlm_run(db, f"sim.ray_address={cluster.address}", "sim.cpus=4", "sim.ray_actors=2")
    actors = cluster.global_state.actor_table(None).values()
    placed = {a["Address"]["NodeID"] for a in actors if "ClientAppActor" in a["ActorClassName"]}
    assert placed == {node.node_id for node in cluster.list_all_nodes()}
    ref = tmp_path / "ref.db"
    run_inprocess(tiny_config(*TINY), str(ref))
    assert store.summarize(db, 1).final_hash == store.summarize(ref, 1).final_hash
