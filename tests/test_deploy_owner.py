"""A `fedlm deploy local` deployment only its owner can use: the SuperLink's Control API
admits only requests with the deployment's token (fedlm.deploy.superlink, the owner-token
patch), which fedlm's own `flwr` commands send from HOME's credential store.

A stranger here is what another local user has: the address and ca.crt, in a FLWR_HOME
of their own. Their `flwr run` of an app whose ServerApp and ClientApp would leave marker
files, their `flwr supernode register` and `flwr ls` are all refused, and nothing of
theirs runs; nor can they take the ServerApp task of the owner's run from the Runtime
API (only the SuperLink's own SuperExec signs); fedlm's own run on the same deployment
goes on as before.
"""

import os
import shutil
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import pytest

from fedlm import config_load
from fedlm.deploy.credentials import make_node_key, make_token, private_home, store_cli_token
from fedlm.deploy.local import LocalDeployment
from fedlm.deploy.superlink import OWNER_TOKEN_ON
from fedlm.errors import ConfigError
from fedlm.flower import patches
from tests.test_deploy import _processes_mentioning

pytestmark = pytest.mark.flower

SETS = ["model=tiny", "workers=1", "updates=2", "inner.steps=2", "inner.batch_size=4",
        "eval.every=1000", "eval.batches=1", "data.seq_len=64", "strategy=async-sgd",
        "clock=wall", "seed=0"]

# someone else's app: its ServerApp (on the SuperLink's host) and its ClientApp (on
# every SuperNode) each leave a marker file, the proof that they ran
STRANGER_APP = '''from pathlib import Path

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context) -> None:
    marker = str(context.run_config["marker"])
    Path(marker + ".serverapp").write_text("ran")
    msgs = [Message(RecordDict({"c": ConfigRecord({"marker": marker})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in grid.get_node_ids()]
    list(grid.send_and_receive(msgs, timeout=60))


@client.train()
def train(msg: Message, context) -> Message:
    Path(str(msg.content["c"]["marker"]) + ".clientapp").write_text("ran")
    return Message(RecordDict(), reply_to=msg)
'''
STRANGER_PYPROJECT = '''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "strangerapp"
version = "1.0.0"
dependencies = ["flwr"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "stranger"

[tool.flwr.app.components]
serverapp = "strangerapp:server"
clientapp = "strangerapp:client"

[tool.flwr.app.config]
marker = ""
'''


# -- the pieces, without a deployment ----------------------------------------------
def test_the_patched_superlink_admits_the_owner_token_only():
    import importlib

    from flwr.common.constant import ACCESS_TOKEN_KEY, NOOP_FLWR_AID

    # the module, not the function of the same name that flwr.superlink.cli exports
    flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")
    token = "k" * 43
    done = patches.owner_token(token)
    try:
        plugin = flower_superlink.load_control_authn_plugin()
        ok, account = plugin.validate_tokens_in_metadata([(ACCESS_TOKEN_KEY, token)])
        assert ok and account.flwr_aid == NOOP_FLWR_AID  # Flower's one open-source account
        for metadata in ([], [(ACCESS_TOKEN_KEY, "k" * 42)], [(ACCESS_TOKEN_KEY, token + "k")],
                         [(ACCESS_TOKEN_KEY, token), (ACCESS_TOKEN_KEY, token)],
                         [("flwr-oidc-refresh-token", token)]):
            assert plugin.validate_tokens_in_metadata(metadata) == (False, None), metadata
        assert plugin.get_auth_tokens("any") is None  # no token is ever handed out
        assert plugin.refresh_tokens([(ACCESS_TOKEN_KEY, token)]) == (None, None)
        assert plugin.get_login_details().authn_type == patches.OWNER_AUTHN_TYPE
    finally:
        done.undo()
    with pytest.raises(ValueError, match="at least 32"):
        patches.owner_token("short")


def test_the_token_and_the_home_are_private(tmp_path):
    home = tmp_path / "home"
    private_home(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    home.chmod(0o755)  # an earlier deployment's, or made by hand: made private again
    private_home(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    token = make_token(home / "keys" / "control.token")
    assert len(token) >= 43 and (home / "keys" / "control.token").read_text() == token + "\n"
    assert stat.S_IMODE((home / "keys" / "control.token").stat().st_mode) == 0o600
    creds = store_cli_token(home, "127.0.0.1:1234", token)
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    assert "flower.account-auth.127.0.0.1:1234.oidc-access-token" in creds.read_text()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # as /tmp: fedlm does not take it over
    with pytest.raises(ConfigError, match="a shared folder"):
        private_home(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


# -- a real deployment ---------------------------------------------------------------
@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    home = tmp_path_factory.mktemp("owner") / "flwr-home"
    with LocalDeployment(home, 1, tls=True, auth=True) as dep:
        assert dep.owner_token
        dep.start(config_load.load(None, SETS))
        yield dep
    assert _processes_mentioning(str(home)) == []


@pytest.fixture
def stranger(deployment, tmp_path):
    """What another local user has: a FLWR_HOME of their own with the address and ca.crt."""
    home = tmp_path / "stranger"
    home.mkdir()
    ca = Path(shutil.copy(deployment.certs["ca"], home / "ca.crt"))
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "there"\n\n[superlink.there]\n'
        f'address = "{deployment.address}"\nroot-certificates = "{ca}"\n')

    def flwr(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], capture_output=True, text=True, timeout=120,
                              env={**deployment.env(), "FLWR_HOME": str(home)})
    return flwr


def _refused(out: subprocess.CompletedProcess) -> bool:
    return out.returncode != 0 and "Authentication failed" in out.stderr


def test_a_stranger_cannot_run_register_or_list(deployment, stranger, tmp_path):
    app, marker = tmp_path / "strangerapp", tmp_path / "marker"
    app.mkdir()
    (app / "strangerapp.py").write_text(STRANGER_APP)
    (app / "pyproject.toml").write_text(STRANGER_PYPROJECT)
    (tmp_path / "rc.toml").write_text(f'marker = "{marker}"\n')
    starts = deployment.superlink_log().count("ControlServicer.StartRun")
    run = stranger("run", str(app), "there", "--run-config", str(tmp_path / "rc.toml"),
                   "--stream")
    assert _refused(run), run.stdout[-2000:] + run.stderr[-2000:]
    _, pub = make_node_key(tmp_path / "stranger.key")
    register = stranger("supernode", "register", str(pub), "there")
    assert _refused(register), register.stdout[-2000:] + register.stderr[-2000:]
    assert _refused(stranger("ls", "there"))
    assert _refused(stranger("supernode", "list", "there"))
    login = stranger("login", "there")  # no way to get a token from the SuperLink
    assert login.returncode != 0 and patches.OWNER_AUTHN_TYPE in login.stderr, login.stderr
    time.sleep(2)  # a ServerApp would have started by now (the SuperExec polls every 1 s)
    assert list(tmp_path.glob("marker*")) == []  # neither its ServerApp nor its ClientApp ran
    assert deployment.security_problems() == []
    assert OWNER_TOKEN_ON in deployment.superlink_log()
    assert deployment.superlink_log().count("ControlServicer.StartRun") == starts
    # the owner's flwr, on the same SuperLink: its one node, registered at start
    assert [n["node-id"] for n in deployment.list_supernodes()] == \
        [str(n) for n in deployment.node_ids]


def test_a_stranger_cannot_take_the_serverapp_task_of_a_run(deployment, tmp_path):
    """The SuperLink's Runtime API hands a run's ServerApp task (and its token: the
    run's app, its config, its nodes) only to the SuperExec that signs with the
    deployment's secret; Flower's subprocess isolation hands it to whoever asks."""
    import httpx
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    ca = Path(shutil.copy(deployment.certs["ca"], tmp_path / "ca.crt"))
    # closed after: an open keep-alive connection holds the SuperLink's graceful shutdown
    with RuntimeHttpClient.from_server_address(
            server_address=deployment.address, insecure=False,
            root_certificates=ca.read_bytes(),
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")]) as client:
        with pytest.raises(httpx.HTTPStatusError, match="401"):
            client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.SERVER_APP]))
    assert "SuperExec authentication failed" in deployment.superlink_log()


def test_the_owner_still_runs(deployment, tmp_path):
    db = tmp_path / "runs.db"
    assert deployment.run(SETS, str(db), timeout=420) == 0, \
        deployment.superlink_log()[-3000:]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT status, clock FROM runs").fetchone() == ("finished", "wall")


def test_a_home_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder of another user")
    home = tmp_path / "theirs"
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)
    with pytest.raises(ConfigError, match="not yours"):
        LocalDeployment(home, 1).start(config_load.load(None, SETS))
    assert stat.S_IMODE(home.stat().st_mode) == 0o755 and not list(home.iterdir())
