from ._batch import predict
from ._export import check_onnx_installed, export_onnx, export_torchscript
from ._outputs import top_k_classes

__all__ = ["check_onnx_installed", "export_onnx", "export_torchscript", "predict", "top_k_classes"]
