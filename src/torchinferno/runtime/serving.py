"""``torchinferno.runtime.serving``: token-step continuous serving (thin re-exports of ``torchinferno.engine``)."""

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.async_engine import AsyncEngine, EngineDeadError
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm import LLM, CompletionOutput
from torchinferno.engine.llm_engine import EngineStats, LLMEngine
from torchinferno.engine.outputs import RequestOutput

__all__ = ["LLMEngine", "EngineConfig", "EngineStats", "LLM", "CompletionOutput", "AsyncEngine", "EngineDeadError",
           "RequestOutput", "SamplingParams"]
