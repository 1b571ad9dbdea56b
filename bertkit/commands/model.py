"""`bertkit fill-mask`: the top-k predictions of a model's MLM head at each [MASK] (a quick sanity check)."""
import click


def fill_mask_predictions(model, tokenizer, texts, top_k: int = 5, device="cpu"):
    """For each text, for each [MASK] in it: a list of (token, probability), best first.

    model: a bertkit BertForPreTraining; tokenizer: a `tokenizers.Tokenizer` that adds [CLS]/[SEP].
    """
    import torch

    mask_id = tokenizer.token_to_id("[MASK]")
    if mask_id is None:
        raise click.ClickException("the tokenizer has no [MASK] token")
    max_len = model.cfg.max_position_embeddings
    results = []
    for text in texts:
        ids = tokenizer.encode(text).ids
        if len(ids) > max_len:
            raise click.ClickException(f"text is {len(ids)} tokens; the model takes at most {max_len}")
        positions = [i for i, t in enumerate(ids) if t == mask_id]
        if not positions:
            raise click.ClickException(f"no [MASK] in {text!r} (write the mask token as [MASK])")
        input_ids = torch.tensor([ids], device=device)
        with torch.no_grad():
            out = model(input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids),
                        mlm_positions=torch.tensor([positions], device=device))
        probs = out.mlm_logits[0].float().softmax(-1)
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        results.append([
            [(tokenizer.id_to_token(int(i)), float(p)) for p, i in zip(top.values[m], top.indices[m])]
            for m in range(len(positions))
        ])
    return results


@click.command("fill-mask")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="An HF-format BERT folder with an MLM head (e.g. from `bertkit export`), with its tokenizer files.")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Predictions per [MASK].")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (cuda when available).")
@click.argument("texts", nargs=-1, required=True)
def fill_mask(model_dir, top_k, device, texts):
    """Print the top-k tokens (with probabilities) for each [MASK] in TEXTS.

    Example: bertkit fill-mask --model out/export "The capital of France is [MASK]."
    """
    import torch

    from bertkit.checkpoint import load_pretrained
    from bertkit.tokenization import load_tokenizer

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model = load_pretrained(model_dir, head="pretraining", require_head=True)
    except (ValueError, FileNotFoundError) as e:
        hint = ("; fill-mask needs a model pretrained with masked-LM, not an encoder-only or fine-tuned checkpoint"
                if "head" in str(e) else "")
        raise click.ClickException(f"{e}{hint}") from e
    tokenizer = load_tokenizer(model_dir)
    model.to(device)
    for text, masks in zip(texts, fill_mask_predictions(model, tokenizer, texts, top_k, device)):
        click.echo(text)
        for n, predictions in enumerate(masks, 1):
            if len(masks) > 1:
                click.echo(f"  [MASK] {n}:")
            for rank, (token, prob) in enumerate(predictions, 1):
                click.echo(f"  {rank:>2}. {token:<20} {prob:.4f}")
