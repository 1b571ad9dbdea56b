"""`bertkit report`: the page of a real pretraining run and of a real fine-tuning run, opened in a real headless
Chromium over the DevTools protocol: no console errors, every image decoded, and a screenshot that is not blank."""
import base64
import io
import json
import re
import shutil
import subprocess
import time
import urllib.request

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from tests.helpers import TINY, toy_vocab, write_corpus

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")


class Browser:
    """Headless Chromium driven over the DevTools protocol (websocket-client): just what these checks need."""

    def __init__(self, profile):
        import websocket

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1280,2000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            if m := re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line):
                port = int(m.group(1))
            elif not line and self.proc.poll() is not None:
                break
        if port is None:
            self.close()
            pytest.fail("chromium did not start its DevTools endpoint")
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(p for p in pages if p["type"] == "page")
        # no Origin header: Chromium 111 and later refuse a DevTools connection from an origin not allowed by flag
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.next_id, self.events = 0, []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    def wait_for(self, method, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(e.get("method") == method for e in self.events):
                return
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def close(self):
        if getattr(self, "ws", None):
            self.ws.close()
        self.proc.kill()
        self.proc.wait()


def check_page(path, tmp_path):
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (the README's test command installs Debian's chromium; "
                    "it could not here)")
    browser = Browser(tmp_path / "profile")
    try:
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", url=path.resolve().as_uri())
        browser.wait_for("Page.loadEventFired")
        images = browser.call("Runtime.evaluate", returnByValue=True, expression=(
            "Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"))
        shot = browser.call("Page.captureScreenshot", format="png")
        title = browser.call("Runtime.evaluate", expression="document.title", returnByValue=True)
    finally:
        browser.close()
    errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == []
    images = images["result"]["value"]
    assert images and all(complete and width > 100 and height > 100 for _, complete, width, height in images)

    from PIL import Image  # comes with matplotlib

    picture = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    colors = picture.getcolors(maxcolors=1 << 20)
    assert picture.size[0] >= 1000 and len(colors) > 50  # plots, not a blank or an error page
    return title["result"]["value"], [alt for alt, *_ in images]


@pytest.mark.slow
def test_pretraining_report_renders(tmp_path, clean_dist_env):
    import random

    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pretrain import PretrainConfig, pretrain

    # a real make-instances folder (its manifest carries the statistics the page plots) over the toy vocabulary
    rng = random.Random(0)
    words = [f"w{i}" for i in range(120)]
    docs = [[" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(rng.randint(2, 8))]
            for _ in range(60)]
    write_corpus(tmp_path / "corpus", [docs[:50]], [docs[50:]])
    (tmp_path / "vocab.txt").write_text("\n".join(toy_vocab()) + "\n")
    inst = tmp_path / "inst"
    make_instances(tmp_path / "corpus", tmp_path / "vocab.txt", inst, InstancesConfig(max_seq_length=32, dupe=2),
                   progress=False)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    run = tmp_path / "run"
    pretrain(PretrainConfig(instances=str(inst), out=str(run), model=str(tmp_path / "model.json"), micro_batch=8,
                            max_steps=6, log_every=1, eval_every=3, eval_batches=1, progress=False, num_workers=0,
                            report_to="none"))
    r = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "pretrain.html")])
    assert r.exit_code == 0, r.output
    title, figures = check_page(tmp_path / "pretrain.html", tmp_path)
    assert title == "bertkit pretraining run: run"
    assert {"loss", "accuracy", "learning rate", "throughput (sequences/s)", "instance lengths",
            "masking and NotNext shares"} <= set(figures)


@pytest.mark.slow
def test_finetuning_report_renders(tmp_path):
    from bertkit.finetune.classify import finetune_classify
    from bertkit.finetune.train import TrainConfig
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), tmp_path / "model",
                    tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    finetune_classify(tmp_path / "model", tmp_path / "train.tsv", tmp_path / "train.tsv",
                      TrainConfig(out_dir=str(tmp_path / "ft"), epochs=2, batch_size=8, save_model=False,
                                  log_every=1, report_to="none"), text_a="text", max_seq_length=16)
    r = CliRunner().invoke(main, ["report", str(tmp_path / "ft")])
    assert r.exit_code == 0, r.output
    title, figures = check_page(tmp_path / "ft" / "report.html", tmp_path)
    assert title.startswith("bertkit fine-tuning run: classify")
    assert {"training loss", "held-out (dev) metrics", "learning rate"} <= set(figures)


def test_a_folder_that_is_no_run_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert r.exit_code != 0 and "neither a pretraining run" in r.output
