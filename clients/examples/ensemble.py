"""An ensemble is called like any model: ``ensemble_mlp`` wires scale -> mlp -> relu on
the server; ``mlp_fused`` is the same computation as one ONNX model, so they agree.

    python clients/examples/ensemble.py --url 127.0.0.1:8001
"""

import numpy as np

from _common import check, url_from_args
from inferd_client import Client

url = url_from_args(__doc__)

with Client(url) as client:
    width = client.model_metadata("ensemble_mlp").inputs[0].shape[-1]
    x = np.random.default_rng(0).standard_normal((2, width)).astype(np.float32)
    ensemble = client.infer("ensemble_mlp", {"INPUT0": x})["OUTPUT0"]
    fused = client.infer("mlp_fused", {"INPUT0": x})["OUTPUT0"]
    print("ensemble_mlp output", ensemble.shape, "max |ensemble - fused| =", float(np.abs(ensemble - fused).max()))
    check(np.allclose(ensemble, fused, rtol=1e-4, atol=1e-5), "ensemble_mlp == mlp_fused")
