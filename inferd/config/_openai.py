"""How a model says it is served under ``/v1`` (the OpenAI-compatible frontend, inferd/frontends/openai/).

A model opts in with config parameters, checked here at load (a typo must not silently do nothing):

``inferd.openai``
    ``chat`` (``/v1/chat/completions`` and ``/v1/completions``), ``completion`` (``/v1/completions``
    only) or ``embedding`` (``/v1/embeddings``).
``inferd.openai.tokenizer``
    a Hugging Face ``tokenizer.json`` in the model's folder (default ``tokenizer.json``), read with the
    ``tokenizers`` library: prompt and completion tokens are counted with it, an embedding model's
    text becomes token ids with it.
``inferd.openai.chat_template``
    (chat) a Jinja template rendered as Hugging Face's ``chat_template`` is (``messages``,
    ``add_generation_prompt``, ``bos_token``, ``eos_token``); default ``chat_template.jinja``, else
    the ``chat_template`` of a ``tokenizer_config.json`` beside the tokenizer.
``inferd.openai.bos_token`` / ``inferd.openai.eos_token``
    the strings the template sees (default: a ``tokenizer_config.json``'s, else empty).
``inferd.openai.max_context``
    tokens a prompt and its completion may take together (0: no limit); a longer request is refused.
``inferd.openai.max_new_tokens``
    (chat, completion) the most tokens the model itself generates for one request (default: the model's
    own ``max_new_tokens`` parameter when it is an integer, else 0: unknown). A completion that reaches it
    was cut by the model, so its ``finish_reason`` is ``length``, as OpenAI and vLLM report a cut answer
    (a client that continues on ``length`` must not take it for a complete one).
``inferd.openai.text_input`` / ``inferd.openai.text_output``
    (chat, completion) the BYTES input the prompt's text goes into and the BYTES output each response's
    text comes in (default: the model's only BYTES input / output).
``inferd.openai.ids_input`` / ``inferd.openai.embedding_output``
    (embedding) the integer input the token ids go into and the FP32 output holding the embedding
    (default: the first integer input, the only FP32 output).
``inferd.openai.pooling``
    (embedding) ``none`` (the output is the embedding, ``[dim]``), ``mean``, ``first`` or ``last``
    (the output is ``[tokens, dim]`` and is pooled so).
``inferd.openai.normalize``
    (embedding) ``true``: the embedding is scaled to unit length (after ``dimensions``).
``inferd.openai.dimensions``
    (embedding) the sizes a request's ``dimensions`` may ask for (``"16,32"``: the first that many
    values are kept); none: a request may only ask for the full size.

The files are read here, at load, so every frontend process gets them from the core through the
façade (``DataPlaneAPI.openai_models``) and nothing reads the repository at request time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from dataclasses import replace
from typing import Any

from inferd._proto import model_config_pb2 as mc
from inferd.config._paths import check_inside
from inferd.errors import ConfigError
from inferd.facade import OpenAIModel, OpenAISpec  # values that cross the façade
from inferd.suggest import did_you_mean

KEY = "inferd.openai"
KINDS = ("chat", "completion", "embedding")
POOLINGS = ("none", "mean", "first", "last")
_SETTINGS = ("tokenizer", "chat_template", "bos_token", "eos_token", "max_context", "max_new_tokens", "text_input",
             "text_output", "ids_input", "embedding_output", "pooling", "normalize", "dimensions")


def is_openai_key(key: str) -> bool:
    return key == KEY or key.startswith(KEY + ".")


def openai_spec(config: mc.ModelConfig, model_dir: Path | None) -> OpenAISpec | None:
    """The model's ``/v1`` settings (None when it has no ``inferd.openai``); ConfigError when they are wrong."""
    name = config.name
    params = {k: v.string_value.strip() for k, v in config.parameters.items() if is_openai_key(k)}
    if not params:
        return None
    known = [f"{KEY}.{s}" for s in _SETTINGS]
    for key in params:
        if key != KEY and key not in known:
            raise ConfigError(f"model '{name}': unknown parameter '{key}'{did_you_mean(key, known)} "
                              f"(the /v1 settings are {KEY} and {', '.join(known)})")
    kind = params.get(KEY, "")
    if kind not in KINDS:
        raise ConfigError(f"model '{name}': parameter '{KEY}' must be one of {', '.join(KINDS)}, got '{kind}'")

    def setting(key: str, default: str = "") -> str:
        return params.get(f"{KEY}.{key}", default)

    if model_dir is None:
        raise ConfigError(f"model '{name}': parameter '{KEY}' needs the model's folder to read its tokenizer")
    tokenizer_file = check_inside(setting("tokenizer", "tokenizer.json"), f"model '{name}': {KEY}.tokenizer")
    tokenizer = _read(name, model_dir / tokenizer_file, f"{KEY}.tokenizer")
    _check_tokenizer(name, tokenizer)
    hf_config = _tokenizer_config(name, (model_dir / tokenizer_file).parent / "tokenizer_config.json")
    values: dict[str, Any] = {
        "kind": kind, "tokenizer": tokenizer,
        "bos_token": setting("bos_token", _token_text(hf_config.get("bos_token"))),
        "eos_token": setting("eos_token", _token_text(hf_config.get("eos_token"))),
        "max_context": _count(name, "max_context", setting("max_context", "0")),
    }
    if kind == "chat":
        values["chat_template"] = _chat_template(name, model_dir, setting("chat_template"), hf_config)
    if kind == "embedding":
        values.update(_embedding(config, setting))
    else:
        values["text_input"] = _tensor(config, config.input, setting("text_input"), "text_input", ("TYPE_STRING",))
        values["text_output"] = _tensor(config, config.output, setting("text_output"), "text_output",
                                        ("TYPE_STRING",))
        dims = [int(d) for t in config.input if t.name == values["text_input"] for d in t.dims]
        if any(d > 1 for d in dims):
            raise ConfigError(f"model '{name}': {KEY}: input '{values['text_input']}' must hold one string "
                              f"(dims [1] or [-1]), got dims {dims}")
        values["text_shape"] = ((1,) if config.max_batch_size > 0 else ()) + tuple(1 for _ in dims)
        own = config.parameters["max_new_tokens"].string_value.strip() if "max_new_tokens" in config.parameters else ""
        values["max_new_tokens"] = _count(name, "max_new_tokens", setting("max_new_tokens", own if own.isdigit() else "0"))
    values["batched"] = config.max_batch_size > 0
    spec = OpenAISpec(**values)
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:16]
    return replace(spec, digest=digest)


def _read(model: str, path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"model '{model}': {what}: no file '{path.name}' in the model's folder ({path})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model '{model}': {what}: cannot read '{path}' as UTF-8 text: {exc}") from None


def _check_tokenizer(model: str, text: str) -> None:
    try:
        from tokenizers import Tokenizer
    except ImportError:  # the frontend says so when a request needs it (inferd[openai])
        Tokenizer = None  # noqa: N806
    try:
        if Tokenizer is not None:
            Tokenizer.from_str(text)
        else:
            json.loads(text)
    except Exception as exc:
        raise ConfigError(f"model '{model}': {KEY}.tokenizer is not a tokenizer.json the tokenizers library "
                          f"reads: {str(exc)[:200]}") from None


def _tokenizer_config(model: str, path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model '{model}': '{path.name}' beside the tokenizer is not JSON: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def _token_text(value: Any) -> str:
    """A tokenizer_config.json token: a string, or an AddedToken object ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _chat_template(model: str, model_dir: Path, file: str, hf_config: dict[str, Any]) -> str:
    if file or (model_dir / "chat_template.jinja").exists() or "chat_template" not in hf_config:
        path = model_dir / check_inside(file or "chat_template.jinja", f"model '{model}': {KEY}.chat_template")
        template = _read(model, path, f"{KEY}.chat_template")
    else:
        template = hf_config["chat_template"]
        if not isinstance(template, str):
            raise ConfigError(f"model '{model}': tokenizer_config.json's chat_template must be one template "
                              f"(a string), got {type(template).__name__}")
    try:
        import jinja2
    except ImportError:
        return template
    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"model '{model}': {KEY}.chat_template line {exc.lineno}: {exc.message}") from None
    return template


def _count(model: str, key: str, raw: str) -> int:
    if not raw.isdigit():
        raise ConfigError(f"model '{model}': parameter '{KEY}.{key}' must be an integer >= 0, got '{raw}'")
    return int(raw)


def _tensor(config: mc.ModelConfig, tensors: Any, name: str, key: str, types: tuple[str, ...]) -> str:
    """The tensor ``name`` (checked) or, when empty, the only one of ``types``."""
    where = "input" if tensors is config.input else "output"
    fitting = [t.name for t in tensors if mc.DataType.Name(t.data_type) in types]
    if name:
        if name not in fitting:
            raise ConfigError(f"model '{config.name}': parameter '{KEY}.{key}' names '{name}', which is not an "
                              f"{where} of type {' or '.join(types)} (those are {fitting})")
        return name
    if len(fitting) != 1:
        raise ConfigError(f"model '{config.name}': {KEY} needs one {where} of type {' or '.join(types)} or "
                          f"parameter '{KEY}.{key}' naming one; the model has {fitting}")
    return fitting[0]


def _embedding(config: mc.ModelConfig, setting: Any) -> dict[str, Any]:
    name = config.name
    ids = setting("ids_input")
    if not ids:
        ints = [t.name for t in config.input if mc.DataType.Name(t.data_type) in ("TYPE_INT64", "TYPE_INT32")]
        ids = ints[0] if ints else ""
    ids = _tensor(config, config.input, ids, "ids_input", ("TYPE_INT64", "TYPE_INT32"))
    ids_dims = [int(d) for t in config.input if t.name == ids for d in t.dims]
    if ids_dims != [-1]:
        raise ConfigError(f"model '{name}': {KEY}: input '{ids}' takes the token ids, so its dims must be [-1], "
                          f"got {ids_dims}")
    output = _tensor(config, config.output, setting("embedding_output"), "embedding_output", ("TYPE_FP32",))
    pooling = setting("pooling", "none")
    if pooling not in POOLINGS:
        raise ConfigError(f"model '{name}': parameter '{KEY}.pooling' must be one of {', '.join(POOLINGS)}, "
                          f"got '{pooling}'")
    dims = [int(d) for t in config.output if t.name == output for d in t.dims]
    if len(dims) != (1 if pooling == "none" else 2) or dims[-1] < 1:
        want = "[dim]" if pooling == "none" else "[tokens, dim]"
        raise ConfigError(f"model '{name}': with {KEY}.pooling '{pooling}' output '{output}' must have dims {want} "
                          f"(a fixed dim), got {dims}")
    normalize = setting("normalize", "false").lower()
    if normalize not in ("true", "false"):
        raise ConfigError(f"model '{name}': parameter '{KEY}.normalize' must be true or false, got '{normalize}'")
    sizes: tuple[int, ...] = ()
    if raw := setting("dimensions"):
        try:
            sizes = tuple(sorted({int(x) for x in raw.split(",")}))
        except ValueError:
            sizes = (0,)
        if not sizes or sizes[0] < 1 or sizes[-1] > dims[-1]:
            raise ConfigError(f"model '{name}': parameter '{KEY}.dimensions' must list sizes 1..{dims[-1]} "
                              f"separated by commas, got '{raw}'")
    ids_type = next(mc.DataType.Name(t.data_type) for t in config.input if t.name == ids)
    return {"ids_input": ids, "ids_dtype": "int64" if ids_type == "TYPE_INT64" else "int32",
            "embedding_output": output, "pooling": pooling, "normalize": normalize == "true",
            "dimensions": sizes, "full_dimension": dims[-1]}
