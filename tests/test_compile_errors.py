"""torch.compile failing is the compiler's problem, not the user's: `pretrain` and `finetune` say so in one line
with the fix (leave --compile out; `pretrain --no-compile --resume` goes on from the last checkpoint), and a resume
can turn --compile off. (On an H200 with torch 2.11, `finetune --compile` stopped with an 80-line Inductor trace.)"""
import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.errors import compile_failure


def a_real_compile_error() -> Exception:
    """What TorchDynamo raises for a graph it refuses (fullgraph=True and an explicit break), a subclass of its
    TorchDynamoException as Inductor's errors are."""
    def f(x):
        torch._dynamo.graph_break()
        return x + 1

    torch._dynamo.reset()
    try:
        torch.compile(f, fullgraph=True, backend="eager")(torch.ones(2))
    except Exception as e:  # noqa: BLE001
        return e
    pytest.fail("the graph break compiled")


def test_a_compile_failure_becomes_one_line_with_the_fix_and_nothing_else_does():
    error = a_real_compile_error()
    message = compile_failure(error, "leave it out")
    assert message.startswith(f"torch.compile could not compile this model ({type(error).__name__}: ")
    assert "leave it out" in message and "\n" not in message
    assert compile_failure(RuntimeError("CUDA out of memory"), "x") is None
    assert compile_failure(ValueError("bad row"), "x") is None


def test_torchdynamo_verbose_lets_the_compilers_trace_through(monkeypatch):
    """The one-line message says TORCHDYNAMO_VERBOSE=1 shows the trace: then the error itself must propagate (on an
    H200 the one line hid the op that failed even with it set)."""
    error = a_real_compile_error()
    monkeypatch.setenv("TORCHDYNAMO_VERBOSE", "1")
    assert compile_failure(error, "leave it out") is None
    monkeypatch.setenv("TORCHDYNAMO_VERBOSE", "0")
    assert compile_failure(error, "leave it out").startswith("torch.compile could not compile this model")


def test_the_commands_print_the_compile_failure_and_let_other_errors_through(tmp_path, monkeypatch):
    error = a_real_compile_error()

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr("bertkit.pretrain.pretrain", fails)
    r = CliRunner().invoke(main, ["pretrain", "--instances", str(tmp_path), "--out", str(tmp_path / "run"),
                                  "--compile"])
    assert r.exit_code == 1 and "torch.compile could not compile this model" in r.output
    assert "run it with --no-compile (with --resume it goes on from the run's last checkpoint)" in r.output
    assert "Traceback" not in r.output

    monkeypatch.setattr("bertkit.finetune.classify.finetune_classify", fails)
    (tmp_path / "rows.csv").write_text("sentence,label\na,0\n")
    args = ["finetune", "classify", "--model", str(tmp_path), "--train-file", str(tmp_path / "rows.csv"),
            "--dev-file", str(tmp_path / "rows.csv"), "--text-a", "sentence", "--out", str(tmp_path / "ft"),
            "--compile"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "run the same command without --compile" in r.output, r.output

    def other(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr("bertkit.finetune.classify.finetune_classify", other)
    r = CliRunner().invoke(main, args)
    assert isinstance(r.exception, RuntimeError) and str(r.exception) == "a bug of ours"  # not dressed up


def test_a_resume_keeps_the_runs_compile_unless_no_compile_is_given(tmp_path, monkeypatch):
    from bertkit.formats import RunConfig
    from bertkit.pretrain import PretrainConfig
    from bertkit.pretrain.resume import inherit

    run = RunConfig(stage="pretrain", pretrain={"compile": True, "model": "tiny"}, resolved={}, model={},
                    init_from="", instances="inst", vocab_size=32, vocab_sha256=None, max_seq_length=32,
                    world_size=1, deepspeed={})
    cfg = PretrainConfig(instances="inst", out="run", resume=True)  # compile=False: the flag's default
    assert inherit(cfg, run, given=set()).compile is True               # `pretrain --resume`
    assert inherit(cfg, run, given={"compile"}).compile is False        # `pretrain --resume --no-compile`

    seen = []
    monkeypatch.setattr("bertkit.pretrain.pretrain", lambda cfg, given: seen.append((cfg.compile, given)) or {})
    for flags in ([], ["--no-compile"]):
        r = CliRunner().invoke(main, ["pretrain", "--instances", str(tmp_path), "--out", str(tmp_path), "--resume",
                                      *flags])
        assert r.exit_code == 0, r.output
    assert [(c, "compile" in given) for c, given in seen] == [(False, False), (False, True)]  # what inherit reads
