"""A Triton Python model: text -> token ids, padded to a fixed length.

Input ``TEXT`` (TYPE_STRING, dims [1]) holds one UTF-8 string per batch row.
Outputs ``INPUT_IDS`` and ``ATTENTION_MASK`` (TYPE_INT64, dims [L]) hold
``[CLS] tokens... [SEP]`` then ``[PAD]`` up to L, where L comes from the
config's dims of ``INPUT_IDS``; longer texts are cut to fit (keeping [SEP]).

Tokens are runs of lowercase letters/digits, or single other non-space
characters. Words of the fixed vocabulary below get its ids; any other word
gets a hash bucket (CRC-32, so ids are the same in every process):
``len(VOCAB) + crc32(word) % HASH_BUCKETS``. The vocabulary size is
``len(VOCAB) + HASH_BUCKETS`` (1024).
"""

import json
import re
import zlib

import numpy as np

import triton_python_backend_utils as pb_utils

PAD, UNK, CLS, SEP = 0, 1, 2, 3
VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]",
    "the", "a", "an", "and", "or", "not", "is", "are", "was", "be", "to", "of", "in", "on", "for", "with",
    "it", "this", "that", "i", "you", "we", "they", "he", "she", "my", "your", "good", "bad", "great",
    "terrible", "love", "hate", "like", "movie", "film", "book", "food", "service", "very", "so", "too",
    "no", "yes", "hello", "world", ".", ",", "!", "?", "'",
]
HASH_BUCKETS = 1024 - len(VOCAB)
_IDS = {word: i for i, word in enumerate(VOCAB)}
_TOKEN = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def token_id(word):
    known = _IDS.get(word)
    if known is not None:
        return known
    return len(VOCAB) + zlib.crc32(word.encode("utf-8")) % HASH_BUCKETS


def encode(text, length):
    """The ids and mask of one text, each a list of ``length`` ints."""
    words = _TOKEN.findall(text.lower())
    ids = [CLS] + [token_id(w) for w in words][: length - 2] + [SEP]
    ids = ids[:length]
    mask = [1] * len(ids) + [0] * (length - len(ids))
    return ids + [PAD] * (length - len(ids)), mask


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        ids_config = pb_utils.get_output_config_by_name(model_config, "INPUT_IDS")
        self.length = int(ids_config["dims"][-1])
        self.dtype = pb_utils.triton_string_to_numpy(ids_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            rows = text.reshape(text.shape[0], -1) if text.ndim > 1 else text.reshape(1, -1)
            ids = np.zeros((rows.shape[0], self.length), dtype=self.dtype)
            mask = np.zeros((rows.shape[0], self.length), dtype=self.dtype)
            for r, row in enumerate(rows):
                value = row[0]
                if isinstance(value, bytes):
                    value = value.decode("utf-8", errors="replace")
                ids[r], mask[r] = encode(str(value), self.length)
            shape = text.shape[:-1] + (self.length,) if text.ndim > 1 else (self.length,)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_IDS", ids.reshape(shape)),
                pb_utils.Tensor("ATTENTION_MASK", mask.reshape(shape)),
            ]))
        return responses
