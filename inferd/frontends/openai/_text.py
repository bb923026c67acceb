"""A model's text side: its tokenizer (``tokenizers``) and its chat template (``jinja2``, as Hugging Face
renders ``chat_template``), built once per model and kept while its spec's digest holds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inferd.facade import OpenAISpec
from inferd.errors import Unavailable
from inferd.frontends.openai._errors import RequestError

INSTALL = "pip install 'inferd[openai]'"


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a byte-level tokenizer writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTES = _byte_alphabet()


@dataclass(frozen=True)
class ModelText:
    spec: OpenAISpec
    tokenizer: Any  # tokenizers.Tokenizer
    template: Any  # jinja2.Template | None
    byte_level: bool = False  # its tokens are bytes in GPT-2's alphabet: ids map back to bytes exactly
    added: dict[int, str] = field(default_factory=dict)  # its added (special) tokens: id -> their text

    @classmethod
    def build(cls, model: str, spec: OpenAISpec) -> "ModelText":
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise Unavailable(f"model '{model}': /v1 needs the tokenizers library on the server: {INSTALL}") from None
        doc = json.loads(spec.tokenizer)
        decoder = doc.get("decoder") or {}
        added = {int(t["id"]): str(t["content"]) for t in doc.get("added_tokens") or () if "id" in t and "content" in t}
        return cls(spec, Tokenizer.from_str(spec.tokenizer),
                   _compile(model, spec.chat_template) if spec.chat_template else None,
                   isinstance(decoder, dict) and decoder.get("type") == "ByteLevel", added)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int], param: str) -> str:
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        bad = [i for i in ids if i >= size]
        if bad:
            raise RequestError(f"'{param}': token id {bad[0]} is not in the model's vocabulary (0..{size - 1})",
                               param)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_of_ids(self, ids: list[int], param: str) -> str | bytes:
        """What a prompt given as token ids sends the model: with a byte-level tokenizer, the exact bytes the
        ids stand for (a prompt cut inside a multi-byte character stays cut, so the model reads the very
        tokens given, not a re-encoding of replacement characters); with another, the decoded text."""
        text = self.decode(ids, param)  # checks the ids against the vocabulary
        if not self.byte_level:
            return text
        out = bytearray()
        for i in ids:
            special = self.added.get(i)
            if special is not None:
                out += special.encode("utf-8")
                continue
            try:
                out += bytes(_BYTES[c] for c in self.tokenizer.id_to_token(i))
            except (KeyError, TypeError):  # not GPT-2's alphabet after all: the text, as before
                return text
        return bytes(out)

    def render(self, model: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
               extra: dict[str, Any]) -> str:
        """The prompt the chat template makes of ``messages``."""
        if self.template is None:
            raise RequestError(f"model '{model}' has no chat template; use /v1/completions", "model")
        import jinja2

        try:
            return str(self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=self.spec.bos_token, eos_token=self.spec.eos_token, **extra))
        except _TemplateRefused as exc:
            raise RequestError(f"model '{model}': the chat template refused the messages: {exc}", "messages") \
                from None
        except jinja2.TemplateError as exc:
            raise RequestError(f"model '{model}': the chat template failed on the messages: {exc}", "messages") \
                from None


class _TemplateRefused(Exception):
    pass


def _raise(message: str) -> None:
    raise _TemplateRefused(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _compile(model: str, source: str) -> Any:
    """As transformers compiles a chat template: a sandbox, trim/lstrip blocks, loop controls,
    ``raise_exception``, ``tojson`` and ``strftime_now``."""
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise Unavailable(f"model '{model}': chat templates need jinja2 on the server: {INSTALL}") from None
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
