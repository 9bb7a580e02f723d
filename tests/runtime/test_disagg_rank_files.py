"""disagg-init's rank files run standalone: one prefill and two decode rank files are started as processes (ports
base + rank), driven by disagg-smoke (tokens == colocated), fed malformed RPCs (4xx, nothing changes), and one decode
rank is killed mid-request (the driver reports it and the prefill rank frees the request's KV)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from torchinferno.cli.main import main
from torchinferno.errors import TorchInfernoError
from torchinferno.ports import free_port
from torchinferno.runtime.disagg import (
    DisaggError,
    RankClient,
    encode_message,
    run_disagg_request,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")
GREEDY = {"max_tokens": 3, "temperature": 0.0}


def _free_run(n: int) -> int:
    """A base port with ``n`` consecutive free ports."""
    for _ in range(50):
        base = free_port()
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def _start(path: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, str(path), "--threads", "1"], stdout=f, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("disagg")
    base = _free_run(3)
    assert main(["disagg-init", str(d / "ranks"), "--prefill-ranks", "1", "--decode-ranks", "2", "--base-port",
                 str(base), "--family", "llama3", "--num-blocks", "16", "--block-size", "8"]) == 0
    assert main(["disagg-init", str(d / "cuda"), "--base-port", str(base), "--family", "llama3", "--device",
                 "cuda"]) == 0
    files = sorted((d / "ranks").glob("rank_*.py"))
    procs = [_start(f, d / f"{f.stem}.log") for f in files]
    cuda = None if torch.cuda.is_available() else subprocess.Popen(
        [sys.executable, str(d / "cuda" / "rank_0_prefill.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC}, text=True)
    clients = [RankClient(f"http://127.0.0.1:{base + r}", timeout_s=60) for r in range(3)]
    try:
        deadline = time.monotonic() + 120
        for c, p, f in zip(clients, procs, files):
            while True:
                try:
                    c.health()
                    break
                except TorchInfernoError:  # not up yet (RankUnreachable)
                    if p.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"{f.name} did not start: {(d / f'{f.stem}.log').read_text()[-2000:]}")
                    time.sleep(0.2)
        yield {"dir": d / "ranks", "base": base, "clients": clients, "procs": procs, "cuda": cuda}
    finally:
        for p in procs + ([cuda] if cuda else []):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def _state(c: RankClient) -> tuple:
    h = c.health()
    return h["free_blocks"], h["held_requests"]


def test_init_writes_one_file_per_rank_with_its_port(ranks):
    d, base = ranks["dir"], ranks["base"]
    assert sorted(p.name for p in d.glob("rank_*.py")) == ["rank_0_prefill.py", "rank_1_decode.py", "rank_2_decode.py"]
    manifest = json.loads((d / "manifest.json").read_text())
    assert [(r["role"], r["url"]) for r in manifest["ranks"]] == [
        ("prefill", f"http://127.0.0.1:{base}"), ("decode", f"http://127.0.0.1:{base + 1}"),
        ("decode", f"http://127.0.0.1:{base + 2}")]
    text = (d / "rank_1_decode.py").read_text()
    assert "rank 1: DECODE" in text and f"port={base + 1}," in text and "POST /decode" in text
    assert "tiny random llama3" in text and "disagg-smoke" in (d / "README.md").read_text()
    for r, c in enumerate(ranks["clients"]):  # each file serves its role on base + rank
        h = c.health()
        assert (h["role"], h["rank"], h["family"]) == ("prefill" if r == 0 else "decode", r, "llama3")


def test_init_refuses_bad_flags_in_one_line(tmp_path, capsys):
    assert main(["disagg-init", str(tmp_path), "--prefill-ranks", "0"]) == 1
    assert main(["disagg-init", str(tmp_path), "--family", "nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--prefill-ranks" in err[0] and "nope" in err[1]


def test_cuda_rank_file_without_cuda_fails_in_one_line(ranks):
    if ranks["cuda"] is None:
        pytest.skip("this machine has CUDA")
    _, err = ranks["cuda"].communicate(timeout=120)
    assert ranks["cuda"].returncode == 1
    assert err.strip().count("\n") == 0 and "not available" in err and "rank_0_prefill.py" in err


def test_smoke_through_the_rank_files_matches_colocated(ranks, capsys):
    base = ranks["base"]
    before = _state(ranks["clients"][0])
    rc = main(["disagg-smoke", "--prefill-url", f"http://127.0.0.1:{base}", "--decode-url",
               f"http://127.0.0.1:{base + 1}", "--prompt", "1", "2", "3", "--new-tokens", "2", "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "check: disaggregated tokens == colocated tokens" in out
    bpt = ranks["clients"][0].health()["kv_bytes_per_token"]
    assert f"kv bytes moved: {3 * bpt} " in out
    assert _state(ranks["clients"][0]) == before
    # several requests in flight over both decode ranks: each equals its colocated generation
    rc = main(["disagg-smoke", "--prefill-url", f"http://127.0.0.1:{base}", "--decode-url",
               f"http://127.0.0.1:{base + 1}", f"http://127.0.0.1:{base + 2}", "--prompt", *map(str, range(1, 11)),
               "--new-tokens", "3", "--requests", "4", "--concurrency", "2", "--check", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["requests"] == 4 and len(res["results"]) == 4
    assert all(r["token_ids"] == r["colocated_token_ids"] and len(r["token_ids"]) == 3 for r in res["results"])
    assert res["kv_bytes_total"] == (10 + 3 * 11) * bpt
    assert _state(ranks["clients"][0]) == before


def _post(port: int, path: str, body: bytes) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body)
        r = conn.getresponse()
        return r.status, json.loads(r.read())["error"]
    finally:
        conn.close()


def test_malformed_rpcs_get_4xx_and_change_nothing(ranks):
    base, (p, d, _) = ranks["base"], ranks["clients"]
    prompt = [5, 6, 7, 8, 9]
    ctl, tensors, _ = p.prefill("held", prompt, GREEDY)
    good = {"request_id": "held", "prompt_token_ids": prompt, "first_token": ctl["first_token"], "sampling": GREEDY}
    name = "layer.0.k"
    before = (_state(p), _state(d))
    frame = encode_message(good, tensors)
    cases = [
        (base, "/prefill", b"{not json", "not valid JSON"),
        (base, "/prefill", json.dumps({"request_id": "x", "prompt_token_ids": [1, "a"]}).encode(), "prompt_token_ids"),
        (base, "/release", json.dumps({"request_id": "nobody"}).encode(), "unknown request_id 'nobody'"),
        (base, "/kv", json.dumps({"request_id": "nobody"}).encode(), "unknown request_id 'nobody'"),
        (base, "/nowhere", b"{}", "no route"),
        (base, "/decode", frame, "served by decode ranks"),
        (base + 1, "/prefill", json.dumps({"request_id": "x", "prompt_token_ids": [1]}).encode(), "served by prefill"),
        (base + 1, "/decode", frame[: len(frame) // 2], "truncated"),
        (base + 1, "/decode", b"{}", "truncated"),
        (base + 1, "/decode", encode_message(good, {**tensors, name: tensors[name].double()}), "dtype float64"),
        (base + 1, "/decode", encode_message(good, {**tensors, name: tensors[name][:, :1]}), "has shape"),
        (base + 1, "/decode", encode_message({**good, "first_token": 10**6}, tensors), "first_token"),
    ]
    for port, path, body, msg in cases:
        status, err = _post(port, path, body)
        assert 400 <= status < 500 and msg in err and "\n" not in err, (path, msg, status, err)
    assert (_state(p), _state(d)) == before
    out, _ = d.decode(good, tensors)  # the ranks keep serving: the good request still works
    assert out["token_ids"][0] == ctl["first_token"] and len(out["token_ids"]) == 3
    p.release("held")


def test_decode_rank_killed_mid_request_frees_the_prefill_kv(ranks):
    p, d, victim = ranks["clients"]
    proc = ranks["procs"][2]
    before = _state(p)
    os.kill(proc.pid, signal.SIGSTOP)  # the request reaches the rank's socket; the rank never answers it
    box: dict = {}

    def drive():
        try:
            run_disagg_request(p, victim, [1, 2, 3, 4], GREEDY, request_id="doomed")
        except DisaggError as e:
            box["error"] = str(e)

    t = threading.Thread(target=drive)
    t.start()
    deadline = time.monotonic() + 60
    while p.health()["held_requests"] != ["doomed"]:  # prefilled: the decode call is in flight
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    t.join(timeout=60)
    err = box.get("error", "")
    assert "request doomed: decode rank failed" in err and "released its KV on the prefill rank" in err, box
    assert _state(p) == before  # the prefill rank freed the request's blocks
    res = run_disagg_request(p, d, [1, 2, 3, 4], GREEDY)  # the rest keep serving
    assert len(res.token_ids) == 3 and _state(p) == before


def test_readme_init_command_writes_eight_cuda_rank_files(tmp_path, monkeypatch, capsys):
    """The README's line: `disagg-init .torchinferno_disagg --prefill-ranks 4 --decode-ranks 4 --base-port 8800
    --device cuda` (accepted without CUDA; the rank files check the device when they start)."""
    monkeypatch.chdir(tmp_path)
    assert main(["disagg-init", ".torchinferno_disagg", "--prefill-ranks", "4", "--decode-ranks", "4",
                 "--base-port", "8800", "--device", "cuda"]) == 0
    d = tmp_path / ".torchinferno_disagg"
    names = sorted(p.name for p in d.glob("rank_*.py"))
    assert names == [f"rank_{r}_prefill.py" for r in range(4)] + [f"rank_{r}_decode.py" for r in range(4, 8)]
    text = (d / "rank_4_decode.py").read_text()
    assert "port=8804," in text and "device='cuda'," in text and "role='decode'," in text
    compile(text, "rank_4_decode.py", "exec")  # a valid standalone Python file


def test_sigterm_stops_a_rank_cleanly(ranks):
    """Last test of the module's ranks: SIGTERM ends a rank file's serve loop with exit status 0."""
    proc = ranks["procs"][1]
    proc.terminate()
    assert proc.wait(timeout=30) == 0
