"""Every numeric flag of every command has its range where it is parsed: 0, a negative number, nan and inf either
fit the flag's range or are a usage error (exit 2) naming the flag, never a traceback and never a run that does
nothing (`pretrain --max-steps 0` once exited 0)."""
import click
import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.commands import Real

ALLOWED_NEGATIVE = {"--null-score-diff-threshold"}  # a difference of scores: any finite real


def commands(group=main, path=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def numeric_options():
    for path, cmd in commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(p.type, (click.types.IntParamType,
                                                                   click.types.FloatParamType)):
                yield pytest.param(path, p, id=f"{' '.join(path)} {p.opts[0]}")


def accepts(option, value) -> bool:
    try:
        option.type.convert(value, option, None)
        return True
    except click.BadParameter:
        return False


@pytest.mark.parametrize("path,option", list(numeric_options()))
def test_every_numeric_flag_has_its_range(path, option):
    flag = option.opts[0]
    assert isinstance(option.type, (click.IntRange, Real)), f"{flag}: a bare {option.type.name}; give it a range"
    assert not accepts(option, "nan") and not accepts(option, "inf")
    assert flag in ALLOWED_NEGATIVE or not accepts(option, "-1")
    for value in ("0", "-1", "nan", "inf"):
        if accepts(option, value):
            continue
        r = CliRunner().invoke(main, [*path, flag, value])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
        assert any(f"'{o}'" in r.output for o in option.opts), r.output  # "Invalid value for '--lr': ..."


def test_the_walk_sees_every_command():
    walked = {" ".join(path) for path, _ in commands()}
    assert {"pretrain", "make-instances", "train-tokenizer", "prepare-corpus", "finetune squad", "finetune ner",
            "fill-mask"} <= walked
    assert sum(1 for _ in numeric_options()) >= 80
