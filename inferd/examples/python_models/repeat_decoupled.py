"""A decoupled Triton Python model: repeat the input N times (as Triton's repeat example).

Inputs: ``IN`` (TYPE_INT32, dims [-1]) and ``REPEAT`` (TYPE_INT32, dims [1]).
For a request with REPEAT = N it sends N responses, response i holding
``OUT`` = IN and ``IDX`` = [i] (TYPE_UINT32), then the final flag alone:
N = 0 answers with the final flag only. A negative N is answered with an
error response, final.

The config sets ``model_transaction_policy { decoupled: true }``, so
``execute`` returns None and answers through each request's response sender.
The responses are sent from a thread per request, after ``execute`` has
returned, so the instance takes its next requests while earlier ones are
still streaming; ``finalize`` waits for those threads.
"""

import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self._threads = set()
        self._lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            repeat = int(pb_utils.get_input_tensor_by_name(request, "REPEAT").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            thread = threading.Thread(target=self._respond, args=(sender, values.copy(), repeat), daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        return None

    def _respond(self, sender, values, repeat):
        try:
            if repeat < 0:
                error = pb_utils.TritonError(f"REPEAT must be >= 0, got {repeat}", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            for i in range(repeat):
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", values),
                    pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def finalize(self):
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=30)
