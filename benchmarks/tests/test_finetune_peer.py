"""benchmarks/lib/finetune_peer.py, transformers' side of the fine-tuning parity grid: its loop resumes exactly."""
import pytest
import torch


@pytest.mark.parametrize("killed_at_batch", [6, 12])  # at the second epoch's first batch, in epoch 3
def test_the_parity_benchmarks_peer_resumes_to_the_weights_of_an_unkilled_run(tmp_path, killed_at_batch):
    """benchmarks/lib/finetune_peer.py's loop (transformers' side of the parity grid) saves its state and a rerun ends
    at the same weights as a run never killed: the optimizer, schedule, shuffle and dropout's draws all continue. 37
    rows in batches of 8 make 5 batches an epoch, the last short."""
    pytest.importorskip("transformers")
    import finetune_peer as peer
    from transformers import BertConfig, BertForQuestionAnswering

    class Killed(Exception):
        pass

    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(0, 50, (12,), generator=g).tolist(), "start_positions": i % 12,
             "end_positions": (i + 2) % 12} for i in range(37)]
    collated = {"n": 0, "die_at": None}

    def collate(batch):
        collated["n"] += 1
        if collated["n"] == collated["die_at"]:
            raise Killed
        return {k: torch.tensor([r[k] for r in batch]) for k in batch[0]}

    def run(state_path, die_at=None):
        collated.update(n=0, die_at=die_at)
        torch.manual_seed(0)
        model = BertForQuestionAnswering(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32))
        torch.manual_seed(5)  # dropout's draws
        earlier = peer.train_loop(model, peer.ShuffledBatches(rows, 8, collate, 42), 13, 1e-2, 0.01, 0.1, 1.0,
                                  state_path, every_s=0.0)
        return model.state_dict(), earlier

    whole, _ = run(None)
    state = tmp_path / "peer_state.pt"
    with pytest.raises(Killed):
        run(state, die_at=killed_at_batch)
    assert state.is_file()
    resumed, earlier = run(state)
    assert earlier > 0  # the killed run's training time is carried into the cell's seconds
    for name, weight in whole.items():
        assert torch.equal(weight, resumed[name]), name
