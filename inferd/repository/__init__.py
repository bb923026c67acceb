"""The model repository: layout, version policy and the load/unload lifecycle."""

from inferd.repository.manager import ModelManager
from inferd.model import Model

__all__ = ["Model", "ModelManager"]
