from ._arrays import ArrayDataset, write_partitions
from ._dataset import Dataset
from ._partitions import PartitionLayout, read_layout, read_partition
from ._spark import SparkDataset

__all__ = ["ArrayDataset", "Dataset", "PartitionLayout", "SparkDataset", "read_layout", "read_partition",
           "write_partitions"]
