"""What an export checks before it writes: the vocabulary and the export folder."""

from __future__ import annotations

from pathlib import Path

from ratune.errors import RatuneError


def check_vocabulary(model, tokenizer, *, base_rows: int | None = None) -> dict:
    """Check that every token id of ``tokenizer`` has an embedding row in ``model`` and that the matrix
    was not resized in training: more rows than tokens only if the base model had ``base_rows`` (None:
    unknown, accepted); return ``{"embedding_rows", "tokenizer_length"}``.

    Raises:
        RatuneError: fewer rows than tokens, input and output rows differ, or rows != ``base_rows``.
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
    """Refuse an export folder ``out`` that exists and is not empty, or is inside ``checkpoint`` or holds it.

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
