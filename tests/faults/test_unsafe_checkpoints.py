"""A run folder never runs code (issue 36, part 1): a crafted pickle in any file of a checkpoint (model states,
ZeRO optimizer states, RNG states), with checksums recomputed as its author would, is refused by export, --resume
and --init-from, naming the file, and its payload never runs. Real checkpoints of every ZeRO stage still load."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.fileio import file_entry
from bertkit.pretrain import PretrainConfig, pretrain
from bertkit.safe_load import UnsafeCheckpointError, refusing_code, safe_load, unsafe_globals
from tests.helpers import REPO, tiny_run


class Payload:
    """Unpickling this runs `touch <marker>`, as an os.system payload in a downloaded checkpoint would."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A two-step run for each ZeRO stage (one process), made once."""
    root = tmp_path_factory.mktemp("unsafe")
    made = {stage: tiny_run(root, f"zero{stage}", zero_stage=stage, lr=1e-3)[1] for stage in (0, 1, 2, 3)}
    return root / "inst", made


def plant(run: Path, name_pattern: str, marker: Path) -> Path:
    """Add a payload entry to the checkpoint file matching name_pattern and recompute checkpoint.json, as a
    hostile folder's author would. Returns the file."""
    folder = run / "checkpoints" / "global_step2"
    target = next(p for p in sorted(folder.glob("*.pt")) if re.fullmatch(name_pattern, p.name))
    data = safe_load(target)  # our own file: plain data
    data["extra"] = Payload(marker)
    torch.save(data, target)
    marker_file = folder / "checkpoint.json"
    meta = json.loads(marker_file.read_text())
    meta["files"][target.name] = file_entry(target)
    marker_file.write_text(json.dumps(meta))
    return target


FILES = {0: ["mp_rank_00_model_states.pt", "rng_rank0.pt"],
         1: [r"zero_pp_rank_0_mp_rank_00_optim_states.pt", "rng_rank0.pt"],
         2: [r"zero_pp_rank_0_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"],
         3: [r"zero_pp_rank_0_mp_rank_00_optim_states.pt", r"zero_pp_rank_0_mp_rank_00_model_states.pt"]}


@pytest.mark.parametrize("stage,pattern", [(s, f) for s, fs in FILES.items() for f in fs])
def test_a_planted_payload_is_refused_by_export_resume_and_init_from(runs, stage, pattern, tmp_path,
                                                                     clean_dist_env):
    inst, made = runs
    run = tmp_path / "run"
    shutil.copytree(made[stage], run)
    marker = tmp_path / "payload_ran"
    target = plant(run, pattern, marker)
    assert unsafe_globals(target) == ["posix.system"]
    message = f"{target}: holds objects a checkpoint never holds (posix.system); this folder may not come from " \
              "bertkit"
    common = ["--instances", str(inst), "--model", str(inst.parent / "model.json"), "--micro-batch", "8",
              "--max-steps", "4", "--eval-every", "0", "--num-workers", "0", "--optimizer", "adamw",
              "--zero-stage", str(stage), "--report-to", "none", "--no-progress"]
    commands = {"export": ["export", str(run), "--out", str(tmp_path / "export")],
                "resume": ["pretrain", *common, "--out", str(run), "--resume"],
                "init-from": ["pretrain", *common, "--out", str(tmp_path / "fresh"), "--init-from", str(run)]}
    for what, args in commands.items():
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1, (what, r.output)
        assert message in r.output, (what, r.output)
        assert "Traceback" not in r.output
        assert not marker.exists(), f"{what} ran the payload"
    assert not (tmp_path / "export" / "model.safetensors").exists()


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_the_second_layer_refuses_when_the_scan_is_bypassed(runs, stage, tmp_path, monkeypatch, clean_dist_env):
    """Should a file change between rank 0's scan and the load, DeepSpeed's own loaders (load_checkpoint,
    zero_to_fp32) still unpickle under weights_only=True."""
    import bertkit.pretrain.checkpoints as ck

    inst, made = runs
    run = tmp_path / "run"
    shutil.copytree(made[stage], run)
    marker = tmp_path / "payload_ran"
    plant(run, FILES[stage][0], marker)
    monkeypatch.setattr(ck, "first_unsafe_file", lambda folder: None)
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        ck.export(run, tmp_path / "export")
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        pretrain(PretrainConfig(instances=str(inst), out=str(run), model=str(inst.parent / "model.json"),
                                micro_batch=8, max_steps=4, eval_every=0, progress=False, num_workers=0,
                                optimizer="adamw", lr=1e-3, report_to="none", zero_stage=stage, resume=True))
    assert not marker.exists()


def test_real_checkpoints_hold_only_allowed_types(runs):
    _, made = runs
    files = [p for run in made.values() for p in (run / "checkpoints" / "global_step2").glob("*.pt")]
    assert len(files) >= 9
    for path in files:
        assert unsafe_globals(path) == [], path
        safe_load(path)


def test_a_legacy_pickle_is_refused_unread(tmp_path):
    """torch's pre-1.6 format cannot be scanned, so it is refused by the scan, and by weights_only when loaded."""
    marker = tmp_path / "payload_ran"
    path = tmp_path / "old.pt"
    torch.save({"w": torch.zeros(2), "x": Payload(marker)}, path, _use_new_zipfile_serialization=False)
    assert unsafe_globals(path) and "not a torch zip checkpoint" in unsafe_globals(path)[0]
    with pytest.raises(UnsafeCheckpointError, match=re.escape(str(path))):
        safe_load(path)
    with pytest.raises(UnsafeCheckpointError), refusing_code():
        torch.load(path, weights_only=False)  # asking for pickles inside refusing_code gets none
    assert not marker.exists()
    assert torch.load is not None and torch.load.__module__ == "torch.serialization"  # restored


def test_no_code_loads_checkpoints_around_safe_load():
    """Every torch.load in bertkit goes through bertkit.safe_load: a new one elsewhere fails here."""
    offenders = []
    for folder in ("bertkit", "pipelines", "kernels"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            if path.name != "safe_load.py" and ("torch.load(" in text or "weights_only=False" in text):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
