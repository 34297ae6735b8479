"""sim.devices: jobs placed over a host's devices (fedlm.worker.placement), in process and
under Flower's Ray backend. No GPU here: CUDA counts are faked where Ray's or our
arithmetic is checked, and real runs place jobs over two "cpu" devices."""

import collections
import threading

import pytest

from fedlm.worker import batched, placement
from fedlm.config_load import ConfigError
from fedlm.flower.simulation import backend_config
from fedlm.runner import run_inprocess
from fedlm.store.readers import operation_log
from fedlm.worker import train as worker
from tests.conftest import tiny_config


@pytest.fixture
def gpus(monkeypatch):
    """Pretend torch sees ``n`` CUDA devices: ``gpus(4)``."""
    def see(n: int) -> None:
        monkeypatch.setattr("fedlm.model.resolve_device", lambda choice: "cuda")
        monkeypatch.setattr(placement, "visible", lambda kind: n if kind == "cuda" else 1)
    return see


def test_one_device_keeps_its_bare_name():
    # before sim.devices a run used "cpu" / "cuda": one device changes nothing
    assert placement.devices(tiny_config("device=cpu")) == ["cpu"]


def test_cpu_devices_name_the_one_cpu_n_times():
    assert placement.devices(tiny_config("device=cpu", "sim.devices=2")) == ["cpu", "cpu"]


def test_all_gpus_by_default_the_first_n_on_request(gpus):
    gpus(4)
    assert placement.devices(tiny_config("device=cuda")) == [f"cuda:{i}" for i in range(4)]
    assert placement.devices(tiny_config("device=cuda", "sim.devices=2")) == ["cuda:0", "cuda:1"]
    assert placement.devices(tiny_config("device=cuda", "sim.devices=1")) == ["cuda"]


def test_more_gpus_than_there_are_is_refused_in_one_line(gpus):
    gpus(2)
    with pytest.raises(ConfigError, match=r"^sim\.devices: must be <= the 2 cuda devices "
                                          r"torch sees, got 3$"):
        placement.devices(tiny_config("device=cuda", "sim.devices=3"))


@pytest.mark.parametrize("bad", ["sim.devices=-1", "sim.devices=1025"])
def test_device_count_is_bounded(bad):
    with pytest.raises(ConfigError, match=r"^sim\.devices: must be in \[0, 1024\]"):
        tiny_config(bad)


@pytest.mark.parametrize("bad", ["sim.ray_address=localhost", "sim.ray_address=ray://h:1",
                                 "sim.ray_address=h:port"])
def test_ray_address_must_name_a_head(bad):
    with pytest.raises(ConfigError, match=r"^sim\.ray_address: must be HOST:PORT of a Ray "
                                          r"head or auto, got '"):
        tiny_config(bad)


def test_a_worker_stays_on_its_device():
    assert [placement.device_of(w, 3) for w in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def _flower_pool(client_resources: dict, cpus: float, gpus: float, monkeypatch) -> int:
    """How many actors Flower's own rule fits on one node of ``cpus`` and ``gpus``."""
    ray_actor = pytest.importorskip("flwr.simulation.ray_transport.ray_actor")
    monkeypatch.setattr(ray_actor.ray, "nodes",
                        lambda: [{"Resources": {"CPU": cpus, "GPU": gpus}}])
    return ray_actor.pool_size_from_resources(client_resources)


@pytest.mark.parametrize("gpu_count", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("actors", [1, 2, 3, 4, 5, 6, 7, 9, 16])
def test_every_actor_fits_on_the_gpus(actors, gpu_count, monkeypatch):
    # Ray places a fraction on one GPU (test_ray_places_every_actor_on_one_gpu below):
    # 6 actors at 4/6 of a GPU each would fit only 4, one a GPU, and 2 would never
    # start; 1/ceil(6/4) = 1/2 fits all 6. Flower's pool (which counts a node's GPUs
    # as one sum) must hold them all too, or it starts fewer.
    share = placement.gpu_share(actors, gpu_count)
    assert 0 < share <= 1
    assert gpu_count * int(1 / share + 1e-9) >= actors  # Ray: whole actors per GPU
    fits = _flower_pool({"num_cpus": 1, "num_gpus": share}, actors, gpu_count, monkeypatch)
    assert fits >= actors
    if gpu_count == 1:
        assert share == 1 / actors  # one GPU: as before sim.devices


def test_flower_on_gpus_gives_ray_all_of_them(gpus, monkeypatch):
    gpus(4)
    cfg = tiny_config("device=cuda", "workers=6", "sim.cpus=6")
    conf = backend_config(cfg)
    assert conf["init_args"]["num_gpus"] == 4
    assert conf["client_resources"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert _flower_pool(conf["client_resources"], 6, 4, monkeypatch) == 6
    two = backend_config(tiny_config("device=cuda", "workers=6", "sim.cpus=6", "sim.devices=2"))
    assert (two["init_args"]["num_gpus"], two["client_resources"]["num_gpus"]) == (2, 1 / 3)


def test_flower_on_the_cpu_asks_for_no_gpu():
    conf = backend_config(tiny_config("device=cpu", "sim.cpus=2"))
    assert conf["init_args"]["num_gpus"] == 0 and conf["client_resources"]["num_gpus"] == 0


def test_without_an_address_ray_is_our_own():
    # a plain ray.init() joins the cluster `ray start` left on this host (or RAY_ADDRESS
    # names) and then refuses num_cpus; "local" always starts a Ray of the run's own
    init = backend_config(tiny_config("device=cpu"))["init_args"]
    assert init["address"] == "local" and init["num_cpus"] >= 1


def test_a_ray_address_attaches_without_resource_counts():
    # ray.init(address=...) refuses num_cpus / num_gpus ("When connecting to an existing
    # cluster, num_cpus and num_gpus must not be provided"): the cluster has its own
    conf = backend_config(tiny_config("device=cpu", "sim.ray_address=10.0.0.1:6379",
                                      "inner.threads=2"))
    init = conf["init_args"]
    assert init["address"] == "10.0.0.1:6379"
    assert not {"num_cpus", "num_gpus", "resources", "object_store_memory"} & set(init)
    assert conf["client_resources"] == {"num_cpus": 2, "num_gpus": 0.0}
    sized = backend_config(tiny_config("device=cpu", "sim.ray_address=auto", "sim.cpus=6",
                                       "sim.ray_actors=4"))
    assert sized["client_resources"]["num_cpus"] == 1.5


def test_on_a_cluster_sim_devices_counts_the_clusters_gpus(gpus):
    # 2 machines of 4 GPUs, 16 actors: 1/2 a GPU each, though this host sees only 1
    gpus(1)
    conf = backend_config(tiny_config("device=cuda", "workers=16", "sim.ray_address=a:6379",
                                      "sim.devices=8"))
    assert conf["client_resources"]["num_gpus"] == 0.5
    assert backend_config(tiny_config("device=cuda", "workers=16",
                                      "sim.ray_address=a:6379"))["client_resources"] == {
        "num_cpus": 1, "num_gpus": 1 / 16}  # without sim.devices: the driver's one GPU


def _run(tmp_path, name: str, *overrides: str):
    db = tmp_path / f"{name}.db"
    run_id = run_inprocess(tiny_config("device=cpu", *overrides), str(db))
    log = operation_log(db, run_id)
    applied = [(u["job_id"], u["base_version"], u["applied_version"], u["update_hash"])
               for u in log.updates]
    return log.run["final_hash"], log.run["virtual_time"], applied


def test_jobs_over_two_devices_end_where_one_device_ends(tmp_path, monkeypatch):
    # Worker w's jobs run on device w mod 2, in that device's own thread, and the
    # two devices' jobs run at once: the first job of workers 0 and 1 meet at a
    # barrier, which one device running one job at a time would break (after 60 s).
    # The run (weights, clock, every update) is the one-device run's.
    barrier = threading.Barrier(2, timeout=60)
    seen: dict[int, set] = {}
    serve = worker.serve_job

    def recording(params, states, job, cfg, *args, **kwargs):
        seen.setdefault(job.worker, set()).add(
            (kwargs["device"], threading.current_thread().name.split("_")[0]))
        if job.job_id < 2:
            barrier.wait()
        return serve(params, states, job, cfg, *args, **kwargs)

    arm = ("strategy=delayed-nesterov", "local_steps=dylu", "fleet.preset=very", "updates=6")
    one = _run(tmp_path, "one", *arm)
    monkeypatch.setattr("fedlm.inprocess.serve_job", recording)
    two = _run(tmp_path, "two", *arm, "sim.devices=2")
    assert two == one
    assert not barrier.broken
    assert seen == {0: {("cpu", "fedlm-job-d0")}, 1: {("cpu", "fedlm-job-d1")},
                    2: {("cpu", "fedlm-job-d0")}}


def test_batched_groups_over_two_devices_end_where_one_device_ends(tmp_path, monkeypatch):
    # A batched sync round's jobs train as one group per device, worker w's on device
    # w mod 2 in that device's thread, the two groups at once (their first groups meet
    # at a barrier); a replica's bits do not depend on its group, so the run is the
    # one-device batched run.
    barrier = threading.Barrier(2, timeout=60)
    seen: dict[int, set] = {}
    job_updates = batched.job_updates

    def recording(items, cfg, *args, **kwargs):
        for _, _, job in items:
            seen.setdefault(job.worker, set()).add(
                (kwargs["device"], threading.current_thread().name.split("_")[0]))
        if min(job.job_id for _, _, job in items) < 2:
            barrier.wait()
        return job_updates(items, cfg, *args, **kwargs)

    arm = ("strategy=diloco", "workers=4", "updates=3", "sim.batched=on")
    one = _run(tmp_path, "one", *arm)
    monkeypatch.setattr(batched, "job_updates", recording)
    two = _run(tmp_path, "two", *arm, "sim.devices=2")
    assert two == one
    assert not barrier.broken
    assert seen == {w: {("cpu", f"fedlm-job-d{w % 2}")} for w in range(4)}


@pytest.mark.flower
def test_ray_places_every_actor_on_one_gpu(gpus):
    # Real Ray, with 4 GPUs it is told of (none needed): the actors of backend_config
    # all start, each sees one GPU as its CUDA_VISIBLE_DEVICES (so "cuda" in an actor
    # is its own), and no GPU holds more than ceil(actors / GPUs) of them. Ray fills
    # a GPU before the next: 6 actors take 2 + 2 + 2 + 0, 8 take 2 on each.
    ray = pytest.importorskip("ray")
    from fedlm.flower import leftovers
    from fedlm.flower.simulation import quiet_libraries

    gpus(4)
    quiet_libraries(flower=False)

    @ray.remote
    class Probe:
        def gpu(self):
            import os
            return tuple(ray.get_gpu_ids()), os.environ.get("CUDA_VISIBLE_DEVICES")

    conf = backend_config(tiny_config("device=cuda", "workers=8", "sim.cpus=8"))
    with leftovers.none_left_behind():
        ray.init(**{**conf["init_args"], "object_store_memory": 80 * 1024**2})
        try:
            for actors, spread in [(6, [2, 2, 2]), (8, [2, 2, 2, 2])]:
                share = placement.gpu_share(actors, 4)
                probes = [Probe.options(num_cpus=0.01, num_gpus=share).remote()
                          for _ in range(actors)]
                refs = [p.gpu.remote() for p in probes]
                ready, _ = ray.wait(refs, num_returns=actors, timeout=120)
                seen = [ray.get(r) for r in ready]
                for p in probes:
                    ray.kill(p)
                assert len(seen) == actors
                assert all(len(ids) == 1 and visible == str(ids[0]) for ids, visible in seen)
                per_gpu = sorted(collections.Counter(ids[0] for ids, _ in seen).values())
                assert per_gpu == spread
        finally:
            ray.shutdown()
