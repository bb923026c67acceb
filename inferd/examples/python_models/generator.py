"""A Triton Python model that generates text: a two-layer GRU language model over bytes.

Input ``PROMPT`` (TYPE_STRING, dims [1]); outputs, one response per generated
byte: ``TOKEN`` (TYPE_INT32, dims [1], the byte's value) and ``TEXT``
(TYPE_STRING, dims [1], the byte itself). Decoding is greedy, so a prompt
always gives the same text, unless the request asks for sampling (parameters
``temperature`` > 0, ``top_p``, ``seed``: the iterative model only). Generation stops at the end byte (0, not sent),
after the config's ``max_new_tokens`` bytes, or after the request's
``max_tokens``. The weights (``weights.npz`` next to this file) are random,
from a fixed seed (:mod:`inferd.examples.generator_assets`): the text is not English,
but it is a real autoregressive model with the cost profile of one: each step
reads every weight once, whatever the number of rows.

The model runs in either of two ways, chosen by its config:

- ``sequence_batching { iterative_sequence: true }`` (continuous batching):
  ``execute`` is one step. A request's first step (flag START) reads its
  prompt; each step sends one byte, keeps the GRU's hidden state and the last
  byte in the implicit state (``HIDDEN``, ``LAST``: the scheduler feeds them
  back, so this code keeps nothing between steps) and releases the request
  with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` to be stepped again, or
  sends the final flag when it is done.
- otherwise (request-level batching, or none): ``execute`` generates every
  request of its batch to the end, stepping the batch until its longest
  request ends: every row at every step (static batching, finished rows as
  padding), or with parameter ``request_batching: compact`` only the rows
  still going.
"""

import json
from pathlib import Path

import numpy as np
import torch

import triton_python_backend_utils as pb_utils

BOS, EOS = 1, 0
START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START


class ByteGRU(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        embed = weights["embed"]
        layers = int(weights["layers"])
        hidden = weights["w_hh_0"].shape[1]
        self.embed = torch.nn.Embedding.from_pretrained(torch.from_numpy(embed))
        self.gru = torch.nn.GRU(embed.shape[1], hidden, num_layers=layers)
        for i in range(layers):
            for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
                getattr(self.gru, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l{i}").data = (
                    torch.from_numpy(weights[f"{name}_{i}"]))
        self.head = torch.nn.Linear(hidden, embed.shape[0])
        self.head.weight.data = torch.from_numpy(weights["head_w"])
        self.head.bias.data = torch.from_numpy(weights["head_b"])
        self.layers, self.hidden = layers, hidden

    def prefill(self, prompt, sampling=None, count=0):
        """The hidden state after BOS + prompt [layers, hidden], and the first byte."""
        ids = torch.tensor([BOS] + list(prompt), dtype=torch.long)
        out, h = self.gru(self.embed(ids)[:, None, :])
        logits = self.head(out[-1, 0])
        return h[:, 0, :], _choose(logits, sampling, count) if sampling else int(logits.argmax())

    def decode(self, tokens, hidden, sampling=None, counts=None):
        """One step for B rows: tokens [B], hidden [layers, B, hidden] -> next bytes [B], new hidden.
        ``sampling``: per row, None (greedy) or its (temperature, top_p, seed)."""
        out, h = self.gru(self.embed(tokens)[None, :, :], hidden)
        logits = self.head(out[0])
        chosen = logits.argmax(-1)
        for row, params in enumerate(sampling or ()):
            if params:
                chosen[row] = _choose(logits[row], params, int(counts[row]))
        return chosen, h


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.max_new = int(params.get("max_new_tokens", "256"))
        # One thread: a step is small GEMMs, and with the event loop on the other core (and a busy
        # machine) torch's pool threads mostly wait for each other. torch's setting is per process.
        torch.set_num_threads(int(params.get("torch_threads", "1")))
        self.iterative = bool(config.get("sequence_batching", {}).get("iterative_sequence", False))
        self.compact = params.get("request_batching", "padded") == "compact"
        folder = Path(args["model_repository"]) / args["model_version"]
        with np.load(folder / "weights.npz") as weights:
            self.net = ByteGRU(weights).eval()

    def execute(self, requests):
        with torch.inference_mode():
            if self.iterative:
                self._step(requests)
            else:
                self._generate(requests)
        return None

    # -- continuous batching: one step --------------------------------------------------

    def _step(self, requests):
        net = self.net
        n = len(requests)
        hidden = np.empty((net.layers, n, net.hidden), dtype=np.float32)
        tokens = np.empty(n, dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        later = []
        sampling = [_sampling(request) for request in requests]
        for i, request in enumerate(requests):
            if request.flags() & START:
                h, tokens[i] = net.prefill(_prompt(request), sampling[i])
                hidden[:, i] = h.numpy()
                continue
            hidden[:, i] = pb_utils.get_input_tensor_by_name(request, "HIDDEN_IN").as_numpy()[0]
            tokens[i], counts[i] = pb_utils.get_input_tensor_by_name(request, "LAST_IN").as_numpy()[0]
            later.append(i)
        if later:  # one decode step for every row past its first, together
            index = np.array(later)
            next_tokens, next_hidden = net.decode(torch.from_numpy(tokens[index]),
                                                  torch.from_numpy(hidden[:, index]),
                                                  [sampling[i] for i in later], counts[index])
            tokens[index] = next_tokens.numpy()
            hidden[:, index] = next_hidden.numpy()
        counts += 1
        for i, request in enumerate(requests):
            token, count = int(tokens[i]), int(counts[i])
            sender = request.get_response_sender()
            if token == EOS or sender.is_cancelled():  # its client gone: end it (a send would raise)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            done = count >= self.max_new
            state = [pb_utils.Tensor("HIDDEN_OUT", hidden[:, i][None]),
                     pb_utils.Tensor("LAST_OUT", np.array([[token, count]], dtype=np.int32))]
            if not done:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            sender.send(pb_utils.InferenceResponse(output_tensors=_byte(token) + state),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)

    # -- request-level batching: every request of the batch to its end --------------------

    def _generate(self, requests):
        """The whole batch, step by step, until its longest request ends. ``padded`` (the
        default; static batching): every row is computed at every step, a finished one as
        padding; ``compact``: finished rows leave the computation."""
        net = self.net
        senders = [request.get_response_sender() for request in requests]
        limits = [min(self.max_new, _max_tokens(request) or self.max_new) for request in requests]
        first = [net.prefill(_prompt(request)) for request in requests]
        hidden = torch.stack([h for h, _ in first], dim=1)
        tokens = torch.tensor([token for _, token in first], dtype=torch.long)
        streaming = [True] * len(requests)
        sent = [0] * len(requests)
        rows = list(range(len(requests)))  # the request of each row of the batch
        while True:
            for row, token in zip(rows, tokens.tolist()):
                if not streaming[row]:
                    continue  # padding
                sender = senders[row]
                if token == EOS or sender.is_cancelled():
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    streaming[row] = False
                    continue
                sent[row] += 1
                streaming[row] = sent[row] < limits[row]
                sender.send(pb_utils.InferenceResponse(output_tensors=_byte(token)),
                            flags=0 if streaming[row] else pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if not any(streaming[row] for row in rows):
                return
            if self.compact:
                keep = [slot for slot, row in enumerate(rows) if streaming[row]]
                if len(keep) < len(rows):
                    index = torch.tensor(keep)
                    tokens, hidden = tokens[index], hidden[:, index]
                    rows = [rows[slot] for slot in keep]
            tokens, hidden = net.decode(tokens, hidden)


def _prompt(request):
    value = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _sampling(request):
    """The request's (temperature, top_p, seed), or None to decode greedily (no temperature, or 0)."""
    params = json.loads(request.parameters() or "{}")
    temperature = params.get("temperature") or 0
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        return None
    top_p = params.get("top_p")
    seed = params.get("seed")
    return (float(temperature), float(top_p) if isinstance(top_p, (int, float)) and 0 < top_p < 1 else 1.0,
            seed if isinstance(seed, int) and seed >= 0 else None)


def _choose(logits, sampling, count):
    """A byte drawn from softmax(logits / temperature), within the top_p nucleus. With a seed the draw
    at step ``count`` is always the same (the generator is seeded by (seed, count)), so a seeded request
    gives the same text however its steps were batched."""
    temperature, top_p, seed = sampling
    probs = torch.softmax(logits.double() / temperature, dim=-1).numpy()
    order = np.argsort(-probs, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(probs[order]), top_p) + 1)]
    p = probs[keep] / probs[keep].sum()
    rng = np.random.default_rng(None if seed is None else [seed, count])
    return int(keep[rng.choice(len(keep), p=p)])


def _max_tokens(request):
    value = json.loads(request.parameters() or "{}").get("max_tokens", 0)
    return value if isinstance(value, int) and value > 0 else 0


def _byte(token):
    return [pb_utils.Tensor("TOKEN", np.array([[token]], dtype=np.int32)),
            pb_utils.Tensor("TEXT", np.array([[bytes([token])]], dtype=np.object_))]
