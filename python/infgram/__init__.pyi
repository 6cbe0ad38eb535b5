from typing import Any, Dict

from . import engine as engine
from ._native import Index as _NativeIndex, build_index as build_index, build_index_from_ids as build_index_from_ids

__version__: str

class Index(_NativeIndex):
    def query(self, request: Dict[str, Any]) -> Dict[str, Any]: ...
