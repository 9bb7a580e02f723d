"""Checkpoint I/O: HF safetensors directories, GGUF import, the model registry and the Hub.

Importing this package is cheap: gguf, tokenizers, huggingface_hub and transformers are only
imported inside the functions that need them.
"""

from torchinferno.checkpoint.gguf_import import convert_gguf
from torchinferno.checkpoint.hub import fetch_from_hub
from torchinferno.checkpoint.safetensors_io import TensorInfo, iter_tensors, read_config, save_hf_dir, tensor_index
from torchinferno.checkpoint.zoo import MODEL_ZOO, ZooEntry, pull, resolve_model

__all__ = [
    "MODEL_ZOO",
    "TensorInfo",
    "ZooEntry",
    "convert_gguf",
    "fetch_from_hub",
    "iter_tensors",
    "pull",
    "read_config",
    "resolve_model",
    "save_hf_dir",
    "tensor_index",
]
