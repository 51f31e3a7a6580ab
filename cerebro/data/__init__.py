from ._dataset import Dataset, write_partitions
from ._partitions import PartitionLayout, read_layout, read_partition

__all__ = ["Dataset", "PartitionLayout", "read_layout", "read_partition", "write_partitions"]
