from ._run_store import RunStore
from ._state_codec import (
                           TensorBytes,
                           frames,
                           pack_tensors,
                           parse,
                           read_exactly,
                           read_message,
                           unpack_tensors,
                           write_message,
)

__all__ = ["RunStore", "TensorBytes", "frames", "pack_tensors", "parse", "read_exactly",
           "read_message", "unpack_tensors", "write_message"]
