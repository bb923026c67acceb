"""A Triton Python model that generates text: a two-layer GRU language model over bytes.

Input ``PROMPT`` (TYPE_STRING, dims [1]); outputs, one response per generated
byte: ``TOKEN`` (TYPE_INT32, dims [1], the byte's value) and ``TEXT``
(TYPE_STRING, dims [1], the byte itself). Decoding is greedy, so a prompt
always gives the same text. Generation stops at the end byte (0, not sent),
after the config's ``max_new_tokens`` bytes, or after the request's
``max_tokens``. The weights (``weights.npz`` next to this file) are random,
from a fixed seed (:mod:`inferd.examples.generator`): the text is not English,
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
  request of its batch to the end, stepping the rows still going together.
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

    def prefill(self, prompt):
        """The hidden state after BOS + prompt [layers, hidden], and the first byte."""
        ids = torch.tensor([BOS] + list(prompt), dtype=torch.long)
        out, h = self.gru(self.embed(ids)[:, None, :])
        return h[:, 0, :], int(self.head(out[-1, 0]).argmax())

    def decode(self, tokens, hidden):
        """One step for B rows: tokens [B], hidden [layers, B, hidden] -> next bytes [B], new hidden."""
        out, h = self.gru(self.embed(tokens)[None, :, :], hidden)
        return self.head(out[0]).argmax(-1), h


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.max_new = int(params.get("max_new_tokens", "256"))
        self.iterative = bool(config.get("sequence_batching", {}).get("iterative_sequence", False))
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
        hidden = torch.empty(net.layers, len(requests), net.hidden)
        tokens = torch.empty(len(requests), dtype=torch.long)
        counts = []
        first = []
        for i, request in enumerate(requests):
            if request.flags() & START:
                h, token = net.prefill(_prompt(request))
                hidden[:, i] = h
                tokens[i] = token
                counts.append(0)
                first.append(True)
                continue
            last = pb_utils.get_input_tensor_by_name(request, "LAST_IN").as_numpy().reshape(-1)
            hidden[:, i] = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "HIDDEN_IN").as_numpy()[0])
            tokens[i] = int(last[0])
            counts.append(int(last[1]))
            first.append(False)
        later = [i for i, f in enumerate(first) if not f]
        if later:
            index = torch.tensor(later)
            next_tokens, next_hidden = net.decode(tokens[index], hidden[:, index])
            tokens[index] = next_tokens
            hidden[:, index] = next_hidden
        for i, request in enumerate(requests):
            token, count = int(tokens[i]), counts[i] + 1
            sender = request.get_response_sender()
            if token == EOS:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            done = count >= self.max_new
            state = [pb_utils.Tensor("HIDDEN_OUT", hidden[:, i].numpy()[None]),
                     pb_utils.Tensor("LAST_OUT", np.array([[token, count]], dtype=np.int32))]
            if not done:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            sender.send(pb_utils.InferenceResponse(output_tensors=_byte(token) + state),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)

    # -- request-level batching: every request of the batch to its end --------------------

    def _generate(self, requests):
        net = self.net
        rows = []  # (sender, remaining, token, hidden)
        for request in requests:
            limit = min(self.max_new, _max_tokens(request) or self.max_new)
            h, token = net.prefill(_prompt(request))
            rows.append([request.get_response_sender(), limit, token, h])
        while rows:
            going = []
            for row in rows:
                sender, remaining, token, _ = row
                if token == EOS or sender.is_cancelled():
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                row[1] = remaining = remaining - 1
                sender.send(pb_utils.InferenceResponse(output_tensors=_byte(token)),
                            flags=0 if remaining else pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                if remaining:
                    going.append(row)
            rows = going
            if not rows:
                break
            tokens = torch.tensor([row[2] for row in rows], dtype=torch.long)
            hidden = torch.stack([row[3] for row in rows], dim=1)
            tokens, hidden = net.decode(tokens, hidden)
            for i, row in enumerate(rows):
                row[2], row[3] = int(tokens[i]), hidden[:, i]


def _prompt(request):
    value = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _max_tokens(request):
    value = json.loads(request.parameters() or "{}").get("max_tokens", 0)
    return value if isinstance(value, int) and value > 0 else 0


def _byte(token):
    return [pb_utils.Tensor("TOKEN", np.array([[token]], dtype=np.int32)),
            pb_utils.Tensor("TEXT", np.array([[bytes([token])]], dtype=np.object_))]
