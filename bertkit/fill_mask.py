"""Fill-mask: a pretrained model's top-k tokens at each [MASK] of a text (a quick check of any MLM checkpoint)."""
import torch

from bertkit.tokenization import MASK, token_text


def fill_mask_predictions(model, tokenizer, texts, top_k: int = 5, device="cpu") -> list:
    """For each text, for each [MASK] in it: a list of (token as it reads, probability), best first.

    model: a bertkit BertForPreTraining; tokenizer: a `tokenizers.Tokenizer` that adds [CLS]/[SEP].
    Raises ValueError for a text without [MASK] or longer than the model's positions.
    """
    mask_id = tokenizer.token_to_id(MASK)
    if mask_id is None:
        raise ValueError(f"the tokenizer has no {MASK} token")
    max_len = model.cfg.max_length
    results = []
    for text in texts:
        ids = tokenizer.encode(text).ids
        if len(ids) > max_len:
            raise ValueError(f"text is {len(ids)} tokens; the model takes at most {max_len}")
        positions = [i for i, t in enumerate(ids) if t == mask_id]
        if not positions:
            raise ValueError(f"no {MASK} in {text!r} (write the mask token as {MASK})")
        input_ids = torch.tensor([ids], device=device)
        with torch.no_grad():
            out = model(input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids),
                        mlm_positions=torch.tensor([positions], device=device))
        probs = out.mlm_logits[0].float().softmax(-1)
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        results.append([
            [(token_text(tokenizer, int(i)), float(p)) for p, i in zip(top.values[m], top.indices[m])]
            for m in range(len(positions))
        ])
    return results
