"""The data plane: the implementation of the façade (:mod:`inferd.facade`) in the process that holds the models.

* :mod:`inferd.dataplane.plane` - :class:`DataPlane`, the façade over the
  repository's models, and the lifecycle the server's wiring drives.
* :mod:`inferd.dataplane.shared_memory` - the registered system shared memory
  regions, and resolving a request's references into them.

The façade itself (:class:`~inferd.facade.DataPlaneAPI` and the plain data it
speaks) is :mod:`inferd.facade`, in the core layer, so that a frontend worker
process imports none of this package.
"""

from inferd.dataplane.plane import SERVER_NAME, DataPlane

__all__ = ["SERVER_NAME", "DataPlane"]
