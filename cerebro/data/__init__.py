from ._arrays import ArrayDataset, in_content_order, write_partitions
from ._blocks import BlockDataset
from ._cache import LocalCache
from ._dask import DaskDataset
from ._dataset import Dataset
from ._file_checks import PartitionFileError
from ._inputs import FeatureSpec, prediction_rows
from ._partitions import ROW_GROUP_BYTES, SPLITS, WINDOW_ROW_GROUPS, PartitionLayout, read_layout, read_partition
from ._ray import RayDataset
from ._sample_order import SampleScheme, sample_order, transform_rng
from ._sources import InMemoryPartition, PartitionSource, StreamedPartition, open_partition
from ._spark import SparkDataset
from ._sql import select_list, table_arrays
from ._storage import Storage

__all__ = ["ROW_GROUP_BYTES", "SPLITS", "WINDOW_ROW_GROUPS", "ArrayDataset", "BlockDataset", "DaskDataset", "Dataset",
           "FeatureSpec", "InMemoryPartition", "LocalCache", "PartitionFileError", "PartitionLayout",
           "PartitionSource", "RayDataset", "SampleScheme", "SparkDataset",
           "Storage", "StreamedPartition", "in_content_order", "open_partition", "prediction_rows", "read_layout",
           "read_partition", "sample_order", "select_list", "table_arrays", "transform_rng", "write_partitions"]
