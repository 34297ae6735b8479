"""A warm ClientApp executor for one SuperNode: no process started per message.

    python -m fedlm.deploy.warm_executor --runtime-api-address 127.0.0.1:PORT
        --superexec-auth-secret-file FILE --parent-pid PID [--insecure | --root-certificates CA]

Flower's SuperNode (``--isolation subprocess``) starts ``flower-superexec``,
which polls the SuperNode's Runtime API (``AcquireTask``) and starts a fresh
``flwr-clientapp`` process for every task: process start, importing flwr,
installing the FAB and loading the ClientApp, for each message (1.5-4 s on a
quiet machine, the "launch" phase of docs/deploy_overhead.md). With
``--isolation process`` the SuperNode starts no SuperExec and waits for one
started next to it; this is that process, run by ``fedlm.deploy.supernode
--warm-executor`` (``fedlm deploy local`` does it by default). It

* polls ``AcquireTask`` as Flower's SuperExec does (same ``RuntimeHttpClient``,
  version and SuperExec-auth interceptors, the secret of the SuperNode's
  ``--superexec-auth-secret-file``), every ``FEDLM_PATCH_WARM_EXECUTOR_POLL_S`` seconds
  (default 0.1) and at once again after a task. Polling faster gains nothing:
  the SuperNode creates the task before it pulls the message's objects from
  the SuperLink (~0.5-1.5 s for the small model), so an executor that claims
  it earlier only waits longer for them; and it costs CPU (0.19 cores per
  idle SuperNode measured at 0.02 s);
* runs each ClientApp task in this process, with Flower's own steps from
  ``flwr.supernode.runtime.run_clientapp``: task heartbeat, ``pull_task_input``,
  the ClientApp called with the message and context, ``push_message`` for the
  reply, ``push_task_output`` for the final status and context. An exception in
  the ClientApp becomes Flower's error reply (``CLIENT_APP_RAISED_EXCEPTION``,
  or ``LOAD_CLIENT_APP_EXCEPTION``) exactly as there, and the executor goes on;
* runs the job itself, in this process: fedlm's ClientApp
  (``fedlm.flower.client_app``, the ``clientapp`` of ``pyproject.toml``) with
  torch, the model, the tokenized shards and its caches kept here across
  messages; and the node's state ``RecordDict`` (the worker's optimizer states
  with ``inner.state_store = context``) kept here too, one per run
  (``NodeStates``, the ``MAX_RUNS`` most recent), in place of Flower's
  ``context.state``: the context pushed back to the SuperNode keeps the state
  it came with, so optimizer states never travel. A job's state semantics (by
  job id, ``prev_job``, ``keep_from``) are ``fedlm.worker.states``'s, as under
  the simulation engine; they die with this process, as they would with a
  restarted SuperNode (the ``disk`` store, the default with checkpoints, keeps
  them);
* installs a FAB once per FAB hash and loads its ClientApp once (imported from
  the installed bundle, as ``flwr-clientapp`` does), then reuses it: flwr and
  the app stay imported. A task of another FAB than the one loaded (a second
  app, or new code) runs the old way, in a fresh ``flwr-clientapp`` process
  (Flower's ``SubprocessExecutor``): modules cannot be unloaded cleanly;
* exits when its SuperNode exits (Flower's parent-process monitor, 0.2 s), on
  SIGTERM/SIGINT (the in-flight task is reported FAILED first), or when the
  Runtime API refuses its secret. ``fedlm.deploy.supernode`` restarts it if it dies.

What changes against a ``flwr-clientapp`` process: a heartbeat the SuperNode
refuses (task expired) is logged and the ClientApp runs to its end instead of
the process being interrupted (its late reply is refused), and a token the
Runtime API rejects (401) fails that task instead of ending the process.
Runtime dependency installation is not supported (``fedlm deploy`` disables it).

Tied to Flower's internals (module paths, ``run_clientapp``'s helpers,
``--isolation process``): ``fedlm.deploy.supernode`` checks the installed
version against ``fedlm.flower.patches.TESTED`` before it starts one, and
refuses another with a message naming the switch (``FEDLM_PATCH_WARM_EXECUTOR=0``:
Flower's SuperExec, a process per message).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import threading
import time
from collections import OrderedDict
from logging import ERROR, INFO, WARNING
from pathlib import Path

import httpx
from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp, LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.config import get_project_config, get_project_dir
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest, SendTaskHeartbeatRequest
from flwr.supercore import log
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.auth.superexec_secret import load_superexec_auth_secret
from flwr.supercore.constant import TaskType
from flwr.supercore.exit import register_signal_handlers
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
from flwr.supercore.superexec.executor import ExecutionSpec
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
from flwr.supercore.telemetry import EventType
from flwr.supernode.runtime.run_clientapp import (
    pull_task_input,
    push_message,
    push_task_output,
)

from fedlm.flower import patches

DEFAULT_POLL_S = 0.1  # see the module doc: the task is claimed while its objects still arrive
TASK_RPC_MAX_S = 120.0  # give up a task's Runtime API call after this long (retries)
START_MARK = "[fedlm warm executor] start task"  # logged per task (benchmarks read these)
DONE_MARK = "[fedlm warm executor] done task"
MAX_RUNS = 4  # runs whose node state this process keeps (the most recent ones)


class NodeStates:
    """This node's state RecordDict per run, held in this process for the ClientApp in
    place of Flower's ``context.state`` (which would travel to the SuperNode and back
    with every task)."""

    def __init__(self, max_runs: int = MAX_RUNS) -> None:
        self.max_runs = max_runs
        self.runs: OrderedDict[int, RecordDict] = OrderedDict()

    def state(self, run_id: int) -> RecordDict:
        state = self.runs.pop(run_id, None)
        self.runs[run_id] = state if state is not None else RecordDict()
        while len(self.runs) > self.max_runs:  # the run used longest ago
            self.runs.popitem(last=False)
        return self.runs[run_id]

    def context_for(self, context: Context) -> Context:
        """The context the ClientApp sees: Flower's, with this process's state."""
        local = copy.copy(context)
        local.state = self.state(context.run_id)
        return local


def _task_retry_invoker():
    """Flower's HTTP retry policy for one task's calls, except that a refused token
    (401) fails the call instead of sending SIGINT to this (long-lived) process."""
    invoker = make_simple_http_retry_invoker()
    flower_giveup = invoker.should_giveup
    def giveup(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 401:
            return True
        return flower_giveup(exc) if flower_giveup else False
    invoker.should_giveup = giveup
    invoker.max_time = TASK_RPC_MAX_S
    return invoker


class WarmExecutor:
    def __init__(self, runtime_api_address: str, insecure: bool,
                 root_certificates_path: str | None, secret: bytes | None,
                 poll_s: float = DEFAULT_POLL_S) -> None:
        self.address = runtime_api_address
        self.insecure = insecure
        self.root_certificates_path = root_certificates_path
        self.root_certificates = (Path(root_certificates_path).read_bytes()
                                  if root_certificates_path else None)
        self.poll_s = poll_s
        self.stop_event = threading.Event()
        interceptors = [RuntimeTracingInterceptor(),
                        RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        if secret:
            interceptors.append(SuperExecAuthHttpInterceptor(
                master_secret=secret, protected_methods=patches.superexec_auth_methods()))
        self.client = RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=insecure,
            root_certificates=self.root_certificates, interceptors=interceptors,
            retry_invoker=make_simple_http_retry_invoker())
        self.fab_hash: str | None = None  # the FAB whose ClientApp is loaded here
        self.app: ClientApp | None = None
        self.tasks = 0
        self.node_states = NodeStates()
        self.current = None  # (client, context) of the task in flight, for on_exit

    # -- the loop -----------------------------------------------------------------
    def serve(self) -> None:
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        while not self.stop_event.is_set():
            res = self.client.AcquireTask(request)
            if res.HasField("task") and res.token:
                task = res.task
                if self.fab_hash is not None and task.fab_hash and task.fab_hash != self.fab_hash:
                    self._launch_process(res.token, task)
                else:
                    self.run_task(res.token, task.task_id)
                continue  # another task may be waiting: ask again at once
            self.stop_event.wait(self.poll_s)

    def _launch_process(self, token: str, task) -> None:
        log(INFO, "[fedlm warm executor] task %d is of FAB %s, not the loaded %s: "
            "a flwr-clientapp process runs it", task.task_id, task.fab_hash[:12],
            self.fab_hash[:12])
        SubprocessExecutor().launch(ExecutionSpec(
            task_type=TaskType.CLIENT_APP, runtime_api_address=self.address, token=token,
            insecure=self.insecure, root_certificates_path=self.root_certificates_path,
            runtime_dependency_install=False, parent_pid=os.getpid(), suppress_output=False,
            task_id=task.task_id, fab_hash=task.fab_hash))

    # -- one task, as flwr.supernode.runtime.run_clientapp runs it ------------------
    def run_task(self, token: str, task_id: int) -> None:
        self.tasks += 1
        log(INFO, "%s %d (#%d in pid %d)", START_MARK, task_id, self.tasks, os.getpid())
        invoker = _task_retry_invoker()
        client = RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=self.insecure,
            root_certificates=self.root_certificates,
            interceptors=[RuntimeTracingInterceptor(),
                          RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                          RuntimeTokenHttpInterceptor(token)],
            retry_invoker=invoker)
        heartbeat = HeartbeatSender(_heartbeat_fn(client, task_id))
        message: Message | None = None
        reply: Message | None = None
        context: Context | None = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        self.current = [client, None, invoker]
        times = [time.perf_counter()]
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client)
            self.current[1] = context
            app = self._client_app(run, fab)
            times.append(time.perf_counter())
            reply = app(message=message, context=self.node_states.context_for(context))
            times.append(time.perf_counter())
            sub_status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # noqa: BLE001 - Flower's error reply, as run_clientapp
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            if isinstance(ex, LoadClientAppError):
                reason = "An exception was raised when attempting to load `ClientApp`"
                code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
            details = reason
            if message:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            if self.current is not None:  # None: on_exit reported the task already
                self.current = None
                try:
                    if reply is not None and context is not None:
                        try:
                            push_message(client, reply, context)
                        except Exception as ex:  # noqa: BLE001
                            log(ERROR, "Failed to push reply message", exc_info=ex)
                    times.append(time.perf_counter())
                    push_task_output(client=client, context=context, sub_status=sub_status,
                                     details=details)
                    times.append(time.perf_counter())
                    if len(times) == 5:  # seconds: pull, ClientApp, push reply, push status
                        log(INFO, "%s %d: pull %.3f app %.3f push %.3f status %.3f", DONE_MARK,
                            task_id, *(b - a for a, b in zip(times, times[1:])))
                except Exception as ex:  # noqa: BLE001 - the next task must still run
                    log(ERROR, "Failed to finish task %d", task_id, exc_info=ex)
                finally:
                    if heartbeat.is_running:
                        heartbeat.stop()
                    client.close()

    def _client_app(self, run, fab) -> ClientApp:
        if self.app is not None and fab.hash_str == self.fab_hash:
            return self.app
        install_from_fab(fab.content, skip_prompt=True)
        app_path = get_project_dir(run.fab_id, run.fab_version, fab.hash_str)
        _forget_other_copies(app_path)
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        self.app = load(run.fab_id, run.fab_version, fab.hash_str)
        self.fab_hash = fab.hash_str
        log(INFO, "[fedlm warm executor] loaded the ClientApp of FAB %s from %s",
            fab.hash_str[:12], app_path)
        return self.app

    def on_exit(self) -> None:
        """SIGTERM/SIGINT/parent gone: report the task in flight FAILED, then close."""
        self.stop_event.set()
        current, self.current = self.current, None
        if current is not None:
            client, context, invoker = current
            invoker.max_tries = 1  # as run_clientapp's exit handler: do not block the exit
            push_task_output(client=client, context=context, sub_status=SubStatus.FAILED,
                             details="the fedlm warm executor was stopped during the task")
            client.close()
        self.client.close()


def _heartbeat_fn(client: RuntimeHttpClient, task_id: int):
    """``make_task_heartbeat_fn_http`` without its SIGINT: this process outlives the task."""
    req = SendTaskHeartbeatRequest()

    def fn() -> bool:
        try:
            res = client.SendTaskHeartbeat(req)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in (httpx.codes.SERVICE_UNAVAILABLE,
                                            httpx.codes.GATEWAY_TIMEOUT):
                return False
            log(WARNING, "[fedlm warm executor] task %d heartbeat refused (%s)", task_id, err)
            return True
        if not res.success:
            log(WARNING, "[fedlm warm executor] task %d: the SuperNode no longer accepts it",
                task_id)
        return True

    return fn


def _forget_other_copies(app_path: Path) -> None:
    """Drop already imported modules of the app's top-level packages that do not come
    from ``app_path`` (this module's own ``fedlm``, imported from the source tree), so
    the ClientApp is imported from the installed bundle, as ``flwr-clientapp`` does."""
    ref = get_project_config(app_path)["tool"]["flwr"]["app"]["components"]["clientapp"]
    top = ref.split(":", 1)[0].split(".", 1)[0]
    root = str(Path(app_path).resolve())
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        where = getattr(sys.modules[name], "__file__", None) or ""
        if not str(Path(where).resolve()).startswith(root):
            del sys.modules[name]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime-api-address", required=True)
    ap.add_argument("--superexec-auth-secret-file", default=None)
    ap.add_argument("--parent-pid", type=int, default=None)
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--root-certificates", default=None)
    args = ap.parse_args(argv)
    if not args.insecure and not args.root_certificates:
        ap.error("give --insecure or --root-certificates (the Runtime API's CA)")
    poll_s = patches.setting("WARM_EXECUTOR_POLL_S", DEFAULT_POLL_S)
    patches.check_supported("warm-executor")
    # the task is claimed while the SuperNode may still pull the message's objects:
    # retry a missing one after 20 ms, not Flower's 1 s
    log(INFO, "%s", patches.pull_backoff("flwr.supernode.runtime.run_clientapp").describe())
    secret = load_superexec_auth_secret(args.superexec_auth_secret_file)
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    executor = WarmExecutor(args.runtime_api_address, args.insecure,
                            None if args.insecure else args.root_certificates, secret, poll_s)
    register_signal_handlers(event_type=EventType.RUN_SUPEREXEC_LEAVE,
                             exit_message="fedlm warm executor stopped.",
                             exit_handlers=[executor.on_exit])
    log(INFO, "[fedlm warm executor] pid %d polls %s every %.3f s (SuperExec auth %s)",
        os.getpid(), args.runtime_api_address, poll_s, "on" if secret else "off")
    executor.serve()


if __name__ == "__main__":
    main()
