"""Packing is loss-equivalent to padded batches: no attention across packed examples.

What ratune runs with ``packing: true`` (train/sft.py -> ``SFTConfig(packing=True, ...)``, trl 1.16):
the default ``packing_strategy="bfd"`` packs whole rows into bins of at most ``max_length`` tokens
(``trl.data_utils.pack_dataset``, which records each bin's ``seq_lengths``) and, because the
strategy is bfd, SFTTrainer turns on ``padding_free``: its ``DataCollatorForLanguageModeling``
flattens a batch into one row with ``position_ids`` restarting at 0 for every example, no
``attention_mask``, and ``labels = -100`` where ``position_ids == 0``. ``SFTTrainer.compute_loss``
calls the model with ``use_cache=False``.

On the attention side, transformers 5.24's ``masking_utils.create_causal_mask`` builds a
block-diagonal causal mask from ``position_ids`` (``find_packed_sequence_indices``: a new example
starts wherever the position does not go up by 1) for the sdpa and eager implementations, but
only when ``attention_mask is None`` and no KV cache is passed (``_preprocess_mask_arguments``);
flash-attention kernels take the same boundaries from ``cu_seq_lens_*``/``position_ids``. So
packed training is leak-free on CPU (sdpa, the default ``load_model`` gets) exactly because TRL's
collator drops the attention mask and TRL's ``compute_loss`` passes ``use_cache=False``. The
controls below show each of those conditions matters: packing without ``position_ids``, with an
all-ones ``attention_mask``, or with a KV cache (``use_cache=True``, the Llama config's default)
attends across examples and the loss changes.

Tolerance: the packed and the padded loss are both float32 sums of the same per-token terms in a
different order and matrix shapes; they agree to 1e-5 absolute (observed: 1.6e-6 at a loss of
14.85, i.e. 1e-7 relative, float32 rounding). Each leak control changes this random model's loss
by more than 1e-3 (observed 0.19 to 0.27), so the margin is two orders of magnitude on each side.
"""

from __future__ import annotations

import pytest

#: answer lengths in words: very different, so examples of ~45 to ~300 tokens share one packed row
ANSWER_WORDS = [1, 250, 3, 90, 2, 160]
TOL = 1e-5


def _rows(tokenizer) -> list[dict]:
    """Rows exactly as train/preflight.py load_training_rows builds them: tokenize_row + labels -100 on the prompt."""
    from ratune.data.labels import tokenize_row

    words = "load the pretrained model from torch hub and run it on the image".split()
    rows = []
    for i, k in enumerate(ANSWER_WORDS):
        user = f"Question {i}: which API classifies images of {'cats' if i % 2 else 'dogs'}?" + " Be brief." * (i % 3)
        answer = " ".join(words[(i + j) % len(words)] for j in range(k))
        tok = tokenize_row(tokenizer, user, answer)
        rows.append({"input_ids": tok.input_ids,
                     "labels": [t if m else -100 for t, m in zip(tok.input_ids, tok.completion_mask)]})
    return rows


def _trainer(model, tokenizer, rows, out, *, packing: bool, max_length: int | None, padding_free: bool = False):
    """An SFTTrainer built with the SFTConfig arguments train/sft.py passes (CPU, one process);
    ``padding_free=True, packing=False, max_length=None`` is TRL's padding-free mode without packing."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(out), per_device_train_batch_size=len(rows), gradient_accumulation_steps=1,
                     learning_rate=1e-3, max_steps=1, use_cpu=True, report_to=[], seed=0, data_seed=0,
                     max_length=max_length, packing=packing, padding_free=padding_free, completion_only_loss=True, dataset_num_proc=None,
                     dataloader_num_workers=0, save_strategy="no", logging_steps=1)
    data = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows], "labels": [r["labels"] for r in rows]})
    return SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)


def _loss(model, batch) -> float:
    """Mean NLL over label tokens, as SFTTrainer/transformers compute it (shifted labels, -100 ignored)."""
    import torch

    with torch.no_grad():
        return float(model(**batch).loss)


def _reference_loss(model, rows) -> float:
    """Each example alone (batch 1, no padding at all): the per-token NLL summed over all examples'
    loss tokens, divided by their count. The ground truth both batchings must match."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            logits = model(input_ids=torch.tensor([r["input_ids"]]), use_cache=False).logits[0, :-1].double()
            labels = torch.tensor(r["labels"][1:])
            total += float(F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
            count += int((labels != -100).sum())
    return total / count


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    from ratune.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    model.eval()  # no dropout (Llama has none; explicit anyway)
    rows = _rows(tokenizer)
    lengths = [len(r["input_ids"]) for r in rows]
    assert max(lengths) > 5 * min(lengths), lengths  # very different lengths
    max_length = 2048
    assert sum(lengths) <= max_length  # all six fit one bin: one packed row holds every example
    out = tmp_path_factory.mktemp("packing")
    packed = _trainer(model, tokenizer, rows, out / "packed", packing=True, max_length=max_length)
    padded = _trainer(model, tokenizer, rows, out / "padded", packing=False, max_length=max_length)
    padding_free = _trainer(model, tokenizer, rows, out / "padding_free", packing=False, max_length=None,
                            padding_free=True)
    return {"model": model, "tokenizer": tokenizer, "rows": rows, "lengths": lengths, "packed": packed,
            "padded": padded, "padding_free": padding_free}


def _batch(trainer) -> dict:
    """One batch of the trainer's own prepared dataset through the trainer's own collator."""
    ds = trainer.train_dataset
    return trainer.data_collator([ds[i] for i in range(len(ds))])


def test_trl_packing_path_is_bfd_padding_free(setup):
    """ratune's SFTConfig(packing=True) in trl 1.16 runs bfd packing + the padding-free collator:
    one flattened row, position_ids restarting per example, no attention_mask; and the model runs
    sdpa (what ratune's load_model gets on CPU)."""
    packed, lengths = setup["packed"], setup["lengths"]
    assert packed.args.packing_strategy == "bfd"
    assert packed.padding_free and packed.data_collator.padding_free
    assert not setup["padded"].padding_free
    assert setup["model"].config._attn_implementation == "sdpa"
    ds = packed.train_dataset
    assert len(ds) == 1 and sorted(ds[0]["seq_lengths"]) == sorted(lengths)  # whole rows, one bin
    batch = _batch(packed)
    assert "attention_mask" not in batch
    assert batch["input_ids"].shape == (1, sum(lengths))  # no padding token processed
    pos = batch["position_ids"][0].tolist()
    starts = [i for i, p in enumerate(pos) if p == 0]
    assert [b - a for a, b in zip(starts, starts[1:] + [len(pos)])] == list(ds[0]["seq_lengths"])
    padded = _batch(setup["padded"])
    assert padded["input_ids"].shape == (len(lengths), max(lengths))
    assert int(padded["attention_mask"].sum()) == sum(lengths)


def test_packed_loss_equals_padded_loss(setup):
    """The packed batch's loss (through SFTTrainer.compute_loss, as training runs it) equals the
    padded batch's and the examples-one-at-a-time reference within 1e-5, with the same number of
    loss tokens: no attention across packed examples."""
    import torch

    model, rows = setup["model"], setup["rows"]
    packed_batch, padded_batch = _batch(setup["packed"]), _batch(setup["padded"])
    n_loss = sum(sum(1 for t in r["labels"][1:] if t != -100) for r in rows)
    # the same loss tokens: the shifted labels of both batches carry every answer token + EOS once
    assert int((packed_batch["labels"][:, 1:] != -100).sum()) == n_loss
    assert int((padded_batch["labels"][:, 1:] != -100).sum()) == n_loss
    with torch.no_grad():
        packed = float(setup["packed"].compute_loss(model, dict(packed_batch)))
        padded = float(setup["padded"].compute_loss(model, dict(padded_batch)))
    reference = _reference_loss(model, rows)
    assert packed == pytest.approx(reference, abs=TOL)
    assert padded == pytest.approx(reference, abs=TOL)
    assert packed == pytest.approx(padded, abs=TOL)
    # the plain forward with the collator's keys gives the same (the model's own loss path)
    assert _loss(model, {**packed_batch, "use_cache": False}) == pytest.approx(reference, abs=TOL)


def test_leak_controls_change_the_loss(setup):
    """Negative controls: the same packed tokens and labels, but with attention allowed across
    examples, give a clearly different loss, so the equivalence above would catch a leak.

    - no position_ids (what a collator that only concatenates would feed): positions run on and
      the causal mask spans the whole row;
    - correct position_ids plus an all-ones attention_mask: transformers then skips the packed-
      sequence detection, so only the attention leaks;
    - correct position_ids with a KV cache (use_cache=True, the Llama config's default): the
      detection is skipped too; TRL's compute_loss passes use_cache=False, which is why training
      does not leak.
    """
    import torch

    model, rows = setup["model"], setup["rows"]
    reference = _reference_loss(model, rows)
    batch = _batch(setup["packed"])
    base = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    no_positions = _loss(model, {**base, "use_cache": False})
    ones_mask = _loss(model, {**base, "position_ids": batch["position_ids"], "use_cache": False,
                              "attention_mask": torch.ones_like(batch["input_ids"])})
    with_cache = _loss(model, {**base, "position_ids": batch["position_ids"], "use_cache": True})
    for leaked in (no_positions, ones_mask, with_cache):
        assert abs(leaked - reference) > 1e-3, (leaked, reference)


def test_eager_attention_is_leak_free_too(setup, tiny_model_dir):
    """The eager implementation gets the same block-diagonal mask from position_ids (and leaks
    without them), so packing is safe on CPU with either of transformers' non-flash kernels."""
    import torch
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="eager")
    eager.eval()
    assert eager.config._attn_implementation == "eager"
    rows = setup["rows"]
    reference = _reference_loss(eager, rows)
    assert reference == pytest.approx(_reference_loss(setup["model"], rows), abs=TOL)  # same weights as sdpa
    batch = _batch(setup["packed"])
    packed = _loss(eager, {k: batch[k] for k in ("input_ids", "labels", "position_ids")} | {"use_cache": False})
    assert packed == pytest.approx(reference, abs=TOL)
    leaked = _loss(eager, {"input_ids": batch["input_ids"], "labels": batch["labels"], "use_cache": False})
    assert abs(leaked - reference) > 1e-3


def test_token_shares_by_hand():
    """Real and loss token shares of a run, worked out by hand (train/tokens.py)."""
    from ratune.train.tokens import seeded_order, shares_for_rows, token_shares

    lengths, loss = [2, 4, 6, 8], [1, 2, 1, 3]  # 20 real tokens, 7 loss tokens
    # dataset order, micro-batch 2: (2, 4) -> 2 x 4 = 8 and (6, 8) -> 2 x 8 = 16: 24 processed
    r = token_shares(lengths, loss, micro_batch_size=2, mode="per_batch")
    assert (r["processed_tokens"], r["real_tokens"], r["loss_tokens"]) == (24, 20, 7)
    assert r["real_token_share"] == pytest.approx(20 / 24) and r["loss_token_share"] == pytest.approx(7 / 24)
    # order (8, 2), (4, 6): 2 x 8 + 2 x 6 = 28 processed
    r = token_shares(lengths, loss, micro_batch_size=2, mode="per_batch", order=[3, 0, 1, 2])
    assert r["processed_tokens"] == 28 and r["real_token_share"] == pytest.approx(20 / 28)
    # micro-batch 3: (2, 4, 6) -> 3 x 6 = 18, then the short last batch (8) -> 8: 26 processed
    r = token_shares(lengths, loss, micro_batch_size=3, mode="per_batch")
    assert r["processed_tokens"] == 26 and r["loss_token_share"] == pytest.approx(7 / 26)
    # micro-batch 1: nothing is padded
    assert token_shares(lengths, loss, micro_batch_size=1, mode="per_batch")["real_token_share"] == 1.0
    # packing (TRL bfd + padding-free): no pad position is processed, whatever the micro-batch
    r = token_shares(lengths, loss, micro_batch_size=2, mode="packing", max_length=8)
    assert r["processed_tokens"] == 20 and r["real_token_share"] == 1.0
    assert r["loss_token_share"] == pytest.approx(7 / 20)
    # padding-free without packing: whole rows concatenated per micro-batch, nothing padded
    r = token_shares(lengths, loss, micro_batch_size=3, mode="padding_free")
    assert (r["processed_tokens"], r["real_token_share"]) == (20, 1.0)
    with pytest.raises(ValueError, match="longer than max_length"):
        token_shares(lengths, loss, micro_batch_size=2, mode="packing", max_length=7)
    with pytest.raises(ValueError, match="needs max_length"):
        token_shares(lengths, loss, micro_batch_size=2, mode="packing")
    with pytest.raises(ValueError, match="loss tokens"):
        token_shares([2], [3], micro_batch_size=1, mode="per_batch")
    with pytest.raises(ValueError, match="permutation"):
        token_shares(lengths, loss, micro_batch_size=2, mode="per_batch", order=[0, 0, 1, 2])
    with pytest.raises(ValueError, match="unknown mode"):
        token_shares(lengths, loss, micro_batch_size=2, mode="max_length")
    assert token_shares([], [], micro_batch_size=2, mode="per_batch")["real_token_share"] == 0.0

    # the sft.py helper: loss tokens counted from labels != -100, per-batch over the seeded order
    columns = {"input_ids": [[1] * n for n in lengths],
               "labels": [[-100] * (n - k) + [5] * k for n, k in zip(lengths, loss)]}
    order = seeded_order(4, 3)
    assert sorted(order) == [0, 1, 2, 3] and order == seeded_order(4, 3)
    expected = sum(2 * max(lengths[i] for i in order[s:s + 2]) for s in (0, 2))
    r = shares_for_rows(columns, micro_batch_size=2, packing=False, max_length=8, seed=3)
    assert r["mode"] == "per_batch" and r["processed_tokens"] == expected and r["loss_tokens"] == 7
    r = shares_for_rows(columns, micro_batch_size=2, packing=True, max_length=8, seed=3)
    assert r["mode"] == "packing" and r["real_token_share"] == 1.0 and r["loss_token_share"] == pytest.approx(7 / 20)
    r = shares_for_rows(columns, micro_batch_size=2, packing=False, max_length=8, seed=3, padding_free=True)
    assert r["mode"] == "padding_free" and r["processed_tokens"] == 20


def test_padding_free_without_packing_is_loss_equivalent_too(setup):
    """TRL's padding_free=True without packing (one micro-batch of whole examples flattened into one
    row, position_ids per example, no bins) goes through the same collator and mask path: same loss.
    It keeps "global_batch_size" counting examples, as in the paper recipe (see the report)."""
    import torch

    trainer = setup["padding_free"]
    assert trainer.padding_free and not trainer.args.packing
    batch = _batch(trainer)
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, sum(setup["lengths"]))
    with torch.no_grad():
        loss = float(trainer.compute_loss(setup["model"], dict(batch)))
    assert loss == pytest.approx(_reference_loss(setup["model"], setup["rows"]), abs=TOL)


def test_packing_refused_where_it_could_leak(setup, tiny_model_dir):
    """train/tokens.check_packing_attention: sdpa and eager (shown leak-free above) pass; an
    implementation outside the checked list, or remote modeling code, is refused."""
    import types

    from ratune.errors import RatuneError
    from ratune.train.tokens import check_packing_attention

    assert check_packing_attention(setup["model"]) == "sdpa"
    eager = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="eager"))
    assert check_packing_attention(eager) == "eager"
    other = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="my_custom_kernel"))
    with pytest.raises(RatuneError, match="uses 'my_custom_kernel'; set packing: false"):
        check_packing_attention(other)
    with pytest.raises(RatuneError, match="trust_remote_code: true.*set packing: false"):
        check_packing_attention(setup["model"], trust_remote_code=True)
    # through a peft wrapper, as train/sft.py holds a LoRA model
    from peft import LoraConfig, get_peft_model

    from ratune.models import load_model

    lora = get_peft_model(load_model(tiny_model_dir), LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert check_packing_attention(lora) == "sdpa"
