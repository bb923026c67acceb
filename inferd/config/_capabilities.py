"""What the config pipeline asks of a model's backend, as attributes of the backend's class.

Validation never compares backend names: it asks the backend it was handed
(:func:`inferd.config.prepare_config` hands it the one ``backends.resolve``
settled). :class:`BackendCapabilities` is the question list with its answers
for a backend that joins a batch's requests into one tensor per input (ONNX
Runtime, TorchScript); ``inferd.backends.Backend`` derives from it, and each
backend class overrides what it does differently. It lives here, below the
backends, so that config/ can read it without importing them.
"""

from __future__ import annotations


class BackendCapabilities:
    """A backend's answers to what config validation asks (class attributes; see each)."""

    # The name a config's ``backend`` field gives it, and the ``platform`` it also answers to ("" if none).
    name: str = ""
    platform: str = ""
    # The model file of a version folder when the config sets no default_model_filename.
    default_filename: str = ""
    # Model file suffixes (".onnx") that pick this backend for a config naming neither platform nor backend.
    file_suffixes: tuple[str, ...] = ()
    # Whether a model may be decoupled (send its own responses) outside an iterative sequence.
    decoupled: bool = False
    # Whether a config may list no input: the model reads whatever a request sends.
    undeclared_inputs: bool = False
    # Whether a batch's requests are joined into one tensor per input, so variable-length
    # batching (inferd.padding, ragged inputs, batch_input/batch_output) applies.
    joins_batches: bool = True
    # Iterative sequences: whether the model ends its sequence by releasing the request without
    # RESCHEDULE (a Python model); else an end output (inferd.iterative_end_output) or max_tokens does.
    ends_sequences_by_release: bool = False
    # Why KIND_GPU cannot run here when gpu_available() is False, and what would fix it.
    gpu_requirement: str = "it has no GPU support"

    def gpu_available(self) -> bool:
        """Whether this backend can run instances on this host's GPUs."""
        return False


# What validation assumes when it is handed no backend (a config checked on its own, by a test or a tool):
# a tensor backend's answers.
TENSOR_BACKEND = BackendCapabilities()
