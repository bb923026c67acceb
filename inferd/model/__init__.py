"""The model layer: one request through one loaded model version.

:class:`Model` is a loaded version (spec, scheduler, statistics);
:func:`run_model` is the one model path (validate, schedule, shape, count;
:func:`submit_model` its callback entry point, for the hand-off's core)
that the data plane runs every client request through and that an ensemble
runs each of its steps through; :func:`infer` and :class:`ModelDispatcher`
run a request on a model found through a :data:`ModelLookup` they are handed. Nothing here imports the repository, the
data plane or a frontend.
"""

from inferd.model.dispatch import ModelDispatcher, ModelLookup, find, infer, infer_stream
from inferd.model.loaded import Model
from inferd.model.path import ModelRun, failure_reason, response, run_model, stream_model, submit_model
from inferd.model.validation import check_requested_outputs, classify, prepare_inputs, shape_outputs

__all__ = [
    "Model", "ModelDispatcher", "ModelRun", "ModelLookup", "check_requested_outputs", "classify",
    "failure_reason", "find", "infer", "infer_stream", "prepare_inputs", "response", "run_model", "shape_outputs",
    "stream_model", "submit_model",
]
