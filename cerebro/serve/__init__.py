from ._batch import predict
from ._outputs import top_k_classes

__all__ = ["predict", "top_k_classes"]
