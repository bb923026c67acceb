"""Moving a batch between the host and a TorchScript instance's device.

On ``cuda:k`` every instance owns a CUDA stream, and one execution is:

1. each input assembled once, straight into a page-locked (pinned) host buffer
   of the batch's size (each request's rows copied into place: no
   ``np.concatenate`` then another copy), then one non-blocking host-to-device
   copy per input on the instance's stream. Inputs that are already device
   tensors on this GPU (a CUDA shared memory region, an ensemble step's output)
   are not moved through the host at all;
2. the model runs on that stream;
3. each output copied back once, non-blocking, into a pinned buffer, one stream
   synchronisation, and the requests get numpy views of it; or, for requests that
   asked for their outputs on this device (the next ensemble step runs here), the
   device tensors themselves as :class:`~inferd.gpu.tensor.DeviceTensor`.

Pinned buffers come from torch's caching host allocator (``pin_memory=True``):
pooled by torch, reused once the copies that read them are done, and released to
the pool when the last numpy view of an output is dropped (after the response is
encoded). Two instances on one GPU have two streams, so one's copies overlap the
other's kernels.

On the CPU the same code runs with no stream and no pinning: a lone request's
arrays are handed to torch without a copy (``torch.from_numpy``), a batch is
assembled into one buffer, and outputs are numpy views of torch's tensors.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from inferd.dtypes import BY_NAME
from inferd.gpu.tensor import DeviceTensor, host_array, torch_dtype


class TorchStager:
    """Owned by one instance; called only from the thread that executes it."""

    def __init__(self, torch: Any, device: Any) -> None:
        self._torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Everything issued inside runs on the instance's stream (on the CPU: as it is)."""
        if self.stream is None:
            yield
        else:
            with self._torch.cuda.device(self.device), self._torch.cuda.stream(self.stream):
                yield

    def synchronize(self) -> None:
        """Wait until the work issued on the instance's stream is done."""
        if self.stream is not None:
            self.stream.synchronize()

    # -- inputs ---------------------------------------------------------------------------

    def batch_input(self, parts: Sequence[Any], dtype: np.dtype) -> Any:
        """One tensor on the instance's device from each request's part (numpy or DeviceTensor), joined
        along the batch dimension in request order."""
        torch = self._torch
        if all(not isinstance(p, DeviceTensor) for p in parts):
            if len(parts) == 1 and not self.cuda:
                return _from_numpy(torch, parts[0])  # no copy at all
            return self._to_device(self._assemble(parts, dtype))
        on_device = [self._device_part(p, dtype) for p in parts]
        return on_device[0] if len(on_device) == 1 else torch.cat(on_device)

    def _assemble(self, parts: Sequence[np.ndarray], dtype: np.dtype) -> Any:
        """The parts copied once into one (pinned, on a GPU instance) host buffer."""
        torch = self._torch
        first = parts[0]
        rows = sum(p.shape[0] for p in parts) if len(parts) > 1 else None
        shape = ((rows,) + tuple(first.shape[1:])) if rows is not None else tuple(first.shape)
        host = torch.empty(shape, dtype=torch_dtype(torch, dtype), pin_memory=self.cuda)
        view = host_array(torch, host)
        start = 0
        for p in parts:
            if rows is None:
                np.copyto(view, p, casting="no")
            else:
                np.copyto(view[start:start + p.shape[0]], p, casting="no")
                start += p.shape[0]
        return host

    def _to_device(self, host: Any) -> Any:
        return host.to(self.device, non_blocking=True) if self.cuda else host

    def _device_part(self, part: Any, dtype: np.dtype) -> Any:
        if isinstance(part, DeviceTensor):
            tensor = part.data
            if tensor.device != self.device:
                # Onto a GPU: queued on the instance's stream. To the CPU: waited for, since a
                # non-blocking copy to the host would be read before it lands (no stream to sync here).
                tensor = tensor.to(self.device, non_blocking=self.cuda)
            return tensor
        return self._to_device(self._assemble([part], dtype))

    # -- outputs ----------------------------------------------------------------------------

    def outputs(self, tensors: Mapping[str, Any], keep_on_device: bool = False) -> dict[str, Any]:
        """The results for the requests: numpy arrays in host memory (one copy from a GPU), or,
        with ``keep_on_device``, the device tensors themselves. Returns once the data is there."""
        torch = self._torch
        if keep_on_device:
            kept = {n: DeviceTensor.of(t.contiguous()) for n, t in tensors.items()}
            self.synchronize()  # the next step may read them on another stream
            return kept
        if not self.cuda:
            return {n: host_array(torch, t if t.device.type == "cpu" else t.cpu()) for n, t in tensors.items()}
        hosts = {}
        for n, t in tensors.items():
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            hosts[n] = host
        self.synchronize()
        return {n: host_array(torch, h) for n, h in hosts.items()}


def _from_numpy(torch: Any, array: np.ndarray) -> Any:
    # torch.from_numpy takes any layout numpy can describe with non-negative strides;
    # anything else (a reversed view, say) is copied. BF16 travels as 16-bit words.
    if any(s < 0 for s in array.strides):
        array = np.ascontiguousarray(array)
    if array.dtype == BY_NAME["BF16"].numpy:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
