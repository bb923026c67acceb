"""Example and test models for inferd, built in code (no downloads).

* :mod:`inferd.examples.onnx_models` -- small deterministic ONNX graph builders.
* :mod:`inferd.examples.build` -- writes a Triton-layout model repository
  (``python -m inferd.examples.build --output DIR``).
"""
