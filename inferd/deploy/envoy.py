"""An Envoy configuration that balances inferd replicas (plain data in, a config dict out).

One listener per protocol: gRPC (HTTP/2 to the replicas, actively health-checked with
``grpc.health.v1`` for ``inference.GRPCInferenceService``) and, optionally, HTTP/REST
(HTTP/1.1, checked on ``/v2/health/ready``). Both clusters balance with LEAST_REQUEST
(two random choices, the one with fewer active requests wins), which suits a server
whose requests vary in cost far better than round robin.

What a request may be retried on is chosen so that nothing a replica accepted runs
twice: a connection that could not be made or closed before the request was sent on
it, a stream the replica refused before reading it (HTTP/2 REFUSED_STREAM, a GOAWAY),
or the replica's own UNAVAILABLE / 503, which inferd answers only for work it did not
start (draining, queue full, model unloading), and a CANCELLED the replica itself sent
(grpc-core's shutdown, see GRPC_RETRY). A request reset while a replica was working on
it (the replica died) is *not* retried: it fails with UNAVAILABLE and the client
decides. Retries go to another host (``previous_hosts``) and are capped by a retry
budget so that a failing fleet is not hit twice as hard. Panic routing is off: Envoy
never sends traffic to a host its health check removed, even when most of them are
down; a replica that refuses a connection is ejected at once rather than at the next
health check.

``python -m inferd.deploy.envoy --grpc HOST:PORT ... [--http HOST:PORT ...]`` prints the
configuration as YAML; with ``--dns`` each HOST is a DNS name resolving to all the replicas
(a Kubernetes headless Service), re-resolved as pods come and go.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from inferd.frontends.grpc_health import INFERENCE_SERVICE  # the service name inferd's grpc.health.v1 answers for

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
DOWNSTREAM_CONNECTIONS = ("type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                          "DownstreamConnectionsConfig")
FILE_ACCESS_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
ACCESS_LOG_FORMAT = ("[%START_TIME%] %REQ(:PATH)% %RESPONSE_CODE% grpc=%GRPC_STATUS% flags=%RESPONSE_FLAGS% "
                     "upstream=%UPSTREAM_HOST% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% hosts=%UPSTREAM_HOSTS_ATTEMPTED% "
                     "reason=%UPSTREAM_TRANSPORT_FAILURE_REASON% details=%RESPONSE_CODE_DETAILS% %DURATION%ms\n")
PREVIOUS_HOSTS = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
GRPC_CLUSTER = "inferd_grpc"
HTTP_CLUSTER = "inferd_http"

Backend = tuple[str, int]  # (host, port)
# Only what a replica never started (see the module docstring): inferd answers UNAVAILABLE
# (gRPC) and 503 (HTTP) for work it refused, never for work it began. CANCELLED from a
# replica (not a reset) comes from grpc-core's shutdown: a call that had arrived but was
# not yet handed to a handler when the server stopped is ended CANCELLED (grpc/grpc#41785);
# a client that cancels resets its stream, so Envoy has nobody to retry for.
# reset-before-request: a request Envoy put on a connection that closed before the request's
# headers went out (a replica killed a moment ago, its close not yet read) never reached it.
GRPC_RETRY = {"retry_on": "connect-failure,reset-before-request,refused-stream,unavailable,cancelled"}
HTTP_RETRY = {"retry_on": "connect-failure,reset-before-request,refused-stream,retriable-status-codes",
              "retriable_status_codes": [503]}


@dataclass(frozen=True)
class EnvoyOptions:
    """Listener addresses and how quickly a dead or draining replica leaves the pool.

    A host is removed after ``unhealthy_threshold`` failed checks ``interval_s`` apart
    (a refused connection counts at once) and readmitted after ``healthy_threshold``
    passing ones. Port 0 lets the system pick; read the bound port from the admin API.
    """

    listen_address: str = "0.0.0.0"
    grpc_port: int = 8001
    http_port: int = 8000
    admin_address: str = "127.0.0.1"
    admin_port: int = 9901
    interval_s: float = 1.0
    timeout_s: float = 1.0
    unhealthy_threshold: int = 2
    healthy_threshold: int = 1
    connect_timeout_s: float = 1.0
    num_retries: int = 2
    retry_budget_percent: float = 25.0
    min_retry_concurrency: int = 16
    dns_refresh_s: float = 5.0
    ejection_s: float = 5.0  # a replica that refused a connection is left out this long (then checked)
    max_downstream_connections: int = 50000
    access_log: str | None = None  # a file for one line per request (response flags, upstream, status)

    def __post_init__(self) -> None:
        for name in ("interval_s", "timeout_s", "connect_timeout_s", "dns_refresh_s", "ejection_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EnvoyOptions.{name} must be > 0, got {getattr(self, name)}")
        for name in ("unhealthy_threshold", "healthy_threshold"):
            if getattr(self, name) < 1:
                raise ValueError(f"EnvoyOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_retries < 0:
            raise ValueError(f"EnvoyOptions.num_retries must be >= 0, got {self.num_retries}")
        for name in ("grpc_port", "http_port", "admin_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ValueError(f"EnvoyOptions.{name} must be in 0..65535, got {getattr(self, name)}")


def _seconds(value: float) -> str:
    return f"{value:.3f}s"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _route(cluster: str, retry: dict[str, Any], options: EnvoyOptions, grpc: bool) -> dict[str, Any]:
    route: dict[str, Any] = {
        "cluster": cluster,
        "timeout": "0s",  # no route timeout: streams and long requests run as long as the client allows
        "retry_policy": {
            **retry,
            "num_retries": options.num_retries,
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                      "typed_config": {"@type": PREVIOUS_HOSTS}}],
            # A replica whose port just closed fails fast, so it has the fewest active requests
            # and least-request's two choices pick it 3 times in 4 with two replicas; five
            # re-picks still sent ~0.5% of the requests of a 1 s drain window back to it
            # (bench/RESULTS.md, replicas), ten sent none in the runs here.
            "host_selection_retry_max_attempts": 10,
        },
    }
    if grpc:
        route["max_stream_duration"] = {"grpc_timeout_header_max": "0s"}  # honour the client's grpc-timeout
    return route


def _listener(name: str, port: int, cluster: str, retry: dict[str, Any], options: EnvoyOptions,
              grpc: bool) -> dict[str, Any]:
    manager: dict[str, Any] = {
        "@type": HCM,
        "stat_prefix": name,
        "codec_type": "AUTO",  # gRPC clients speak HTTP/2 without TLS (h2c); AUTO recognises its preface
        "route_config": {"name": name, "virtual_hosts": [{
            "name": name, "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": _route(cluster, retry, options, grpc)}],
        }]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    if options.access_log:
        manager["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": FILE_ACCESS_LOG, "path": options.access_log,
            "log_format": {"text_format_source": {"inline_string": ACCESS_LOG_FORMAT}}}}]
    return {
        "name": name,
        "address": _address(options.listen_address, port),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }


def _cluster(name: str, backends: list[Backend], health: dict[str, Any], http2: bool,
             options: EnvoyOptions, dns: bool) -> dict[str, Any]:
    protocol: dict[str, Any] = {"http2_protocol_options": {}} if http2 else {"http_protocol_options": {}}
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connect_timeout": _seconds(options.connect_timeout_s),
        "lb_policy": "LEAST_REQUEST",
        "common_lb_config": {"healthy_panic_threshold": {"value": 0.0}},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS, "explicit_http_config": protocol}},
        # A replica whose port just closed fails connections at once, so it has the fewest
        # active requests and least-request keeps choosing it: eject it on its first refused
        # connection instead of waiting for the next health check.
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "enforcing_consecutive_local_origin_failure": 100,
            "enforcing_consecutive_5xx": 0,  # a 503 is inferd shedding load, not a broken replica
            "interval": _seconds(options.interval_s),
            "base_ejection_time": _seconds(options.ejection_s),
            "max_ejection_percent": 50,
        },
        "circuit_breakers": {"thresholds": [{
            "priority": "DEFAULT",
            "retry_budget": {"budget_percent": {"value": options.retry_budget_percent},
                             "min_retry_concurrency": options.min_retry_concurrency},
        }]},
        "health_checks": [{
            "timeout": _seconds(options.timeout_s),
            "interval": _seconds(options.interval_s),
            # Envoy's default checks a cluster without traffic only once a minute: a replica
            # that died while idle would still get the first requests after it.
            "no_traffic_interval": _seconds(options.interval_s),
            "unhealthy_threshold": options.unhealthy_threshold,
            "healthy_threshold": options.healthy_threshold,
            **health,
        }],
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _address(host, port)}} for host, port in backends]}]},
    }
    if dns:
        cluster["dns_refresh_rate"] = _seconds(options.dns_refresh_s)
        cluster["respect_dns_ttl"] = False
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    return cluster


def envoy_config(grpc_backends: list[Backend], http_backends: list[Backend] | None = None,
                 options: EnvoyOptions | None = None, dns: bool = False) -> dict[str, Any]:
    """The bootstrap configuration for Envoy in front of ``grpc_backends`` (and ``http_backends``).

    ``dns``: each backend host is a DNS name whose addresses are all replicas (STRICT_DNS),
    as a Kubernetes headless Service gives; otherwise each backend is one replica's address.
    """
    options = options or EnvoyOptions()
    if not grpc_backends:
        raise ValueError("envoy_config: at least one gRPC backend is needed, got none")
    listeners = [_listener("grpc", options.grpc_port, GRPC_CLUSTER, GRPC_RETRY, options, grpc=True)]
    clusters = [_cluster(GRPC_CLUSTER, grpc_backends, {"grpc_health_check": {"service_name": INFERENCE_SERVICE}},
                         True, options, dns)]
    if http_backends:
        listeners.append(_listener("http", options.http_port, HTTP_CLUSTER, HTTP_RETRY, options, grpc=False))
        clusters.append(_cluster(HTTP_CLUSTER, http_backends, {"http_health_check": {"path": "/v2/health/ready"}},
                                 False, options, dns))
    return {
        "admin": {"address": _address(options.admin_address, options.admin_port)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {"@type": DOWNSTREAM_CONNECTIONS,
                             "max_active_downstream_connections": options.max_downstream_connections}}]},
    }


def _backend(text: str) -> Backend:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got '{text}'")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inferd.deploy.envoy",
                                description="Print an Envoy configuration balancing inferd replicas.")
    p.add_argument("--grpc", type=_backend, action="append", required=True, metavar="HOST:PORT",
                   help="a replica's gRPC address (repeatable); with --dns, a name resolving to all of them")
    p.add_argument("--http", type=_backend, action="append", default=[], metavar="HOST:PORT",
                   help="a replica's HTTP/REST address (repeatable)")
    p.add_argument("--dns", action="store_true", help="the hosts are DNS names of all replicas (STRICT_DNS)")
    p.add_argument("--listen-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--admin-port", type=int, default=9901)
    p.add_argument("--health-interval-s", type=float, default=1.0)
    args = p.parse_args(argv)
    try:
        options = EnvoyOptions(listen_address=args.listen_address, grpc_port=args.grpc_port,
                               http_port=args.http_port, admin_port=args.admin_port,
                               interval_s=args.health_interval_s)
    except ValueError as exc:
        p.error(str(exc))
    config = envoy_config(args.grpc, args.http, options, dns=args.dns)
    try:
        import yaml
    except ImportError:  # JSON is YAML too
        json.dump(config, sys.stdout, indent=2)
        print()
        return 0
    yaml.safe_dump(config, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
