import os
from typing import Any, Dict, Optional, Tuple, Union

from . import engine as engine
from ._native import Index as _NativeIndex, build_index as build_index, build_index_from_ids as build_index_from_ids
from ._native import Draft as Draft, Drafter as Drafter, Model as _NativeModel
from . import speculative as speculative

__version__: str

class Index(_NativeIndex):
    def query(self, request: Dict[str, Any]) -> Dict[str, Any]: ...
    def infgram_rows(
        self,
        tokens: Any,
        *,
        window: int = 500,
        end_token: Optional[int] = None,
        vocab: Optional[int] = None,
        estimator: Union[None, str, Dict[str, Any]] = None,
        mixer: Mixer = None,
    ) -> InfgramRows: ...  # type: ignore[override]

Mixer = Union[None, str, "os.PathLike[str]", Dict[str, Any]]

def mixer_estimator(mixer: Mixer = None) -> Dict[str, Any]: ...

class InfgramRows:
    offsets: Any
    ids: Any
    logprobs: Any
    suffix_len: Any
    count: Any
    distinct: Any
    vocab: int
    estimator: Dict[str, Any]
    def __init__(self, native: Any) -> None: ...
    def __len__(self) -> int: ...
    def row(self, j: int) -> Tuple[Any, Any]: ...
    def dense(self) -> Any: ...
    def lambdas(self, mixer: Mixer = None) -> Any: ...
    def mix(self, logits: Any, mixer: Mixer = None) -> Any: ...
    def mix_targets(self, targets: Any, neural_logprobs: Any, mixer: Mixer = None) -> Any: ...

class Model(_NativeModel):
    def step(self, new_ids: Any) -> Any: ...
    def __call__(self, new_ids: Any) -> Any: ...
