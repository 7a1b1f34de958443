"""The hub push of an exported folder; the token is never written to any file."""

from __future__ import annotations

import os

from ratune.errors import RatuneError


def hub_token(push_to_hub: str | None, private: bool) -> str | None:
    """The Hugging Face token for a push to ``push_to_hub`` (None: no push).

    Raises:
        RatuneError: ``--private`` without a push, a repo id that is not ``OWNER/NAME``, no token.
    """
    if push_to_hub is None:
        if private:
            raise RatuneError("--private only applies with --push-to-hub REPO_ID")
        return None
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(push_to_hub)
    except HFValidationError as exc:
        raise RatuneError(f"--push-to-hub {push_to_hub!r}: not a valid repo id ({exc})") from None
    if "/" not in push_to_hub:
        raise RatuneError(f"--push-to-hub {push_to_hub!r}: give the full repo id, OWNER/NAME")
    token = get_token()
    if not token:
        raise RatuneError(f"--push-to-hub {push_to_hub}: no Hugging Face token found; set $HF_TOKEN or run "
                          "`hf auth login`, then rerun (nothing was exported)")
    return token


def push_folder(folder: str | os.PathLike, repo_id: str, *, token: str, private: bool = False,
                kept: str | os.PathLike | None = None) -> str:
    """Create model repo ``repo_id`` (exist_ok), upload ``folder`` to it and return its URL; ``kept``
    names where the export stays after a refused push (default ``folder``).

    Raises:
        RatuneError: the hub refuses or cannot be reached.
        OSError: a write fault on this machine (:func:`ratune.boundary.write_fault`).
    """
    from huggingface_hub import HfApi

    from ratune.boundary import write_fault

    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message="Upload model exported by ratune")
    except Exception as exc:  # network, auth, validation: all reported the same way
        if write_fault(exc) is not None:  # this machine's disk (the upload's local cache), not the hub
            raise
        raise RatuneError(f"push to {repo_id} failed ({type(exc).__name__}: {exc}); the export is kept in "
                          f"{kept or folder}") from None
    return str(url)
