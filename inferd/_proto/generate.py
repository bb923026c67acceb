"""Regenerate the Python modules in ``inferd/_proto`` from ``proto/*.proto``.

Usage::

    python -m inferd._proto.generate           # rewrite the generated files
    python -m inferd._proto.generate --check   # exit 1 if they are stale

Two packages get the same code: the server's ``inferd/_proto`` and the client
package's ``clients/inferd_client/_proto`` (which cannot import inferd, so it
also gets a copy of ``_pool.py``).

Needs ``grpcio-tools`` (a test/dev dependency only: the output is committed,
so installing inferd needs no build step). Steps:

1. run ``grpc_tools.protoc -I proto --python_out --pyi_out --grpc_python_out``
   into a scratch directory;
2. make the imports between generated modules package-relative
   (``from . import model_config_pb2 ...``);
3. register the descriptors in the private pool ``inferd._proto._pool.POOL``
   instead of protobuf's default pool, which tritonclient already fills with
   the same ``inference.*`` names, and build the message classes through
   ``_pool.build_top_descriptors_and_messages`` so that they are recorded in a
   private symbol database too (see ``_pool.py``), under their real module
   name ``inferd._proto.*_pb2`` (so pickle can find them);
4. drop ``model_config_pb2_grpc.py`` (that file declares no service) and copy
   the rest into each target package.

``--check`` compares against a fresh generation; its result depends on the
grpcio-tools version, whose version numbers end up in the generated headers.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
PROTO_DIR = REPO_ROOT / "proto"
CLIENT_PACKAGE_DIR = REPO_ROOT / "clients" / "inferd_client" / "_proto"
# Where the generated files go: the server's package, and the client package's.
TARGETS = (PACKAGE_DIR, CLIENT_PACKAGE_DIR)

PROTO_FILES = ("model_config.proto", "grpc_service.proto")
MODULES = tuple(Path(p).stem + "_pb2" for p in PROTO_FILES)  # model_config_pb2, grpc_service_pb2

# Generated files we keep, in this package.
OUTPUTS = (
    "model_config_pb2.py",
    "model_config_pb2.pyi",
    "grpc_service_pb2.py",
    "grpc_service_pb2.pyi",
    "grpc_service_pb2_grpc.py",
)

MARKER = "# Post-processed by inferd._proto.generate (relative imports, private descriptor pool).\n"

_POOL_IMPORT_OLD = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
_POOL_IMPORT_NEW = (
    "from ._pool import POOL as _POOL\n"
    "from ._pool import build_top_descriptors_and_messages as _build_top_descriptors_and_messages\n"
)
_POOL_ADD_OLD = "_descriptor_pool.Default().AddSerializedFile("
_POOL_ADD_NEW = "_POOL.AddSerializedFile("
_BUILD_OLD = "_builder.BuildTopDescriptorsAndMessages("
_BUILD_NEW = "_build_top_descriptors_and_messages("


class GenerateError(RuntimeError):
    """Raised when protoc fails or its output no longer looks as expected."""


def _replace_exactly(text: str, old: str, new: str, count: int, where: str) -> str:
    found = text.count(old)
    if found != count:
        raise GenerateError(f"{where}: expected {count} occurrence(s) of {old!r}, found {found}")
    return text.replace(old, new)


def _relative_imports(text: str, where: str) -> str:
    """``import X_pb2 as Y`` -> ``from . import X_pb2 as Y`` for our own modules."""
    pattern = re.compile(r"^import (" + "|".join(map(re.escape, MODULES)) + r")( as \w+)?$", re.M)
    text, _ = pattern.subn(r"from . import \1\2", text)
    leftover = re.search(r"^import (\w+_pb2)\b", text, re.M)
    if leftover:
        raise GenerateError(f"{where}: unexpected absolute import of {leftover.group(1)}")
    return text


def _postprocess(name: str, text: str) -> str:
    text = _relative_imports(text, name)
    if name.endswith("_pb2.py"):
        text = _replace_exactly(text, _POOL_IMPORT_OLD, _POOL_IMPORT_NEW, 1, name)
        text = _replace_exactly(text, _POOL_ADD_OLD, _POOL_ADD_NEW, 1, name)
        text = _replace_exactly(text, _BUILD_OLD, _BUILD_NEW, 1, name)
        # Give the classes their real module (``inferd._proto.x_pb2``) so pickle finds them.
        module = name[: -len(".py")]
        text = _replace_exactly(text, f"(DESCRIPTOR, '{module}', _globals)", "(DESCRIPTOR, __name__, _globals)", 1, name)
        if "_descriptor_pool" in text:
            raise GenerateError(f"{name}: default-pool reference left after rewrite")
    if name.endswith(".py"):
        # Keep protoc's own header lines first; add our marker after them.
        lines = text.splitlines(keepends=True)
        i = 0
        while i < len(lines) and lines[i].startswith("#"):
            i += 1
        text = "".join(lines[:i]) + MARKER + "".join(lines[i:])
    return text


def render() -> dict[str, str]:
    """Run protoc and return ``{file name: post-processed text}``."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise GenerateError("grpcio-tools is required: pip install grpcio-tools") from exc

    with tempfile.TemporaryDirectory(prefix="inferd-proto-") as tmp:
        # protoc's bundled well-known types, in case a .proto ever imports one.
        try:
            from importlib.resources import files

            wkt_include = str(files("grpc_tools") / "_proto")
        except Exception:  # pragma: no cover
            wkt_include = None
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            *([f"-I{wkt_include}"] if wkt_include else []),
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(PROTO_DIR / p) for p in PROTO_FILES),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise GenerateError(f"protoc failed with exit code {rc}")
        produced = {p.name for p in Path(tmp).iterdir()}
        missing = set(OUTPUTS) - produced
        if missing:
            raise GenerateError(f"protoc did not produce {sorted(missing)}")
        return {name: _postprocess(name, (Path(tmp) / name).read_text()) for name in OUTPUTS}


def files_for(target: Path, rendered: dict[str, str]) -> dict[str, str]:
    """What ``target`` must hold: the rendered modules, and for a package other than
    this one a copy of ``_pool.py`` (the client package cannot import inferd)."""
    out = dict(rendered)
    if target != PACKAGE_DIR:
        out["_pool.py"] = _COPY_HEADER + (PACKAGE_DIR / "_pool.py").read_text()
    return out


_COPY_HEADER = "# Copied from inferd/_proto/_pool.py by inferd._proto.generate; do not edit.\n"


def stale_files(rendered: dict[str, str], targets: tuple[Path, ...] = TARGETS) -> list[Path]:
    out = []
    for target in targets:
        for name, text in files_for(target, rendered).items():
            path = target / name
            if not path.exists() or path.read_text() != text:
                out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd._proto.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the generated files are stale")
    opts = parser.parse_args(argv)
    try:
        rendered = render()
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = stale_files(rendered)
    if opts.check:
        if stale:
            print("stale generated files: " + ", ".join(map(str, stale)), file=sys.stderr)
            return 1
        print("generated files are up to date")
        return 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files_for(path.parent, rendered)[path.name])
        print(f"wrote {path}")
    if not stale:
        print("generated files are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
