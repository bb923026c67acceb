# Copied from inferd/_proto/_pool.py by inferd._proto.generate; do not edit.
"""Private descriptor pool for inferd's generated protobuf modules.

tritonclient registers the same fully qualified names (``inference.*``) in
protobuf's default pool, and a pool refuses a second, different definition of
a name. Registering ours here instead lets both be imported into one process.
Anything that looks our descriptors up by name (for example gRPC server
reflection) must be given ``POOL``.
"""

from __future__ import annotations

import threading
from typing import Any

from google.protobuf import descriptor_pool, symbol_database
from google.protobuf.internal import builder as _builder

POOL = descriptor_pool.DescriptorPool()

# Our message classes are recorded here rather than in the default symbol
# database: with the pure-Python protobuf runtime, recording a class there also
# adds its descriptor to the default pool, where it would shadow tritonclient's.
SYMBOL_DB = symbol_database.SymbolDatabase(pool=POOL)

_lock = threading.Lock()


def build_top_descriptors_and_messages(file_des: Any, module_name: str, module: dict[str, Any]) -> None:
    """``builder.BuildTopDescriptorsAndMessages`` bound to ``SYMBOL_DB``.

    Used by the generated ``*_pb2.py`` modules in place of the stock call.
    """
    if not hasattr(_builder, "_sym_db"):  # a runtime without the module-level database
        _builder.BuildTopDescriptorsAndMessages(file_des, module_name, module)
        return
    with _lock:
        saved = _builder._sym_db
        _builder._sym_db = SYMBOL_DB
        try:
            _builder.BuildTopDescriptorsAndMessages(file_des, module_name, module)
        finally:
            _builder._sym_db = saved
