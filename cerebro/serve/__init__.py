from ._batch import predict
from ._export import export_onnx
from ._outputs import top_k_classes

__all__ = ["export_onnx", "predict", "top_k_classes"]
