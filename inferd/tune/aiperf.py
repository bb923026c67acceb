"""NVIDIA AIPerf (genai-perf's successor, PyPI ``aiperf``) as ``inferd tune``'s load generator.

Used when asked for (``--load-generator aiperf``) and installed: the ``aiperf`` command on the
PATH, or the one ``$AIPERF`` names (it brings a large dependency tree, so it may live in a venv of
its own). Each round is one ``aiperf profile`` run, and the figures are read from the files it
writes (``profile_export_aiperf.json`` in its artifact folder), not from its console.

AIPerf (0.13) has no endpoint type for the KServe v2 protocol; it reaches ``POST
/v2/models/<name>/infer`` as a generic HTTP API:

* ``--endpoint-type raw`` posts each payload as written, to the URL as given;
* ``--custom-dataset-type inputs_json`` takes the payloads, KServe v2 JSON requests built here
  from the model's metadata and ``inferd perf``'s input options (one session per request);
* ``--extra-inputs response_field:outputs[0].name``: the raw endpoint counts a request as answered
  only when a JMESPath query finds something in the response;
* ``--use-server-token-count`` and ``--tokenizer DIR``: the raw endpoint still loads a tokenizer,
  and the built-in one downloads its vocabulary; DIR is a one-word tokenizer written here, so the
  run needs no network.

A run starts a dozen processes (about 13 s on a 2-core host before the first request), so each
round costs that on top of its warm-up (one ``-p`` window) and its measured three; a time budget
buys far fewer rounds than with ``inferd perf``'s client, which stays up between rounds.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferd._proto import model_config_pb2 as mc
from inferd.tune.host import mark, usage
from inferd.tune.rounds import Round
from inferd.tune.run import MEASURED_WINDOWS, Fleet, Loader, Target, TuneError
from inferd.tune.space import Candidate

EXPORT = "profile_export_aiperf.json"
RESPONSE_FIELD = "outputs[0].name"


def find_aiperf() -> str | None:
    """The aiperf command: ``$AIPERF`` when set, else ``aiperf`` on the PATH; None when neither."""
    named = os.environ.get("AIPERF")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("aiperf")


def kserve_request(step: dict[str, np.ndarray], datatypes: dict[str, str]) -> dict[str, Any]:
    """One KServe v2 JSON inference request body for a set of input arrays (full shapes)."""
    inputs = []
    for name, array in step.items():
        if datatypes[name] == "BYTES":
            data: list = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.flatten()]
        else:
            data = array.flatten().tolist()
        inputs.append({"name": name, "shape": [int(d) for d in array.shape], "datatype": datatypes[name], "data": data})
    return {"inputs": inputs}


def inputs_file(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """AIPerf's inputs_json dataset: one single-turn session per request body."""
    return {"data": [{"session_id": f"request-{i}", "payloads": [body]} for i, body in enumerate(requests)]}


def write_tokenizer(folder: Path) -> Path:
    """A one-word tokenizer in Hugging Face's format: what the raw endpoint insists on loading,
    without the download the built-in one needs."""
    folder.mkdir(parents=True, exist_ok=True)
    unknown = "[UNK]"
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": unknown, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {unknown: 0}, "unk_token": unknown}}))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": unknown, "model_max_length": 1_000_000}))
    return folder


def command(aiperf: str, url: str, model: str, concurrency: int, window_s: float, inputs: Path, tokenizer: Path,
            out: Path) -> list[str]:
    """The ``aiperf profile`` command line of one round: a warm-up window, then three measured."""
    return [aiperf, "profile", "-m", model, "--url", f"http://{url}/v2/models/{model}/infer",
            "--endpoint-type", "raw", "--custom-dataset-type", "inputs_json", "--input-file", str(inputs),
            "--extra-inputs", f"response_field:{RESPONSE_FIELD}", "--use-server-token-count",
            "--tokenizer", str(tokenizer), "--concurrency", str(concurrency),
            "--warmup-duration", f"{window_s:g}", "--benchmark-duration", f"{MEASURED_WINDOWS * window_s:g}",
            "--ui-type", "none", "--output-artifact-dir", str(out)]


@dataclass(frozen=True)
class AIPerfFigures:
    """What a run's ``profile_export_aiperf.json`` says of its profiling phase."""

    throughput: float  # requests/s
    p50_us: float
    p99_us: float
    requests: int
    error_rate: float  # percent of requests that failed
    duration_s: float


def parse_export(doc: dict[str, Any]) -> AIPerfFigures:
    """The figures of a ``profile_export_aiperf.json`` (latencies there are in ms); ValueError
    naming the field when one is missing."""
    def metric(name: str, stat: str) -> float:
        entry = doc.get(name)
        if not isinstance(entry, dict) or stat not in entry:
            raise ValueError(f"{EXPORT} has no {name}.{stat} (fields: {', '.join(sorted(doc))[:300]})")
        return float(entry[stat])

    unit = doc.get("request_latency", {}).get("unit", "ms")
    scale = {"ms": 1e3, "us": 1.0, "s": 1e6, "ns": 1e-3}.get(unit)
    if scale is None:
        raise ValueError(f"{EXPORT}: request_latency in unknown unit {unit!r}")
    error_rate = metric("request_error_rate", "avg") if "request_error_rate" in doc else 0.0
    return AIPerfFigures(metric("request_throughput", "avg"), metric("request_latency", "p50") * scale,
                         metric("request_latency", "p99") * scale, int(metric("request_count", "avg")), error_rate,
                         metric("benchmark_duration", "avg"))


def read_export(out: Path) -> AIPerfFigures:
    path = out / EXPORT
    if not path.is_file():
        raise FileNotFoundError(f"aiperf wrote no {EXPORT} in {out}")
    return parse_export(json.loads(path.read_text()))


class AIPerfRounds:
    """The search's ``measure`` with AIPerf as the load: one ``aiperf profile`` run per round."""

    def __init__(self, fleet: Fleet, base: mc.ModelConfig, workdir: Path) -> None:
        aiperf = find_aiperf()
        if aiperf is None:
            raise TuneError("--load-generator aiperf: the aiperf command is not installed (pip install aiperf, "
                            "or point $AIPERF at it: it has many dependencies and may live in a venv of its own)")
        self.aiperf, self.loader, self.settings = aiperf, Loader(fleet, base), fleet.settings
        self.current = self.loader.current
        self.dir = workdir
        self.tokenizer = write_tokenizer(workdir / "tokenizer")
        self.inputs: dict[str, Path] = {}
        self.count = 0

    def _inputs(self, t: Target) -> Path:
        """The requests, built once per loaded name as ``inferd perf`` would send them."""
        path = self.inputs.get(t.name)
        if path is not None:
            return path
        from inferd.perf import PerfError, parse_options
        from inferd.perf.inputs import ServerClient, build_inputs

        options = parse_options(["-m", t.name, "-u", t.grpc_url, *self.settings.perf_args])
        client = ServerClient(t.grpc_url, options.connect_timeout)
        try:
            model = client.model_info(t.name, "")
            steps = build_inputs(model, options)
        except PerfError as exc:
            raise TuneError(f"the requests for model '{self.settings.model}' cannot be built: {exc}") from None
        finally:
            client.close()
        datatypes = {i.name: i.datatype for i in model.inputs}
        path = self.dir / f"inputs-{t.name}.json"
        path.write_text(json.dumps(inputs_file([kserve_request(step, datatypes) for step in steps])))
        self.inputs[t.name] = path
        return path

    def __call__(self, candidate: Candidate, level: float) -> Round:
        t = self.loader.place(candidate)
        if isinstance(t, str):
            return Round(candidate, level, 0.0, 0.0, 0.0, error=t)
        inputs = self._inputs(t)
        self.count += 1
        out = self.dir / f"round-{self.count:04d}"
        argv = command(self.aiperf, t.load_url, t.name, int(level), self.settings.window_ms / 1000, inputs,
                       self.tokenizer, out)
        stats = _Statistics(t)
        before, count0, cpu0 = mark(t.pid), stats.inferences(), _children_cpu()
        with open(self.dir / "aiperf.log", "ab") as log:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=600)
        after, count1, cpu1 = mark(t.pid), stats.inferences(), _children_cpu()
        try:
            figures = read_export(out)
        except (FileNotFoundError, ValueError) as exc:
            error = f"aiperf exited {proc.returncode}: {exc} (its log: {self.dir / 'aiperf.log'})"
            if candidate == self.current:
                raise TuneError(f"the load generator cannot measure model '{self.settings.model}': {error}") from None
            return Round(candidate, level, 0.0, 0.0, 0.0, error=error, wall_s=after.t - before.t)
        u = usage(before, after, cpu1 - cpu0)
        inferences = count1 - count0
        cpu_us = u.server_s / inferences * 1e6 if u.server_s is not None and inferences > 0 else None
        error = "" if figures.error_rate < 100 else "no request succeeded"
        return Round(candidate, level, figures.throughput, figures.p50_us, figures.p99_us, cpu_us, u.others_cores,
                     cpu1 - cpu0, u.seconds, u.rss_mib, error)

    def close(self) -> None:
        self.loader.restore()


class _Statistics:
    """The server's inference count for one loaded name (ModelStatistics over gRPC)."""

    def __init__(self, t: Target) -> None:
        self.t = t

    def inferences(self) -> int:
        from inferd.perf.inputs import ServerClient

        client = ServerClient(self.t.grpc_url, 10.0)
        try:
            return client.statistics(self.t.name, "")["inference_count"]
        finally:
            client.close()


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

