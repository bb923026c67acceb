"""The cascade of the ``cascade`` ensemble written as BLS (Triton's way without conditional
steps): the cheap model for every row, the expensive one only for the rows the cheap one is
unsure of (SCORE < THRESHOLD), their rows merged back in order. The benchmark and the tests
compare the two."""

import numpy as np
import triton_python_backend_utils as pb_utils

THRESHOLD = 0.8


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            cheap = pb_utils.InferenceRequest(model_name="cascade_cheap", requested_output_names=["OUTPUT0", "SCORE"],
                                              inputs=[x]).exec()
            if cheap.has_error():
                responses.append(pb_utils.InferenceResponse(error=cheap.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(cheap, "OUTPUT0").as_numpy()
            score = pb_utils.get_output_tensor_by_name(cheap, "SCORE").as_numpy()
            unsure = score.reshape(len(score), -1)[:, 0] < THRESHOLD
            if unsure.any():
                rows = x.as_numpy()[unsure]
                expensive = pb_utils.InferenceRequest(
                    model_name="cascade_expensive", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", rows)]).exec()
                if expensive.has_error():
                    responses.append(pb_utils.InferenceResponse(error=expensive.error()))
                    continue
                out = np.array(out, copy=True)
                out[unsure] = pb_utils.get_output_tensor_by_name(expensive, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)]))
        return responses
