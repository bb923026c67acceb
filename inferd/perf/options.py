"""The ``inferd perf`` command line: parser, range/shape syntax and the entry point."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path


HTTP_REQUIREMENT = "aiohttp>=3.9"  # -i http's client (tritonclient[http] brings it too)

# Closed loop: one worker process per this many slots by default. perf_analyzer drives each slot
# from its own thread; one Python event loop driving 16 is one schedulable thread against the
# server's and every other process's, and on a busy host it is starved of CPU and sends late.
SLOTS_PER_WORKER = 4
MAX_AUTO_WORKERS = 8


def default_workers(mode: str, levels: list) -> int:
    if mode != "concurrency":
        return 1
    return min(MAX_AUTO_WORKERS, -(-max(int(v) for v in levels) // SLOTS_PER_WORKER))


# What each protocol can do: the --help epilog, and the rule PerfOptions.from_args applies.
PROTOCOL_SUPPORT = """\
what each protocol (-i) supports:
  grpc  everything here: --streaming, --shared-memory system|cuda, sequences, -H (as metadata),
        --ssl-grpc-* (TLS and mutual TLS), --input-data, --request-intervals
  http  all but --streaming (HTTP has no stream, perf_analyzer's neither): --shared-memory
        system|cuda, sequences, -H, --ssl-https-*, --input-data, --request-intervals
The --ssl-grpc-* options belong to -i grpc and --ssl-https-* to -i http (give an https:// URL
or any --ssl-https-* option for TLS); giving the other protocol's is an error."""
RESERVED_HEADERS = {"content-type", "content-length", "te", "host", "user-agent", "inference-header-content-length"}


class PerfError(Exception):
    """An error reported to the user as one line, without a traceback (exit status 1)."""


# --------------------------------------------------------------------------- value syntax


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got '{text}'") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def parse_header(text: str) -> tuple[str, str]:
    """``-H 'Name: value'`` -> (name, value) as perf_analyzer takes it; names are lower-cased
    (gRPC metadata keys must be)."""
    name, sep, value = text.partition(":")
    name = name.strip().lower()
    if not sep or not name or any(c.isspace() for c in name):
        raise argparse.ArgumentTypeError(f"bad header '{text}': expected NAME:VALUE (e.g. -H 'x-tenant: a')")
    if name.endswith("-bin") or name.startswith("grpc-") or name in RESERVED_HEADERS:
        raise argparse.ArgumentTypeError(
            f"bad header '{text}': '{name}' is set by the transport itself; choose another name")
    return name, value.strip()


def parse_sequence_id_range(text: str) -> tuple[int, int | None]:
    """``START[:END]`` -> (START, END or None); ids START <= id < END."""
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad sequence id range '{text}': expected START or START:END integers") \
            from None
    if len(values) > 2 or values[0] < 1:
        raise argparse.ArgumentTypeError(f"bad sequence id range '{text}': expected START[:END] with START >= 1")
    if len(values) == 2 and values[1] <= values[0]:
        raise argparse.ArgumentTypeError(f"bad sequence id range '{text}': END {values[1]} must be above START {values[0]}")
    return values[0], values[1] if len(values) == 2 else None


def _split_range(text: str, what: str) -> list[str]:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(
            f"bad {what} range '{text}': expected START, START:END or START:END:STEP"
        )
    return [p.strip() for p in parts]


def parse_concurrency_range(text: str) -> list[int]:
    """``start[:end[:step]]`` -> the concurrency levels, e.g. ``1:8:2`` -> [1, 3, 5, 7]."""
    parts = _split_range(text, "concurrency")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad concurrency range '{text}': START, END and STEP must be integers"
        ) from None
    start, end, step = values[0], values[1] if len(values) > 1 else values[0], values[2] if len(values) > 2 else 1
    if start < 1:
        raise argparse.ArgumentTypeError(f"bad concurrency range '{text}': START must be >= 1, got {start}")
    if end < start:
        raise argparse.ArgumentTypeError(f"bad concurrency range '{text}': END {end} is below START {start}")
    if step < 1:
        raise argparse.ArgumentTypeError(f"bad concurrency range '{text}': STEP must be >= 1, got {step}")
    return list(range(start, end + 1, step))


def parse_rate_range(text: str) -> list[float]:
    """``start[:end[:step]]`` in requests/second, e.g. ``100:400:100`` -> [100, 200, 300, 400]."""
    parts = _split_range(text, "request rate")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad request rate range '{text}': START, END and STEP must be numbers"
        ) from None
    start, end, step = values[0], values[1] if len(values) > 1 else values[0], values[2] if len(values) > 2 else 1.0
    if not start > 0 or start == float("inf"):
        raise argparse.ArgumentTypeError(f"bad request rate range '{text}': START must be > 0, got {parts[0]}")
    if end < start:
        raise argparse.ArgumentTypeError(f"bad request rate range '{text}': END {parts[1]} is below START {parts[0]}")
    if not step > 0:
        raise argparse.ArgumentTypeError(f"bad request rate range '{text}': STEP must be > 0, got {parts[2]}")
    levels, k = [], 0
    while True:
        value = start + k * step
        if value > end * (1 + 1e-9):
            break
        levels.append(round(value, 9))
        k += 1
        if k > 10_000:
            raise argparse.ArgumentTypeError(f"bad request rate range '{text}': more than 10000 levels")
    return levels


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:d1,d2`` -> (NAME, (d1, d2)); the dims exclude the batch dimension."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"bad shape '{text}': expected NAME:d1,d2,... (e.g. INPUT0:3,224,224)")
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad shape '{text}': dimensions must be integers separated by commas"
        ) from None
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"bad shape '{text}': dimensions must be >= 1")
    return name, shape


# --------------------------------------------------------------------------- the parser


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "perf",
        help="measure a model's throughput and latency over gRPC or HTTP (perf_analyzer's flags)",
        description=(
            "Load a model on a KServe v2 / Triton server and report throughput, latency "
            "percentiles and the server-side time split per load level. Options follow Triton's "
            "perf_analyzer where they overlap."
        ),
        epilog=PROTOCOL_SUPPORT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model-name", dest="model", required=True, help="model to load")
    p.add_argument("-x", "--model-version", dest="model_version", default="",
                   help="model version (default: the server's choice)")
    p.add_argument("-u", "--url", default=None,
                   help="server HOST:PORT (default localhost:8001 for grpc, localhost:8000 for http)")
    p.add_argument("-i", "--protocol", default="grpc", choices=["grpc", "http"],
                   help="grpc (ModelInfer) or http (KServe v2 REST with binary tensor data); default grpc")
    p.add_argument("-b", "--batch-size", type=_positive_int, default=1,
                   help="rows per request (the model's batch dimension; default 1)")

    load = p.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--concurrency-range", type=parse_concurrency_range, metavar="START:END:STEP",
                      help="closed loop: this many requests in flight (default 1)")
    mode.add_argument("--request-rate-range", type=parse_rate_range, metavar="START:END:STEP",
                      help="open loop: send at this many requests/second, whatever the responses")
    mode.add_argument("--request-intervals", metavar="FILE",
                      help="open loop: the gaps between sends, in microseconds, one per line, "
                           "repeated when the file is used up (perf_analyzer's custom intervals)")
    load.add_argument("--request-distribution", choices=["constant", "poisson"], default="constant",
                      help="open loop: gaps between sends (default constant)")
    load.add_argument("--workers", type=_positive_int, default=None,
                      help="load-generating processes (default: closed loop, one per "
                           f"{SLOTS_PER_WORKER} slots of the highest concurrency, at most {MAX_AUTO_WORKERS}; "
                           "open loop, 1)")
    load.add_argument("--max-inflight", type=_positive_int, default=1024,
                      help="open loop: at most this many requests in flight per worker (default 1024)")
    load.add_argument("--priority", type=_nonneg_int, default=None,
                      help="send the 'priority' request parameter (1 is the highest level)")
    load.add_argument("--request-timeout-us", type=_nonneg_int, default=None,
                      help="send the 'timeout' request parameter (server-side queue timeout, microseconds)")
    load.add_argument("--seed", type=int, default=0, help="seed for random input data and Poisson gaps")

    data = p.add_argument_group("input data")
    data.add_argument("--input-data", default="random",
                      help="random | zero | FILE.json (perf_analyzer's {\"data\": [...]}) | FILE.npz "
                           "(one array per input); default random")
    data.add_argument("--shape", action="append", type=parse_shape, default=[], metavar="NAME:D1,D2",
                      help="shape of an input with variable dimensions, without the batch dimension (repeatable)")
    data.add_argument("--string-length", type=_positive_int, default=128,
                      help="length of random BYTES elements (default 128)")

    meas = p.add_argument_group("measurement")
    meas.add_argument("-p", "--measurement-interval", type=_positive_int, default=5000, metavar="MS",
                      help="measurement window in milliseconds (default 5000)")
    meas.add_argument("-s", "--stability-percentage", type=_positive_float, default=10.0,
                      help="throughput and average latency of the last 3 windows must be within this "
                           "percentage of each other (default 10)")
    meas.add_argument("-r", "--max-trials", type=_positive_int, default=10,
                      help="at most this many windows per load level (default 10)")
    meas.add_argument("--request-count", type=_positive_int, default=None,
                      help="instead of time windows: send exactly N requests per load level and measure them all")
    meas.add_argument("--connect-timeout", type=_positive_float, default=10.0,
                      help="seconds to wait for the server's first answers (default 10)")

    seq = p.add_argument_group("sequences (models with sequence_batching; found from the model's config)")
    seq.add_argument("--sequence-length", type=_positive_int, default=20,
                     help="requests per sequence (default 20), varied by --sequence-length-variation")
    seq.add_argument("--sequence-length-variation", type=_nonneg_float, default=20.0, metavar="PCT",
                     help="each sequence's length is drawn within this percentage of --sequence-length (default 20)")
    seq.add_argument("--sequence-id-range", type=parse_sequence_id_range, default=None, metavar="START[:END]",
                     help="sequence ids to use, START up to END exclusive, reused in turn "
                          "(default 1 and up, unbounded)")
    seq.add_argument("--num-of-sequences", type=_positive_int, default=4,
                     help="open loop: sequences in progress at once (default 4); closed loop: one per slot")

    conn = p.add_argument_group("connection")
    conn.add_argument("--streaming", action="store_true",
                      help="gRPC only: send over ModelStreamInfer, one stream per slot (closed loop) or "
                           "per worker (open loop)")
    conn.add_argument("-H", dest="headers", action="append", type=parse_header, default=[], metavar="NAME:VALUE",
                      help="a header on every request (gRPC metadata or HTTP header); repeatable")
    conn.add_argument("--shared-memory", choices=["none", "system", "cuda"], default="none",
                      help="inputs and outputs through shared memory regions registered with the server "
                           "(the server must share the host; cuda needs a CUDA device and cuda-python); default none")
    conn.add_argument("--output-shared-memory-size", type=_positive_int, default=102400, metavar="BYTES",
                      help="bytes of the region each output is written to with --shared-memory (default 102400)")
    conn.add_argument("--ssl-grpc-use-ssl", action="store_true", help="gRPC over TLS")
    conn.add_argument("--ssl-grpc-root-certifications-file", metavar="FILE",
                      help="gRPC TLS: PEM root certificates to trust (default: the system's)")
    conn.add_argument("--ssl-grpc-private-key-file", metavar="FILE", help="gRPC mutual TLS: the client's PEM key")
    conn.add_argument("--ssl-grpc-certificate-chain-file", metavar="FILE",
                      help="gRPC mutual TLS: the client's PEM certificate chain")
    conn.add_argument("--ssl-https-verify-peer", type=int, choices=[0, 1], default=1,
                      help="HTTPS: check the server's certificate (default 1)")
    conn.add_argument("--ssl-https-verify-host", type=int, choices=[0, 1, 2], default=2,
                      help="HTTPS: check that the certificate names the host (1 and 2 both check; default 2)")
    conn.add_argument("--ssl-https-ca-certificates-file", metavar="FILE",
                      help="HTTPS: CA certificates to trust (PEM; default: the system's)")
    conn.add_argument("--ssl-https-client-certificate-file", metavar="FILE", help="HTTPS mutual TLS: client certificate")
    conn.add_argument("--ssl-https-client-certificate-type", choices=["PEM", "DER"], default="PEM",
                      help="HTTPS: the client certificate's format (default PEM)")
    conn.add_argument("--ssl-https-private-key-file", metavar="FILE", help="HTTPS mutual TLS: client private key")
    conn.add_argument("--ssl-https-private-key-type", choices=["PEM", "DER"], default="PEM",
                      help="HTTPS: the private key's format (default PEM)")

    out = p.add_argument_group("output")
    out.add_argument("-f", "--latency-report-file", dest="csv", default=None, metavar="FILE.csv",
                     help="write perf_analyzer's CSV (same header and columns)")
    out.add_argument("--verbose-csv", action="store_true",
                     help="add perf_analyzer's --verbose-csv columns (Avg latency, request/response, response wait)")
    out.add_argument("--json", default=None, metavar="FILE.json", help="write all results as JSON")
    out.add_argument("--plot", default=None, metavar="FILE.png",
                     help="plot throughput vs latency and latency percentiles per level (needs matplotlib)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


PLOT_REQUIREMENT = "matplotlib>=3.8"  # the perf extra in pyproject.toml


@dataclass(frozen=True)
class TlsOptions:
    """TLS for the load and the control calls: gRPC's three PEM files, or HTTPS's checks and files."""

    protocol: str  # "grpc" | "http"
    root_certificates: str | None = None  # gRPC root certs / HTTPS CA file
    private_key: str | None = None
    certificate_chain: str | None = None  # gRPC chain / HTTPS client certificate
    certificate_type: str = "PEM"  # HTTPS only
    private_key_type: str = "PEM"  # HTTPS only
    verify_peer: bool = True  # HTTPS only
    verify_host: bool = True  # HTTPS only

    def __post_init__(self) -> None:
        for what, path in (("root certificates", self.root_certificates), ("private key", self.private_key),
                           ("certificate", self.certificate_chain)):
            if path is not None and not Path(path).is_file():
                raise PerfError(f"TLS {what} file '{path}' does not exist")
        if (self.private_key is None) != (self.certificate_chain is None):
            raise PerfError("mutual TLS needs both the client's certificate and its private key "
                            "(--ssl-grpc-certificate-chain-file with --ssl-grpc-private-key-file, or "
                            "--ssl-https-client-certificate-file with --ssl-https-private-key-file)")


@dataclass(frozen=True)
class SequenceOptions:
    """How requests to a model with sequence_batching are grouped (perf_analyzer's defaults)."""

    length: int = 20
    variation_pct: float = 20.0
    id_start: int = 1
    id_end: int | None = None  # exclusive; None: unbounded
    count: int = 4  # open loop: sequences in progress at once


@dataclass
class PerfOptions:
    """Validated settings (built from the parsed arguments)."""

    model: str
    version: str
    url: str
    protocol: str  # "grpc" | "http"
    batch_size: int
    mode: str  # "concurrency" | "request_rate"
    levels: list
    distribution: str
    workers: int
    max_inflight: int
    priority: int | None
    timeout_us: int | None
    seed: int
    input_data: str
    shapes: dict[str, tuple[int, ...]]
    string_length: int
    interval_ms: int
    stability_pct: float
    max_trials: int
    request_count: int | None
    connect_timeout: float
    csv: str | None
    verbose_csv: bool
    json: str | None
    plot: str | None
    quiet: bool
    headers: list[tuple[str, str]] = field(default_factory=list)
    streaming: bool = False
    shared_memory: str = "none"  # "none" | "system" | "cuda"
    output_shm_size: int = 102400
    tls: TlsOptions | None = None
    sequence: SequenceOptions = field(default_factory=SequenceOptions)
    intervals_us: list[int] | None = None  # --request-intervals: the open-loop gaps

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "PerfOptions":
        if args.streaming and args.protocol != "grpc":
            raise PerfError("--streaming is gRPC only (ModelStreamInfer); HTTP has no streaming inference: "
                            "drop --streaming or use -i grpc")
        shapes: dict[str, tuple[int, ...]] = {}
        for name, dims in args.shape:
            if name in shapes and shapes[name] != dims:
                raise PerfError(f"--shape given twice for input '{name}' with different dimensions")
            shapes[name] = dims
        intervals = None
        if args.request_intervals is not None:
            intervals = read_intervals(args.request_intervals)
            mode, levels = "request_rate", [round(1e6 * len(intervals) / sum(intervals), 6)]
        elif args.request_rate_range is not None:
            mode, levels = "request_rate", args.request_rate_range
        else:
            mode, levels = "concurrency", args.concurrency_range or [1]
        return cls(
            model=args.model, version=args.model_version, protocol=args.protocol,
            url=args.url or ("localhost:8000" if args.protocol == "http" else "localhost:8001"),
            batch_size=args.batch_size,
            mode=mode, levels=levels, distribution=args.request_distribution,
            workers=args.workers or default_workers(mode, levels),
            max_inflight=args.max_inflight, priority=args.priority, timeout_us=args.request_timeout_us,
            seed=args.seed, input_data=args.input_data, shapes=shapes, string_length=args.string_length,
            interval_ms=args.measurement_interval, stability_pct=args.stability_percentage,
            max_trials=args.max_trials, request_count=args.request_count,
            connect_timeout=args.connect_timeout, csv=args.csv, verbose_csv=args.verbose_csv,
            json=args.json, plot=args.plot, quiet=args.quiet,
            headers=args.headers, streaming=args.streaming, shared_memory=args.shared_memory,
            output_shm_size=args.output_shared_memory_size, tls=_tls(args), intervals_us=intervals,
            sequence=SequenceOptions(args.sequence_length, args.sequence_length_variation,
                                     *(args.sequence_id_range or (1, None)), args.num_of_sequences),
        )


def read_intervals(path: str) -> list[int]:
    """--request-intervals FILE: positive microseconds, one per line (blank lines skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise PerfError(f"--request-intervals {path}: cannot read it: {exc.strerror or exc}") from None
    values = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = int(line.strip())
        except ValueError:
            raise PerfError(f"--request-intervals {path} line {n}: '{line.strip()}' is not an integer "
                            "number of microseconds") from None
        if value < 1:
            raise PerfError(f"--request-intervals {path} line {n}: {value} us; intervals must be >= 1 us")
        values.append(value)
    if not values:
        raise PerfError(f"--request-intervals {path}: the file has no intervals (one microsecond count per line)")
    return values


def _tls(args: argparse.Namespace) -> TlsOptions | None:
    grpc_given = [f"--ssl-grpc-{k.replace('_', '-')}" for k in
                  ("root_certifications_file", "private_key_file", "certificate_chain_file")
                  if getattr(args, f"ssl_grpc_{k}") is not None] + (["--ssl-grpc-use-ssl"] if args.ssl_grpc_use_ssl else [])
    https = {k: getattr(args, f"ssl_https_{k}") for k in
             ("ca_certificates_file", "client_certificate_file", "private_key_file")}
    https_given = [f"--ssl-https-{k.replace('_', '-')}" for k, v in https.items() if v is not None]
    https_given += [f"--ssl-https-{k.replace('_', '-')}" for k, default in
                    (("verify_peer", 1), ("verify_host", 2), ("client_certificate_type", "PEM"),
                     ("private_key_type", "PEM")) if getattr(args, f"ssl_https_{k}") != default]
    if args.protocol == "grpc":
        if https_given:
            raise PerfError(f"{', '.join(https_given)}: HTTPS options, but -i is grpc; use --ssl-grpc-* for gRPC")
        if not grpc_given:
            return None
        return TlsOptions("grpc", args.ssl_grpc_root_certifications_file, args.ssl_grpc_private_key_file,
                          args.ssl_grpc_certificate_chain_file)
    if grpc_given:
        raise PerfError(f"{', '.join(grpc_given)}: gRPC options, but -i is http; use --ssl-https-* for HTTPS")
    if not https_given and not (args.url or "").startswith("https://"):
        return None
    return TlsOptions("http", https["ca_certificates_file"], https["private_key_file"], https["client_certificate_file"],
                      args.ssl_https_client_certificate_type, args.ssl_https_private_key_type,
                      bool(args.ssl_https_verify_peer), bool(args.ssl_https_verify_host))


def parse_options(argv: list[str]) -> PerfOptions:
    """``inferd perf``'s arguments (without the word ``perf``) -> validated options, for callers
    that measure from code (``inferd tune``, the benchmark suite); argparse exits on bad syntax."""
    parser = argparse.ArgumentParser(prog="inferd")
    add_parser(parser.add_subparsers(dest="command"))
    return PerfOptions.from_args(parser.parse_args(["perf", *argv]))
