"""``torchinferno.runtime.cudagraphs``: CUDA-graph decode capture and replay per batch-size bucket (thin
re-exports of ``kernels.cuda_graphs`` and the engine's graph model runner)."""

from torchinferno.engine.graph_runner import CudaGraphModelRunner, can_use_cuda_graphs, graph_batch_sizes
from torchinferno.kernels.cuda_graphs import DEFAULT_BUCKETS, CudaGraphDecodeRunner, backend_supports_graphs

__all__ = ["CudaGraphDecodeRunner", "CudaGraphModelRunner", "DEFAULT_BUCKETS", "backend_supports_graphs",
           "can_use_cuda_graphs", "graph_batch_sizes"]
