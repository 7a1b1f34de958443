"""`ratune train` on a catalog hub: the config's ``hub`` takes a
catalog folder, the data manifest's hub must agree with it (an error naming the config file, the
field and both hubs), the run manifest records the hub's name and the catalog record, and
``ratune export`` writes a card that names the catalog with no APIBench metadata. On the real
OpenAPI petstore (examples/catalogs/) with its hand-written pairs, the tiny random Llama, 1 step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from ratune.errors import RatuneError

ROOT = Path(__file__).resolve().parent.parent
PETSTORE = ROOT / "examples" / "catalogs" / "openapi-spec-validator" / "petstore.yaml"
PAIRS = ROOT / "examples" / "catalogs" / "petstore_pairs.jsonl"


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _catalog(folder: Path, name: str = "petstore") -> Path:
    """The petstore catalog named ``name``; as ``petstore``, its pairs split at eval fraction 0.2,
    seed 0 (24 train, 6 eval; the pairs name ``petstore.*`` APIs)."""
    from ratune.catalog.folder import import_catalog
    from ratune.catalog.pairs import write_pairs

    import_catalog("openapi", PETSTORE, folder, name)
    if name == "petstore":
        write_pairs(folder, PAIRS, eval_fraction=0.2, seed=0)
    return folder


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Path:
    return _catalog(tmp_path_factory.mktemp("train_catalog") / "petstore")


@pytest.fixture(scope="module")
def data(catalog, tmp_path_factory, smol_tokenizer) -> Path:
    """``ratune data build --hub CATALOG --modes oracle`` of the petstore catalog."""
    from ratune.data.build import BuildSettings, build_dataset

    out = tmp_path_factory.mktemp("train_catalog_data") / "data"
    build_dataset(apibench_dir=None, hub=str(catalog), out_dir=out, tokenizer=smol_tokenizer, tokenizer_name="smol",
                  modes=["oracle"], progress=False, settings=BuildSettings(max_length=512, max_document_tokens=64))
    return out


def _config(tmp_path: Path, name: str, **fields) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(fields, sort_keys=False), encoding="utf-8")
    return path


def _train_fields(tiny_model_dir, data: Path, output_dir: Path) -> dict:
    return {"model": str(tiny_model_dir), "data_dir": str(data), "train_retriever": "oracle",
            "output_dir": str(output_dir), "max_length": 512, "global_batch_size": 2, "per_device_batch_size": 2,
            "max_steps": 1, "learning_rate": 5e-2, "warmup_ratio": 0.0, "lr_scheduler": "constant"}


@pytest.fixture(scope="module")
def run(catalog, data, tiny_model_dir, tmp_path_factory) -> Path:
    """A complete one-step full finetune on the catalog data, from a YAML config with ``hub: CATALOG``."""
    from ratune.train.sft import main

    root = tmp_path_factory.mktemp("train_catalog_run")
    config = _config(root, "petstore.yaml", hub=str(catalog), **_train_fields(tiny_model_dir, data, root / "run"))
    assert main(["--config", str(config)]) == 0
    return root / "run"


def test_the_run_manifest_records_the_catalog(run, catalog, data):
    built = json.loads((data / "manifest.json").read_text())
    record = {"kind": "catalog", "path": str(catalog.resolve()), "name": "petstore",
              "import_source": built["catalog"]["import_source"],
              "pairs": {"source": {"path": str(PAIRS), "sha256": _sha256(PAIRS)}, "eval_fraction": 0.2, "seed": 0}}
    assert built["catalog"] == record  # what the data build recorded, the run's one source
    assert record["import_source"]["kind"] == "openapi" and record["import_source"]["sha256"] == _sha256(PETSTORE)
    for manifest in (json.loads((run / "manifest.json").read_text()),
                     json.loads((run / "model" / "ratune_manifest.json").read_text())):
        assert manifest["hub"] == "petstore"
        assert manifest["catalog"] == record
        assert manifest["config"]["hub"] == str(catalog)  # the config's value as given
        assert manifest["data"]["examples"] == 24 and manifest["steps"] == 1
    assert yaml.safe_load((run / "config.yaml").read_text())["hub"] == str(catalog)


def test_a_config_whose_hub_is_not_the_datas_is_refused_before_any_folder(catalog, data, tiny_model_dir, tmp_path):
    from ratune.train.sft import main

    manifest = data / "manifest.json"
    # hub left out: the default torchhub is not the catalog the data was built from
    out = tmp_path / "run_default"
    config = _config(tmp_path, "default.yaml", **_train_fields(tiny_model_dir, data, out))
    with pytest.raises(RatuneError) as err:
        main(["--config", str(config)])
    assert str(err.value) == (
        f"{config}: hub: torchhub (the default: the config does not set hub) is not the hub the data was built "
        f"from: {manifest} says hub: petstore (the catalog folder {catalog.resolve()}); set hub: "
        f"{catalog.resolve()}, or train on data built with `ratune data build --hub torchhub`")
    assert not out.exists()

    # an APIBench hub, set in the file
    fields = _train_fields(tiny_model_dir, data, out)
    config = _config(tmp_path, "huggingface.yaml", model=fields.pop("model"), hub="huggingface", **fields)
    with pytest.raises(RatuneError) as err:
        main(["--config", str(config)])
    # the error names the line of hub: (line 2: the file holds model, then hub)
    assert str(err.value).startswith(f"{config}:2: hub: huggingface is not the hub the data was built from: "
                                     f"{manifest} says hub: petstore (the catalog folder {catalog.resolve()});")
    assert not out.exists()

    # another catalog folder (the same spec imported as shop)
    shop = _catalog(tmp_path / "shop", name="shop")
    config = _config(tmp_path, "shop.yaml", hub=str(shop), **_train_fields(tiny_model_dir, data, out))
    with pytest.raises(RatuneError) as err:
        main(["--config", str(config)])
    assert str(err.value).startswith(f"{config}:1: hub: {shop} (catalog 'shop') is not the hub the data was "
                                     f"built from: {manifest} says hub: petstore")
    assert not out.exists()


def test_a_catalog_config_on_apibench_data_is_refused(catalog, tmp_path):
    """The other way round, on a data manifest as ``ratune data build --hub torchhub`` writes it
    (no ``catalog`` record); a config made in Python has no file to name."""
    from ratune.train.config import TrainConfig
    from ratune.train.preflight import check_data_hub

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"command": "data build", "hub": "torchhub"}))
    cfg = TrainConfig(model="m", data_dir=str(tmp_path / "data"), train_retriever="oracle",
                      output_dir=str(tmp_path / "run"), hub=str(catalog))
    with pytest.raises(RatuneError) as err:
        check_data_hub(cfg)
    assert str(err.value) == (
        f"the training config: hub: {catalog} (catalog 'petstore') is not the hub the data was built from: "
        f"{tmp_path / 'data' / 'manifest.json'} says hub: torchhub (an APIBench hub); set hub: torchhub, or train "
        f"on data built with `ratune data build --hub {catalog}`")
    # the APIBench config on APIBench data: its name, no catalog record (no APIBench folder needed)
    apibench_cfg = cfg.model_copy(update={"hub": "torchhub"})
    assert check_data_hub(apibench_cfg) == {"hub": "torchhub"}


def test_hub_is_validated_with_the_config_and_apibench_configs_resolve_as_before(catalog, tmp_path):
    from ratune.config import load_config
    from ratune.train.config import TrainConfig

    base = {"model": "m", "data_dir": "d", "train_retriever": "none", "output_dir": "o"}
    assert TrainConfig(**base).model_dump(mode="json")["hub"] == "torchhub"  # sweep cells hash this dump
    assert TrainConfig(**base, hub="tensorflowhub").model_dump(mode="json")["hub"] == "tensorflowhub"
    assert TrainConfig(**base, hub=str(catalog)).hub == str(catalog)
    with pytest.raises(RatuneError, match=r"bad\.yaml: hub: Value error, unknown hub 'pytorch': expected one of "
                                          r"torchhub, huggingface, tensorflowhub, or a tool-set folder \(ratune tools import\), "
                                          r"or a catalog folder"):
        load_config(TrainConfig, _config(tmp_path, "bad.yaml", **base, hub="pytorch"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(RatuneError, match=r"folder\.yaml: hub: Value error, .*plain: not a catalog folder"):
        load_config(TrainConfig, _config(tmp_path, "folder.yaml", **base, hub=str(tmp_path / "plain")))


def test_export_card_names_the_catalog_and_has_no_apibench(run, tmp_path):
    from huggingface_hub import ModelCard

    from ratune.eval.report import make_cell, write_table2
    from ratune.export.checkpoint import export_checkpoint

    # a catalog cell as eval run writes it (eval/catalog_scorer.py): top-level rates = strict, no gorilla block
    metrics = {"n": 6, "accuracy": 0.5, "hallucination": 1 / 6, "error": 2 / 6, "metric": "strict",
               "strict": {"accuracy": 0.5, "hallucination": 1 / 6, "error": 2 / 6, "correct_n": 3,
                          "hallucination_n": 1, "error_n": 2}}
    cells = [make_cell("oracle", "0_shot", metrics)]
    assert "accuracy" not in cells[0]
    write_table2(cells, hub="petstore", model="tiny", out_dir=tmp_path / "report")
    out = export_checkpoint(run, tmp_path / "exported", table2=tmp_path / "report" / "table2.json")
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert "APIBench" not in readme and "gorilla-llm" not in readme
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    assert "datasets" not in data
    assert {"petstore", "api-catalog", "train-retriever-oracle"} <= set(data["tags"])
    assert [(r.dataset_type, r.dataset_name, r.dataset_config, r.metric_value) for r in card.data.eval_results] == [
        ("petstore", "API catalog petstore", None, 0.5)]
    assert [r.metric_name for r in card.data.eval_results] == ["strict API accuracy (0_shot retrieval)"]
    text = card.text
    assert ("for API calling on the API catalog `petstore` (the user's own APIs, imported with `ratune catalog "
            "import`), trained with **train-time retrieval `oracle`**") in text
    assert (f"The API catalog `petstore`: the user's own APIs, imported with `ratune catalog import --from openapi` "
            f"(source sha256 `{_sha256(PETSTORE)}`)") in text
    inputs = json.loads((Path(json.loads((run / "manifest.json").read_text())["config"]["data_dir"])
                         / "manifest.json").read_text())["inputs"]
    assert set(inputs) == {"apis.jsonl", "train.jsonl", "eval.jsonl"}
    assert "Catalog `petstore` files (from the training data manifest):" in text
    for name, sha in inputs.items():
        assert f"| {name} | `{sha}` |" in text
    assert ("Measured on the eval pairs of the API catalog `petstore` (scored with the catalog's own metric, "
            "docs/catalog_scoring.md;") in text
    assert "| test-time retrieval | strict accuracy [95 % CI] | hallucination | error | n |" in text
    assert "| 0_shot | 50.0 [18.8-81.2] | 16.7 | 33.3 | 6 |" in text  # Wilson 95 % of 3/6; 1 and 2 of 6
    recipe = json.loads((out / "ratune_export.json").read_text())["recipe"]
    assert recipe["hub"] == "petstore"
    assert recipe["catalog"] == {"name": "petstore", "import_source": {"kind": "openapi", "sha256": _sha256(PETSTORE)}}
    assert "/" not in json.dumps(recipe["catalog"])  # no local path in what may be pushed
