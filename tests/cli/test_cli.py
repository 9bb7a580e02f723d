"""CLI: JSON output shape, audit, and one-line errors (non-zero exit, no traceback) on bad input."""

import json
import os
import subprocess
import sys

import pytest

from torchinferno.cli.main import main


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from torchinferno.testing import tiny_model
    from torchinferno.checkpoint.auto import save_pretrained

    d = tmp_path_factory.mktemp("tiny")
    save_pretrained(tiny_model("llama3"), d)
    return d


def run_cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINFERNO_DEBUG"}
    return subprocess.run([sys.executable, "-m", "torchinferno.cli", *args], capture_output=True, text=True, env=env, timeout=300)


def test_generate_json_on_tiny_dir(tiny_dir, capsys):
    rc = main(["generate", str(tiny_dir), "hello", "--tokenizer", "byte", "--max-new-tokens", "5", "--ignore-eos", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert set(out) >= {"prompt_token_ids", "token_ids", "text", "finish_reason", "decode_tok_per_s"}
    assert len(out["token_ids"]) == 5 and out["finish_reason"] == "length"


def test_audit_prints_environment_and_table(capsys):
    assert main(["audit", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "torch" in data["environment"]
    statuses = {r["status"] for r in data["features"]}
    assert statuses <= {"working", "partial", "missing"} and len(data["features"]) > 30


def _assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_path_is_one_line(tmp_path):
    _assert_one_line_error(run_cli("generate", str(tmp_path / "nope"), "hi"), "nope")


def test_unknown_model_name_lists_valid_names():
    _assert_one_line_error(run_cli("generate", "no-such-model", "hi"), "no-such-model", "smollm2-135m-instruct")


def test_corrupt_safetensors_names_the_file(tiny_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((tiny_dir / "config.json").read_text())
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    _assert_one_line_error(run_cli("generate", str(bad), "hi", "--tokenizer", "byte"), "model.safetensors")


def test_truncated_safetensors_is_one_line(tiny_dir, tmp_path):
    bad = tmp_path / "trunc"
    bad.mkdir()
    (bad / "config.json").write_text((tiny_dir / "config.json").read_text())
    data = (tiny_dir / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    _assert_one_line_error(run_cli("generate", str(bad), "hi", "--tokenizer", "byte"), "model.safetensors")


def test_unsupported_gguf_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "gemma.gguf"
    w = gguf.GGUFWriter(str(path), "gemma")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    env_cache = ["--cache-dir", str(tmp_path / "cache")]
    _assert_one_line_error(run_cli("generate", str(path), "hi", *env_cache), "gemma")


def test_bad_flag_value_lists_choices():
    proc = run_cli("generate", "x", "hi", "--dtype", "int3")
    assert proc.returncode == 2 and "float32" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_sampling_value_is_one_line(tiny_dir):
    _assert_one_line_error(run_cli("generate", str(tiny_dir), "hi", "--tokenizer", "byte", "--top-p", "1.5"), "top_p")


def test_audit_fails_naming_a_row_that_cites_a_missing_test_file(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("")
    roadmap = tmp_path / "docs" / "ROADMAP.md"
    roadmap.write_text("| area | capability | status | evidence |\n|---|---|---|---|\n"
                       "| 1 | thing that is tested | working | tests/test_here.py |\n"
                       "| 2 | thing with lost evidence | working | tests/test_here.py, tests/gone/test_lost.py (oracle) |\n")
    for extra in ([], ["--json"]):
        assert main(["audit", "--roadmap", str(roadmap), *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "thing with lost evidence" in err[0] and "tests/gone/test_lost.py" in err[0], err
        assert "thing that is tested" not in err[0]
    (tmp_path / "tests" / "gone").mkdir()
    (tmp_path / "tests" / "gone" / "test_lost.py").write_text("")
    assert main(["audit", "--roadmap", str(roadmap)]) == 0


def test_repo_roadmap_cites_only_existing_test_files():
    from pathlib import Path

    from torchinferno.cli.audit_cmds import missing_test_citations, parse_roadmap

    root = Path(__file__).resolve().parents[2]
    assert missing_test_citations(parse_roadmap(root / "docs" / "ROADMAP.md"), root) == []
