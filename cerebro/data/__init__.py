from ._dataset import Dataset
from ._partitions import PartitionLayout, read_layout, read_partition, write_partitions

__all__ = ["Dataset", "PartitionLayout", "read_layout", "read_partition", "write_partitions"]
