"""``inferd examples``: write the example models as a model repository, from an installed inferd.

The example repository is part of the wheel on purpose: a user who installs inferd gets
models to serve and clients to point at them without a source checkout, and the
README's walk-through starts from it (``inferd examples --output model_repository``).
``--triton`` writes Triton's example repository instead (:mod:`inferd.examples.triton_examples`),
which Triton's own example clients run against unmodified.
"""

from __future__ import annotations

import argparse
import sys

# The builder writes ONNX files with onnx.helper: imported when the command runs, so that a base install
# (no onnx) can run every other inferd command.
EXAMPLES_EXTRA = "pip install 'inferd[examples]'"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("examples", help="write the example models as a model repository",
                       description="Write inferd's example models (or, with --triton, Triton's example "
                                   "repository) as a model repository, built in code (nothing is downloaded).")
    p.add_argument("--output", "-o", help="model repository directory to write (required unless --list)")
    p.add_argument("--model", action="append", dest="models", metavar="NAME",
                   help="only this model of inferd's (repeatable); default: all; --list names them")
    p.add_argument("--list", action="store_true", help="list inferd's example models and exit")
    p.add_argument("--triton", action="store_true",
                   help="Triton's example repository (simple, simple_sequence, densenet_onnx, ...) instead")
    p.add_argument("--with-repeat", action="store_true", help="with --triton: also write repeat_int32 (decoupled)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        from inferd.examples import build, triton_examples
    except ImportError as exc:
        print(f"inferd examples: the example models are built with the onnx package, which is not installed "
              f"({exc}); install it with: {EXAMPLES_EXTRA}", file=sys.stderr)
        return 1
    if args.list:
        for spec in build.MODELS:
            print(spec.name)
        return 0
    if not args.output:
        parser.error("inferd examples: --output DIR is required (the model repository to write)")
    if args.triton:
        if args.models:
            parser.error("inferd examples: --model picks among inferd's example models; --triton writes "
                         "Triton's whole example repository (drop one of them)")
        for name in triton_examples.build(args.output, args.with_repeat):
            print(f"{name}: written under {args.output}")
        return 0
    if args.with_repeat:
        parser.error("inferd examples: --with-repeat applies to --triton (inferd's own examples include repeat models)")
    try:
        build.build_repository(args.output, only=args.models)
    except ValueError as exc:
        parser.error(f"inferd examples: {exc}")
    return 0
