"""``serve --generation-config``: a model's generation_config.json supplies the sampling fields a request leaves
out (a request's own fields win); ``vllm`` ignores the file; bad files fail at startup in one line."""

import json

import pytest

from torchinferno.errors import CheckpointError, ConfigError
from torchinferno.core.generation_defaults import SamplingDefaults, load_sampling_defaults
from torchinferno.server.protocol import ChatCompletionRequest, sampling_params


def _write(folder, **cfg):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2, **cfg}))
    return folder


def test_auto_reads_the_checkpoint_vllm_ignores_it(tmp_path):
    ckpt = _write(tmp_path / "ckpt", temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=64, do_sample=True,
                  repetition_penalty=1.1)
    d = load_sampling_defaults("auto", str(ckpt))
    assert d.values() == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_tokens": 64}
    assert d.unsupported == ("repetition_penalty",)
    assert "temperature=0.6" in d.describe() and "repetition_penalty" in d.describe()
    assert load_sampling_defaults("vllm", str(ckpt)) == SamplingDefaults()
    assert load_sampling_defaults("auto", None) == SamplingDefaults()  # a random model: nothing to read
    plain = _write(tmp_path / "plain", repetition_penalty=1.0)  # ids only, a neutral penalty: nothing to say
    assert load_sampling_defaults("auto", str(plain)).describe() == ""
    other = _write(tmp_path / "other", min_p=0.05)
    assert load_sampling_defaults(str(other), str(ckpt)).values() == {"min_p": 0.05}  # a folder beats the checkpoint


@pytest.mark.parametrize("cfg,msg", [
    ({"temperature": -1}, "temperature must be a finite number >= 0, got -1"),
    ({"top_p": 0}, "top_p must be a finite number in (0, 1], got 0"),
    ({"top_k": -2}, "top_k must be an integer >= -1, got -2"),
    ({"max_new_tokens": "8"}, "max_new_tokens must be an integer >= 1, got '8'"),
    ({"min_p": True}, "min_p must be a finite number in [0, 1], got True"),
])
def test_bad_values_name_the_file_and_key(tmp_path, cfg, msg):
    folder = _write(tmp_path, **cfg)
    with pytest.raises(ConfigError, match="generation_config.json: ") as e:
        load_sampling_defaults("auto", str(folder))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_folder_without_the_file_lists_the_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"no generation_config.json there \(valid: auto, vllm or a folder"):
        load_sampling_defaults(str(tmp_path), None)
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(CheckpointError, match="invalid JSON in .*generation_config.json"):
        load_sampling_defaults(str(tmp_path), None)


def test_request_fields_win_over_the_defaults():
    d = SamplingDefaults(temperature=0.0, top_p=0.5, top_k=0, min_p=0.1)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}])
    p = sampling_params(req, None, 16, None, d)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.0, 0.5, -1, 0.1)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], temperature=0.7, top_p=1.0, top_k=5,
                                min_p=0.0)
    p = sampling_params(req, None, 16, None, d)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.7, 1.0, 5, 0.0)
    p = sampling_params(ChatCompletionRequest(messages=[{"role": "user", "content": "x"}]), None, 16, None)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, -1, 0.0)  # no file: the OpenAI defaults


def test_served_requests_take_the_files_defaults(tmp_path):
    openai = pytest.importorskip("openai")
    from torchinferno.server.live import LiveServer

    folder = _write(tmp_path, temperature=0.0, max_new_tokens=4)
    argv = ["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "64", "--max-num-seqs", "4",
            "--served-model-name", "tiny", "--engine-in-process", "--generation-config", str(folder)]
    with LiveServer(argv) as s:
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=60)
        msgs = [{"role": "user", "content": "hello there"}]
        extra = {"ignore_eos": True}
        got = client.chat.completions.create(model="tiny", messages=msgs, extra_body=extra)
        want = client.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=4,
                                              extra_body=extra)
        assert got.usage.completion_tokens == 4 and got.choices[0].message.content == want.choices[0].message.content
        assert client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                              extra_body=extra).usage.completion_tokens == 2
        assert client.completions.create(model="tiny", prompt="abc", extra_body=extra).usage.completion_tokens == 4


def test_llm_generate_without_params_takes_the_checkpoints_defaults(tmp_path):
    from torchinferno.checkpoint.auto import save_pretrained
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm import LLM
    from torchinferno.testing import tiny_model

    ckpt = save_pretrained(tiny_model("llama3"), tmp_path / "ckpt")
    _write(ckpt, temperature=0.0, top_k=0, max_new_tokens=3)
    llm = LLM(str(ckpt), num_gpu_blocks=32, block_size=4)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.max_tokens, d.top_p) == (0.0, -1, 3, 1.0)
    prompt = [[5, 17, 99, 3]]
    want = llm.generate(prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True), use_tqdm=False)
    got = llm.generate(prompt, use_tqdm=False)
    assert len(got[0].token_ids) <= 3 and got[0].token_ids == want[0].token_ids[:len(got[0].token_ids)]
    assert LLM(str(ckpt), num_gpu_blocks=32, block_size=4, generation_config="vllm").get_default_sampling_params() \
        == SamplingParams()
