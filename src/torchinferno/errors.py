"""User-facing error types.

Anything raised as a ``TorchInfernoError`` is an expected failure caused by input (a bad flag,
a missing file, a corrupt checkpoint). The CLI prints it as one line and exits non-zero; a
server maps it to a 4xx response. Bugs stay ordinary exceptions.
"""


class TorchInfernoError(Exception):
    """Base class: an input problem the user can fix; the message is one clear line."""


class ConfigError(TorchInfernoError):
    """A config, flag or name is invalid (the message lists valid values where there are some)."""


class CheckpointError(TorchInfernoError):
    """A checkpoint is missing, corrupt or does not fit the model (the message names the tensor/file)."""


class TokenizerError(TorchInfernoError):
    """A tokenizer or chat template cannot be loaded or applied."""


class SamplingError(TorchInfernoError):
    """Invalid sampling parameters."""


class EngineDeadError(RuntimeError):
    """The engine stopped (shutdown, a failed step, or its process died); no more requests are served.

    Not a ``TorchInfernoError``: no input caused it. Servers answer it with 503."""
