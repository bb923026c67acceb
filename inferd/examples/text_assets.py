"""The example models' tokenizers and chat template, built in code (nothing is downloaded).

Both tokenizers are Hugging Face ``tokenizer.json`` files made with the ``tokenizers`` library's BPE
trainer over a text that ships with Python (the Zen of Python, :mod:`this`), so every build gives the
same bytes:

- :func:`byte_tokenizer`, the generator's: the byte GRU reads and writes bytes, so its vocabulary is
  the 256 bytes (byte-level pre-tokenizer and decoder; the trainer is given exactly the byte alphabet,
  so it learns no merges): a prompt's token count is the number of bytes the model reads, and each
  response the model sends is one completion token;
- :func:`encoder_tokenizer`, the text encoder's: byte-level BPE with merges learnt from the text, its
  ids below the encoder's vocabulary (1000).

:data:`CHAT_TEMPLATE` is a Hugging Face ``chat_template`` (Jinja) with role markers as plain text, so
the byte tokenizer counts them as the model reads them.
"""

from __future__ import annotations

import codecs
import contextlib
import io

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'developer', 'user', 'assistant'] %}"
    "{{ raise_exception('role ' + message['role'] + ' is not one this template knows') }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
BOS_TOKEN, EOS_TOKEN = "<s>", "</s>"


def _text() -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):  # importing it prints the Zen
        import this
    return codecs.decode(this.s, "rot13").splitlines()


def _train(vocab_size: int, special: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_text(), trainer=trainer)
    return tokenizer.to_str()


def byte_tokenizer() -> bytes:
    return _train(256, []).encode()


def encoder_tokenizer(vocab: int = 1000) -> bytes:
    return _train(vocab, ["<pad>"]).encode()
