"""The data plane: the protocol-neutral façade both frontends call.

* :mod:`inferd.dataplane.api` - :class:`DataPlaneAPI` (the interface, all
  ``async``, plain data in and out) and the types it speaks.
* :mod:`inferd.dataplane.plane` - :class:`DataPlane`, its implementation over
  the repository's models, and the lifecycle the server's wiring drives.
* :mod:`inferd.dataplane.shared_memory` - the registered system shared memory
  regions, and resolving a request's references into them.
"""

from inferd.dataplane.api import DataPlaneAPI, ModelMetadata, ServerMetadata, TensorMetadata
from inferd.dataplane.plane import SERVER_NAME, DataPlane

__all__ = ["SERVER_NAME", "DataPlane", "DataPlaneAPI", "ModelMetadata", "ServerMetadata", "TensorMetadata"]
