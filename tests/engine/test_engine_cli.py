"""``torchinferno serve-smoke`` runs concurrent requests and checks them against plain generation."""

import pytest

from torchinferno.cli.main import main


def test_serve_smoke_default_and_tiny_pool(capsys):
    assert main(["serve-smoke", "--num-requests", "6", "--max-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("serve-smoke OK: 6/6") and "prefix hits" in out
    # A KV pool too small for all requests at once: preemption must keep outputs identical.
    assert main(["serve-smoke", "--num-requests", "10", "--max-tokens", "12", "--kv-cache-memory", "80KiB",
                 "--max-num-batched-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "OK: 10/10" in out and "preemptions 0," not in out


def test_serve_smoke_reports_a_too_small_pool(capsys):
    assert main(["serve-smoke", "--kv-cache-memory", "1KiB"]) == 1
    assert "KV cache" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["paged", "dense"])
def test_serve_smoke_cache_backends(capsys, backend):
    """The README's ``serve-smoke --device cpu --cache-backend paged`` (and dense: one block per sequence)."""
    assert main(["serve-smoke", "--device", "cpu", "--cache-backend", backend, "--num-requests", "4", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("serve-smoke OK: 4/4") and f"{backend} cache" in out
    hits = int(out.split("prefix hits ")[1].split("/")[0])
    assert (hits > 0) == (backend == "paged")  # the dense layout has no prefix reuse
