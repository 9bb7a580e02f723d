"""pyproject extras: the README's `pip install -e ".[dev]"` installs the test tools (declared once, under
`test`), and the original's `.[serve,...]` spellings name a declared extra."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_dev_extra_is_the_test_extra():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert extras["dev"] == ["torchinferno[test]"]
    assert any(r.startswith("pytest") for r in extras["test"])


def test_serve_extra_is_declared_and_adds_nothing_beyond_the_base():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["optional-dependencies"]["serve"] == []
    base = {d.split(">")[0].split("=")[0] for d in project["dependencies"]}
    assert {"fastapi", "uvicorn", "prometheus_client", "httpx"} <= base
