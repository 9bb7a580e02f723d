"""Shared fixtures: tiny random models (see torchinferno.testing)."""

import pytest

from torchinferno.testing import tiny_model


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama3")
