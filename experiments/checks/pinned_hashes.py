"""Final weight hashes of twelve tiny configurations, to compare two commits.

    python experiments/checks/pinned_hashes.py out.json      # in a checkout: its fedlm

A change that must not alter what the per-job path computes (a refactor, a faster
digest, a server on the device) keeps every hash; experiments/checks/pinned_hashes.json
holds them as this machine's CPU and torch computed them (another CPU kind may differ in
the last bits, so this is a check to run, not a test of the suite). Covers every kind of
strategy and server, DyLU, faults, a shared link, streaming, halos, a changing fleet and
the paper's shard protocol with a pretrained start.
"""
import json, sys, tempfile, os
sys.path.insert(0, os.getcwd())
from fedlm.runner import run_inprocess
from fedlm import store, config_load
BASE = ["model=tiny", "workers=3", "updates=4", "inner.steps=3", "inner.batch_size=4", "eval.every=2",
        "eval.batches=2", "eval.batch_size=8", "data.seq_len=64"]
CASES = {
 "diloco": ["strategy=diloco"],
 "fedavg-very": ["strategy=fedavg", "fleet.preset=very"],
 "dn-dylu-very": ["strategy=delayed-nesterov", "local_steps=dylu", "fleet.preset=very", "updates=8"],
 "diloco-dylu": ["strategy=diloco-dylu", "fleet.preset=very"],
 "async-sgd-faults": ["strategy=async-sgd", "faults.crash=0.2", "faults.nan=0.1", "updates=8"],
 "fedbuff": ["strategy=fedbuff", "updates=6"],
 "poly-budget": ["strategy=poly", "local_step_budget=40", "updates=100"],
 "stream": ["strategy=diloco", "stream.fragments=2", "stream.overlap=1", "inner.steps=4", "fleet.preset=geo"],
 "halos": ["strategy=halos", "workers=4", "fleet.preset=halos", "fleet.base_step_time=0.0004", "updates=6"],
 "dylu-online-shared": ["strategy=delayed-nesterov", "local_steps=dylu-online", "network.server_up=3e6", "updates=8"],
 "dyn": ["strategy=delayed-nesterov", "local_steps=dylu", "fleet.slowdown={factor = 2, normal = 20, slow = 10}", "fleet.join=[0, 5, 0]", "updates=8"],
 "paper": ["strategy=delayed-nesterov", "local_steps=dylu", "data.shards=5", "data.shard_choice=paper", "inner.schedule=shard", "init.pretrain_steps=10", "updates=8"],
}
out = {}
for name, sets in CASES.items():
    d = tempfile.mkdtemp()
    rid = run_inprocess(config_load.load(None, BASE + sets), os.path.join(d, "r.db"))
    out[name] = store.list_runs(os.path.join(d, "r.db"))[0]["final_hash"]
    print(name, out[name][:16], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
