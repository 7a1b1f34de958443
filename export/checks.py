"""What an export checks before it writes: the vocabulary against the embedding matrix, and the
export folder against the checkpoint."""

from __future__ import annotations

from pathlib import Path

from ratune.errors import RatuneError


def check_vocabulary(model, tokenizer, *, base_rows: int | None = None) -> dict:
    """Check that every token id the tokenizer can produce has an embedding row, and that the
    embedding matrix was not resized during training.

    The rule: the input (and, when untied, output) embedding rows must equal ``len(tokenizer)``;
    more rows than tokens is accepted only when the base model had exactly that many rows, i.e.
    the padding is the base model's own (many models pad the matrix to a multiple of 64 or 128;
    those rows are never indexed) and no vocabulary was added or removed during training. Fewer
    rows than tokens is always refused: token ids >= rows (e.g. a pad token added to the tokenizer
    without resizing the model) would index past the matrix. ratune itself never adds tokens
    (:func:`ratune.models.load_tokenizer` pads with EOS).

    Args:
        model: a causal LM.
        tokenizer: the tokenizer to export with it.
        base_rows: embedding rows of the base model before training (None when unknown: then any
            rows >= len(tokenizer) are accepted, the model's own config being the reference).
    Returns:
        ``{"embedding_rows", "tokenizer_length"}``.
    Raises:
        RatuneError: naming both numbers when the rows and the tokenizer length disagree as above.
    """
    rows = int(model.get_input_embeddings().weight.shape[0])
    out_emb = model.get_output_embeddings()
    n_tok = len(tokenizer)
    if out_emb is not None and int(out_emb.weight.shape[0]) != rows:
        raise RatuneError(f"vocabulary mismatch: input embeddings have {rows} rows but the output layer has "
                          f"{int(out_emb.weight.shape[0])}; refusing to export")
    if rows < n_tok:
        raise RatuneError(
            f"vocabulary mismatch: the model has {rows} embedding rows but the tokenizer has {n_tok} tokens "
            f"(tokens were added without resizing the embeddings); refusing to export a model that cannot "
            f"embed token ids {rows}..{n_tok - 1}")
    if rows > n_tok and base_rows is not None and rows != base_rows:
        raise RatuneError(
            f"vocabulary mismatch: the model has {rows} embedding rows but the tokenizer has {n_tok} tokens, "
            f"and the base model had {base_rows} rows (the embeddings were resized during training); "
            f"refusing to export")
    return {"embedding_rows": rows, "tokenizer_length": n_tok}


def check_out_folder(checkpoint: Path, out: Path) -> None:
    """Refuse an export folder that exists and is not empty, or that is inside the checkpoint or
    holds it (compared resolved: symlinks and ``..`` followed).

    Raises:
        RatuneError: naming the folder and the reason.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RatuneError(f"{out}: output folder exists and is not empty; choose another --out")
    source = checkpoint.resolve()
    if out == source or source in out.parents:
        raise RatuneError(f"{out}: the export folder is inside the checkpoint {source}; choose an --out outside it")
    if out in source.parents:
        raise RatuneError(f"{out}: the export folder would hold the checkpoint {source}; choose another --out")
